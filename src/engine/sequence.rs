//! One sequence's state: its KV cache (any backend's) and the tokens whose keys and values the
//! cache holds. A session keeps one, the batch runner one per slot; rollback, prefix reuse and
//! logit masking are written here once for both.

use crate::backend::cuda::CudaKv;
use crate::backend::SeqCache;
use crate::cache::{KvCache, KvOverflow, KvWindowError};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_new` tokens were generated.
    Length,
    /// The context filled up.
    ContextFull,
    /// The caller asked to stop (Ctrl-C, a closed connection).
    Cancelled,
}

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

    /// Keep the first `n` tokens (the cache's rollback); returns how many are kept (fewer
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

/// A sequence's KV cache: in RAM (or a file), or a slot of a session's cache on the GPU.
/// (Few per process: the size difference of the variants does not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Kv {
    Cpu(KvCache),
    Cuda(CudaKv),
}

impl SeqCache for Kv {
    fn len(&self) -> usize {
        match self {
            Kv::Cpu(k) => SeqCache::len(k),
            Kv::Cuda(k) => k.len(),
        }
    }
    fn check_fits(&self, n: usize) -> Result<(), KvOverflow> {
        match self {
            Kv::Cpu(k) => k.check_fits(n),
            Kv::Cuda(k) => k.check_fits(n),
        }
    }
    fn check_window(&self, n: usize) -> Result<(), KvWindowError> {
        match self {
            Kv::Cpu(k) => k.check_window(n),
            Kv::Cuda(k) => k.check_window(n),
        }
    }
    fn advance(&mut self, n: usize) -> Result<(), KvOverflow> {
        match self {
            Kv::Cpu(k) => k.advance(n),
            Kv::Cuda(k) => k.advance(n),
        }
    }
    fn rollback(&mut self, n: usize) -> usize {
        match self {
            Kv::Cpu(k) => k.rollback(n),
            Kv::Cuda(k) => k.rollback(n),
        }
    }
    fn reset(&mut self) {
        match self {
            Kv::Cpu(k) => k.reset(),
            Kv::Cuda(k) => k.reset(),
        }
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
