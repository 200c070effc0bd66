//! The KV cache (seed 004): allocated once for the configured context, head-major per layer,
//! f16, with a cursor that advances, rolls back and resets without touching the data.
//!
//! Layout of one layer's keys (values alike):
//! ```text
//! k[layer]: [n_kv_heads, max_len, head_dim]   f16
//! offset(h, p, d) = h * max_len * head_dim + p * head_dim + d
//! ```
//! Head-major keeps every head's history contiguous, so attention over positions `0..len`
//! of one head is one sequential read.
//!
//! Invariant: positions `>= len` hold stale or zero data and are never read. A forward pass
//! writes the K/V of its new tokens at `len..len+n`, attends over `0..len+n`, then `advance(n)`.
//!
//! The element type is chosen when the cache is created ([`KvType`]): f16 (the reference
//! engine's default, what the golden outputs were made with), or Q8_0 — each head's row of
//! `head_dim` values stored as `head_dim / 32` blocks of 32 signed bytes and one f16 scale
//! (34 bytes per 32 values instead of 64), same head-major layout with rows of blocks. The
//! attention kernel dequantizes a Q8_0 cache tile by tile ([`KvLayer`]).
//!
//! Where it lives is chosen at creation too: in RAM, or — when a RAM budget is smaller than
//! the whole cache ([`KvLayout::offload_ring`]) — in a file streamed through a ring of layer
//! buffers ([`super::offload`]). A forward pass brackets each layer's writes and attention with
//! [`KvCache::begin_layer`] / [`KvCache::end_layer`] (no-ops in RAM).

use half::f16;

use zerocopy::{FromBytes, IntoBytes};

use super::offload::{LayerGeom, OffloadError, OffloadStore};
use crate::quant::blocks::{cast, cast_mut, BlockQ8_0, QK};
use crate::quant::reference::Quantize;

/// Why a KV cache could not be created.
#[derive(Debug, thiserror::Error)]
pub enum KvCacheError {
    #[error(transparent)]
    Type(#[from] KvTypeError),
    #[error(transparent)]
    Offload(#[from] OffloadError),
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    /// IEEE half precision (2 bytes per value).
    #[default]
    F16,
    /// Blocks of 32 values: an f16 scale and 32 signed bytes (34 bytes per 32 values).
    Q8_0,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one head's row of `head_dim` values (`head_dim` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => head_dim * 2,
            KvType::Q8_0 => head_dim.div_ceil(QK) * std::mem::size_of::<BlockQ8_0>(),
        }
    }

    /// Can a head of `head_dim` values be stored in this type?
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KvTypeError> {
        match self {
            KvType::Q8_0 if !head_dim.is_multiple_of(QK) => Err(KvTypeError::HeadDim {
                ty: self.name(),
                head_dim,
                block: QK,
            }),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = KvTypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(KvTypeError::Unknown(s.to_owned())),
        }
    }
}

/// A KV cache type that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvTypeError {
    #[error("unknown KV cache type {0:?} (expected f16 or q8_0)")]
    Unknown(String),
    #[error(
        "a {ty} KV cache needs a head dimension divisible by {block}; this model's is {head_dim}"
    )]
    HeadDim {
        ty: &'static str,
        head_dim: usize,
        block: usize,
    },
}

/// Geometry of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    /// Key head dimension.
    pub head_dim_k: usize,
    /// Value head dimension (equal to the key's for every architecture we run so far).
    pub head_dim_v: usize,
    /// Maximum number of positions (the context size).
    pub max_len: usize,
}

impl KvLayout {
    /// Elements of one layer's keys.
    pub fn k_elems_per_layer(&self) -> usize {
        self.n_kv_heads * self.max_len * self.head_dim_k
    }

    /// Elements of one layer's values.
    pub fn v_elems_per_layer(&self) -> usize {
        self.n_kv_heads * self.max_len * self.head_dim_v
    }

    /// Bytes of the whole f16 cache: `n_layers · n_kv_heads · max_len · (head_dim_k + head_dim_v) · 2`.
    pub fn bytes(&self) -> usize {
        self.bytes_as(KvType::F16)
    }

    /// Bytes of one layer's keys (or values) in `ty`.
    pub fn layer_bytes(&self, ty: KvType, head_dim: usize) -> usize {
        self.n_kv_heads * self.max_len * ty.row_bytes(head_dim)
    }

    /// Bytes of one layer's keys and values together in `ty` (one offload ring buffer).
    pub fn layer_kv_bytes(&self, ty: KvType) -> usize {
        self.layer_bytes(ty, self.head_dim_k) + self.layer_bytes(ty, self.head_dim_v)
    }

