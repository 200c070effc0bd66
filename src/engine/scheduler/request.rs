//! What goes into the scheduler and comes out of it: a request, its sink and how it ended,
//! and the counters the server's `/metrics` reads.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::code::CodeStops;
use crate::engine::logprobs::TokenLogprobs;
use crate::engine::pooling::EmbedSpec;
use crate::grammar::Constraint;
use crate::sampler::SamplerConfig;

/// One generation request.
pub struct SeqRequest {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Maximum new tokens.
    pub max_new: usize,
    pub sampler: SamplerConfig,
    /// Stop sequences: generation ends before the first occurrence of any (not included).
    pub stop: Vec<String>,
    /// Code completion's early ends (none by default).
    pub code: CodeStops,
    /// Reuse a cached prefix of the prompt (false: evaluate it all, a cold run).
    pub cache_prompt: bool,
    /// Who may share cached prefixes with this request: only requests of the same tenant
    /// (the server's hash of an API key and `cache_salt`; 0 where neither is given).
    pub tenant: u64,
    /// Never stop at an end-of-generation token (their logits are masked): generate exactly
    /// `max_new` tokens unless a stop sequence or the context ends it (benchmarks, tests).
    pub ignore_eos: bool,
    /// Structured output: tokens are sampled from the logits this grammar allows, its masks
    /// computed while the batch's forward pass runs; the request ends (`Stop`) when the
    /// grammar is complete.
    pub grammar: Option<Constraint>,
    /// Report each generated token's log-probability and its position's `k` most likely
    /// alternatives ([`SeqSink::logprobs`]; `Some(0)`: the token's own only).
    pub logprobs: Option<usize>,
    /// More choices of the same prompt (`n > 1`): each gets a slot of its own at admission and
    /// continues from this request's prefill with its own sampler, grammar and sink (the other
    /// fields are this request's).
    pub forks: Vec<Fork>,
    /// An embedding instead of a generation: the prompt is evaluated (in prefill chunks, beside
    /// the other sequences) with no logits, its hidden states pooled; the sink gets
    /// [`SeqSink::embedding`], then `done` (`Stop`). `max_new`, sampling and stops are unused.
    pub embed: Option<EmbedSpec>,
    /// Teacher forcing instead of a generation (perplexity): the prompt is evaluated (in
    /// prefill chunks, beside the other sequences) and, from this position on, each
    /// position's log-probability of the prompt's next token goes to [`SeqSink::scores`];
    /// then `done` (`Stop`). `max_new`, sampling and stops are unused. Only a runner sized
    /// for it scores ([`crate::engine::batch::CacheOptions::score_rows`]).
    pub score: Option<usize>,
    /// Receives the events of this request; returning `false` (the receiver is gone: a closed
    /// connection) cancels the request and frees its slot. Any `FnMut(SeqEvent) -> bool` is
    /// one (it receives owned text); [`SeqSink`] itself takes borrowed text.
    pub sink: Box<dyn SeqSink>,
}

/// Another choice of a [`SeqRequest`]'s prompt.
pub struct Fork {
    pub sampler: SamplerConfig,
    pub grammar: Option<Constraint>,
    pub sink: Box<dyn SeqSink>,
}

impl SeqRequest {
    /// An embedding request: `prompt`'s pooled vector goes to `sink` (no generation).
    pub fn embedding(prompt: Vec<u32>, spec: EmbedSpec, sink: Box<dyn SeqSink>) -> SeqRequest {
        SeqRequest {
            cache_prompt: true,
            embed: Some(spec),
            ..SeqRequest::no_generation(prompt, sink)
        }
    }

    /// A scoring request: the log-probability of each of `prompt`'s tokens after position
    /// `first` given the ones before it goes to `sink` ([`SeqRequest::score`]).
    pub fn scoring(prompt: Vec<u32>, first: usize, sink: Box<dyn SeqSink>) -> SeqRequest {
        SeqRequest {
            score: Some(first),
            ..SeqRequest::no_generation(prompt, sink)
        }
    }

    /// A request that generates nothing, reads nothing back and keeps no prompt cache: what
    /// [`SeqRequest::embedding`] and [`SeqRequest::scoring`] start from.
    fn no_generation(prompt: Vec<u32>, sink: Box<dyn SeqSink>) -> SeqRequest {
        SeqRequest {
            prompt,
            max_new: 0,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            code: CodeStops::default(),
            cache_prompt: false,
            tenant: 0,
            ignore_eos: false,
            grammar: None,
            logprobs: None,
            forks: Vec::new(),
            embed: None,
            score: None,
            sink,
        }
    }
}

