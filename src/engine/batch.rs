//! Several sequences over one model: the runner of continuous batching.
//!
//! Each slot is one sequence's KV region (a [`KvCache`] of `n_ctx` positions) and the tokens it
//! holds. A decode step evaluates one token for each of several slots as **one** forward pass:
//! every weight matrix is read once for all of them, which is where batching wins on a
//! bandwidth-bound CPU. A step may also carry prefill chunks of some slots beside the decode
//! tokens of the others ([`BatchRunner::push_part`], then [`BatchRunner::run_step`]: chunked
//! prefill), so a long prompt never stops the running sequences for more than one chunk.
//!
//! A step may also score a slot's chunk ([`BatchRunner::push_score_part`]): the
//! log-probability of each next given token (teacher forcing: perplexity).
//!
//! All buffers are allocated in [`BatchRunner::new`]: scratch for `prefill_chunk + slots` rows
//! (one chunk beside one decode token per slot, and each slot's drafts when speculating), one
//! logits row per slot (and one per draft), a scored chunk's log-probabilities where the
//! runner scores ([`CacheOptions::score_rows`]). A step allocates nothing.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::sequence::{common_prefix, mask_logits};
use super::session::{
    check_context, exec_spec_with, kv_layout, scratch_spec, EngineError, SessionOptions,
};
use crate::backend::exec::{Executor, HasExecutor, SlotRows};
use crate::backend::Device;
use crate::cache::KvType;
use crate::model::forward::{ForwardError, Logits};
use crate::model::Model;

/// How a runner is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// Sequences served at once (`--parallel`).
    pub n_slots: usize,
    /// Context positions of each slot.
    pub n_ctx: usize,
    pub n_threads: usize,
    /// Tokens per prefill pass.
    pub prefill_chunk: usize,
    /// Element type of every slot's KV cache.
    pub kv_type: KvType,
    /// Where the steps run (every slot's cache is there too).
    pub device: Device,
    /// Draft tokens a slot's verification pass may carry beside its sampled token
    /// (speculative decoding, [`BatchRunner::push_verify`]; 0: none), cut to `prefill_chunk`
    /// − 1 (a pass is one sequence's chunk). Each slot then keeps `1 + draft_max` logits rows.
    pub draft_max: usize,
}

/// One slot's part of a step: `tokens` of the step's token buffer, whether the slot's
/// logits after its last token are wanted, which of its tokens' final hidden states
/// (relative to the part; embeddings), whether it is a verification pass (every row
/// alone, the logits after each kept), and which of its rows are scored (relative to the
/// part) with their results from `score_at` on in the runner's score buffers.
#[derive(Clone, Debug)]
struct StepPart {
    slot: usize,
    tokens: Range<usize>,
    logits: bool,
    hidden: Range<usize>,
    alone: bool,
    score: Range<usize>,
    score_at: usize,
}

/// A [`BatchRunner`] logits row's destination that is a scored row: its index in the score
/// buffers, with this bit set.
const SCORED: usize = 1 << (usize::BITS - 1);

/// The model, the device's executor (its weights, a KV cache slot per sequence, scratch) and
/// the tokens each slot holds.
pub struct BatchRunner {
    pub model: Arc<Model>,
    pub opts: BatchOptions,
    /// [`BatchRunner::rollback_reach`].
    reach: usize,
    exec: Box<dyn Executor>,
    /// Per slot, the tokens whose keys and values its cache holds.
    slots: Vec<Vec<u32>>,
    /// The slots' rows of the pass being run (reused).
    pass_rows: Vec<SlotRows>,
    /// `[n_slots, 1 + draft_max, vocab]`: per slot, the logits after its last evaluated token
    /// (row 0), or after each token of its verification pass.
    logits: Vec<f32>,
    /// The tokens of the step being built, slot after slot (reused).
    step_tokens: Vec<u32>,
    /// The parts of the step being built, by increasing slot (reused).
    parts: Vec<StepPart>,
    /// Per part, the forward pass of the step it runs in; the parts and tokens of the pass
    /// being run (reused: see [`BatchRunner::plan_passes`]).
    pass_of: Vec<usize>,
    pass_parts: Vec<StepPart>,
    pass_tokens: Vec<u32>,
    /// Per logits row of a step: its batch row, and its row of `logits` (reused).
    logit_rows: Vec<usize>,
    logit_dest: Vec<usize>,
    /// The batch rows whose hidden states a step hands out, and per range its slot and the
    /// position of its first row (reused).
    hidden_rows: Vec<Range<usize>>,
    hidden_at: Vec<(usize, usize)>,
    /// [`BatchRunner::pick_argmax`] for the step being built; per slot, the token the
    /// executor's argmax picked in the last step; the argmax's output (reused).
    argmax: bool,
    picked: Vec<Option<u32>>,
    picked_rows: Vec<u32>,
    /// Per scored row of the step ([`BatchRunner::push_score_part`]), the given token after
    /// it, and the log-probability of that token (f64 bits, written by the executor's
    /// threads); empty, never grown, where the runner does not score.
    score_next: Vec<u32>,
    scores: Vec<AtomicU64>,
}