    /// How a cache of `ty` fits a RAM budget: `None` if the whole cache fits (kept in RAM),
    /// else the number of layer buffers of the offload ring (at least 2).
    pub fn offload_ring(
        &self,
        ty: KvType,
        budget: Option<usize>,
    ) -> Result<Option<usize>, KvBudgetError> {
        let Some(budget) = budget else {
            return Ok(None);
        };
        let slot = self.layer_kv_bytes(ty);
        if self.bytes_as(ty) <= budget {
            return Ok(None);
        }
        let ring = budget / slot.max(1);
        if ring < 2 || self.n_layers < 3 {
            return Err(KvBudgetError {
                budget,
                min: if self.n_layers < 3 {
                    self.bytes_as(ty)
                } else {
                    2 * slot
                },
            });
        }
        Ok(Some(ring.min(self.n_layers - 1)))
    }

    /// Bytes of the whole cache in `ty`:
    /// `n_layers · n_kv_heads · max_len · (row_bytes(head_dim_k) + row_bytes(head_dim_v))`.
    pub fn bytes_as(&self, ty: KvType) -> usize {
        self.n_layers
            * (self.layer_bytes(ty, self.head_dim_k) + self.layer_bytes(ty, self.head_dim_v))
    }
}

/// One layer of the cache as the attention kernel reads it: rows of `[n_kv_heads, max_len]`,
/// each `head_dim` values in the cache's type.
#[derive(Clone, Copy, Debug)]
pub enum KvLayer<'a> {
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Q8_0 {
        keys: &'a [BlockQ8_0],
        values: &'a [BlockQ8_0],
    },
}

impl<'a> KvLayer<'a> {
    /// Rows `lo..hi` (row = head · max_len + position) of `head_dim` keys as f16: borrowed from
    /// an f16 cache, dequantized into `buf` from a Q8_0 one.
    #[inline]
    pub fn keys_f16<'b>(
        &self,
        rows: std::ops::Range<usize>,
        head_dim: usize,
        buf: &'b mut [f16],
    ) -> &'b [f16]
    where
        'a: 'b,
    {
        self.rows_f16(true, rows, head_dim, buf)
    }

    /// As [`KvLayer::keys_f16`] for values.
    #[inline]
    pub fn values_f16<'b>(
        &self,
        rows: std::ops::Range<usize>,
        head_dim: usize,
        buf: &'b mut [f16],
    ) -> &'b [f16]
    where
        'a: 'b,
    {
        self.rows_f16(false, rows, head_dim, buf)
    }

    #[inline]
    fn rows_f16<'b>(
        &self,
        keys: bool,
        rows: std::ops::Range<usize>,
        head_dim: usize,
        buf: &'b mut [f16],
    ) -> &'b [f16]
    where
        'a: 'b,
    {
        match *self {
            KvLayer::F16 { keys: k, values: v } => {
                &(if keys { k } else { v })[rows.start * head_dim..rows.end * head_dim]
            }
            KvLayer::Q8_0 { keys: k, values: v } => {
                dequant_rows(if keys { k } else { v }, rows, head_dim, buf)
            }
        }
    }

    /// Rows of `head_dim_k`/`head_dim_v` values it holds, checked against a geometry.
    pub fn holds(&self, rows: usize, head_dim_k: usize, head_dim_v: usize) -> bool {
        match *self {
            KvLayer::F16 { keys, values } => {
                keys.len() >= rows * head_dim_k && values.len() >= rows * head_dim_v
            }
            KvLayer::Q8_0 { keys, values } => {
                keys.len() * QK >= rows * head_dim_k && values.len() * QK >= rows * head_dim_v
            }
        }
    }

    pub fn ty(&self) -> KvType {
        match self {
            KvLayer::F16 { .. } => KvType::F16,
            KvLayer::Q8_0 { .. } => KvType::Q8_0,
        }
    }
}

/// Dequantize rows `rows` of `head_dim` values (`head_dim / 32` blocks each) into `buf`:
/// `x = f16(d · q)`, the product in f32 rounded once to f16.
fn dequant_rows<'b>(
    blocks: &[BlockQ8_0],
    rows: std::ops::Range<usize>,
    head_dim: usize,
    buf: &'b mut [f16],
) -> &'b [f16] {
    let bpr = head_dim / QK;
    let n = rows.len() * head_dim;
    let out = &mut buf[..n];
    let src = &blocks[rows.start * bpr..rows.end * bpr];
    dequant_q8_0_f16(src, out);
    out
}