/// Where a request's output goes. The scheduler calls it from its own thread, in order:
/// any number of [`SeqSink::text`] (and [`SeqSink::token`]), then one [`SeqSink::done`].
pub trait SeqSink: Send {
    /// New text (possibly empty: a liveness probe). `false` cancels the request.
    fn text(&mut self, text: &str) -> bool;
    /// The id of a generated token (before its text, which may come later or be held back).
    fn token(&mut self, _id: u32) {}
    /// The generated token's log-probabilities (after [`SeqSink::token`]; only for requests
    /// with [`SeqRequest::logprobs`]).
    fn logprobs(&mut self, _lp: &TokenLogprobs) {}
    /// An embedding request's vectors (one, or one per position with pooling `none`), just
    /// before `done`.
    fn embedding(&mut self, _rows: Vec<Vec<f32>>) {}
    /// A scoring request's log-probabilities of the prompt's tokens after positions `at..`
    /// (consecutive, as the steps evaluate them; every scored position once, in order).
    fn scores(&mut self, _at: usize, _lps: &[f64]) {}
    /// The request ended.
    fn done(&mut self, finished: Finished);
}

/// A closure receiving owned events (allocates each text event).
impl<F: FnMut(SeqEvent) -> bool + Send> SeqSink for F {
    fn text(&mut self, text: &str) -> bool {
        self(SeqEvent::Text(text.to_owned()))
    }
    fn done(&mut self, finished: Finished) {
        self(SeqEvent::Done(finished));
    }
}

/// What a request produces, in order: any number of `Text`, then one `Done`.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// New text (possibly empty: a liveness probe the receiver may ignore).
    Text(String),
    Done(Finished),
}

/// Why and how a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub usage: Usage,
    /// The stop sequence that ended the text (`reason` is then `Stop`), if one did.
    pub stop_word: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop sequence.
    Stop,
    /// `max_new` tokens, or the slot's context is full.
    Length,
    /// The receiver went away.
    Cancelled,
    /// The engine refused the request.
    Error(String),
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

/// Counters and gauges of the scheduler, read by the server's `/metrics`.
#[derive(Debug, Default)]
pub struct SchedMetrics {
    pub requests_admitted: AtomicU64,
    pub requests_finished: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_failed: AtomicU64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens actually evaluated.
    pub prefill_tokens: AtomicU64,
    /// Requests that reused a cached prefix.
    pub prefix_hits: AtomicU64,
    /// Prompt tokens not evaluated thanks to the prefix cache.
    pub prefill_tokens_saved: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Generated tokens the executor picked where the logits were computed (greedy rows with
    /// nothing reading their logits: [`crate::engine::BatchRunner::pick_argmax`]).
    pub argmax_tokens: AtomicU64,
    pub decode_steps: AtomicU64,
    /// Speculative decoding: verification passes, draft tokens evaluated, drafts accepted.
    pub spec_passes: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicUsize,
    /// Slots holding an active request.
    pub slots_in_use: AtomicUsize,
    pub slots_total: AtomicUsize,
    /// KV positions holding the tokens of active requests, and all the slots' positions (the
    /// cache usage routers read; a finished sequence's cached prefix counts as free).
    pub kv_tokens_in_use: AtomicUsize,
    pub kv_tokens_total: AtomicUsize,
    /// Generated tokens per second over recent decode steps (f64 bits).
    decode_tps_bits: AtomicU64,
}

impl SchedMetrics {
    /// Recent aggregate decode speed, tokens per second.
    pub fn decode_tps(&self) -> f64 {
        f64::from_bits(self.decode_tps_bits.load(Relaxed))
    }

    pub(super) fn record_step(&self, tokens: usize, secs: f64) {
        if secs <= 0.0 {
            return;
        }
        let now = tokens as f64 / secs;
        let old = self.decode_tps();
        let tps = if old == 0.0 {
            now
        } else {
            0.9 * old + 0.1 * now
        };
        self.decode_tps_bits.store(tps.to_bits(), Relaxed);
    }
}
