//! Embeddings of several prompts at once: each prompt an embedding request on a scheduler of
//! its own (continuous batching over up to four sequences), as `kiln embedding` and the Python
//! bindings compute them.

use std::sync::{Arc, Mutex};

use super::batch::{BatchOptions, BatchRunner};
use super::pooling::EmbedSpec;
use super::scheduler::{FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink};
use super::session::EngineError;
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

/// The vectors of each prompt of `prompts` (token ids): one row when pooled, one per token with
/// [`super::pooling::Pooling::None`]. `opts.n_slots` is cut to the prompts' count (at most 4).
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
        n_slots: prompts.len().clamp(1, 4),
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