/// Where a runner's caches live and whether it scores, beyond [`BatchOptions`] (the command
/// line's flags; a server keeps the defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheOptions {
    /// RAM for a slot's KV cache: past it, the cache lives in a file and a ring of layer
    /// buffers fitting this budget is streamed (None = always in RAM).
    pub kv_budget: Option<usize>,
    /// Give sliding-window layers a cache of the whole context (llama.cpp's `--swa-full`).
    pub swa_full: bool,
    /// Scoring ([`BatchRunner::push_score_part`]: perplexity): the logits rows the output
    /// head computes at once (at least the slots' rows), and room for a prefill chunk's
    /// log-probabilities. 0: the runner does not score, and keeps no buffer for it.
    pub score_rows: usize,
}

impl BatchOptions {
    /// A runner of `n_slots` sized as a session with `opts` (its context, threads, prefill
    /// chunk, KV type and placement, device), verifying up to `draft_max` drafts a pass.
    pub fn from_session(
        opts: &SessionOptions,
        n_slots: usize,
        draft_max: usize,
    ) -> (BatchOptions, CacheOptions) {
        let batch = BatchOptions {
            n_slots,
            n_ctx: opts.n_ctx,
            n_threads: opts.n_threads,
            prefill_chunk: opts.prefill_chunk,
            kv_type: opts.kv_type,
            device: opts.device,
            draft_max,
        };
        let cache = CacheOptions {
            kv_budget: opts.kv_budget,
            swa_full: opts.swa_full,
            score_rows: 0,
        };
        (batch, cache)
    }
}

impl BatchRunner {
    pub fn new(model: Arc<Model>, opts: BatchOptions) -> Result<BatchRunner, EngineError> {
        BatchRunner::with_cache(model, opts, CacheOptions::default(), &mut |_, _| {})
    }

