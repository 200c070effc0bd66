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

use crate::kernels::kv_type::KvType;

/// Ring rows are a multiple of this: the attention kernel's key tile.
pub const RING_ALIGN: usize = crate::kernels::f16ops::KV_TILE;

/// Error when a sequence would not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the KV cache holds {capacity} positions: {current} used + {requested} new would overflow it"
)]
pub struct KvOverflow {
    pub capacity: usize,
    pub current: usize,
    pub requested: usize,
}

/// A pass the sliding-window rings cannot serve exactly.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvWindowError {
    #[error(
        "a pass of {n} tokens exceeds the {max} the sliding-window ring of {rows} rows allows"
    )]
    PassTooLong { n: usize, max: usize, rows: usize },
    #[error("the sliding-window ring no longer holds the window before position {pos} (it keeps positions {kept} and up)")]
    WindowLost { pos: usize, kept: usize },
}

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

/// Where a sequence stands in a cache of some layout: the positions written, and — with
/// sliding-window rings — the oldest position from which the rings still hold everything
/// written. The bookkeeping of every backend's cache (`KvCache` in RAM, a GPU session's slot),
/// written once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Positions written (`current_length` in the KV cache design).
    pub len: usize,
    /// The rings hold positions `kept..len` intact (0 without rings).
    pub kept: usize,
}

impl Cursor {
    /// Can a pass start at position `pos` (`<= len`) and attend exactly: does every ring
    /// still hold the window before `pos` (positions `pos + 1 − window .. pos`)? Always true
    /// without rings, and at 0.
    pub fn can_resume_at(&self, l: &KvLayout, pos: usize) -> bool {
        match &l.window {
            None => true,
            Some(w) => pos == 0 || (pos + 1).saturating_sub(w.window) >= self.kept,
        }
    }

    /// Check that a pass of `n` tokens from `len` is exact with the rings: the pass fits in a
    /// ring beside the window, and the window before `len` is still held.
    pub fn check_window(&self, l: &KvLayout, n: usize) -> Result<(), KvWindowError> {
        let Some(w) = &l.window else {
            return Ok(());
        };
        if n > w.max_pass() {
            return Err(KvWindowError::PassTooLong {
                n,
                max: w.max_pass(),
                rows: w.rows,
            });
        }
        if !self.can_resume_at(l, self.len) {
            return Err(KvWindowError::WindowLost {
                pos: self.len,
                kept: self.kept,
            });
        }
        Ok(())
    }

    /// Would `additional` more positions exceed the capacity?
    pub fn would_overflow(&self, l: &KvLayout, additional: usize) -> bool {
        self.len
            .checked_add(additional)
            .is_none_or(|n| n > l.max_len)
    }

    /// Check that `additional` positions fit.
    pub fn check_fits(&self, l: &KvLayout, additional: usize) -> Result<(), KvOverflow> {
        if self.would_overflow(l, additional) {
            return Err(KvOverflow {
                capacity: l.max_len,
                current: self.len,
                requested: additional,
            });
        }
        Ok(())
    }

    /// Commit `count` positions written by a pass. The rings have overwritten positions
    /// `< len − rows`.
    pub fn advance(&mut self, l: &KvLayout, count: usize) -> Result<(), KvOverflow> {
        self.check_fits(l, count)?;
        self.len += count;
        if let Some(w) = &l.window {
            self.kept = self.kept.max(self.len.saturating_sub(w.rows));
        }
        Ok(())
    }

    /// Move back to `to_len` (no-op if already shorter) and return the new length. Where the
    /// rings no longer hold the window before `to_len`, everything is forgotten instead
    /// (length 0): the caller evaluates the tokens again.
    pub fn rollback(&mut self, l: &KvLayout, to_len: usize) -> usize {
        let to = self.len.min(to_len);
        // (Back to 0 is a fresh start: the rings' old positions are no longer needed, and
        // keeping `kept` would refuse the window of the positions written next.)
        if to > 0 && self.can_resume_at(l, to) {
            self.len = to;
        } else {
            *self = Cursor::default();
        }
        self.len
    }

    /// How many of `src`'s first `n` positions another cache of the same layout can take over
    /// (0 where the rings no longer hold the window before them), and the cursor it then has.
    pub fn prefix_of(src: &Cursor, l: &KvLayout, n: usize) -> (usize, Cursor) {
        let n = n.min(src.len);
        match src.can_resume_at(l, n) && n > 0 {
            true => (
                n,
                Cursor {
                    len: n,
                    kept: src.kept,
                },
            ),
            false => (0, Cursor::default()),
        }
    }
}

/// A KV budget too small to run with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a KV budget of {budget} bytes is too small: the offload ring needs two layer buffers (beside any sliding-window rings), {min} bytes")]
pub struct KvBudgetError {
    pub budget: usize,
    pub min: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollback_to_the_start_forgets_the_rings_turnover() {
        let l = KvLayout::full(1, 1, 4, 4, 256).with_window(8, &[true], 4);
        let rows = l.window.as_ref().unwrap().rows;
        let mut c = Cursor::default();
        c.advance(&l, 3 * rows).unwrap();
        assert!(c.kept > 0, "the ring turned over");
        assert_eq!(c.rollback(&l, 0), 0);
        assert_eq!(c, Cursor::default());
        // Written again from 0, past the ring: every window is there.
        for _ in 0..3 * rows {
            c.check_window(&l, 1).unwrap();
            c.advance(&l, 1).unwrap();
        }
        // A rollback within the window's margin keeps the positions; one past it forgets all.
        let len = c.len;
        assert_eq!(c.rollback(&l, len - 2), len - 2);
        assert_eq!(c.rollback(&l, len - rows), 0);
        assert_eq!(c, Cursor::default());
    }
}
