//! Geometry of a KV cache: which layers keep every position of the context, and which —
//! sliding-window layers — keep only a ring of their last positions.
//!
//! A sliding-window layer's query at position `p` sees keys `p + 1 − window ..= p`. A pass of
//! `n` tokens at `pos0..pos0+n` writes its keys first, then attends, so its first query needs
//! positions back to `pos0 + 1 − window` while its writes reach `pos0 + n − 1`: a ring of
//! `window + n − 1` rows holds both. The ring is rounded up to a multiple of the attention
//! kernel's key tile ([`RING_ALIGN`]), so a tile of positions (tiles start at multiples of 64)
//! never wraps and the kernel visits exactly the keys, in exactly the order, of a full cache:
//! the logits are bit-identical. Position `p` lives at row `p mod rows`.

use std::sync::Arc;

use super::kv_type::KvType;

/// Ring rows are a multiple of this: the attention kernel's key tile.
pub const RING_ALIGN: usize = crate::kernels::f16ops::KV_TILE;

/// The sliding-window layers of a cache and their ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvWindow {
    /// Positions a query sees, itself included (the model's `attention.sliding_window`).
    pub window: usize,
    /// Rows of each ring (a multiple of [`RING_ALIGN`]); position `p` lives at row
    /// `p mod rows`.
    pub rows: usize,
    /// The most tokens of one pass the ring was sized for.
    pub max_tokens: usize,
    /// Per layer: does it keep a ring?
    pub layers: Arc<[bool]>,
}

impl KvWindow {
    /// Rows a ring needs for passes of at most `max_tokens` tokens:
    /// `window + max_tokens − 1`, rounded up to [`RING_ALIGN`].
    pub fn rows_for(window: usize, max_tokens: usize) -> usize {
        (window.max(1) + max_tokens.max(1) - 1).next_multiple_of(RING_ALIGN)
    }

    /// The most tokens one pass may add without overwriting a position its first query sees:
    /// `rows − window + 1`.
    pub fn max_pass(&self) -> usize {
        self.rows + 1 - self.window
    }
}

/// Geometry of a KV cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    /// Key head dimension.
    pub head_dim_k: usize,
    /// Value head dimension (equal to the key's for every architecture we run so far).
    pub head_dim_v: usize,
    /// Maximum number of positions (the context size).
    pub max_len: usize,
    /// Sliding-window layers that keep a ring instead of `max_len` positions (`None`: every
    /// layer keeps every position).
    pub window: Option<KvWindow>,
}

impl KvLayout {
    /// Every layer keeps all `max_len` positions.
    pub fn full(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        max_len: usize,
    ) -> KvLayout {
        KvLayout {
            n_layers,
            n_kv_heads,
            head_dim_k,
            head_dim_v,
            max_len,
            window: None,
        }
    }

    /// The layers flagged in `layers` attend to a sliding `window` and keep a ring sized for
    /// passes of at most `max_tokens` tokens — unless the ring would not be smaller than the
    /// context, where they keep every position like the others.
    pub fn with_window(mut self, window: usize, layers: &[bool], max_tokens: usize) -> KvLayout {
        let rows = KvWindow::rows_for(window, max_tokens);
        let any = layers.iter().take(self.n_layers).any(|&b| b);
        self.window = (window > 0 && any && rows < self.max_len).then(|| KvWindow {
            window,
            rows,
            max_tokens: max_tokens.max(1),
            layers: (0..self.n_layers)
                .map(|l| layers.get(l).copied().unwrap_or(false))
                .collect(),
        });
        self
    }

    /// Ring rows of `layer`, if it keeps a ring.
    pub fn ring_rows(&self, layer: usize) -> Option<usize> {
        self.window
            .as_ref()
            .filter(|w| w.layers[layer])
            .map(|w| w.rows)
    }

    /// Rows per head of `layer`'s buffers: its ring's, or `max_len`.
    pub fn rows(&self, layer: usize) -> usize {
        self.ring_rows(layer).unwrap_or(self.max_len)
    }

