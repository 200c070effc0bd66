//! Continuous batching: many requests over one [`BatchRunner`].
//!
//! Requests wait in a FIFO queue until a slot is free. Each iteration of [`Scheduler::step`]
//! admits waiting requests into free slots, then runs **one** forward pass carrying the next
//! token of every sequence that is generating and at most one prefill chunk's worth of prompt
//! tokens (chunked prefill, the scheduling of Sarathi-Serve and vLLM). New requests thus join
//! between steps and finished ones leave without stalling the others; a long prompt delays
//! the running sequences by at most one chunk per step.
//!
//! Prompt tokens are handed out shortest remaining prompt first (then oldest first), each
//! sequence's in pieces of `prefill_chunk` tokens from the first uncached one (the pieces a
//! [`super::Session::prefill`] of the prompt evaluates: same bits). A short prompt arriving
//! while a long one is being prefilled is thus evaluated in the next step, and the long
//! prompt waits one step per request that overtakes it (at most one per slot freed, as
//! admission needs a free slot).
//!
//! Prefix cache: a finished sequence's slot keeps its tokens and KV. A new request goes to the
//! free slot sharing the longest prefix with its prompt (least recently used among equals) and
//! prefills only the rest; if a busy slot shares a longer prefix, that prefix's KV is copied
//! over first (rollback, across slots). Prefixes are shared only between requests of one tenant
//! ([`SeqRequest::tenant`]), so that what is cached says nothing of another's prompt.
//!
//! Generation samples a sequence's logits after each of its tokens with its own sampler, one
//! call per token, the prompt's last logits first: the sampling loop of every generation, as
//! `kiln run`, `chat` and `bench` drive it through [`super::Engine`] (a scheduler of one slot)
//! and the server through its own thread. A request's greedy output is a single sequence's
//! greedy decoding (batched rows give each sequence the logits it gets alone).
//!
//! Several choices of one prompt (`n > 1`, [`SeqRequest::forks`]) share one prefill: the request
//! is admitted when a slot is free for each choice; its own slot evaluates the prompt while the
//! others wait, then each of them takes a copy of the prompt's KV and of its last logits and
//! samples on with its own sampler, grammar and sink.
//!
//! A scoring request ([`SeqRequest::score`], perplexity) is a prompt evaluated in the same
//! prefill chunks, its positions' log-probabilities of the next given token handed to its
//! sink step by step (`score.rs`); it samples nothing.
//!
//! Log-probabilities ([`SeqRequest::logprobs`]) are read from the raw logits row before any
//! mask or sampling, into buffers allocated at admission ([`super::logprobs`]).
//!
//! Speculative decoding ([`Scheduler::speculate`], `speculate.rs`): a generating sequence's
//! pending token goes into the step with its drafts (the tokens that followed the latest
//! earlier occurrence of its last few tokens, or a draft model's guesses: its slots catch up
//! one prefill chunk a step), every row computed as its own decode step
//! ([`BatchRunner::push_verify`]). Its rows are then sampled in order with its own sampler
//! ([`super::speculative`] says why that keeps the output): a draft is kept while the sample
//! equals it, the first disagreement is the next pending token, and the slot is rolled back to
//! the kept tokens. Same samples as without it, in the same order, fewer steps where text
//! repeats.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use super::batch::BatchRunner;
use super::logprobs::TokenLogprobs;
use super::pooling::Pooler;
use super::session::EngineError;
use super::speculative::DraftWant;
use crate::grammar::{overlap, Constraint};
use crate::sampler::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use score::push_scored;

mod code;
mod request;
mod score;
mod speculate;
pub use code::CodeStops;
use code::CodeWatch;
pub use request::{
    FinishReason, Finished, Fork, SchedMetrics, SeqEvent, SeqRequest, SeqSink, Usage,
};
pub use speculate::ServeDrafter;
use speculate::ServeSpec;

enum Phase {
    /// Prompt tokens `next..` still to evaluate.
    Prefill { next: usize },
    /// `pending` was sampled and emitted; it is evaluated in the next decode step.
    Decode { pending: u32 },
    /// A fork waiting for the prefill of the request in slot `on` (whose prompt it shares).
    Waiting { on: usize },
}

