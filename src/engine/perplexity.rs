//! Perplexity as the reference engine's `llama-perplexity` computes it: the text is tokenized
//! whole, cut into chunks of `n_ctx` tokens (the first replaced by BOS when the model adds one),
//! and each chunk scores the log-likelihood of its second half.

use super::session::{EngineError, Session};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sampler::log_softmax;

/// Result of a perplexity run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PerplexityReport {
    pub n_ctx: usize,
    pub chunks: usize,
    pub tokens_scored: usize,
    /// Perplexity over all chunks so far, after each chunk.
    pub running_ppl: Vec<f64>,
    pub final_ppl: f64,
    /// Standard error of the mean negative log-likelihood, propagated to PPL (as llama.cpp).
    pub stderr: f64,
}

/// Score `tokens` (already tokenized with the model's BOS policy) in chunks of `n_ctx`.
/// `bos` replaces each chunk's first token when given. `on_chunk(i, running_ppl)` reports.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<PerplexityReport, EngineError> {
    let available = tokens.len() / n_ctx.max(1);
    let chunks = max_chunks.map_or(available, |m| m.min(available));
    if chunks == 0 || n_ctx < 2 {
        return Err(EngineError::PromptTooLong {
            prompt: tokens.len(),
            ctx: 2 * n_ctx,
            used: 0,
        });
    }
    let first = n_ctx / 2;
    let mut nll = 0.0f64;
    let mut nll2 = 0.0f64;
    let mut count = 0usize;
    let mut running = Vec::with_capacity(chunks);
    let mut batch = vec![0u32; n_ctx];
    // Each scored position's log-probability (f64 bits), computed on the session's threads,
    // then summed in position order: the same sums as one position at a time.
    let lps: Vec<AtomicU64> = (0..n_ctx).map(|_| AtomicU64::new(0)).collect();
    for i in 0..chunks {
        let start = i * n_ctx;
        batch.copy_from_slice(&tokens[start..start + n_ctx]);
        if let Some(b) = bos {
            batch[0] = b;
        }
        session.reset();
        let score = |pos: usize, logits: &[f32]| {
            // Position `pos` predicts the next token of the original text.
            if pos + 1 < n_ctx {
                let lp = log_softmax(logits, tokens[start + pos + 1]);
                lps[pos].store(lp.to_bits(), Ordering::Relaxed);
            }
        };
        session.eval_all_each(&batch, first, &score)?;
        for lp in &lps[first..n_ctx - 1] {
            let lp = f64::from_bits(lp.load(Ordering::Relaxed));
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(i, ppl);
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let stderr = (var / (count as f64 - 1.0).max(1.0)).sqrt() * mean.exp();
    Ok(PerplexityReport {
        n_ctx,
        chunks,
        tokens_scored: count,
        final_ppl: *running.last().unwrap_or(&f64::NAN),
        running_ppl: running,
        stderr,
    })
}