    /// [`BatchRunner::new`] with its caches placed as `cache` says, calling `progress(bytes
    /// done, bytes in all)` while the weights go to the GPU (not at all on the CPU, or where
    /// another runner already put them there).
    pub fn with_cache(
        model: Arc<Model>,
        opts: BatchOptions,
        cache: CacheOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<BatchRunner, EngineError> {
        let c = &model.config;
        let n_slots = opts.n_slots.max(1);
        let n_ctx = opts.n_ctx.max(1);
        check_context(c, n_ctx)?;
        // Bidirectional attention sees a whole sequence in one pass: a pass holds any prompt.
        let opts = if c.causal {
            opts
        } else {
            BatchOptions {
                prefill_chunk: n_ctx,
                ..opts
            }
        };
        let chunk = opts.prefill_chunk.clamp(1, n_ctx);
        let opts = BatchOptions {
            draft_max: drafts_kept(opts.draft_max, opts.prefill_chunk, n_ctx, opts.device),
            ..opts
        };
        let mut sopts = SessionOptions::new(n_ctx, opts.n_threads);
        sopts.kv_type = opts.kv_type;
        sopts.device = opts.device;
        sopts.kv_budget = cache.kv_budget;
        sopts.swa_full = cache.swa_full;
        // A sequence gets at most a prefill chunk per pass (what its sliding-window rings must
        // hold beside the window)...
        sopts.prefill_chunk = opts.prefill_chunk.max(1);
        let layout = kv_layout(c, &sopts);
        let reach = layout.window.as_ref().map_or(usize::MAX, |w| w.max_pass());
        // ...and a pass carries a chunk beside one decode token per slot, and each slot's
        // drafts.
        let sopts = runner_session_options(&sopts, n_slots, opts.draft_max, cache.score_rows);
        let spec = scratch_spec(&model, &sopts);
        let espec = crate::backend::exec::ExecSpec {
            solo: true,
            ..exec_spec_with(&sopts, n_slots, layout, spec)
        };
        let exec = crate::backend::open::executor(model.clone(), &espec, progress)?;
        let rows = n_slots * (1 + opts.draft_max);
        let scored = if cache.score_rows > 0 { chunk } else { 0 };
        Ok(BatchRunner {
            exec,
            slots: (0..n_slots).map(|_| Vec::with_capacity(n_ctx)).collect(),
            pass_rows: Vec::with_capacity(n_slots),
            logits: vec![0.0; rows * c.vocab_size],
            step_tokens: Vec::with_capacity(spec.max_tokens),
            parts: Vec::with_capacity(n_slots),
            pass_of: Vec::with_capacity(n_slots),
            pass_parts: Vec::with_capacity(n_slots),
            pass_tokens: Vec::with_capacity(spec.max_tokens),
            logit_rows: Vec::with_capacity(rows),
            logit_dest: Vec::with_capacity(rows),
            hidden_rows: Vec::with_capacity(n_slots),
            hidden_at: Vec::with_capacity(n_slots),
            argmax: false,
            picked: vec![None; n_slots],
            picked_rows: vec![0; n_slots],
            score_next: Vec::with_capacity(scored),
            scores: (0..scored).map(|_| AtomicU64::new(0)).collect(),
            reach,
            opts: BatchOptions {
                n_slots,
                n_ctx,
                prefill_chunk: chunk,
                ..opts
            },
            model,
        })
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    /// The tokens whose keys and values slot `slot` holds.
    pub fn tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot]
    }

    /// The logits after slot `slot`'s last evaluated token.
    pub fn logits(&self, slot: usize) -> &[f32] {
        self.logits_at(slot, 0)
    }

    /// The logits after token `i` of slot `slot`'s last verification pass
    /// ([`BatchRunner::push_verify`]); `i = 0` is [`BatchRunner::logits`].
    pub fn logits_at(&self, slot: usize, i: usize) -> &[f32] {
        let r = self.logits_row(slot, i);
        &self.logits[r.clone()]
    }

    /// Where row `i` of slot `slot` lies in `logits`.
    fn logits_row(&self, slot: usize, i: usize) -> Range<usize> {
        assert!(
            i <= self.opts.draft_max,
            "logits row {i} past the draft rows"
        );
        let v = self.model.config.vocab_size;
        let r = slot * (1 + self.opts.draft_max) + i;
        r * v..(r + 1) * v
    }

    /// Make slot `dst`'s logits a copy of slot `src`'s (a fork continuing from `src`'s prompt).
    pub fn copy_logits(&mut self, dst: usize, src: usize) {
        let (s, d) = (self.logits_row(src, 0), self.logits_row(dst, 0));
        self.logits.copy_within(s, d.start);
    }

    /// Make `tokens` impossible to sample from row `i` of slot `slot`'s logits (set to `-inf`).
    pub fn mask_tokens(&mut self, slot: usize, i: usize, tokens: &[u32]) {
        let r = self.logits_row(slot, i);
        mask_logits(&mut self.logits[r], tokens);
    }

    /// The most tokens a verification pass may add after a slot's position and still roll
    /// back to it exactly: a sliding-window ring's `rows − window + 1` (see
    /// `KvWindow::max_pass`); unbounded without rings.
    pub fn rollback_reach(&self) -> usize {
        self.reach
    }

    /// Would `n` more tokens overflow slot `slot`?
    pub fn would_overflow(&self, slot: usize, n: usize) -> bool {
        self.exec.check_fits(slot, n).is_err()
    }

    /// Length of the common prefix of slot `slot`'s tokens and `tokens`.
    pub fn common_prefix(&self, slot: usize, tokens: &[u32]) -> usize {
        common_prefix(&self.slots[slot], tokens)
    }