/// A request holding a slot.
struct Active<'t> {
    req: SeqRequest,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    phase: Phase,
    /// Text held back because it could be the start of a stop sequence.
    held: String,
    /// The stop sequence (by index) that ended the text.
    stop_hit: Option<usize>,
    /// The text against the request's [`CodeStops`].
    code: CodeWatch,
    generated: usize,
    cached: usize,
    /// Admission order (ties of the prefill order).
    order: u64,
    /// Log-probability buffers, for requests that report them.
    logprobs: Option<TokenLogprobs>,
    /// The sampler goes back to [`Scheduler::take_sampler`] at the end.
    keep_sampler: bool,
    /// Speculative decoding: the step's verification pass (the pending token, then its
    /// drafts; empty: a plain decode row), and how many drafts the next pass asks for.
    verify: Vec<u32>,
    want: DraftWant,
}

enum Emit {
    Continue,
    StopHit,
    /// A line too shallow for the request's `n_indent` ended the text.
    Cut,
    Gone,
}

impl Active<'_> {
    /// Send `text`, holding back any tail that may begin a stop sequence; what is sent
    /// passes the request's [`CodeStops`] first.
    fn emit(&mut self, text: &str) -> Emit {
        self.held.push_str(text);
        let stop = (self.req.stop.iter().enumerate())
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i)))
            .min();
        let (n, end) = match stop {
            Some((at, i)) => {
                self.stop_hit = Some(i);
                (at, Emit::StopHit)
            }
            None => {
                let n = self.held.len() - held_back(&self.held, &self.req.stop);
                (n, Emit::Continue)
            }
        };
        let (n, end) = match self.code.cut(&self.held[..n]) {
            Some(cut) => {
                self.stop_hit = None;
                (cut, Emit::Cut)
            }
            None => (n, end),
        };
        let alive = self.req.sink.text(&self.held[..n]);
        match end {
            Emit::Continue => {
                self.held.drain(..n);
                if alive {
                    Emit::Continue
                } else {
                    Emit::Gone
                }
            }
            end => {
                self.held.clear();
                end
            }
        }
    }

    /// Prompt tokens still to evaluate (0 once generating).
    fn remaining(&self) -> usize {
        match self.phase {
            Phase::Prefill { next } => self.req.prompt.len() - next,
            Phase::Decode { .. } | Phase::Waiting { .. } => 0,
        }
    }
}

/// Bytes at the end of `text` that are a proper prefix of some stop sequence (so may still
/// grow into it), cut at a character boundary.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    let mut keep = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            if i > keep && text.ends_with(&s[..i]) {
                keep = i;
            }
        }
    }
    keep
}

/// [`Scheduler::pick_slot`]'s answer: shared-prefix lengths of the chosen free slot and of the
/// best source slot.
struct SlotChoice {
    slot: usize,
    own: usize,
    src: usize,
    best: usize,
}

/// The continuous-batching scheduler over one runner.
pub struct Scheduler<'t> {
    runner: BatchRunner,
    tok: &'t Tokenizer,
    /// The requests waiting for a slot, each with the sampler it continues, if any.
    waiting: VecDeque<(SeqRequest, Option<Sampler>)>,
    /// The sampler of the last request that continued one, once it is done
    /// ([`Scheduler::take_sampler`]).
    returned: Option<Sampler>,
    active: Vec<Option<Active<'t>>>,
    /// Per slot, when it was last released (LRU among free slots).
    released_at: Vec<u64>,
    /// Per slot, the tenant whose tokens it holds (prefixes are shared within a tenant only).
    tenants: Vec<u64>,
    tick: u64,
    metrics: Arc<SchedMetrics>,
    /// Per slot, the prompt tokens it evaluates in the step being planned (reused).
    plan: Vec<usize>,
    /// Per slot, whether it has tokens in the step being run, and whether that step evaluates
    /// the last of its prompt (reused).
    in_step: Vec<bool>,
    completing: Vec<bool>,
    /// The text of the token being emitted (reused).
    piece: String,
    /// Per slot, the pooling of the embedding request it holds.
    poolers: Vec<Option<Pooler>>,
    /// Speculative decoding, when on.
    spec: Option<ServeSpec>,
    /// A sequence's tokens and its pending one, for the drafter (reused).
    history: Vec<u32>,
    /// A scoring request's log-probabilities of a step (reused; empty where the runner
    /// does not score).
    scored: Vec<f64>,
}

