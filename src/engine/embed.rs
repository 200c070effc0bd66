//! Embeddings of several prompts at once: each prompt an embedding request on a scheduler of
//! its own (continuous batching), as `kiln embedding` and the Python bindings compute them. On
//! the CPU the scheduler gets as many sequences as whole prompts fit in one pass, so that a
//! pass carries up to a prefill chunk's rows through every matrix product (each weight read
//! once for all of them) and attention still runs per sequence.

use std::sync::{Arc, Mutex};

use super::batch::{BatchOptions, BatchRunner};
use super::pooling::EmbedSpec;
use super::scheduler::{FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink};
use super::session::EngineError;
use crate::backend::Device;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Why a prompt got no embedding.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("prompt {index} has {tokens} tokens, more than the context of {ctx}")]
    TooLong {
        index: usize,
        tokens: usize,
        ctx: usize,
    },
    #[error("prompt {index}: {msg}")]
    Failed { index: usize, msg: String },
}

/// One prompt's vectors and how its request ended.
#[derive(Default)]
struct Collected {
    rows: Vec<Vec<f32>>,
    finished: Option<Finished>,
}

/// Collects one prompt's vectors.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Collected>>);

impl SeqSink for Collect {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn embedding(&mut self, rows: Vec<Vec<f32>>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).rows = rows;
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).finished = Some(f);
    }
}

/// The most sequences one pass of [`embed_prompts`] carries (very short prompts).
const MAX_SLOTS: usize = 64;

/// The vectors of each prompt of `prompts` (token ids): one row when pooled, one per token with
/// [`super::pooling::Pooling::None`]. The scheduler's sequences ([`slots_for`]): at least
/// `opts.n_slots` (at most 4), more on the CPU where more whole prompts fit in a pass; never more
/// than the prompts.
pub fn embed_prompts(
    model: &Arc<Model>,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    spec: EmbedSpec,
    opts: BatchOptions,
) -> Result<Vec<Vec<Vec<f32>>>, EmbedError> {
    for (index, t) in prompts.iter().enumerate() {
        if t.len() > opts.n_ctx {
            return Err(EmbedError::TooLong {
                index,
                tokens: t.len(),
                ctx: opts.n_ctx,
            });
        }
    }
    let opts = BatchOptions {
        n_slots: slots_for(model.config.causal, prompts, &opts),
        ..opts
    };
    let runner = BatchRunner::new(Arc::clone(model), opts)?;
    let mut sched = Scheduler::new(runner, tok, Arc::new(SchedMetrics::default()));
    let outs: Vec<Collect> = prompts
        .iter()
        .map(|prompt| {
            let out = Collect::default();
            let sink = Box::new(out.clone());
            sched.submit(SeqRequest::embedding(prompt.clone(), spec, sink));
            out
        })
        .collect();
    while !sched.is_idle() {
        sched.step();
    }
    let mut vectors = Vec::with_capacity(outs.len());
    for (index, o) in outs.iter().enumerate() {
        let mut g = o.0.lock().unwrap_or_else(|e| e.into_inner());
        match g.finished.as_ref().map(|f| &f.reason) {
            Some(FinishReason::Stop) => vectors.push(std::mem::take(&mut g.rows)),
            Some(FinishReason::Error(e)) => {
                let msg = e.clone();
                return Err(EmbedError::Failed { index, msg });
            }
            other => {
                let msg = format!("ended without an embedding ({other:?})");
                return Err(EmbedError::Failed { index, msg });
            }
        }
    }
    Ok(vectors)
}

/// How many sequences [`embed_prompts`] runs at once: as many of the longest prompt as fit in
/// the rows of one pass (an encoder's pass holds its whole context, a decoder's a prefill
/// chunk), at least `opts.n_slots` cut to 4, at most [`MAX_SLOTS`] and the prompts' count. Only
/// on the CPU, where a sequence's cache is allocated lazily and costs only the positions it
/// fills; elsewhere `opts.n_slots` cut to 4.
fn slots_for(causal: bool, prompts: &[Vec<u32>], opts: &BatchOptions) -> usize {
    let base = opts.n_slots.clamp(1, 4);
    let fit = if opts.device == Device::Cpu {
        let n_ctx = opts.n_ctx.max(1);
        let rows = if causal {
            opts.prefill_chunk.clamp(1, n_ctx)
        } else {
            n_ctx
        };
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1).max(1);
        rows / longest
    } else {
        0
    };
    fit.clamp(base, MAX_SLOTS.max(base))
        .min(prompts.len().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvType;

    fn opts(n_ctx: usize, prefill_chunk: usize, device: Device) -> BatchOptions {
        BatchOptions {
            n_slots: 4,
            n_ctx,
            n_threads: 1,
            prefill_chunk,
            kv_type: KvType::F16,
            device,
            draft_max: 0,
        }
    }

    #[test]
    fn a_pass_holds_as_many_whole_prompts_as_fit() {
        let texts = |n: usize, len: usize| vec![vec![1u32; len]; n];
        let cpu = opts(512, 64, Device::Cpu);
        // An encoder's pass holds its context: 512 / 30 = 17 sequences of 256 texts.
        assert_eq!(slots_for(false, &texts(256, 30), &cpu), 17);
        // A decoder's holds a prefill chunk: 64 / 30 = 2, but never fewer than 4.
        assert_eq!(slots_for(true, &texts(256, 30), &cpu), 4);
        assert_eq!(slots_for(true, &texts(256, 8), &cpu), 8);
        // Never more sequences than prompts, nor than MAX_SLOTS.
        assert_eq!(slots_for(false, &texts(3, 30), &cpu), 3);
        assert_eq!(slots_for(false, &texts(1000, 2), &cpu), MAX_SLOTS);
        // A prompt longer than a pass: the sequences asked for.
        assert_eq!(slots_for(false, &texts(9, 600), &cpu), 4);
        assert_eq!(slots_for(false, &[], &cpu), 1);
        // Off the CPU a cache is allocated whole: at most 4, as asked.
        let gpu = opts(512, 64, Device::Cuda);
        assert_eq!(slots_for(false, &texts(256, 30), &gpu), 4);
        let two = BatchOptions { n_slots: 2, ..gpu };
        assert_eq!(slots_for(false, &texts(256, 30), &two), 2);
    }
}
