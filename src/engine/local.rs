//! The engine driven from the caller's thread: `kiln run`, `chat` and `bench` and the Python
//! bindings submit their generations to the scheduler the server runs ([`Scheduler`]), over a
//! batch runner of one slot, and step it until the generation is done. Rollback, prefix reuse
//! (a chat's turns, a benchmark's depth), sliding-window rings and speculative decoding are
//! thus the scheduler's, the same code as a server's requests take.
//!
//! A generation hands each token and its text to a callback as the step that sampled it ends;
//! returning `false` from it (or the request's cancel flag) stops the generation as cancelled.
//! A score ([`Engine::score`], perplexity) hands each step's log-probabilities the same way.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::batch::BatchRunner;
use super::scheduler::{
    CodeStops, FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink, ServeDrafter,
};
use super::sequence::StopReason;
use super::session::EngineError;
use super::speculative::SpecStats;
use crate::grammar::Constraint;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// Timings and counts of one generation, as the reference engine reports them.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GenStats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from the cache instead of recomputed.
    pub reused_tokens: usize,
    pub prompt_ms: f64,
    pub gen_tokens: usize,
    pub gen_ms: f64,
    pub stop: Option<StopReason>,
    /// Speculative decoding's counts (zero without it).
    pub spec: SpecStats,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens - self.reused_tokens, self.prompt_ms)
    }
    pub fn gen_tps(&self) -> f64 {
        rate(self.gen_tokens, self.gen_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// What to generate.
pub struct GenerateRequest<'a> {
    pub prompt: &'a [u32],
    /// Maximum new tokens (`None`: until the context is full).
    pub max_new: Option<usize>,
    /// Reuse a cached prefix of the prompt (chat turns); else the whole prompt is evaluated.
    pub reuse_prefix: bool,
    pub cancel: Option<&'a AtomicBool>,
    /// Never end at an end-of-generation token: their logits are masked (llama.cpp's
    /// `--ignore-eos`), so generation runs to `max_new` or a full context.
    pub ignore_eos: bool,
    /// Stop sequences: generation ends before the first occurrence of any (not included in
    /// the text handed out).
    pub stop: &'a [String],
}

impl<'a> GenerateRequest<'a> {
    /// `max_new` tokens after `prompt`, evaluated whole, no cancel flag, no stop sequence.
    pub fn new(prompt: &'a [u32], max_new: Option<usize>) -> GenerateRequest<'a> {
        GenerateRequest {
            prompt,
            max_new,
            reuse_prefix: false,
            cancel: None,
            ignore_eos: false,
            stop: &[],
        }
    }
}

/// What the request's sink has received and the engine not yet handed on: per token its id
/// (`u32::MAX` for text with no token of its own: the decoder's tail) and its text's range
/// in `text`; a score's log-probabilities from position `scores_at` on; then how the request
/// ended. Buffers are reused from step to step.
#[derive(Default)]
struct Outbox {
    events: Vec<(u32, Range<usize>)>,
    text: String,
    scores: Vec<f64>,
    scores_at: usize,
    finished: Option<Finished>,
}

impl Outbox {
    /// Room for a step's events: its sampled tokens (a verification pass's `rows`), a
    /// decoder's tail, text held back for a stop sequence; `scored` log-probabilities.
    fn with_room(rows: usize, scored: usize) -> Outbox {
        Outbox {
            events: Vec::with_capacity(rows + 2),
            text: String::with_capacity(64 * (rows + 2)),
            scores: Vec::with_capacity(scored),
            scores_at: 0,
            finished: None,
        }
    }

    fn clear(&mut self) {
        self.events.clear();
        self.text.clear();
        self.scores.clear();
        self.finished = None;
    }
}

/// The sink of an engine's request: fills the outbox, and answers `false` (cancel) once the
/// engine's stop flag is set.
struct Sink {
    out: Arc<Mutex<Outbox>>,
    stop: Arc<AtomicBool>,
}

impl Sink {
    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SeqSink for Sink {
    fn text(&mut self, text: &str) -> bool {
        if !text.is_empty() {
            let mut o = self.outbox();
            let start = o.text.len();
            o.text.push_str(text);
            let end = o.text.len();
            match o.events.last_mut() {
                // The text of the token just sampled (or more of it, held back until now).
                Some((_, r)) if r.end == start => r.end = end,
                _ => o.events.push((u32::MAX, start..end)),
            }
        }
        !self.stop.load(Relaxed)
    }

    fn token(&mut self, id: u32) {
        let mut o = self.outbox();
        let at = o.text.len();
        o.events.push((id, at..at));
    }

    fn scores(&mut self, at: usize, lps: &[f64]) {
        let mut o = self.outbox();
        if o.scores.is_empty() {
            o.scores_at = at;
        }
        o.scores.extend_from_slice(lps);
    }

    fn done(&mut self, finished: Finished) {
        self.outbox().finished = Some(finished);
    }
}

/// A scheduler over a runner, stepped from the caller's thread one generation at a time.
pub struct Engine<'t> {
    sched: Scheduler<'t>,
    metrics: Arc<SchedMetrics>,
    out: Arc<Mutex<Outbox>>,
    stop: Arc<AtomicBool>,
    /// Events taken from the outbox, handed on outside its lock (reused).
    taken: Outbox,
}

impl<'t> Engine<'t> {
    /// An engine generating with `runner` (its slots are the scheduler's: one is enough) and
    /// `tok`'s text. An encoder (an embedding model) is refused: it gives no text.
    pub fn new(runner: BatchRunner, tok: &'t Tokenizer) -> Result<Engine<'t>, EngineError> {
        let c = &runner.model.config;
        if c.arch.is_encoder() {
            return Err(EngineError::encoder_generation(&c.arch_name));
        }
        let metrics = Arc::new(SchedMetrics::default());
        let rows = 1 + runner.opts.draft_max;
        let scored = if runner.can_score() {
            runner.opts.prefill_chunk
        } else {
            0
        };
        Ok(Engine {
            sched: Scheduler::new(runner, tok, Arc::clone(&metrics)),
            metrics,
            out: Arc::new(Mutex::new(Outbox::with_room(rows, scored))),
            stop: Arc::new(AtomicBool::new(false)),
            taken: Outbox::with_room(rows, scored),
        })
    }

    /// Decode speculatively with `drafter`'s guesses ([`Scheduler::speculate`]): up to the
    /// runner's `draft_max` drafts a pass, fewer than `draft_min` not verified.
    pub fn speculate(&mut self, drafter: impl Into<ServeDrafter>, draft_min: usize) {
        self.sched.speculate(drafter, draft_min);
    }

    /// The runner the generations run on.
    pub fn runner(&self) -> &BatchRunner {
        self.sched.runner()
    }

    /// The runner back, its slots holding what the last generation left.
    pub fn into_runner(self) -> BatchRunner {
        self.sched.into_runner()
    }

    /// The scheduler's counters, over every generation so far.
    pub fn metrics(&self) -> &SchedMetrics {
        &self.metrics
    }

    /// Context positions of a generation.
    pub fn n_ctx(&self) -> usize {
        self.runner().n_ctx()
    }

    /// Refuse a prompt of `n` tokens that leaves no room for a generated token.
    pub fn check_fits(&self, n: usize) -> Result<(), EngineError> {
        if n >= self.n_ctx() {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                ctx: self.n_ctx(),
                used: 0,
            });
        }
        Ok(())
    }

    /// Generate from `req.prompt` with `sampler` (its random stream goes on from where an
    /// earlier generation left it), the output held to `grammar` where given (the scheduler's
    /// structured output; no speculation then), handing each new token and its text to
    /// `on_token` (complete UTF-8 only; the decoder's tail at the end comes with the id
    /// `u32::MAX`); returning `false` from it stops generation as cancelled. `progress(done,
    /// total)` follows the prompt's evaluation, a step at a time.
    pub fn generate(
        &mut self,
        req: &GenerateRequest<'_>,
        sampler: &mut Sampler,
        grammar: Option<Constraint>,
        progress: &mut dyn FnMut(usize, usize),
        on_token: &mut dyn FnMut(u32, &str) -> bool,
    ) -> Result<GenStats, EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_fits(req.prompt.len())?;
        let max_new = req.max_new.unwrap_or(usize::MAX);
        let sink = self.fresh_sink();
        let seq = SeqRequest {
            prompt: req.prompt.to_vec(),
            max_new,
            sampler: sampler.config().clone(),
            stop: req.stop.to_vec(),
            code: CodeStops::default(),
            cache_prompt: req.reuse_prefix,
            tenant: 0,
            ignore_eos: req.ignore_eos,
            grammar,
            logprobs: None,
            forks: Vec::new(),
            embed: None,
            score: None,
            sink: Box::new(sink),
        };
        let spec0 = self.spec_stats();
        // The sampler goes to the request and comes back when it is done.
        let own = std::mem::replace(sampler, Sampler::new(sampler.config().clone(), 0));
        self.sched.submit_continuing(seq, own);
        let t0 = Instant::now();
        let mut t1: Option<Instant> = None;
        let mut stats = GenStats {
            prompt_tokens: req.prompt.len(),
            ..GenStats::default()
        };
        let mut prompt_done = 0;
        let mut finished = None;
        while finished.is_none() {
            if self.sched.is_idle() {
                break;
            }
            if req.cancel.is_some_and(|c| c.load(Relaxed)) {
                self.stop.store(true, Relaxed);
            }
            self.sched.step();
            self.take_outbox();
            if t1.is_none() {
                if self.taken.events.is_empty() && self.taken.finished.is_none() {
                    // Still evaluating the prompt.
                    let held = self.runner().tokens(0).len();
                    if held > prompt_done {
                        prompt_done = held;
                        progress(held, req.prompt.len());
                    }
                } else {
                    stats.prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
                    t1 = Some(Instant::now());
                }
            }
            for (id, r) in self.taken.events.drain(..) {
                if self.stop.load(Relaxed) && id != u32::MAX {
                    // (Sampled after the consumer stopped: not handed on.)
                    continue;
                }
                if id != u32::MAX {
                    stats.gen_tokens += 1;
                }
                if !on_token(id, &self.taken.text[r]) {
                    self.stop.store(true, Relaxed);
                }
            }
            self.taken.text.clear();
            finished = self.taken.finished.take();
        }
        if let Some(s) = self.sched.take_sampler() {
            *sampler = s;
        }
        let Some(f) = finished else {
            // (Every request is answered; an idle scheduler without an answer is a bug.)
            return Err(EngineError::Failed("the request ended unanswered".into()));
        };
        let stop = match f.reason {
            FinishReason::Stop => StopReason::EndOfGeneration,
            FinishReason::Length if f.usage.completion_tokens >= max_new => StopReason::Length,
            FinishReason::Length => StopReason::ContextFull,
            FinishReason::Cancelled => StopReason::Cancelled,
            FinishReason::Error(e) => return Err(EngineError::Failed(e)),
        };
        // A stop the consumer asked for ends the generation as cancelled, as a cancel flag.
        let stop = if self.stop.load(Relaxed) {
            StopReason::Cancelled
        } else {
            stop
        };
        stats.reused_tokens = f.usage.cached_tokens;
        stats.gen_ms = t1.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        stats.stop = Some(stop);
        let spec1 = self.spec_stats();
        stats.spec = SpecStats {
            passes: spec1.passes - spec0.passes,
            drafted: spec1.drafted - spec0.drafted,
            accepted: spec1.accepted - spec0.accepted,
        };
        Ok(stats)
    }

    /// Score `tokens` (a fresh sequence; the runner must score: `CacheOptions::score_rows`):
    /// hand `on_scores(at, lps)` the log-probabilities of the given token after each position
    /// from `first` on, `lps[i]` that after position `at + i`, in position order as the
    /// prefill steps compute them.
    pub fn score(
        &mut self,
        tokens: &[u32],
        first: usize,
        on_scores: &mut dyn FnMut(usize, &[f64]),
    ) -> Result<(), EngineError> {
        let sink = self.fresh_sink();
        self.sched
            .submit(SeqRequest::scoring(tokens.to_vec(), first, Box::new(sink)));
        // (A request refused at once is answered before any step.)
        let finished = loop {
            self.take_outbox();
            if !self.taken.scores.is_empty() {
                on_scores(self.taken.scores_at, &self.taken.scores);
            }
            let finished = self.taken.finished.take();
            self.taken.clear();
            if finished.is_some() || self.sched.is_idle() {
                break finished;
            }
            self.sched.step();
        };
        match finished.map(|f| f.reason) {
            Some(FinishReason::Stop) => Ok(()),
            Some(FinishReason::Error(e)) => Err(EngineError::Failed(e)),
            Some(r) => Err(EngineError::Failed(format!(
                "the score ended early ({r:?})"
            ))),
            None => Err(EngineError::Failed("the request ended unanswered".into())),
        }
    }

    /// The sink of a new request: the stop flag lowered and the outbox emptied.
    fn fresh_sink(&mut self) -> Sink {
        self.stop.store(false, Relaxed);
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Sink {
            out: Arc::clone(&self.out),
            stop: Arc::clone(&self.stop),
        }
    }

    /// Take what the request's sink has received since the last call into `taken` (the
    /// emptied buffers of the last take go back to the sink).
    fn take_outbox(&mut self) {
        let mut o = self.out.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *o, &mut self.taken);
    }

    /// The scheduler's speculation counts so far.
    fn spec_stats(&self) -> SpecStats {
        let m = &self.metrics;
        SpecStats {
            passes: m.spec_passes.load(Relaxed) as usize,
            drafted: m.spec_drafted.load(Relaxed) as usize,
            accepted: m.spec_accepted.load(Relaxed) as usize,
        }
    }
}