    /// The row of `layer` that holds position `pos`.
    #[inline]
    pub fn row_of(&self, layer: usize, pos: usize) -> usize {
        match self.ring_rows(layer) {
            Some(r) => pos % r,
            None => pos,
        }
    }

    /// Layers keeping a ring.
    pub fn n_ring_layers(&self) -> usize {
        self.window
            .as_ref()
            .map_or(0, |w| w.layers.iter().filter(|&&b| b).count())
    }

    /// Layers keeping every position.
    pub fn n_full_layers(&self) -> usize {
        self.n_layers - self.n_ring_layers()
    }

    /// Elements of `layer`'s keys.
    pub fn k_elems(&self, layer: usize) -> usize {
        self.n_kv_heads * self.rows(layer) * self.head_dim_k
    }

    /// Elements of `layer`'s values.
    pub fn v_elems(&self, layer: usize) -> usize {
        self.n_kv_heads * self.rows(layer) * self.head_dim_v
    }

    /// Bytes of the whole f16 cache.
    pub fn bytes(&self) -> usize {
        self.bytes_as(KvType::F16)
    }

    /// Bytes of one full layer's keys (or values) in `ty`: `n_kv_heads · max_len` rows.
    pub fn layer_bytes(&self, ty: KvType, head_dim: usize) -> usize {
        self.n_kv_heads * self.max_len * ty.row_bytes(head_dim)
    }

    /// Bytes of `layer`'s keys (or values) in `ty`.
    pub fn layer_bytes_at(&self, layer: usize, ty: KvType, head_dim: usize) -> usize {
        self.n_kv_heads * self.rows(layer) * ty.row_bytes(head_dim)
    }

    /// Bytes of one full layer's keys and values together in `ty` (one offload ring buffer).
    pub fn layer_kv_bytes(&self, ty: KvType) -> usize {
        self.layer_bytes(ty, self.head_dim_k) + self.layer_bytes(ty, self.head_dim_v)
    }

    /// Bytes of every sliding-window ring in `ty` (always in RAM, also when offloading).
    pub fn ring_kv_bytes(&self, ty: KvType) -> usize {
        (0..self.n_layers)
            .filter(|&l| self.ring_rows(l).is_some())
            .map(|l| {
                self.layer_bytes_at(l, ty, self.head_dim_k)
                    + self.layer_bytes_at(l, ty, self.head_dim_v)
            })
            .sum()
    }

    /// How a cache of `ty` fits a RAM budget: `None` if the whole cache fits (kept in RAM),
    /// else the number of full-layer buffers of the offload ring (at least 2; the
    /// sliding-window rings stay in RAM beside it).
    pub fn offload_ring(
        &self,
        ty: KvType,
        budget: Option<usize>,
    ) -> Result<Option<usize>, KvBudgetError> {
        let Some(budget) = budget else {
            return Ok(None);
        };
        if self.bytes_as(ty) <= budget {
            return Ok(None);
        }
        let (slot, rings, n_full) = (
            self.layer_kv_bytes(ty),
            self.ring_kv_bytes(ty),
            self.n_full_layers(),
        );
        let ring = budget.saturating_sub(rings) / slot.max(1);
        if ring < 2 || n_full < 3 {
            return Err(KvBudgetError {
                budget,
                min: if n_full < 3 {
                    self.bytes_as(ty)
                } else {
                    rings + 2 * slot
                },
            });
        }
        Ok(Some(ring.min(n_full - 1)))
    }

    /// Bytes of the whole cache in `ty`: per layer,
    /// `n_kv_heads · rows · (row_bytes(head_dim_k) + row_bytes(head_dim_v))`.
    pub fn bytes_as(&self, ty: KvType) -> usize {
        (0..self.n_layers)
            .map(|l| {
                self.layer_bytes_at(l, ty, self.head_dim_k)
                    + self.layer_bytes_at(l, ty, self.head_dim_v)
            })
            .sum()
    }
}

/// A KV budget too small to run with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a KV budget of {budget} bytes is too small: the offload ring needs two layer buffers (beside any sliding-window rings), {min} bytes")]
pub struct KvBudgetError {
    pub budget: usize,
    pub min: usize,
}