impl<'t> Scheduler<'t> {
    pub fn new(runner: BatchRunner, tok: &'t Tokenizer, metrics: Arc<SchedMetrics>) -> Self {
        let n = runner.n_slots();
        metrics.slots_total.store(n, Relaxed);
        metrics
            .kv_tokens_total
            .store(n.saturating_mul(runner.n_ctx()), Relaxed);
        Scheduler {
            tok,
            waiting: VecDeque::new(),
            returned: None,
            active: (0..n).map(|_| None).collect(),
            released_at: vec![0; n],
            tenants: vec![0; n],
            tick: 0,
            metrics,
            plan: vec![0; n],
            in_step: vec![false; n],
            completing: vec![false; n],
            piece: String::with_capacity(64),
            poolers: (0..n).map(|_| None).collect(),
            spec: None,
            scored: Vec::with_capacity(if runner.can_score() {
                runner.opts.prefill_chunk
            } else {
                0
            }),
            history: Vec::new(),
            runner,
        }
    }

    /// Nothing waiting and nothing running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.iter().all(Option::is_none)
    }

    /// Queue a request. Requests that can never run are answered at once with an error.
    pub fn submit(&mut self, req: SeqRequest) {
        self.queue(req, None);
    }

    /// [`Scheduler::submit`], the request's tokens drawn by `sampler` as an earlier request
    /// left it (its random stream goes on: a chat's turns) instead of a new sampler of
    /// `req.sampler`; once the request is done, [`Scheduler::take_sampler`] gives it back.
    pub fn submit_continuing(&mut self, req: SeqRequest, sampler: Sampler) {
        self.queue(req, Some(sampler));
    }

    /// The sampler of the last request queued by [`Scheduler::submit_continuing`], once that
    /// request is done.
    pub fn take_sampler(&mut self) -> Option<Sampler> {
        self.returned.take()
    }

    /// The runner the requests run on.
    pub fn runner(&self) -> &BatchRunner {
        &self.runner
    }

    /// The runner back, its slots holding what they hold (the requests still queued or
    /// running are dropped unanswered: call it when [`Scheduler::is_idle`]).
    pub fn into_runner(self) -> BatchRunner {
        self.runner
    }

    fn queue(&mut self, mut req: SeqRequest, sampler: Option<Sampler>) {
        let n_ctx = self.runner.n_ctx();
        let choices = 1 + req.forks.len();
        // A generation needs room for one token more; an embedding or a score only its prompt.
        let room = if req.embed.is_some() || req.score.is_some() {
            n_ctx + 1
        } else {
            n_ctx
        };
        let err = if choices > self.runner.n_slots() {
            Some(format!(
                "{choices} choices need {choices} sequence slots; there are {}",
                self.runner.n_slots()
            ))
        } else if let Some(e) = self.refuse_score(&req) {
            Some(e)
        } else if req.embed.is_none() && self.runner.model.config.arch.is_encoder() {
            let arch = &self.runner.model.config.arch_name;
            Some(EngineError::encoder_generation(arch).to_string())
        } else if req.prompt.is_empty() {
            Some(EngineError::EmptyPrompt.to_string())
        } else if req.prompt.len() >= room {
            Some(
                EngineError::PromptTooLong {
                    prompt: req.prompt.len(),
                    ctx: n_ctx,
                    used: 0,
                }
                .to_string(),
            )
        } else if let Some(&id) = req
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.runner.model.config.vocab_size)
        {
            Some(format!("token id {id} is outside the vocabulary"))
        } else {
            None
        };
        if let Some(e) = err {
            self.metrics.requests_failed.fetch_add(1, Relaxed);
            let usage = Usage {
                prompt_tokens: req.prompt.len(),
                ..Usage::default()
            };
            for f in &mut req.forks {
                f.sink.done(Finished {
                    reason: FinishReason::Error(e.clone()),
                    usage,
                    stop_word: None,
                });
            }
            req.sink.done(Finished {
                reason: FinishReason::Error(e),
                usage,
                stop_word: None,
            });
            if sampler.is_some() {
                self.returned = sampler;
            }
            return;
        }
        self.waiting.push_back((req, sampler));
        self.publish_gauges();
    }

    /// Serve requests from `rx` until every sender is gone and the work is done.
    pub fn run(mut self, rx: Receiver<SeqRequest>) {
        loop {
            if self.is_idle() {
                match rx.recv() {
                    Ok(r) => self.submit(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = rx.try_recv() {
                self.submit(r);
            }
            self.step();
        }
    }

    /// One iteration: admit, then one forward pass with every generating sequence's next
    /// token and up to one prefill chunk of prompt tokens.
    pub fn step(&mut self) {
        self.admit();
        self.draft();
        self.plan_prefill();
        self.run_step();
    }

    /// Publish the queue and slot gauges (called at every change, so that a client that has
    /// just seen a response start reads gauges that already count it).
    fn publish_gauges(&self) {
        let in_use = self.active.iter().filter(|a| a.is_some()).count();
        self.metrics.slots_in_use.store(in_use, Relaxed);
        let kv: usize = (0..self.active.len())
            .filter(|&s| self.active[s].is_some())
            .map(|s| self.runner.tokens(s).len())
            .sum();
        self.metrics.kv_tokens_in_use.store(kv, Relaxed);
        self.metrics.queue_depth.store(self.waiting.len(), Relaxed);
    }

    fn admit(&mut self) {
        while let Some(choice) = self.pick_slot() {
            let (mut req, sampler) = self.waiting.pop_front().expect("pick_slot saw a request");
            self.tick += 1;
            // Keep at least one prompt token to evaluate, so that fresh logits exist (an
            // embedding reuses no prefix whose hidden states its pooling reads, and under
            // bidirectional attention none at all: a cached key saw its own prompt's future).
            let causal = self.runner.model.config.causal;
            let reuse = causal && req.embed.is_none_or(|e| e.pooling.reuses_prefix());
            // (A score reuses no prefix past its first scored position.)
            let limit = if req.cache_prompt && reuse {
                (req.prompt.len() - 1).min(req.score.unwrap_or(usize::MAX))
            } else {
                0
            };
            let (slot, own) = (choice.slot, choice.own.min(limit));
            let (src, best) = (choice.src, choice.best.min(limit));
            // What is kept may be less (0) where a sliding-window ring no longer holds it.
            let cached = if best > own {
                self.runner.copy_prefix(slot, src, best)
            } else {
                self.runner.rollback(slot, own)
            };
            let m = &self.metrics;
            m.requests_admitted
                .fetch_add(1 + req.forks.len() as u64, Relaxed);
            m.prompt_tokens.fetch_add(req.prompt.len() as u64, Relaxed);
            if cached > 0 {
                m.prefix_hits.fetch_add(1, Relaxed);
                m.prefill_tokens_saved.fetch_add(cached as u64, Relaxed);
            }
            let forks = std::mem::take(&mut req.forks);
            let fork_reqs: Vec<SeqRequest> = forks
                .into_iter()
                .map(|f| SeqRequest {
                    prompt: req.prompt.clone(),
                    max_new: req.max_new,
                    sampler: f.sampler,
                    stop: req.stop.clone(),
                    code: req.code,
                    cache_prompt: req.cache_prompt,
                    tenant: req.tenant,
                    ignore_eos: req.ignore_eos,
                    grammar: f.grammar,
                    logprobs: req.logprobs,
                    embed: None,
                    score: None,
                    forks: Vec::new(),
                    sink: f.sink,
                })
                .collect();
            let dim = self.runner.model.config.dim;
            self.tenants[slot] = req.tenant;
            self.poolers[slot] = req.embed.map(|e| Pooler::new(e, dim));
            let mut first = self.activate(req, Phase::Prefill { next: cached }, cached);
            if let Some(s) = sampler {
                first.sampler = s;
                first.keep_sampler = true;
            }
            self.active[slot] = Some(first);
            for fork in fork_reqs {
                let f = self
                    .lru_free_slot()
                    .expect("admission counted a slot per choice");
                self.poolers[f] = None;
                self.tenants[f] = self.tenants[slot];
                self.active[f] = Some(self.activate(fork, Phase::Waiting { on: slot }, 0));
            }
            self.publish_gauges();
        }
    }

    /// A request's state in a slot.
    fn activate(&self, req: SeqRequest, phase: Phase, cached: usize) -> Active<'t> {
        let vocab = self.runner.model.config.vocab_size;
        Active {
            sampler: Sampler::new(req.sampler.clone(), vocab),
            stream: StreamDecoder::new(self.tok),
            phase,
            held: String::with_capacity(64),
            stop_hit: None,
            code: CodeWatch::new(req.code),
            generated: 0,
            cached,
            order: self.tick,
            logprobs: req.logprobs.map(TokenLogprobs::new),
            keep_sampler: false,
            verify: match self.spec {
                Some(_) => Vec::with_capacity(1 + self.runner.opts.draft_max),
                None => Vec::new(),
            },
            want: DraftWant::new(self.runner.opts.draft_max),
            req,
        }
    }

    /// The free slot released longest ago.
    fn lru_free_slot(&self) -> Option<usize> {
        (0..self.active.len())
            .filter(|&s| self.active[s].is_none())
            .min_by_key(|&s| self.released_at[s])
    }

    /// Where the next waiting request goes, from one pass over the slots: the free slot with
    /// the longest shared prefix (then the least recently released), and the slot of any state
    /// sharing the longest prefix (a source to copy from); only the slots of the request's
    /// tenant share a prefix with it. `None` if nothing waits or no slot is free.
    fn pick_slot(&self) -> Option<SlotChoice> {
        let (front, _) = self.waiting.front()?;
        let prompt = &front.prompt;
        let free_slots = self.active.iter().filter(|a| a.is_none()).count();
        if free_slots < 1 + front.forks.len() {
            return None;
        }
        let mut free: Option<(usize, usize)> = None;
        let (mut src, mut best) = (0, 0);
        for s in 0..self.runner.n_slots() {
            let n = if self.tenants[s] == front.tenant {
                self.runner.common_prefix(s, prompt)
            } else {
                0
            };
            if n > best {
                (src, best) = (s, n);
            }
            let key = |s: usize, n: usize| (n, std::cmp::Reverse(self.released_at[s]));
            if self.active[s].is_none() && free.is_none_or(|(f, fnum)| key(s, n) > key(f, fnum)) {
                free = Some((s, n));
            }
        }
        let (slot, own) = free?;
        Some(SlotChoice {
            slot,
            own,
            src,
            best,
        })
    }

    /// Choose the prompt tokens of the next step into `plan`: the sequences with the fewest
    /// prompt tokens left first (then the oldest), each its next piece of `prefill_chunk`
    /// tokens (or what is left), while they fit in one chunk (the scratch holds a chunk beside
    /// every decode row and verification pass). A sequence whose receiver is gone is cancelled
    /// here.
    fn plan_prefill(&mut self) {
        let chunk = self.runner.opts.prefill_chunk;
        let n_decode: usize = self
            .active
            .iter()
            .flatten()
            .filter(|a| matches!(a.phase, Phase::Decode { .. }))
            .map(|a| a.verify.len().max(1))
            .sum();
        let mut room = chunk.min(self.runner.max_step_tokens().saturating_sub(n_decode));
        self.plan.fill(0);
        let mut first = true;
        while room > 0 {
            let Some((slot, left)) = self
                .active
                .iter()
                .enumerate()
                .filter(|&(s, _)| self.plan[s] == 0)
                .filter_map(|(s, a)| a.as_ref().map(|a| (s, a)))
                .filter(|(_, a)| a.remaining() > 0)
                .min_by_key(|(_, a)| (a.remaining(), a.order))
                .map(|(s, a)| (s, a.remaining()))
            else {
                break;
            };
            // Bidirectional attention needs a sequence's whole prompt in one pass (the runner's
            // chunk holds any prompt then).
            let whole = !self.runner.model.config.causal;
            let mut piece = if whole { left } else { chunk.min(left) };
            if piece > room && whole {
                break;
            }
            if piece > room {
                if !first {
                    break;
                }
                piece = room;
            }
            // A closed connection stops the prefill too.
            let a = self.active[slot].as_mut().expect("chosen active");
            if !a.req.sink.text("") {
                self.finish(slot, FinishReason::Cancelled);
                continue;
            }
            self.plan[slot] = piece;
            room -= piece;
            first = false;
        }
    }

    /// Run the planned step: every generating sequence's pending token and the planned prompt
    /// pieces, in one forward pass; then sample where a sequence has fresh logits.
    fn run_step(&mut self) {
        self.runner.begin_step();
        let (mut n_decode, mut n_prefill) = (0, 0);
        self.in_step.fill(false);
        self.completing.fill(false);
        for (s, a) in self.active.iter().enumerate() {
            let Some(a) = a else { continue };
            match a.phase {
                Phase::Decode { .. } if !a.verify.is_empty() => {
                    self.runner.push_verify(s, &a.verify);
                    n_decode += 1;
                    self.in_step[s] = true;
                }
                Phase::Decode { pending } => {
                    self.runner.push_part(s, &[pending], true);
                    n_decode += 1;
                    self.in_step[s] = true;
                }
                Phase::Prefill { next } if self.plan[s] > 0 => {
                    let end = next + self.plan[s];
                    let prompt = &a.req.prompt;
                    let part = &prompt[next..end];
                    match (a.req.embed, a.req.score) {
                        (Some(e), _) => {
                            let rows = e.pooling.rows_wanted(next, part.len(), prompt.len());
                            self.runner.push_embed_part(s, part, rows);
                        }
                        (None, Some(first)) => {
                            push_scored(&mut self.runner, s, prompt, next..end, first)
                        }
                        (None, None) => self.runner.push_part(s, part, end == prompt.len()),
                    }
                    n_prefill += end - next;
                    self.in_step[s] = true;
                    self.completing[s] = end == prompt.len();
                }
                Phase::Prefill { .. } | Phase::Waiting { .. } => {}
            }
        }
        if n_decode + n_prefill == 0 {
            return;
        }
        if self.argmax_step() {
            self.runner.pick_argmax();
        }
        let t0 = Instant::now();
        // Each constrained sequence with fresh logits coming (a decode token, or its prompt's
        // last piece: the first mask; a fork, its prompt's) consumes its pending token and
        // computes its next mask on a helper thread while the step's forward pass runs.
        let mut masks: Vec<(&mut Constraint, Option<u32>)> = Vec::new();
        for (s, a) in self.active.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            let Some(c) = a.req.grammar.as_mut() else {
                continue;
            };
            match a.phase {
                Phase::Decode { pending } => masks.push((c, Some(pending))),
                Phase::Prefill { .. } if self.completing[s] => masks.push((c, None)),
                Phase::Waiting { on } if self.completing[on] => masks.push((c, None)),
                Phase::Prefill { .. } | Phase::Waiting { .. } => {}
            }
        }
        let (runner, poolers) = (&mut self.runner, &mut self.poolers);
        let mut pool = |slot: usize, _pos: usize, state: &[f32]| {
            if let Some(p) = poolers[slot].as_mut() {
                p.add(state);
            }
        };
        let res = overlap(&mut masks, || runner.run_step_with(&mut pool));
        drop(masks);
        let m = &self.metrics;
        m.prefill_tokens.fetch_add(n_prefill as u64, Relaxed);
        let secs = t0.elapsed().as_secs_f64();
        if n_decode > 0 {
            m.decode_steps.fetch_add(1, Relaxed);
        }
        let accepted = m.spec_accepted.load(Relaxed);
        for slot in 0..self.active.len() {
            // (a fork released by an earlier slot of this loop is not in the step)
            if !self.in_step[slot] {
                continue;
            }
            let Some(a) = self.active[slot].as_mut() else {
                continue;
            };
            if let Err(e) = &res {
                self.finish(slot, FinishReason::Error(e.to_string()));
                continue;
            }
            match a.phase {
                Phase::Decode { .. } if !a.verify.is_empty() => self.accept_drafts(slot),
                Phase::Decode { .. } => self.sample_next(slot),
                Phase::Prefill { next } => {
                    let next = next + self.plan[slot];
                    if a.req.score.is_some() {
                        self.hand_scores(slot, next);
                    } else if next == a.req.prompt.len() && a.req.embed.is_some() {
                        self.finish_embedding(slot);
                    } else if next == a.req.prompt.len() {
                        self.release_forks(slot);
                        self.sample_next(slot);
                    } else {
                        a.phase = Phase::Prefill { next };
                    }
                }
                Phase::Waiting { .. } => {}
            }
        }
        if n_decode > 0 {
            // A decode row's token, and the drafts its verification pass kept.
            let kept = self.metrics.spec_accepted.load(Relaxed) - accepted;
            self.metrics.record_step(n_decode + kept as usize, secs);
        }
    }

    /// Whether every sequence sampling after this step draws the plain argmax of its logits
    /// with nothing else reading them (no log-probabilities, grammar, bias or penalties, no
    /// fork to hand them to, no verification pass): then the executor picks the tokens where
    /// the logits are. A request that never ends at an end-of-generation token needs its
    /// logits where the argmax is one (rare: they are then fetched), so only as the step's
    /// only row.
    fn argmax_step(&self) -> bool {
        let (mut rows, mut masked) = (0, false);
        for (s, a) in self.active.iter().enumerate() {
            let Some(a) = a else { continue };
            let fresh = match a.phase {
                Phase::Decode { .. } => true,
                // (A score samples nothing.)
                Phase::Prefill { .. } => self.completing[s] && a.req.score.is_none(),
                Phase::Waiting { on } if self.completing[on] => return false,
                Phase::Waiting { .. } => false,
            };
            if !fresh {
                continue;
            }
            let plain = a.sampler.is_argmax()
                && a.verify.is_empty()
                && a.logprobs.is_none()
                && a.req.grammar.is_none()
                && a.req.embed.is_none();
            if !plain {
                return false;
            }
            rows += 1;
            masked |= a.req.ignore_eos;
        }
        rows > 0 && (!masked || rows == 1)
    }

    /// The prompt of the request in `main` is evaluated: each fork waiting on it takes a copy
    /// of its KV and logits and samples its first token (where a sliding-window ring no longer
    /// holds what a copy needs, the fork evaluates the rest of the prompt itself).
    fn release_forks(&mut self, main: usize) {
        for f in 0..self.active.len() {
            let Some(a) = self.active[f].as_mut() else {
                continue;
            };
            if !matches!(a.phase, Phase::Waiting { on } if on == main) {
                continue;
            }
            let len = a.req.prompt.len();
            let kept = self.runner.copy_prefix(f, main, len);
            a.cached = kept;
            if kept == len {
                self.runner.copy_logits(f, main);
                self.sample_next(f);
            } else {
                a.phase = Phase::Prefill { next: kept };
            }
        }
        self.publish_gauges();
    }

    /// Sample the token after the first `hist` tokens of `slot` from its logits row `row` on
    /// the host: its log-probabilities, `ignore_eos`'s mask, its grammar's, its sampler. `None`
    /// where the request ended (its grammar is complete, or failed).
    fn sample_host(&mut self, slot: usize, row: usize, hist: usize) -> Option<u32> {
        let a = self.active[slot].as_mut().expect("active slot");
        if let Some(lp) = a.logprobs.as_mut() {
            // The raw logits: before `ignore_eos`, the grammar and the sampler touch them.
            lp.observe(self.runner.logits_at(slot, row));
        }
        if a.req.ignore_eos {
            self.runner.mask_tokens(slot, row, self.tok.eog_ids());
        }
        let logits = self.runner.logits_at(slot, row);
        let history = &self.runner.tokens(slot)[..hist];
        match a.req.grammar.as_mut() {
            Some(c) if c.is_done() => {
                self.finish_with(slot, FinishReason::Stop, true);
                None
            }
            Some(c) => match c.apply(logits) {
                Ok(masked) => Some(a.sampler.sample(masked, history)),
                Err(e) => {
                    self.finish(slot, FinishReason::Error(e.to_string()));
                    None
                }
            },
            None => Some(a.sampler.sample(logits, history)),
        }
    }

    /// Release `slot` without flushing (cancelled, failed, or cut by a stop sequence).
    fn finish(&mut self, slot: usize, reason: FinishReason) {
        self.finish_with(slot, reason, false);
    }

    /// An embedding's prompt is evaluated: hand over its pooled vectors and release the slot.
    fn finish_embedding(&mut self, slot: usize) {
        let head = self.runner.model.weights.classifier.as_ref();
        if let (Some(p), Some(a)) = (self.poolers[slot].take(), self.active[slot].as_mut()) {
            match p.finish(head) {
                Ok(rows) => a.req.sink.embedding(rows),
                Err(e) => return self.finish(slot, FinishReason::Error(e.to_string())),
            }
        }
        self.finish_with(slot, FinishReason::Stop, false);
    }

    /// Sample the next token of `slot` from its fresh logits, emit it, and either finish or
    /// queue it for the next decode step.
    fn sample_next(&mut self, slot: usize) {
        let n = self.runner.tokens(slot).len();
        if let Some(t) = self.sample_emit(slot, 0, n) {
            let a = self.active[slot].as_mut().expect("active slot");
            a.phase = Phase::Decode { pending: t };
        }
    }

    /// Sample the token after the first `hist` tokens of `slot` from its logits row `row`
    /// (0, or a verification pass's), emit it, and return it if the generation goes on (else
    /// the slot is released).
    fn sample_emit(&mut self, slot: usize, row: usize, hist: usize) -> Option<u32> {
        let a = self.active[slot].as_mut().expect("active slot");
        if a.generated >= a.req.max_new {
            self.finish_with(slot, FinishReason::Length, true);
            return None;
        }
        let t = match self.runner.picked(slot).filter(|_| row == 0) {
            // (An end of generation a request ignores: the next best is on the host.)
            Some(t) if a.req.ignore_eos && self.tok.is_eog(t) => {
                match self.runner.fetch_picked(slot) {
                    Ok(()) => None,
                    Err(e) => {
                        self.finish(slot, FinishReason::Error(e.to_string()));
                        return None;
                    }
                }
            }
            t => t,
        };
        let on_device = t.is_some();
        let t = match t {
            Some(t) => t,
            None => self.sample_host(slot, row, hist)?,
        };
        let a = self.active[slot].as_mut().expect("active slot");
        if self.tok.is_eog(t) {
            self.finish_with(slot, FinishReason::Stop, true);
            return None;
        }
        a.generated += 1;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        if on_device {
            self.metrics.argmax_tokens.fetch_add(1, Relaxed);
        }
        a.req.sink.token(t);
        if let Some(lp) = a.logprobs.as_mut() {
            lp.choose(t, self.runner.logits_at(slot, row)[t as usize]);
            a.req.sink.logprobs(lp);
        }
        self.piece.clear();
        a.stream.push_into(t, &mut self.piece);
        let end = match a.emit(&self.piece) {
            Emit::Continue if a.code.timed_out() => {
                // (The text held back for a stop sequence goes out first.)
                self.finish_with(slot, FinishReason::Length, true);
                return None;
            }
            Emit::Continue => None,
            Emit::StopHit => Some(FinishReason::Stop),
            Emit::Cut => Some(FinishReason::Length),
            Emit::Gone => Some(FinishReason::Cancelled),
        };
        if let Some(reason) = end {
            self.finish(slot, reason);
            return None;
        }
        // The last token asked for ends the request as it is sampled: no forward pass evaluates
        // it (the slot's tokens end before it, so a next turn continuing the text evaluates it
        // in its prefill). Else there must be room for `t` in the cache: the position after the
        // first `hist` tokens (held already where a verification pass's later rows fill it).
        let last = (self.active[slot].as_ref()).is_some_and(|a| a.generated >= a.req.max_new);
        if last || hist == self.runner.tokens(slot).len() && self.runner.would_overflow(slot, 1) {
            self.finish_with(slot, FinishReason::Length, true);
            return None;
        }
        Some(t)
    }

    /// Release `slot`: with `flush`, output the text still pending or held back; report; keep
    /// the slot's tokens and KV for prefix reuse.
    fn finish_with(&mut self, slot: usize, reason: FinishReason, flush: bool) {
        let Some(mut a) = self.active[slot].take() else {
            return;
        };
        self.poolers[slot] = None;
        self.tick += 1;
        self.released_at[slot] = self.tick;
        self.publish_gauges();
        let mut reason = reason;
        if flush {
            // Text still undecoded or held back for a stop sequence that never came.
            let tail = a.stream.flush().unwrap_or_default();
            match a.emit(&tail) {
                Emit::StopHit => reason = FinishReason::Stop,
                Emit::Cut => reason = FinishReason::Length,
                _ if !a.held.is_empty() => {
                    let n = a.code.cut(&a.held);
                    a.req.sink.text(&a.held[..n.unwrap_or(a.held.len())]);
                    if n.is_some() {
                        reason = FinishReason::Length;
                    }
                }
                _ => {}
            }
        }
        let m = &self.metrics;
        match reason {
            FinishReason::Cancelled => m.requests_cancelled.fetch_add(1, Relaxed),
            FinishReason::Error(_) => m.requests_failed.fetch_add(1, Relaxed),
            _ => m.requests_finished.fetch_add(1, Relaxed),
        };
        let usage = Usage {
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: a.generated,
            cached_tokens: a.cached,
        };
        if matches!(a.phase, Phase::Prefill { .. }) {
            // Its forks never got their prompt: they end the same way.
            for f in 0..self.active.len() {
                if matches!(&self.active[f], Some(w) if matches!(w.phase, Phase::Waiting { on } if on == slot))
                {
                    self.finish_with(f, reason.clone(), false);
                }
            }
        }
        let stop_word = a.stop_hit.map(|i| a.req.stop[i].clone());
        a.req.sink.done(Finished {
            reason,
            usage,
            stop_word,
        });
        if a.keep_sampler {
            self.returned = Some(a.sampler);
        }
    }
}

#[cfg(test)]
mod tests;
