//! One sequence's state: its KV cache (any backend's) and the tokens whose keys and values the
//! cache holds. A session keeps one, the batch runner one per slot; rollback, prefix reuse and
//! logit masking are written here once for both.

use crate::backend::SeqCache;

/// A KV cache and the tokens in it, in order.
pub struct Sequence<K> {
    pub kv: K,
    pub tokens: Vec<u32>,
}

impl<K: SeqCache> Sequence<K> {
    /// An empty sequence over `kv`, room for `n_ctx` tokens reserved.
    pub fn new(kv: K, n_ctx: usize) -> Self {
        Sequence {
            kv,
            tokens: Vec::with_capacity(n_ctx),
        }
    }

    /// Length of the common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Keep the first `n` tokens (seed 004's rollback); returns how many are kept (fewer
    /// where the cache cannot go back that far, e.g. sliding-window rings).
    pub fn rollback(&mut self, n: usize) -> usize {
        let kept = self.kv.rollback(n);
        self.tokens.truncate(kept);
        kept
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.kv.reset();
        self.tokens.clear();
    }

    /// Whether `n` more tokens would overflow the cache.
    pub fn would_overflow(&self, n: usize) -> bool {
        self.kv.check_fits(n).is_err()
    }
}

/// Set the logits of `tokens` to -inf, so that no sampler picks them (`--ignore-eos`).
pub fn mask_logits(row: &mut [f32], tokens: &[u32]) {
    for &t in tokens {
        if let Some(l) = row.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}
