//! Perplexity as the reference engine's `llama-perplexity` computes it: the text is tokenized
//! whole, cut into chunks of `n_ctx` tokens (the first replaced by BOS when the model adds one),
//! and each chunk scores the log-likelihood of its second half. Each chunk is a scoring
//! request of the engine ([`Engine::score`]): evaluated in prefill chunks, the log-probability
//! of each next token computed on the executor's threads as the output head gives its rows.

use super::batch::{BatchOptions, CacheOptions};
use super::local::Engine;
use super::session::{EngineError, SessionOptions};

/// Logits rows the output head computes at once when scoring (the reference's batch of
/// output rows is its `n_ubatch`; this bounds the logits scratch).
pub const SCORE_ROWS: usize = 32;

/// A one-slot runner for perplexity, sized as a session with `opts`: no drafts, the output
/// head computing [`SCORE_ROWS`] rows at a time.
pub fn scoring_options(opts: &SessionOptions) -> (BatchOptions, CacheOptions) {
    let (batch, cache) = BatchOptions::from_session(opts, 1, 0);
    let cache = CacheOptions {
        score_rows: SCORE_ROWS,
        ..cache
    };
    (batch, cache)
}

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
/// The engine's context holds a chunk ([`scoring_options`] sizes its runner).
pub fn perplexity(
    engine: &mut Engine<'_>,
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
    // Each scored position's log-probability, summed in position order once the chunk is
    // scored: the same sums as one position at a time.
    let mut lps = vec![0.0f64; n_ctx];
    for i in 0..chunks {
        let start = i * n_ctx;
        batch.copy_from_slice(&tokens[start..start + n_ctx]);
        if let Some(b) = bos {
            batch[0] = b;
        }
        // Position `pos` predicts the next token of the original text (the chunk's own, but
        // for the first position, whose token BOS replaced: it is never scored). The scores
        // come in position order, each once.
        let mut upto = Some(first);
        engine.score(&batch, first, &mut |at, got| {
            upto = upto.filter(|&u| u == at).map(|_| at + got.len());
            if upto.is_some() {
                lps[at..at + got.len()].copy_from_slice(got);
            }
        })?;
        if upto != Some(n_ctx - 1) {
            return Err(EngineError::Failed(format!(
                "chunk {i}: positions {first}..{} were not each scored once, in order",
                n_ctx - 1
            )));
        }
        for &lp in &lps[first..n_ctx - 1] {
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