    /// Keep only the first `n` tokens of slot `slot` (the cache's rollback); returns how many
    /// are kept (0 where the sliding-window rings no longer hold the window before `n`).
    pub fn rollback(&mut self, slot: usize, n: usize) -> usize {
        let kept = self.exec.rollback(slot, n);
        self.slots[slot].truncate(kept);
        kept
    }

    /// Make slot `dst` hold the first `n` tokens of slot `src` (a prefix computed by another
    /// sequence), copying their keys and values; returns how many it holds (0 where `src`'s
    /// sliding-window rings no longer hold the window before `n`).
    pub fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> usize {
        if dst == src {
            return self.rollback(dst, n);
        }
        let n = n.min(self.slots[src].len());
        let n = self.exec.copy_prefix(dst, src, n);
        let (d, s) = if dst < src {
            let (a, b) = self.slots.split_at_mut(src);
            (&mut a[dst], &b[0])
        } else {
            let (a, b) = self.slots.split_at_mut(dst);
            (&mut b[0], &a[src])
        };
        d.clear();
        d.extend_from_slice(&s[..n]);
        n
    }

    /// Evaluate one prefill chunk (at most `opts.prefill_chunk` tokens) of slot `slot`. With
    /// `want_logits`, the last token's logits become [`BatchRunner::logits`] of the slot.
    pub fn prefill_chunk(
        &mut self,
        slot: usize,
        tokens: &[u32],
        want_logits: bool,
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if tokens.len() > self.opts.prefill_chunk {
            return Err(ForwardError::BatchTooLarge {
                n: tokens.len(),
                max: self.opts.prefill_chunk,
            }
            .into());
        }
        if self.would_overflow(slot, tokens.len()) {
            return Err(EngineError::PromptTooLong {
                prompt: tokens.len(),
                ctx: self.opts.n_ctx,
                used: self.slots[slot].len(),
            });
        }
        let part = [SlotRows {
            slot,
            n_tokens: tokens.len(),
            alone: false,
        }];
        let row = [tokens.len() - 1];
        let dest = self.logits_row(slot, 0);
        let out = &mut self.logits[dest];
        let mut sink = |_: usize, l: &[f32]| out.copy_from_slice(l);
        let want = if want_logits {
            Logits::Picked(&row, &mut sink)
        } else {
            Logits::None
        };
        self.exec.forward(&part, tokens, want, false)?;
        self.slots[slot].extend_from_slice(tokens);
        Ok(())
    }

    /// Most tokens one step can carry (the scratch rows).
    pub fn max_step_tokens(&self) -> usize {
        self.exec.max_rows()
    }

    /// Tokens in the step being built.
    pub fn step_len(&self) -> usize {
        self.step_tokens.len()
    }

    /// Start building a step (forgets any parts not run).
    pub fn begin_step(&mut self) {
        self.step_tokens.clear();
        self.parts.clear();
        self.argmax = false;
        self.picked.fill(None);
        self.score_next.clear();
    }

    /// Have the executor pick the most likely token of each logits row of the step being built
    /// where the logits were computed ([`Executor::argmax`]: on a GPU, one id a row crosses
    /// the bus instead of a vocabulary of logits), for [`BatchRunner::picked`]; the rows are
    /// then not copied to [`BatchRunner::logits`]. A step of verification passes or hidden
    /// states, or of more than one pass, copies its logits as usual.
    pub fn pick_argmax(&mut self) {
        self.argmax = true;
    }

    /// The token the executor's argmax picked from slot `slot`'s logits in the last step
    /// ([`BatchRunner::pick_argmax`]), if it did.
    pub fn picked(&self, slot: usize) -> Option<u32> {
        self.picked[slot]
    }

    /// Bring the logits the executor's argmax picked slot `slot`'s token from to
    /// [`BatchRunner::logits`] after all (the step's only logits row: a device keeps the first).
    pub fn fetch_picked(&mut self, slot: usize) -> Result<(), EngineError> {
        if self.picked[slot].is_none() || self.logit_rows.len() != 1 {
            return Err(ForwardError::Device(format!(
                "slot {slot}'s logits are not the step's only row kept on the device"
            ))
            .into());
        }
        self.exec.fetch_logits()?;
        let r = self.logits_row(slot, 0);
        self.logits[r].copy_from_slice(self.exec.logits());
        self.picked[slot] = None;
        Ok(())
    }

