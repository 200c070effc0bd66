//! The generation loop: prefill the prompt, then sample → decode until an end-of-generation
//! token, the token limit, a full context or a cancel request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::session::{EngineError, Session};
use super::speculative::{Speculation, Step};
use crate::grammar::{overlap, Constraint};
use crate::sampler::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why generation stopped (a sequence's end, shared by every way of generating).
pub use super::sequence::StopReason;

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
    pub spec: super::speculative::SpecStats,
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
    /// Reuse a cached prefix of the prompt (chat turns).
    pub reuse_prefix: bool,
    pub cancel: Option<&'a AtomicBool>,
    /// Never end at an end-of-generation token: their logits are masked (llama.cpp's
    /// `--ignore-eos`), so generation runs to `max_new` or a full context.
    pub ignore_eos: bool,
}

/// Generate from `req.prompt`, handing each new token and its text (complete UTF-8 only) to
/// `on_token`; returning `false` from it stops generation as cancelled.
pub fn generate(
    session: &mut Session,
    sampler: &mut Sampler,
    tok: &Tokenizer,
    req: &GenerateRequest<'_>,
    progress: &mut dyn FnMut(usize, usize),
    on_token: &mut dyn FnMut(u32, &str) -> bool,
) -> Result<GenStats, EngineError> {
    generate_constrained(session, sampler, tok, req, None, progress, on_token)
}

/// [`generate`] with the output held to a grammar: each token is sampled from the logits
/// masked by `constraint`, whose next mask is computed on a helper thread while the token's
/// forward pass runs; generation stops (as [`StopReason::EndOfGeneration`]) when the grammar
/// is complete.
pub fn generate_constrained(
    session: &mut Session,
    sampler: &mut Sampler,
    tok: &Tokenizer,
    req: &GenerateRequest<'_>,
    constraint: Option<&mut Constraint>,
    progress: &mut dyn FnMut(usize, usize),
    on_token: &mut dyn FnMut(u32, &str) -> bool,
) -> Result<GenStats, EngineError> {
    generate_with(
        session, sampler, tok, req, constraint, None, progress, on_token,
    )
}

/// Hands emitted tokens on: the end of generation, the count, the text, the consumer's stop.
struct Emitter<'a, 't> {
    tok: &'t Tokenizer,
    stream: StreamDecoder<'t>,
    gen_tokens: usize,
    on_token: &'a mut dyn FnMut(u32, &str) -> bool,
}

impl Emitter<'_, '_> {
    fn emit(&mut self, t: u32) -> Result<(), StopReason> {
        if self.tok.is_eog(t) {
            return Err(StopReason::EndOfGeneration);
        }
        self.gen_tokens += 1;
        let text = self.stream.push(t).unwrap_or_default();
        if !(self.on_token)(t, &text) {
            return Err(StopReason::Cancelled);
        }
        Ok(())
    }
}

/// [`generate`] with either or neither of a grammar (see [`generate_constrained`]) and
/// speculative decoding (each token evaluated together with the drafter's guesses of the tokens
/// after it: [`super::speculative`]). Speculation is not applied to a constrained generation.
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    session: &mut Session,
    sampler: &mut Sampler,
    tok: &Tokenizer,
    req: &GenerateRequest<'_>,
    mut constraint: Option<&mut Constraint>,
    mut spec: Option<&mut Speculation>,
    progress: &mut dyn FnMut(usize, usize),
    on_token: &mut dyn FnMut(u32, &str) -> bool,
) -> Result<GenStats, EngineError> {
    let mut stats = GenStats {
        prompt_tokens: req.prompt.len(),
        ..GenStats::default()
    };
    let t0 = Instant::now();
    // The first mask is computed while the prompt is evaluated.
    let mut first: Vec<(&mut Constraint, Option<u32>)> = Vec::new();
    first.extend(constraint.as_deref_mut().map(|c| (c, None)));
    if req.reuse_prefix {
        stats.reused_tokens = overlap(&mut first, || session.prefill_reuse(req.prompt, progress))?;
    } else {
        session.reset();
        overlap(&mut first, || session.prefill(req.prompt, progress))?;
    }
    drop(first);
    stats.prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

    let cancelled = || req.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
    let mut out = Emitter {
        tok,
        stream: StreamDecoder::new(tok),
        gen_tokens: 0,
        on_token,
    };
    if constraint.is_some() {
        spec = None;
    }
    if let Some(sp) = spec.as_deref_mut() {
        sp.start(session);
    }
    let t1 = Instant::now();
    let limit = req.max_new.unwrap_or(usize::MAX);
    let on_device = session.argmax_on_device()
        && sampler.is_argmax()
        && constraint.is_none()
        && !req.ignore_eos;
    let mask = req.ignore_eos.then(|| tok.eog_ids());
    // A token already chosen, not yet evaluated: by the GPU's argmax, or by a verification.
    let mut chosen: Option<u32> = None;
    let stop = loop {
        if out.gen_tokens >= limit {
            break StopReason::Length;
        }
        if cancelled() {
            break StopReason::Cancelled;
        }
        if chosen.is_none() {
            if let Some(m) = mask {
                session.mask_tokens(m);
            }
        }
        let next = match (chosen.take(), constraint.as_deref_mut()) {
            (Some(t), _) => t,
            (None, Some(c)) if c.is_done() => break StopReason::EndOfGeneration,
            (None, Some(c)) => sampler.sample(c.apply(session.logits())?, session.tokens()),
            (None, None) => sampler.sample(session.logits(), session.tokens()),
        };
        if let Err(stop) = out.emit(next) {
            break stop;
        }
        if session.would_overflow(1) {
            break StopReason::ContextFull;
        }
        if let Some(sp) = spec.as_deref_mut() {
            let room = limit - out.gen_tokens;
            match sp.step(session, sampler, next, room, mask, &mut |t| out.emit(t))? {
                Step::Plain => {}
                Step::Next(t) => {
                    chosen = t;
                    if t.is_none() {
                        // Only the token limit leaves nothing chosen.
                        debug_assert!(out.gen_tokens >= limit);
                    }
                    continue;
                }
                Step::Stop(stop) => break stop,
            }
        }
        if on_device {
            // Greedy on the GPU: the next token is picked there; no logits cross the bus.
            chosen = Some(session.decode_greedy(next)?);
            continue;
        }
        let mut step: Vec<(&mut Constraint, Option<u32>)> = Vec::new();
        step.extend(constraint.as_deref_mut().map(|c| (c, Some(next))));
        overlap(&mut step, || session.decode(next))?;
    };
    if let Some(tail) = out.stream.flush() {
        (out.on_token)(u32::MAX, &tail);
    }
    stats.gen_tokens = out.gen_tokens;
    stats.gen_ms = t1.elapsed().as_secs_f64() * 1e3;
    stats.stop = Some(stop);
    if let Some(sp) = spec {
        stats.spec = sp.stats;
    }
    Ok(stats)
}