/// Q8_0 blocks to f16: `f16(d · q)` per value.
pub fn dequant_q8_0_f16(blocks: &[BlockQ8_0], out: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    assert_eq!(blocks.len() * QK, out.len());
    let mut tmp = [0.0f32; QK];
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (t, &q) in tmp.iter_mut().zip(&b.qs) {
            *t = q as f32 * d;
        }
        o.convert_from_f32_slice(&tmp);
    }
}

/// A KV budget too small to run with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a KV budget of {budget} bytes is too small: the offload ring needs two layer buffers, {min} bytes")]
pub struct KvBudgetError {
    pub budget: usize,
    pub min: usize,
}

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

/// `n` zero f16 values from a zeroed allocation: the OS maps zero pages lazily, so only the
/// positions actually written become resident (`vec![f16::ZERO; n]` would memset them all).
pub(crate) fn zeroed_f16(n: usize) -> Vec<f16> {
    use half::vec::HalfBitsVecExt;
    vec![0u16; n].reinterpret_into()
}

/// The per-layer buffers of one element type.
enum Store {
    /// Per layer, `[n_kv_heads, max_len, head_dim]` f16.
    F16 { k: Vec<Vec<f16>>, v: Vec<Vec<f16>> },
    /// Per layer, `[n_kv_heads, max_len, head_dim / 32]` Q8_0 blocks, as bytes.
    Q8_0 { k: Vec<Vec<u8>>, v: Vec<Vec<u8>> },
    /// Every layer in a file, streamed through a ring of layer buffers (`[K][V]` bytes of the
    /// layout above, held as f16 words).
    Offload { ty: KvType, store: OffloadStore },
}

/// Write position `pos` of every head into one layer's keys `k` and values `v` (bytes of
/// `[n_kv_heads, max_len, row]`) in type `ty`.
#[allow(clippy::too_many_arguments)]
fn write_rows(
    ty: KvType,
    l: &KvLayout,
    k: &mut [u8],
    v: &mut [u8],
    pos: usize,
    k_row: &[f32],
    v_row: &[f32],
) {
    let (hk, hv) = (l.head_dim_k, l.head_dim_v);
    let (rk, rv) = (ty.row_bytes(hk), ty.row_bytes(hv));
    for h in 0..l.n_kv_heads {
        let row = h * l.max_len + pos;
        let (kd, vd) = (
            &mut k[row * rk..(row + 1) * rk],
            &mut v[row * rv..(row + 1) * rv],
        );
        let (ks, vs) = (&k_row[h * hk..(h + 1) * hk], &v_row[h * hv..(h + 1) * hv]);
        match ty {
            KvType::F16 => {
                for (dst, src) in [(kd, ks), (vd, vs)] {
                    let dst = <[f16]>::mut_from_bytes(dst).expect("f16 rows are aligned");
                    for (d, &x) in dst.iter_mut().zip(src) {
                        *d = f16::from_f32(x);
                    }
                }
            }
            KvType::Q8_0 => {
                for (dst, src) in [(kd, ks), (vd, vs)] {
                    BlockQ8_0::quantize(src, cast_mut(dst).expect("whole blocks"));
                }
            }
        }
    }
}

/// Copy positions `0..n` of every head, per layer `[heads, max_len, row]`, from `src` to `dst`.
fn copy_head_prefix<T: Copy>(
    dst: &mut [Vec<T>],
    src: &[Vec<T>],
    heads: usize,
    max_len: usize,
    row: usize,
    n: usize,
) {
    for (d, s) in dst.iter_mut().zip(src) {
        for h in 0..heads {
            let r = h * max_len * row..(h * max_len + n) * row;
            d[r.clone()].copy_from_slice(&s[r]);
        }
    }
}

/// One sequence's KV cache.
pub struct KvCache {
    layout: KvLayout,
    store: Store,
    /// Positions written so far (`current_length` in the seed).
    len: usize,
}

impl KvCache {
    /// Allocate the whole f16 cache. Zeroed allocations are lazily backed by the OS, so
    /// resident memory grows as positions are written; the plan counts the full size.
    pub fn new(layout: KvLayout) -> KvCache {
        let k = (0..layout.n_layers)
            .map(|_| zeroed_f16(layout.k_elems_per_layer()))
            .collect();
        let v = (0..layout.n_layers)
            .map(|_| zeroed_f16(layout.v_elems_per_layer()))
            .collect();
        KvCache {
            layout,
            store: Store::F16 { k, v },
            len: 0,
        }
    }