    /// Add slot `slot`'s next `tokens` (a decode token, or a prefill chunk) to the step being
    /// built. With `logits`, [`BatchRunner::logits`] of the slot holds the logits after the
    /// last of them once the step has run. Slots must come in increasing order, each once.
    pub fn push_part(&mut self, slot: usize, tokens: &[u32], logits: bool) {
        self.push(slot, tokens, logits, 0..0, false, 0..0);
    }

    /// Add slot `slot`'s verification pass of speculative decoding to the step being built:
    /// `tokens` (its sampled token, then the drafts after it, at most `1 + opts.draft_max`),
    /// each computed as a decode step of it alone would be (the same bits). Once the step has
    /// run, [`BatchRunner::logits_at`] `(slot, i)` holds the logits after `tokens[i]`; the
    /// caller then rolls the slot back to the tokens it keeps.
    pub fn push_verify(&mut self, slot: usize, tokens: &[u32]) {
        assert!(
            tokens.len() <= 1 + self.opts.draft_max,
            "a verification pass of {} tokens; the runner keeps {} logits rows a slot",
            tokens.len(),
            1 + self.opts.draft_max
        );
        self.push(slot, tokens, true, 0..0, true, 0..0);
    }

    /// Add slot `slot`'s next `tokens` for an embedding: no logits; the final-normed hidden
    /// states of its tokens `hidden` (indices into `tokens`) go to the sink of
    /// [`BatchRunner::run_step_with`].
    pub fn push_embed_part(&mut self, slot: usize, tokens: &[u32], hidden: Range<usize>) {
        assert!(hidden.end <= tokens.len(), "hidden rows past the part");
        self.push(slot, tokens, false, hidden, false, 0..0);
    }

    /// Add slot `slot`'s next `tokens` (a prefill chunk) to the step being built, scoring its
    /// rows `rows` (indices into `tokens`): `next[i]` is the given token after row
    /// `rows.start + i`, whose log-probability under that row's logits
    /// [`BatchRunner::scores`] holds once the step has run (teacher forcing). The runner must
    /// score ([`CacheOptions::score_rows`]); the step's scored rows are at most a prefill
    /// chunk.
    pub fn push_score_part(
        &mut self,
        slot: usize,
        tokens: &[u32],
        rows: Range<usize>,
        next: &[u32],
    ) {
        assert!(
            rows.end <= tokens.len() && next.len() == rows.len(),
            "scored rows past the part, or not one next token each"
        );
        self.score_next.extend_from_slice(next);
        self.push(slot, tokens, false, 0..0, false, rows);
    }

    /// Whether the runner scores ([`CacheOptions::score_rows`]).
    pub fn can_score(&self) -> bool {
        !self.scores.is_empty()
    }

