//! The KV cache: allocated once for the configured context, head-major per layer,
//! f16, with a cursor that advances, rolls back and resets without touching the data.
//!
//! Layout of one layer's keys (values alike):
//! ```text
//! k[layer]: [n_kv_heads, rows, head_dim]   f16
//! offset(h, p, d) = h * rows * head_dim + row(p) * head_dim + d
//! ```
//! For a layer that sees the whole context, `rows = max_len` and `row(p) = p`. A
//! sliding-window layer keeps only a ring of its last positions ([`super::layout`]):
//! `rows = window + max_tokens − 1` rounded up to 64 and `row(p) = p mod rows`. Head-major
//! keeps every head's history contiguous, so attention over a head's positions is one
//! sequential read (two for a ring that wraps).
//!
//! Invariant: positions `>= len` hold stale or zero data and are never read. A forward pass
//! writes the K/V of its new tokens at `len..len+n`, attends over `0..len+n`, then `advance(n)`.
//! A ring holds positions `kept_from()..len` intact; older ones have been overwritten. That is
//! all a sliding-window layer needs to go on from `len`, and it stays so after a rollback of
//! up to `rows − window + 1` positions; a rollback or a prefix copy to a point whose window
//! the ring no longer holds empties the cache instead, so the caller recomputes (never a
//! wrong number: [`KvCache::can_resume_at`]).
//!
//! The element type is chosen when the cache is created ([`KvType`]): f16 (the reference
//! engine's default, what the golden outputs were made with), or Q8_0 — each head's row of
//! `head_dim` values stored as `head_dim / 32` blocks of 32 signed bytes and one f16 scale
//! (34 bytes per 32 values instead of 64), same head-major layout with rows of blocks. The
//! attention kernel dequantizes a Q8_0 cache tile by tile ([`KvLayer`]).
//!
//! Where it lives is chosen at creation too: in RAM, or — when a RAM budget is smaller than
//! the whole cache ([`KvLayout::offload_ring`]) — the full layers in a file streamed through a
//! ring of layer buffers ([`super::offload`]), the sliding-window rings in RAM. A forward pass
//! brackets each layer's writes and attention with [`KvCache::begin_layer`] /
//! [`KvCache::end_layer`] (no-ops in RAM).

use half::f16;
use half::slice::HalfFloatSliceExt;

use zerocopy::{FromBytes, IntoBytes};

use super::offload::{zeroed_f16, LayerGeom, OffloadError, OffloadFault, OffloadStore};
use crate::kernels::{par_ring_rows, ThreadPool};
use crate::quant::blocks::{cast, cast_mut, BlockQ8_0};
use crate::quant::reference::Quantize;

pub use super::layout::{
    Cursor, KvBudgetError, KvLayout, KvOverflow, KvWindow, KvWindowError, RING_ALIGN,
};
pub use crate::kernels::kv_type::{dequant_q8_0_f16, KvLayer, KvSide, KvType, KvTypeError};