    /// Allocate a cache of element type `ty` (lazily resident, like [`KvCache::new`]).
    pub fn with_type(layout: KvLayout, ty: KvType) -> Result<KvCache, KvTypeError> {
        ty.check_head_dim(layout.head_dim_k)?;
        ty.check_head_dim(layout.head_dim_v)?;
        Ok(match ty {
            KvType::F16 => KvCache::new(layout),
            KvType::Q8_0 => {
                let (kb, vb) = (
                    layout.layer_bytes(ty, layout.head_dim_k),
                    layout.layer_bytes(ty, layout.head_dim_v),
                );
                KvCache {
                    layout,
                    store: Store::Q8_0 {
                        k: (0..layout.n_layers).map(|_| vec![0u8; kb]).collect(),
                        v: (0..layout.n_layers).map(|_| vec![0u8; vb]).collect(),
                    },
                    len: 0,
                }
            }
        })
    }

    /// A cache of type `ty` whose layers live in a file, streamed through a ring of `ring`
    /// layer buffers by a background thread (`2 <= ring < n_layers`; see [`super::offload`]).
    pub fn offloaded(layout: KvLayout, ty: KvType, ring: usize) -> Result<KvCache, KvCacheError> {
        ty.check_head_dim(layout.head_dim_k)?;
        ty.check_head_dim(layout.head_dim_v)?;
        let geom = LayerGeom {
            n_kv_heads: layout.n_kv_heads,
            max_len: layout.max_len,
            row_k: ty.row_bytes(layout.head_dim_k),
            row_v: ty.row_bytes(layout.head_dim_v),
        };
        let store = OffloadStore::new(geom, layout.n_layers, ring)?;
        Ok(KvCache {
            layout,
            store: Store::Offload { ty, store },
            len: 0,
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

    /// Make `layer` readable and writable (an offloaded cache waits for its buffer; the
    /// in-RAM caches have nothing to do). Call before writing a forward pass's positions.
    pub fn begin_layer(&mut self, layer: usize) {
        if let Store::Offload { store, .. } = &mut self.store {
            store.begin_layer(layer);
        }
    }

    /// Done with `layer` for this pass, whose positions `new` were written (an offloaded
    /// cache writes them back and prefetches the layer its buffer serves next).
    pub fn end_layer(&mut self, layer: usize, new: std::ops::Range<usize>) {
        if let Store::Offload { store, .. } = &mut self.store {
            store.end_layer(layer, new);
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maximum positions.
    pub fn capacity(&self) -> usize {
        self.layout.max_len
    }

    /// Would `additional` more positions exceed the capacity?
    pub fn would_overflow(&self, additional: usize) -> bool {
        self.len
            .checked_add(additional)
            .is_none_or(|n| n > self.layout.max_len)
    }

    /// Check that `additional` positions fit.
    pub fn check_fits(&self, additional: usize) -> Result<(), KvOverflow> {
        if self.would_overflow(additional) {
            Err(KvOverflow {
                capacity: self.layout.max_len,
                current: self.len,
                requested: additional,
            })
        } else {
            Ok(())
        }
    }

    /// Commit `count` positions written by the last forward pass.
    pub fn advance(&mut self, count: usize) -> Result<(), KvOverflow> {
        self.check_fits(count)?;
        self.len += count;
        Ok(())
    }

    /// Move the cursor back to `to_len` (no-op if already shorter). Data past it becomes stale.
    pub fn rollback(&mut self, to_len: usize) {
        self.len = self.len.min(to_len);
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Store the keys and values of position `pos` for `layer`, converting to the cache's
    /// type (f16: rounded to nearest even; Q8_0: one block per 32 values, `d = amax / 127`).
    /// `k_row` is `[n_kv_heads * head_dim_k]`, `v_row` is `[n_kv_heads * head_dim_v]`.
    pub fn write(&mut self, layer: usize, pos: usize, k_row: &[f32], v_row: &[f32]) {
        let l = &self.layout;
        assert!(
            pos < l.max_len,
            "KV write at {pos} past capacity {}",
            l.max_len
        );
        let (hk, hv) = (l.head_dim_k, l.head_dim_v);
        match &mut self.store {
            Store::F16 { k, v } => {
                for h in 0..l.n_kv_heads {
                    let dst = &mut k[layer][(h * l.max_len + pos) * hk..][..hk];
                    for (d, &s) in dst.iter_mut().zip(&k_row[h * hk..(h + 1) * hk]) {
                        *d = f16::from_f32(s);
                    }
                    let dst = &mut v[layer][(h * l.max_len + pos) * hv..][..hv];
                    for (d, &s) in dst.iter_mut().zip(&v_row[h * hv..(h + 1) * hv]) {
                        *d = f16::from_f32(s);
                    }
                }
            }
            Store::Q8_0 { k, v } => {
                write_rows(
                    KvType::Q8_0,
                    l,
                    &mut k[layer],
                    &mut v[layer],
                    pos,
                    k_row,
                    v_row,
                );
            }
            Store::Offload { ty, store } => {
                let kb = store.geom().k_bytes();
                let (k, v) = store.current_mut(layer).as_mut_bytes().split_at_mut(kb);
                write_rows(*ty, l, k, v, pos, k_row, v_row);
            }
        }
    }

    /// Make this cache hold the first `n` positions of `src` (same layout and type): the keys
    /// and values are copied head by head and the cursor set to `n`. This is how a sequence
    /// reuses a prefix another sequence has already computed (prefix caching across slots).
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<(), KvOverflow> {
        assert_eq!(
            self.layout, src.layout,
            "copying between caches of another shape"
        );
        let n = n.min(src.len);
        self.len = 0;
        self.check_fits(n)?;
        let l = self.layout;
        let (hk, hv) = (l.head_dim_k, l.head_dim_v);
        match (&mut self.store, &src.store) {
            (Store::F16 { k, v }, Store::F16 { k: sk, v: sv }) => {
                copy_head_prefix(k, sk, l.n_kv_heads, l.max_len, hk, n);
                copy_head_prefix(v, sv, l.n_kv_heads, l.max_len, hv, n);
            }
            (Store::Q8_0 { k, v }, Store::Q8_0 { k: sk, v: sv }) => {
                let (rk, rv) = (KvType::Q8_0.row_bytes(hk), KvType::Q8_0.row_bytes(hv));
                copy_head_prefix(k, sk, l.n_kv_heads, l.max_len, rk, n);
                copy_head_prefix(v, sv, l.n_kv_heads, l.max_len, rv, n);
            }
            _ => panic!("copying between KV caches of different element types"),
        }
        self.len = n;
        Ok(())
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
            Store::Offload { ty, store } => {
                let (k, v) = store
                    .current(layer)
                    .as_bytes()
                    .split_at(store.geom().k_bytes());
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

    /// All of `layer`'s keys of an f16 cache, `[n_kv_heads, max_len, head_dim_k]`.
    ///
    /// # Panics
    /// On a Q8_0 cache (use [`KvCache::layer`]).
    pub fn keys(&self, layer: usize) -> &[f16] {
        match self.layer(layer) {
            KvLayer::F16 { keys, .. } => keys,
            KvLayer::Q8_0 { .. } => panic!("keys(): the KV cache is q8_0, not f16"),
        }
    }

    /// All of `layer`'s values of an f16 cache, `[n_kv_heads, max_len, head_dim_v]`.
    ///
    /// # Panics
    /// On a Q8_0 cache (use [`KvCache::layer`]).
    pub fn values(&self, layer: usize) -> &[f16] {
        match self.layer(layer) {
            KvLayer::F16 { values, .. } => values,
            KvLayer::Q8_0 { .. } => panic!("values(): the KV cache is q8_0, not f16"),
        }
    }

    /// Bytes allocated in RAM (for an offloaded cache, its ring of layer buffers).
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Offload { store, .. } => store.ram_bytes(),
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
        }
    }

    #[test]
    fn q8_0_rows_round_trip_within_half_a_step() {
        let l = layout64();
        let mut c = KvCache::with_type(l, KvType::Q8_0).unwrap();
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
            let keys = layer.keys_f16(rows.clone(), 64, &mut kb).to_vec();
            let values = layer.values_f16(rows, 32, &mut vb).to_vec();
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
            .keys_f16(0..15, 64, &mut vec![f16::ONE; 15 * 64])
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
        assert!(KvCache::with_type(odd, KvType::F16).is_ok());
        let err = KvCache::with_type(odd, KvType::Q8_0).err().unwrap();
        assert!(err.to_string().contains("divisible by 32"), "{err}");
        // Q8_0 is 34/64 of f16.
        let l = layout64();
        assert_eq!(l.bytes_as(KvType::Q8_0) * 64, l.bytes_as(KvType::F16) * 34);
        // The f16 accessors keep working for an f16 cache built either way.
        let c = KvCache::with_type(l, KvType::F16).unwrap();
        assert_eq!(c.keys(0).len(), 3 * 5 * 64);
        assert_eq!(c.bytes(), l.bytes());
    }
}