    /// The log-probabilities of slot `slot`'s scored rows in the last step
    /// ([`BatchRunner::push_score_part`]), in row order (empty where it scored none).
    pub fn scores(&self, slot: usize) -> impl Iterator<Item = f64> + '_ {
        let at = self
            .parts
            .iter()
            .find(|p| p.slot == slot)
            .map_or(0..0, |p| p.score_at..p.score_at + p.score.len());
        self.scores[at]
            .iter()
            .map(|b| f64::from_bits(b.load(Relaxed)))
    }

    fn push(
        &mut self,
        slot: usize,
        tokens: &[u32],
        logits: bool,
        hidden: Range<usize>,
        alone: bool,
        score: Range<usize>,
    ) {
        assert!(slot < self.slots.len(), "slot {slot} out of range");
        assert!(
            self.parts.last().is_none_or(|p| p.slot < slot),
            "step parts must come by increasing slot"
        );
        let start = self.step_tokens.len();
        self.step_tokens.extend_from_slice(tokens);
        self.parts.push(StepPart {
            slot,
            tokens: start..self.step_tokens.len(),
            logits,
            hidden,
            alone,
            score_at: self.score_next.len() - score.len(),
            score,
        });
    }

    /// Run the step built with [`BatchRunner::push_part`] as one forward pass: every matrix
    /// is read once for all its rows, attention runs per slot over its own cache. (On the GPU,
    /// a step with verification passes beside prompt chunks, or more rows than a pass of
    /// decode rows holds, runs as several: [`BatchRunner::plan_passes`].) On error no slot
    /// changes; logits rows and hidden states of passes that ran before it may have been
    /// written or handed out.
    pub fn run_step(&mut self) -> Result<(), EngineError> {
        self.run_step_with(&mut |_, _, _| {})
    }

    /// [`BatchRunner::run_step`], handing the hidden states asked for by
    /// [`BatchRunner::push_embed_part`] to `hidden` as `(slot, position, state)`, in order.
    pub fn run_step_with(
        &mut self,
        hidden: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), EngineError> {
        if self.parts.is_empty() {
            return Ok(());
        }
        if self.score_next.len() > self.scores.len() {
            return Err(EngineError::Failed(format!(
                "a step scores {} rows; this runner scores {} (its score_rows)",
                self.score_next.len(),
                self.scores.len()
            )));
        }
        for p in &self.parts {
            if p.tokens.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if p.tokens.len() > self.opts.prefill_chunk {
                return Err(ForwardError::BatchTooLarge {
                    n: p.tokens.len(),
                    max: self.opts.prefill_chunk,
                }
                .into());
            }
            if self.would_overflow(p.slot, p.tokens.len()) {
                return Err(if p.tokens.len() == 1 {
                    EngineError::ContextFull {
                        ctx: self.opts.n_ctx,
                    }
                } else {
                    EngineError::PromptTooLong {
                        prompt: p.tokens.len(),
                        ctx: self.opts.n_ctx,
                        used: self.slots[p.slot].len(),
                    }
                });
            }
        }
        let passes = self.plan_passes();
        for pass in 0..passes {
            if let Err(e) = self.run_pass(pass, passes, hidden) {
                // The slots of this pass and the earlier ones go back to where the step found
                // them (a device error surfaces after the pass advanced its caches).
                for (p, _) in self
                    .parts
                    .iter()
                    .zip(&self.pass_of)
                    .filter(|(_, &k)| k <= pass)
                {
                    let n = self.slots[p.slot].len();
                    self.exec.rollback(p.slot, n);
                }
                return Err(e);
            }
        }
        for p in &self.parts {
            let t = &self.step_tokens[p.tokens.clone()];
            self.slots[p.slot].extend_from_slice(t);
        }
        Ok(())
    }

    /// Assign each part of the step to a forward pass (`pass_of`); returns the number of
    /// passes. One where the device computes a verification pass's rows as decode steps inside
    /// any pass (the CPU). Elsewhere a pass's rows are its decode steps only in a pass of
    /// decode rows of at most [`Device::alone_rows`] (the GPU; see `SeqBatch::alone`): a step
    /// with prefill chunks or more rows runs its other parts in one pass, then its
    /// verification passes in passes of at most that many rows.
    fn plan_passes(&mut self) -> usize {
        self.pass_of.clear();
        let parts = &self.parts;
        let alone_rows = self.opts.device.alone_rows();
        let one = match alone_rows {
            None => true,
            Some(max) => {
                !parts.iter().any(|p| p.alone)
                    || (self.step_tokens.len() <= max
                        && parts.iter().all(|p| p.alone || p.tokens.len() == 1))
            }
        };
        let max = alone_rows.unwrap_or(usize::MAX);
        if one {
            self.pass_of.resize(parts.len(), 0);
            return 1;
        }
        let first = usize::from(parts.iter().any(|p| !p.alone));
        let (mut pass, mut rows) = (first, 0);
        for p in parts {
            if !p.alone {
                self.pass_of.push(0);
                continue;
            }
            if rows > 0 && rows + p.tokens.len() > max {
                (pass, rows) = (pass + 1, 0);
            }
            rows += p.tokens.len();
            self.pass_of.push(pass);
        }
        pass + 1
    }

    /// Run the parts of the step assigned to pass `pass` of `passes` as one forward pass (their
    /// slots' tokens are not yet extended).
    fn run_pass(
        &mut self,
        pass: usize,
        passes: usize,
        hidden: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), EngineError> {
        if passes == 1 {
            // The whole step: its own parts and tokens (swapped in, not copied).
            std::mem::swap(&mut self.pass_parts, &mut self.parts);
            std::mem::swap(&mut self.pass_tokens, &mut self.step_tokens);
            let r = self.run_pass_parts(hidden);
            std::mem::swap(&mut self.pass_parts, &mut self.parts);
            std::mem::swap(&mut self.pass_tokens, &mut self.step_tokens);
            return r;
        }
        self.pass_parts.clear();
        self.pass_tokens.clear();
        for (p, _) in self
            .parts
            .iter()
            .zip(&self.pass_of)
            .filter(|(_, &k)| k == pass)
        {
            let start = self.pass_tokens.len();
            self.pass_tokens
                .extend_from_slice(&self.step_tokens[p.tokens.clone()]);
            self.pass_parts.push(StepPart {
                tokens: start..self.pass_tokens.len(),
                ..p.clone()
            });
        }
        self.run_pass_parts(hidden)
    }

    /// Run `pass_parts` (over `pass_tokens`) as one forward pass.
    fn run_pass_parts(
        &mut self,
        hidden: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.logit_rows.clear();
        self.logit_dest.clear();
        let per_slot = 1 + self.opts.draft_max;
        for p in &self.pass_parts {
            if !p.score.is_empty() {
                for (i, r) in p.score.clone().enumerate() {
                    self.logit_rows.push(p.tokens.start + r);
                    self.logit_dest.push(SCORED | (p.score_at + i));
                }
                continue;
            }
            if !p.logits {
                continue;
            }
            let first = if p.alone {
                p.tokens.start
            } else {
                p.tokens.end - 1
            };
            for (i, row) in (first..p.tokens.end).enumerate() {
                self.logit_rows.push(row);
                self.logit_dest.push(p.slot * per_slot + i);
            }
        }
        self.hidden_rows.clear();
        self.hidden_at.clear();
        for p in self.pass_parts.iter().filter(|p| !p.hidden.is_empty()) {
            let first = p.tokens.start + p.hidden.start;
            self.hidden_rows.push(first..p.tokens.start + p.hidden.end);
            let pos = self.slots[p.slot].len() + p.hidden.start;
            self.hidden_at.push((p.slot, pos));
        }
        let v = self.model.config.vocab_size;
        let (scores, score_next) = (&self.scores, &self.score_next);
        let score = |k: usize, l: &[f32]| {
            let lp = crate::sampler::log_softmax(l, score_next[k]);
            scores[k].store(lp.to_bits(), Relaxed);
        };
        let (logits, logit_dest) = (&mut self.logits, &self.logit_dest);
        let mut sink = |i: usize, l: &[f32]| {
            let r = logit_dest[i];
            if r & SCORED != 0 {
                score(r & !SCORED, l);
            } else {
                logits[r * v..(r + 1) * v].copy_from_slice(l);
            }
        };
        // A pass whose only logits are one part's scored rows scores them on the executor's
        // threads, in any order.
        let mut with_logits = self
            .pass_parts
            .iter()
            .filter(|p| p.logits || !p.score.is_empty());
        let each = match (with_logits.next(), with_logits.next()) {
            (Some(p), None) if !p.score.is_empty() => {
                let rows = p.tokens.start + p.score.start..p.tokens.start + p.score.end;
                Some((rows, p.score_at))
            }
            _ => None,
        };
        let each_row = |row: usize, l: &[f32]| {
            if let Some((rows, at)) = &each {
                score(at + row - rows.start, l);
            }
        };
        let (hidden_rows, hidden_at) = (&self.hidden_rows, &self.hidden_at);
        let mut hidden_sink = |row: usize, state: &[f32]| {
            // Ranges come in increasing order and are few (one per embedding in the step).
            let i = hidden_rows.partition_point(|r| r.end <= row);
            let (slot, pos) = hidden_at[i];
            hidden(slot, pos + row - hidden_rows[i].start, state);
        };
        // The argmax where the logits are: a step of one pass of rows that each end a part.
        let keep = self.argmax
            && hidden_rows.is_empty()
            && !self
                .pass_parts
                .iter()
                .any(|p| p.alone || !p.score.is_empty());
        let want = if keep {
            Logits::Kept(&self.logit_rows)
        } else if let (Some((rows, _)), true) = (&each, hidden_rows.is_empty()) {
            Logits::EachRow(rows.clone(), &each_row)
        } else if hidden_rows.is_empty() {
            Logits::Picked(&self.logit_rows, &mut sink)
        } else {
            Logits::Hidden {
                hidden: hidden_rows,
                hidden_sink: &mut hidden_sink,
                picked: &self.logit_rows,
                sink: &mut sink,
            }
        };
        self.pass_rows.clear();
        self.pass_rows
            .extend(self.pass_parts.iter().map(|p| SlotRows {
                slot: p.slot,
                n_tokens: p.tokens.len(),
                alone: p.alone,
            }));
        self.exec
            .forward(&self.pass_rows, &self.pass_tokens, want, true)?;
        if keep && !self.logit_rows.is_empty() {
            let out = &mut self.picked_rows[..self.logit_rows.len()];
            self.exec.argmax(out)?;
            for (&d, &t) in self.logit_dest.iter().zip(out.iter()) {
                self.picked[d / per_slot] = Some(t);
            }
        }
        Ok(())
    }

    /// One decode step: evaluate `token` for each `(slot, token)` of `batch` in one forward
    /// pass. Slots must be distinct and in increasing order. Afterwards
    /// [`BatchRunner::logits`] of each of those slots holds its next-token logits.
    pub fn decode(&mut self, batch: &[(usize, u32)]) -> Result<(), EngineError> {
        assert!(
            batch.windows(2).all(|w| w[0].0 < w[1].0),
            "decode batch slots must be distinct and increasing"
        );
        self.begin_step();
        for &(slot, t) in batch {
            self.push_part(slot, &[t], true);
        }
        self.run_step()
    }

    /// Run on `target`'s CPU threads (a draft model's runner, stepped between `target`'s steps
    /// from the same thread: two pools would each keep their workers spinning while the
    /// other's run). Nothing changes where either runs on another device.
    pub fn share_threads(&mut self, target: &BatchRunner) {
        self.exec.share_threads(&*target.exec);
    }

    /// Bytes of the slots' logits rows and the host scratch (a device's is device memory):
    /// what the memory plan's "scratch (activations)" and "logits" count.
    pub fn host_scratch_bytes(&self) -> usize {
        self.logits.len() * 4 + self.exec.host_scratch_bytes()
    }

    /// Bytes of the KV caches of all slots.
    pub fn kv_bytes(&self) -> usize {
        self.exec.kv_bytes()
    }
}