/// Why a KV cache could not be created.
#[derive(Debug, thiserror::Error)]
pub enum KvCacheError {
    #[error(transparent)]
    Type(#[from] KvTypeError),
    #[error(transparent)]
    Offload(#[from] OffloadError),
}

/// The per-layer buffers of one element type.
enum Store {
    /// Per layer, `[n_kv_heads, rows, head_dim]` f16.
    F16 { k: Vec<Vec<f16>>, v: Vec<Vec<f16>> },
    /// Per layer, `[n_kv_heads, rows, head_dim / 32]` Q8_0 blocks, as bytes.
    Q8_0 { k: Vec<Vec<u8>>, v: Vec<Vec<u8>> },
    /// The full layers in a file, streamed through a ring of layer buffers (`[K][V]` bytes of
    /// the layout above, held as f16 words); the sliding-window rings in RAM, `[K][V]` bytes
    /// alike (empty for a full layer).
    Offload {
        ty: KvType,
        store: OffloadStore,
        rings: Vec<Vec<f16>>,
        /// Per layer, its index among the full layers (the offload store's layer number).
        slot: Vec<usize>,
    },
}

/// Store one head's keys or values of one position, `src`, in `dst` (its row of the cache) in
/// type `ty`: f16 rounded to nearest even, or Q8_0 blocks (`d = amax / 127`).
fn store_row(ty: KvType, dst: &mut [u8], src: &[f32]) {
    match ty {
        KvType::F16 => <[f16]>::mut_from_bytes(dst)
            .expect("f16 rows are aligned")
            .convert_from_f32_slice(src),
        KvType::Q8_0 => BlockQ8_0::quantize(src, cast_mut(dst).expect("whole blocks")),
    }
}

/// Make one layer of `dst` hold what `src` holds for positions `0..n` (`row` elements per
/// position and head): the first `n` rows of every head of a full layer, the whole of a ring.
fn copy_layer<T: Copy>(
    dst: &mut [T],
    src: &[T],
    heads: usize,
    rows: usize,
    ring: bool,
    row: usize,
    n: usize,
) {
    if ring {
        dst.copy_from_slice(src);
        return;
    }
    for h in 0..heads {
        let r = h * rows * row..(h * rows + n) * row;
        dst[r.clone()].copy_from_slice(&src[r]);
    }
}

/// One sequence's KV cache.
pub struct KvCache {
    layout: KvLayout,
    store: Store,
    /// Positions written so far (`current_length` in the KV cache design), and how far back the
    /// sliding-window rings hold everything.
    cur: Cursor,
}

impl KvCache {
    /// Allocate the whole f16 cache. Zeroed allocations are lazily backed by the OS, so
    /// resident memory grows as positions are written; the plan counts the full size.
    pub fn new(layout: KvLayout) -> KvCache {
        let k = (0..layout.n_layers)
            .map(|l| zeroed_f16(layout.k_elems(l)))
            .collect();
        let v = (0..layout.n_layers)
            .map(|l| zeroed_f16(layout.v_elems(l)))
            .collect();
        KvCache {
            layout,
            store: Store::F16 { k, v },
            cur: Cursor::default(),
        }
    }

    /// Allocate a cache of element type `ty` (lazily resident, like [`KvCache::new`]).
    pub fn with_type(layout: KvLayout, ty: KvType) -> Result<KvCache, KvTypeError> {
        ty.check_head_dim(layout.head_dim_k)?;
        ty.check_head_dim(layout.head_dim_v)?;
        Ok(match ty {
            KvType::F16 => KvCache::new(layout),
            KvType::Q8_0 => {
                let bytes = |l: usize, hd: usize| vec![0u8; layout.layer_bytes_at(l, ty, hd)];
                let k = (0..layout.n_layers)
                    .map(|l| bytes(l, layout.head_dim_k))
                    .collect();
                let v = (0..layout.n_layers)
                    .map(|l| bytes(l, layout.head_dim_v))
                    .collect();
                KvCache {
                    layout,
                    store: Store::Q8_0 { k, v },
                    cur: Cursor::default(),
                }
            }
        })
    }

    /// A cache of type `ty` whose full layers live in a file, streamed through a ring of
    /// `ring` layer buffers by a background thread (`2 <= ring < full layers`; see
    /// [`super::offload`]); the sliding-window rings stay in RAM.
    pub fn offloaded(layout: KvLayout, ty: KvType, ring: usize) -> Result<KvCache, KvCacheError> {
        ty.check_head_dim(layout.head_dim_k)?;
        ty.check_head_dim(layout.head_dim_v)?;
        let geom = LayerGeom {
            n_kv_heads: layout.n_kv_heads,
            max_len: layout.max_len,
            row_k: ty.row_bytes(layout.head_dim_k),
            row_v: ty.row_bytes(layout.head_dim_v),
        };
        let store = OffloadStore::new(geom, layout.n_full_layers(), ring)?;
        let mut slot = Vec::with_capacity(layout.n_layers);
        let mut rings = Vec::with_capacity(layout.n_layers);
        let mut full = 0;
        for l in 0..layout.n_layers {
            slot.push(full);
            if layout.ring_rows(l).is_some() {
                let bytes = layout.layer_bytes_at(l, ty, layout.head_dim_k)
                    + layout.layer_bytes_at(l, ty, layout.head_dim_v);
                rings.push(zeroed_f16(bytes / 2));
            } else {
                rings.push(Vec::new());
                full += 1;
            }
        }
        Ok(KvCache {
            layout,
            store: Store::Offload {
                ty,
                store,
                rings,
                slot,
            },
            cur: Cursor::default(),
        })
    }

    /// The element type.
    pub fn ty(&self) -> KvType {
        match self.store {
            Store::F16 { .. } => KvType::F16,
            Store::Q8_0 { .. } => KvType::Q8_0,
            Store::Offload { ty, .. } => ty,
        }
    }

    /// Is the cache streamed from a file (and how many layer buffers are in RAM)?
    pub fn offload_ring(&self) -> Option<usize> {
        match &self.store {
            Store::Offload { store, .. } => Some(store.ring()),
            _ => None,
        }
    }

    /// The offload store's layer number of `layer`, if that layer is streamed from the file.
    fn offloaded_layer(&mut self, layer: usize) -> Option<(&mut OffloadStore, usize)> {
        match &mut self.store {
            Store::Offload { store, slot, .. } if self.layout.ring_rows(layer).is_none() => {
                Some((store, slot[layer]))
            }
            _ => None,
        }
    }

    /// Make `layer` readable and writable (an offloaded cache waits for its buffer; the
    /// in-RAM caches and rings have nothing to do). Call before writing a forward pass's
    /// positions. Fails when an offloaded cache's file I/O failed (the cache is lost).
    pub fn begin_layer(&mut self, layer: usize) -> Result<(), OffloadFault> {
        match self.offloaded_layer(layer) {
            Some((store, l)) => store.begin_layer(l),
            None => Ok(()),
        }
    }

    /// Done with `layer` for this pass, whose positions `new` were written (an offloaded
    /// cache writes them back and prefetches the layer its buffer serves next).
    pub fn end_layer(&mut self, layer: usize, new: std::ops::Range<usize>) {
        if let Some((store, l)) = self.offloaded_layer(layer) {
            store.end_layer(l, new);
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        self.cur.len
    }

    pub fn is_empty(&self) -> bool {
        self.cur.len == 0
    }

    /// Maximum positions.
    pub fn capacity(&self) -> usize {
        self.layout.max_len
    }

    /// Ring rows of `layer`, if it is a sliding-window layer keeping a ring.
    pub fn ring_rows(&self, layer: usize) -> Option<usize> {
        self.layout.ring_rows(layer)
    }

    /// The sliding-window rings hold positions `kept_from()..len()` intact.
    pub fn kept_from(&self) -> usize {
        self.cur.kept
    }

    /// See [`Cursor::can_resume_at`].
    pub fn can_resume_at(&self, pos: usize) -> bool {
        self.cur.can_resume_at(&self.layout, pos)
    }

    /// See [`Cursor::check_window`].
    pub fn check_window(&self, n: usize) -> Result<(), KvWindowError> {
        self.cur.check_window(&self.layout, n)
    }

    /// Would `additional` more positions exceed the capacity?
    pub fn would_overflow(&self, additional: usize) -> bool {
        self.cur.would_overflow(&self.layout, additional)
    }

    /// Check that `additional` positions fit.
    pub fn check_fits(&self, additional: usize) -> Result<(), KvOverflow> {
        self.cur.check_fits(&self.layout, additional)
    }

    /// Commit `count` positions written by the last forward pass (see [`Cursor::advance`]).
    pub fn advance(&mut self, count: usize) -> Result<(), KvOverflow> {
        self.cur.advance(&self.layout, count)
    }

    /// Move the cursor back to `to_len` (no-op if already shorter) and return the new length.
    /// Data past it becomes stale. Where the sliding-window rings no longer hold the window
    /// before `to_len` (a rollback of more than `rows − window + 1` positions), the cache is
    /// emptied instead (length 0): the caller evaluates the tokens again.
    pub fn rollback(&mut self, to_len: usize) -> usize {
        self.cur.rollback(&self.layout, to_len)
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.cur = Cursor::default();
    }

    /// Store the keys and values of position `pos` for `layer`, converting to the cache's
    /// type (f16: rounded to nearest even; Q8_0: one block per 32 values, `d = amax / 127`).
    /// `k_row` is `[n_kv_heads * head_dim_k]`, `v_row` is `[n_kv_heads * head_dim_v]`.
    pub fn write(&mut self, layer: usize, pos: usize, k_row: &[f32], v_row: &[f32]) {
        let (hk, hv) = (self.layout.head_dim_k, self.layout.head_dim_v);
        let (rows, row) = (self.layout.rows(layer), self.layout.row_of(layer, pos));
        assert!(
            pos < self.layout.max_len,
            "KV write at {pos} past capacity {}",
            self.layout.max_len
        );
        let heads = self.layout.n_kv_heads;
        assert!(
            k_row.len() == heads * hk && v_row.len() == heads * hv,
            "KV write of rows of {} and {} values for {heads} heads of {hk} and {hv}",
            k_row.len(),
            v_row.len()
        );
        let (ty, k, v) = self.layer_bytes_mut(layer);
        let (rk, rv) = (ty.row_bytes(hk), ty.row_bytes(hv));
        for (h, (ks, vs)) in k_row
            .chunks_exact(hk)
            .zip(v_row.chunks_exact(hv))
            .enumerate()
        {
            let r = h * rows + row;
            store_row(ty, &mut k[r * rk..(r + 1) * rk], ks);
            store_row(ty, &mut v[r * rv..(r + 1) * rv], vs);
        }
    }

    /// Store positions `pos0..pos0 + n` of `layer` as [`KvCache::write`] stores each, the
    /// heads and positions spread over `pool`'s threads: `k` is `[n, n_kv_heads * head_dim_k]`,
    /// `v` is `[n, n_kv_heads * head_dim_v]`. Where `n` exceeds a sliding-window ring, only
    /// the positions the ring keeps are written (the earlier ones would be overwritten).
    pub fn write_batch(
        &mut self,
        pool: &ThreadPool,
        layer: usize,
        pos0: usize,
        n: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let l = &self.layout;
        let (heads, hk, hv) = (l.n_kv_heads, l.head_dim_k, l.head_dim_v);
        assert!(
            pos0 + n <= l.max_len,
            "KV write of {n} positions at {pos0} past capacity {}",
            l.max_len
        );
        let rows = l.rows(layer);
        let skip = n.saturating_sub(rows);
        let (first, n) = (pos0 + skip, n - skip);
        let start = l.row_of(layer, first);
        let (k, v) = (&k[skip * heads * hk..], &v[skip * heads * hv..]);
        let (ty, kb, vb) = self.layer_bytes_mut(layer);
        let (rk, rv) = (ty.row_bytes(hk), ty.row_bytes(hv));
        par_ring_rows(
            pool,
            (kb, rk),
            (vb, rv),
            heads,
            rows,
            start,
            n,
            &|h, j, kd, vd| {
                let (ks, vs) = ((j * heads + h) * hk, (j * heads + h) * hv);
                store_row(ty, kd, &k[ks..ks + hk]);
                store_row(ty, vd, &v[vs..vs + hv]);
            },
        );
    }

    /// One layer's key and value bytes (`[n_kv_heads, rows, row bytes]` each) and their type:
    /// the layer's buffers, or for an offloaded cache its ring or its current slot.
    fn layer_bytes_mut(&mut self, layer: usize) -> (KvType, &mut [u8], &mut [u8]) {
        match &mut self.store {
            Store::F16 { k, v } => (
                KvType::F16,
                k[layer].as_mut_bytes(),
                v[layer].as_mut_bytes(),
            ),
            Store::Q8_0 { k, v } => (KvType::Q8_0, &mut k[layer], &mut v[layer]),
            Store::Offload {
                ty,
                store,
                rings,
                slot,
            } => {
                let kb = self
                    .layout
                    .layer_bytes_at(layer, *ty, self.layout.head_dim_k);
                let buf = if self.layout.ring_rows(layer).is_some() {
                    &mut rings[layer][..]
                } else {
                    store.current_mut(slot[layer])
                };
                let (k, v) = buf.as_mut_bytes().split_at_mut(kb);
                (*ty, k, v)
            }
        }
    }

    /// Make this cache hold the first `n` positions of `src` (same layout and type): the keys
    /// and values are copied head by head and the cursor set to `n`, which is returned. This
    /// is how a sequence reuses a prefix another sequence has already computed (prefix caching
    /// across slots). Asking for more than `src` holds copies what it has; a prefix whose
    /// window `src`'s rings no longer hold ([`KvCache::can_resume_at`]) copies nothing, and
    /// the caller computes it.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<usize, KvOverflow> {
        assert_eq!(
            self.layout, src.layout,
            "copying between caches of another shape"
        );
        let (n, cur) = Cursor::prefix_of(&src.cur, &self.layout, n);
        self.reset();
        self.check_fits(n)?;
        if n == 0 {
            return Ok(0);
        }
        let l = &self.layout;
        let (hk, hv) = (l.head_dim_k, l.head_dim_v);
        let heads = l.n_kv_heads;
        match (&mut self.store, &src.store) {
            (Store::F16 { k, v }, Store::F16 { k: sk, v: sv }) => {
                for layer in 0..l.n_layers {
                    let (rows, ring) = (l.rows(layer), l.ring_rows(layer).is_some());
                    copy_layer(&mut k[layer], &sk[layer], heads, rows, ring, hk, n);
                    copy_layer(&mut v[layer], &sv[layer], heads, rows, ring, hv, n);
                }
            }
            (Store::Q8_0 { k, v }, Store::Q8_0 { k: sk, v: sv }) => {
                let (rk, rv) = (KvType::Q8_0.row_bytes(hk), KvType::Q8_0.row_bytes(hv));
                for layer in 0..l.n_layers {
                    let (rows, ring) = (l.rows(layer), l.ring_rows(layer).is_some());
                    copy_layer(&mut k[layer], &sk[layer], heads, rows, ring, rk, n);
                    copy_layer(&mut v[layer], &sv[layer], heads, rows, ring, rv, n);
                }
            }
            _ => panic!("copying between KV caches of different element types or offloaded"),
        }
        self.cur = cur;
        Ok(n)
    }

    /// `layer` as the attention kernel reads it.
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        match &self.store {
            Store::F16 { k, v } => KvLayer::F16 {
                keys: &k[layer],
                values: &v[layer],
            },
            Store::Q8_0 { k, v } => KvLayer::Q8_0 {
                keys: cast(&k[layer]).expect("whole blocks"),
                values: cast(&v[layer]).expect("whole blocks"),
            },
            Store::Offload {
                ty,
                store,
                rings,
                slot,
            } => {
                let l = &self.layout;
                let buf = if l.ring_rows(layer).is_some() {
                    &rings[layer][..]
                } else {
                    store.current(slot[layer])
                };
                let (k, v) = buf
                    .as_bytes()
                    .split_at(l.layer_bytes_at(layer, *ty, l.head_dim_k));
                match ty {
                    KvType::F16 => KvLayer::F16 {
                        keys: <[f16]>::ref_from_bytes(k).expect("f16 rows"),
                        values: <[f16]>::ref_from_bytes(v).expect("f16 rows"),
                    },
                    KvType::Q8_0 => KvLayer::Q8_0 {
                        keys: cast(k).expect("whole blocks"),
                        values: cast(v).expect("whole blocks"),
                    },
                }
            }
        }
    }

    /// All of `layer`'s keys of an f16 cache, `[n_kv_heads, rows, head_dim_k]`.
    ///
    /// # Panics
    /// On a Q8_0 cache (use [`KvCache::layer`]).
    pub fn keys(&self, layer: usize) -> &[f16] {
        match self.layer(layer) {
            KvLayer::F16 { keys, .. } => keys,
            KvLayer::Q8_0 { .. } => panic!("keys(): the KV cache is q8_0, not f16"),
        }
    }

    /// All of `layer`'s values of an f16 cache, `[n_kv_heads, rows, head_dim_v]`.
    ///
    /// # Panics
    /// On a Q8_0 cache (use [`KvCache::layer`]).
    pub fn values(&self, layer: usize) -> &[f16] {
        match self.layer(layer) {
            KvLayer::F16 { values, .. } => values,
            KvLayer::Q8_0 { .. } => panic!("values(): the KV cache is q8_0, not f16"),
        }
    }

    /// Bytes allocated in RAM (for an offloaded cache, its ring of layer buffers and the
    /// sliding-window rings).
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Offload { store, .. } => {
                store.ram_bytes() + self.layout.ring_kv_bytes(self.ty())
            }
            _ => self.layout.bytes_as(self.ty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            n_layers: 2,
            n_kv_heads: 2,
            head_dim_k: 4,
            head_dim_v: 4,
            max_len: 8,
            window: None,
        }
    }

    #[test]
    fn cursor_operations() {
        let mut c = KvCache::new(layout());
        assert!(c.is_empty());
        assert!(!c.would_overflow(8));
        assert!(c.would_overflow(9));
        c.advance(5).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(
            c.advance(4),
            Err(KvOverflow {
                capacity: 8,
                current: 5,
                requested: 4
            })
        );
        assert_eq!(c.len(), 5, "a refused advance changes nothing");
        c.rollback(3);
        assert_eq!(c.len(), 3);
        c.rollback(7);
        assert_eq!(c.len(), 3, "rollback never moves forward");
        c.reset();
        assert_eq!(c.len(), 0);
        assert!(c.would_overflow(usize::MAX));
    }

    #[test]
    fn copy_prefix_copies_only_the_prefix() {
        let mut a = KvCache::new(layout());
        for pos in 0..5 {
            let k: Vec<f32> = (0..8).map(|i| (pos * 10 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            for layer in 0..2 {
                a.write(layer, pos, &k, &v);
            }
        }
        a.advance(5).unwrap();
        let mut b = KvCache::new(layout());
        b.advance(7).unwrap();
        b.copy_prefix_from(&a, 3).unwrap();
        assert_eq!(b.len(), 3);
        for layer in 0..2 {
            for h in 0..2 {
                let off = h * 8 * 4;
                assert_eq!(b.keys(layer)[off..off + 12], a.keys(layer)[off..off + 12]);
                assert_eq!(
                    b.values(layer)[off..off + 12],
                    a.values(layer)[off..off + 12]
                );
                assert!(b.keys(layer)[off + 12..off + 32]
                    .iter()
                    .all(|x| x.to_f32() == 0.0));
            }
        }
        // Asking for more than the source holds copies what it has.
        b.copy_prefix_from(&a, 100).unwrap();
        assert_eq!(b.len(), 5);
    }

    #[test]
    fn head_major_layout() {
        let mut c = KvCache::new(layout());
        let k: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..8).map(|i| -(i as f32)).collect();
        c.write(1, 3, &k, &v);
        let keys = c.keys(1);
        // head 0, pos 3 at 3*4; head 1, pos 3 at (8+3)*4
        assert_eq!(
            keys[12..16].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            vec![0.0, 1.0, 2.0, 3.0]
        );
        assert_eq!(
            keys[44..48].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            vec![4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(c.values(1)[44].to_f32(), -4.0);
        assert!(c.keys(0).iter().all(|x| x.to_f32() == 0.0));
        assert_eq!(c.bytes(), 2 * 2 * 8 * 8 * 2);
    }

    fn layout64() -> KvLayout {
        KvLayout {
            n_layers: 2,
            n_kv_heads: 3,
            head_dim_k: 64,
            head_dim_v: 32,
            max_len: 5,
            window: None,
        }
    }

    #[test]
    fn q8_0_rows_round_trip_within_half_a_step() {
        let l = layout64();
        let mut c = KvCache::with_type(l.clone(), KvType::Q8_0).unwrap();
        assert_eq!(c.ty(), KvType::Q8_0);
        // 2 layers × 3 heads × 5 positions × (2 + 1 blocks) × 34 bytes
        assert_eq!(c.bytes(), 2 * 3 * 5 * 3 * 34);
        assert_eq!(c.bytes(), l.bytes_as(KvType::Q8_0));
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 8.0 - 4.0
        };
        let mut k: Vec<f32> = (0..3 * 64).map(|_| rnd()).collect();
        k[70] = 100.0; // one outlier: only its block's scale grows
        let v: Vec<f32> = (0..3 * 32).map(|_| rnd()).collect();
        c.write(1, 2, &k, &v);
        let mut kb = vec![f16::ZERO; 5 * 64];
        let mut vb = vec![f16::ZERO; 5 * 32];
        let layer = c.layer(1);
        for h in 0..3 {
            let rows = h * 5..h * 5 + 5;
            let keys = layer
                .rows_f16(KvSide::Keys, rows.clone(), 64, &mut kb)
                .to_vec();
            let values = layer.rows_f16(KvSide::Values, rows, 32, &mut vb).to_vec();
            for (row, data, hd) in [(&keys, &k, 64), (&values, &v, 32)] {
                for p in 0..5 {
                    let got = &row[p * hd..(p + 1) * hd];
                    if p != 2 {
                        assert!(got.iter().all(|x| x.to_f32() == 0.0), "untouched position");
                        continue;
                    }
                    for (blk, (g, x)) in got
                        .chunks(32)
                        .zip(data[h * hd..(h + 1) * hd].chunks(32))
                        .enumerate()
                    {
                        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                        let step = amax / 127.0;
                        for (g, x) in g.iter().zip(x) {
                            let err = (g.to_f32() - x).abs();
                            assert!(
                                err <= step * 0.5 + x.abs() / 1024.0 + 1e-6,
                                "head {h} block {blk}: {} vs {x}",
                                g.to_f32()
                            );
                        }
                    }
                }
            }
        }
        // The other layer is untouched.
        let keys0 = c
            .layer(0)
            .rows_f16(KvSide::Keys, 0..15, 64, &mut vec![f16::ONE; 15 * 64])
            .to_vec();
        assert!(keys0.iter().all(|x| x.to_f32() == 0.0));
    }

    #[test]
    fn kv_type_choice() {
        assert_eq!("q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert_eq!("F16".parse::<KvType>(), Ok(KvType::F16));
        assert!(matches!(
            "q4".parse::<KvType>(),
            Err(KvTypeError::Unknown(_))
        ));
        let odd = KvLayout {
            head_dim_k: 48,
            ..layout64()
        };
        assert!(KvCache::with_type(odd.clone(), KvType::F16).is_ok());
        let err = KvCache::with_type(odd, KvType::Q8_0).err().unwrap();
        assert!(err.to_string().contains("divisible by 32"), "{err}");
        // Q8_0 is 34/64 of f16.
        let l = layout64();
        assert_eq!(l.bytes_as(KvType::Q8_0) * 64, l.bytes_as(KvType::F16) * 34);
        // The f16 accessors keep working for an f16 cache built either way.
        let c = KvCache::with_type(l.clone(), KvType::F16).unwrap();
        assert_eq!(c.keys(0).len(), 3 * 5 * 64);
        assert_eq!(c.bytes(), l.bytes());
    }
}

#[cfg(test)]
#[path = "kv_ring_tests.rs"]
mod ring_tests;