impl HasExecutor for BatchRunner {
    fn executor(&self) -> &dyn Executor {
        &*self.exec
    }
    fn executor_mut(&mut self) -> &mut dyn Executor {
        &mut *self.exec
    }
}

/// The drafts a runner's verification pass may carry of the `draft_max` asked for: a pass is
/// one sequence's pass, at most a prefill chunk (of at most the context); where a device
/// computes rows alone only in passes of decode rows, at most their rows
/// ([`Device::alone_rows`]).
#[must_use]
pub fn drafts_kept(draft_max: usize, prefill_chunk: usize, n_ctx: usize, device: Device) -> usize {
    let rows = device.alone_rows().unwrap_or(usize::MAX);
    draft_max.min(prefill_chunk.clamp(1, n_ctx.max(1)).min(rows) - 1)
}

/// How a runner of `n_slots` sizes its buffers, from a session's options: a pass carries a
/// prefill chunk (at most a slot's context) beside one decode token and up to `draft_max`
/// drafts per slot, and the output head computes a logits row per slot at a time, and
/// `draft_max` more (so that a lone verification pass reads the head once), or `score_rows`
/// where more (a scoring runner: [`CacheOptions::score_rows`]). (The memory plan sizes a
/// runner with this.)
pub fn runner_session_options(
    opts: &SessionOptions,
    n_slots: usize,
    draft_max: usize,
    score_rows: usize,
) -> SessionOptions {
    SessionOptions {
        batch_rows: n_slots * (1 + draft_max),
        logit_rows: (n_slots + draft_max).max(score_rows),
        ..*opts
    }
}
