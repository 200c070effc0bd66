//! Grouped-query attention over the head-major f16 KV cache: causal (decoders), or
//! bidirectional over the pass's positions (encoders, [`AttnShape::causal`] off).
//!
//! # Why this arithmetic
//!
//! The kernel reproduces the reference engine's CPU flash attention (llama.cpp / ggml,
//! `ggml_compute_forward_flash_attn_ext_f16`) operation for operation, because the golden
//! outputs we are tested against come from it and small models are hypersensitive to the
//! rounding inside attention: rounding the query to f16, or keeping the weighted sum of values
//! in f16 instead of f32, moves SmolLM2-135M's logits by tenths. Exact f32/f64 attention is
//! *more* accurate but agrees *less* with the reference. The reference has two paths, picked
//! by the number of tokens in the batch:
//!
//! - **Vector path** (fewer than [`TILE_Q`] tokens: decode and short prompts). Per query row
//!   the query is rounded to f16; keys are visited in order with an online softmax whose
//!   weighted sum of values lives in an **f16** accumulator:
//!   `s = dot(q16, k)·scale`; on a new maximum the accumulator is rescaled by
//!   `expf(M_old − s)` (rounded to f16), else `vs = expf(s − M)`; then
//!   `acc = f16(acc + v·vs)` and `S = S·ms + vs`; finally `out = acc / S` (times `1/S`).
//!   The reference splits a long decode row into one chunk of keys per thread, so its bits
//!   depend on its thread count; we do not follow it there (see below).
//! - **Tiled path** (at least [`TILE_Q`] tokens: prompt batches). The query stays f32; keys
//!   come in tiles of [`KV_TILE`] aligned to multiples of 64 positions. Per tile: scores are
//!   plain f32 fused-multiply-add chains, the softmax uses the reference's polynomial `expf`
//!   with sums in f64 per tile, and the f32 accumulator takes the tile's values in one
//!   fused-multiply-add chain per element.
//! - **Long decode** (one token, padded visible length ≥ [`LONG_KV`]): the tiled arithmetic
//!   except for the scores, which are lane-split dot products over the key rows in place (the
//!   vector path's `dot`, on the f32 query) instead of chains over a transposed tile; its keys
//!   split into at most 16 chunks of whole tiles (at least 32 tiles each, or two halves of a
//!   shorter row), the chunks' results merged in order in f32. The vector path's key-by-key
//!   f16 chain cannot be spread over the cores and dominated decode at depth; this split
//!   depends on the context length only, so decode gives the same bits whatever the thread
//!   count.
//!
//! A soft cap (Gemma-2's [`AttnShape::softcap`]) enters each path where the reference's does:
//! the scaled score `s` becomes `c·tanh(s)` with the scale divided by `c`, before the mask and
//! the softmax ([`super::f16ops::ScoreScale`]).
//!
//! The primitives with their exact summation orders are in [`super::f16ops`]; the merge
//! order, the tile boundaries and the split rule are here. Every thread count and SIMD path
//! gives the same bits.
//!
//! Work is split into items that each read their keys and values once for all the query heads
//! of one kv head (GQA).

use super::f16ops::{F16Ops, KeyRun, ScoreScale, Vkq, KV_TILE};
use super::kv_type::{KvLayer, KvSide, KvType};
use super::pool::{DisjointSlice, ThreadPool};
use half::f16;

/// Shape and masking of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplier applied to q·k (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Soft cap of the scaled scores, `c·tanh(s/c)` before the mask and softmax (Gemma-2's
    /// `attn_logit_softcapping`; [`ScoreScale`]).
    pub softcap: Option<f32>,
    /// Sliding window: a query at position p sees keys at positions `> p - window`.
    pub window: Option<usize>,
    /// Causal masking: a query at position p sees keys up to p. Off (an encoder's
    /// bidirectional attention), every query of a pass sees every key up to the pass's last
    /// position, `pos0 + n_tokens - 1` (no window then).
    pub causal: bool,
    /// Positions per head of the cache (its `max_len`, the context): with `ring` unset, the
    /// rows per head of the buffers too. It picks the path (as the reference's padded cache
    /// length does), so a ring takes the same path as a full cache.
    pub kv_stride: usize,
    /// A sliding-window layer's ring: the buffers hold this many rows per head (a multiple of
    /// [`KV_TILE`], at least `window + n_tokens − 1`), position `p` at row `p mod ring`.
    pub ring: Option<usize>,
    /// Attention sinks (gpt-oss's `attn_sinks`): one learned logit per query head that joins
    /// the softmax's denominator as a key with no value, so a row's weights sum to less than 1
    /// ([`join_sink`]).
    pub sinks: Option<&'a [f32]>,
    /// ALiBi's slope per query head (Jina-BERT-v2; [`alibi_slopes`], computed once at load):
    /// each scaled score of query position `i` and key position `j` of head `h` gets
    /// `slope_h · −|i − j|` ([`alibi_bias`]). Such a layer always takes the tiled path.
    pub alibi: Option<&'a [f32]>,
}

impl AttnShape<'_> {
    /// Rows per head of the buffers.
    #[inline]
    pub fn rows(&self) -> usize {
        self.ring.unwrap_or(self.kv_stride)
    }

    /// The row of position `pos`.
    #[inline]
    pub fn row_of(&self, pos: usize) -> usize {
        match self.ring {
            Some(r) => pos % r,
            None => pos,
        }
    }
}

/// Batches of at least this many tokens take the tiled path (the reference's query tile).
pub const TILE_Q: usize = 64;
/// The reference pads the visible cache length to a multiple of this.
const KV_PAD: usize = 256;
/// A decode row whose padded visible length is at least this takes the tiled path, its keys
/// split into chunks.
pub const LONG_KV: usize = 512;
/// Most tokens per work item of the tiled path: each item converts a key tile once for its
/// `tokens × group` query rows ([`item_tokens`]).
const ITEM_TOKENS: usize = 64;
/// Fewest tokens per work item of the tiled path.
const MIN_ITEM_TOKENS: usize = 16;

/// Tokens per work item of a tiled prompt of `n_tokens` over `n_kv_heads` kv heads: as many as
/// [`ITEM_TOKENS`] (fewer conversions of each key tile), halved down to [`MIN_ITEM_TOKENS`]
/// while that leaves under four items per thread (Gemma-3's one kv head on 16 threads). A
/// row's arithmetic does not depend on the items, so neither do the bits.
fn item_tokens(n_tokens: usize, n_kv_heads: usize, n_threads: usize) -> usize {
    let mut t = ITEM_TOKENS;
    while t > MIN_ITEM_TOKENS && n_tokens.div_ceil(t) * n_kv_heads < 4 * n_threads {
        t /= 2;
    }
    t
}

/// Per-thread and partial-result buffers, sized once at load.
pub struct AttnScratch {
    /// `[n_threads][n_heads][head_dim_k]` queries rounded to f16 (vector path).
    q16: Vec<f32>,
    /// `[n_threads][n_heads][head_dim_v]` f16 accumulators, held in f32 (vector path).
    acc16: Vec<f32>,
    /// `[n_threads][head_dim_k][KV_TILE]` one key tile, transposed, in f32 (tiled path).
    kt: Vec<f32>,
    /// `[n_threads][ITEM_TOKENS · group][KV_TILE]` scores of a tile (tiled path).
    scores: Vec<f32>,
    /// `[n_threads][max(ITEM_TOKENS · group, n_heads)][2]` running max and sum (both paths).
    ms: Vec<f32>,
    /// Split decode partials, `[MAX_CHUNKS][n_heads][2 + head_dim_v]` (max, sum, f32
    /// accumulator).
    partial: Vec<f32>,
    /// `[n_threads][KV_TILE][head_dim_k]` keys of a quantized cache, dequantized to f16
    /// (empty for an f16 cache, which is read in place).
    kq: Vec<f16>,
    /// `[n_threads][KV_TILE][head_dim_v]` values likewise.
    vq: Vec<f16>,
    group: usize,
    n_threads: usize,
    head_dim_k: usize,
    head_dim_v: usize,
}

impl AttnScratch {
    /// Buffers for `n_threads` threads (any batch size) over an f16 cache.
    pub fn new(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        n_threads: usize,
    ) -> Self {
        Self::with_kv(
            n_heads,
            n_kv_heads,
            head_dim_k,
            head_dim_v,
            n_threads,
            KvType::F16,
        )
    }

    /// Buffers for `n_threads` threads over a cache of type `kv`.
    pub fn with_kv(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        n_threads: usize,
        kv: KvType,
    ) -> Self {
        let l = Layout::new(n_heads, n_kv_heads, head_dim_k, head_dim_v, n_threads, kv);
        AttnScratch {
            kq: vec![f16::ZERO; l.kq],
            vq: vec![f16::ZERO; l.vq],
            q16: vec![0.0; l.q16],
            acc16: vec![0.0; l.acc16],
            kt: vec![0.0; l.kt],
            scores: vec![0.0; l.scores],
            ms: vec![0.0; l.ms],
            partial: vec![0.0; l.partial],
            group: l.group,
            n_threads,
            head_dim_k,
            head_dim_v,
        }
    }

    /// Bytes held (for the memory plan).
    pub fn bytes(&self) -> usize {
        (self.q16.len()
            + self.acc16.len()
            + self.kt.len()
            + self.scores.len()
            + self.ms.len()
            + self.partial.len())
            * 4
            + (self.kq.len() + self.vq.len()) * 2
    }

    /// The bytes `new` would allocate, without allocating.
    pub fn bytes_for(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        n_threads: usize,
    ) -> usize {
        Self::bytes_for_kv(
            n_heads,
            n_kv_heads,
            head_dim_k,
            head_dim_v,
            n_threads,
            KvType::F16,
        )
    }

    /// The bytes `with_kv` would allocate, without allocating.
    pub fn bytes_for_kv(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        n_threads: usize,
        kv: KvType,
    ) -> usize {
        let l = Layout::new(n_heads, n_kv_heads, head_dim_k, head_dim_v, n_threads, kv);
        (l.q16 + l.acc16 + l.kt + l.scores + l.ms + l.partial) * 4 + (l.kq + l.vq) * 2
    }
}

/// Whether a context of `end` positions is short: the reference's padded visible length is
/// under [`LONG_KV`].
fn is_short(kv_stride: usize, end: usize) -> bool {
    let n_kv = end
        .next_multiple_of(KV_PAD)
        .min(kv_stride.next_multiple_of(KV_PAD));
    n_kv < LONG_KV
}

/// Whether a decode token at position `pos0` is cheap enough to run on one thread (a short
/// context: [`SoloAttention`] batches such rows). Every path gives the same bits whatever the
/// thread count, so this is a question of speed only.
pub fn decode_is_short(kv_stride: usize, pos0: usize) -> bool {
    is_short(kv_stride, pos0 + 1)
}

/// Attention for many short decode rows at once: each sequence's attention runs on one thread
/// with its own scratch, the sequences spread over the pool (one dispatch instead of one per
/// sequence). The bits equal a single-sequence decode's, since no path depends on the thread
/// count.
pub struct SoloAttention {
    /// A pool of one (runs inline).
    solo: ThreadPool,
    /// One single-thread scratch per thread of the outer pool.
    scratch: Vec<AttnScratch>,
}

impl SoloAttention {
    pub fn new(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        n_threads: usize,
        kv: KvType,
    ) -> Self {
        SoloAttention {
            solo: ThreadPool::new(1),
            scratch: (0..n_threads.max(1))
                .map(|_| AttnScratch::with_kv(n_heads, n_kv_heads, head_dim_k, head_dim_v, 1, kv))
                .collect(),
        }
    }

    /// `out` rows of sequence `i < n` = attention of its query row over `seq(i) = (layer,
    /// pos0)`; `q` and `out` hold one row per sequence. (A function rather than a list of the
    /// layers, so a decode step allocates nothing.)
    #[allow(clippy::too_many_arguments)]
    pub fn run<'a>(
        &mut self,
        pool: &ThreadPool,
        ops: &F16Ops,
        shape: &AttnShape,
        q: &[f32],
        n: usize,
        seq: &(dyn Fn(usize) -> (KvLayer<'a>, usize) + Sync),
        out: &mut [f32],
    ) {
        assert!(self.scratch.len() >= pool.n_threads());
        let (qd, od) = (
            shape.n_heads * shape.head_dim_k,
            shape.n_heads * shape.head_dim_v,
        );
        let outs = DisjointSlice::new(&mut out[..n * od]);
        let scr = DisjointSlice::new(&mut self.scratch[..]);
        let solo = &self.solo;
        pool.run_items(n, &|tid, i| {
            let (kv, pos0) = seq(i);
            // SAFETY: thread `tid` alone uses scratch `tid`; sequence `i` owns output row `i`.
            let (scratch, o) = unsafe {
                (
                    &mut scr.part(tid..tid + 1)[0],
                    outs.part(i * od..(i + 1) * od),
                )
            };
            attention_kv(
                solo,
                ops,
                shape,
                &q[i * qd..(i + 1) * qd],
                1,
                pos0,
                kv,
                o,
                scratch,
            );
        });
    }
}

/// Per-thread buffers a quantized cache is dequantized into, a tile at a time (empty parts for
/// an f16 cache, which is read in place).
struct DequantBufs<'s> {
    k: DisjointSlice<'s, f16>,
    v: DisjointSlice<'s, f16>,
    nk: usize,
    nv: usize,
}

impl<'s> DequantBufs<'s> {
    fn new(kq: &'s mut [f16], vq: &'s mut [f16], quantized: bool, hdk: usize, hdv: usize) -> Self {
        let (nk, nv) = if quantized {
            (KV_TILE * hdk, KV_TILE * hdv)
        } else {
            (0, 0)
        };
        DequantBufs {
            k: DisjointSlice::new(kq),
            v: DisjointSlice::new(vq),
            nk,
            nv,
        }
    }

    /// Thread `tid`'s key and value tiles.
    ///
    /// # Safety
    /// At most one caller per `tid` at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part(&self, tid: usize) -> (&mut [f16], &mut [f16]) {
        // SAFETY: parts of distinct threads are disjoint; the caller guarantees one user each.
        unsafe {
            (
                self.k.part(tid * self.nk..(tid + 1) * self.nk),
                self.v.part(tid * self.nv..(tid + 1) * self.nv),
            )
        }
    }
}

/// Element counts of the scratch buffers.
struct Layout {
    group: usize,
    q16: usize,
    acc16: usize,
    kt: usize,
    scores: usize,
    ms: usize,
    partial: usize,
    kq: usize,
    vq: usize,
}

impl Layout {
    fn new(
        n_heads: usize,
        n_kv_heads: usize,
        hdk: usize,
        hdv: usize,
        n_threads: usize,
        kv: KvType,
    ) -> Layout {
        let group = n_heads / n_kv_heads.max(1);
        let nt = n_threads.max(1);
        let rows = ITEM_TOKENS * group;
        Layout {
            group,
            q16: nt * n_heads * hdk,
            acc16: nt * n_heads * hdv,
            kt: nt * hdk * KV_TILE,
            scores: nt * rows * KV_TILE,
            ms: nt * rows.max(n_heads) * 2,
            partial: MAX_CHUNKS * n_heads * (2 + hdv),
            kq: if kv == KvType::F16 {
                0
            } else {
                nt * KV_TILE * hdk
            },
            vq: if kv == KvType::F16 {
                0
            } else {
                nt * KV_TILE * hdv
            },
        }
    }
}

/// Attention for `n_tokens` queries at positions `pos0..pos0+n_tokens`.
///
/// - `q`: `[n_tokens, n_heads * head_dim_k]` (RoPE applied, f32)
/// - `keys`/`values`: one layer of the cache, `[n_kv_heads, rows, head_dim]` (`rows`: `kv_stride`,
///   or the ring's), holding every position a query sees
/// - `out`: `[n_tokens, n_heads * head_dim_v]`
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    ops: &F16Ops,
    shape: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    keys: &[f16],
    values: &[f16],
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    attention_kv(
        pool,
        ops,
        shape,
        q,
        n_tokens,
        pos0,
        KvLayer::F16 { keys, values },
        out,
        scratch,
    )
}

/// [`attention`] over one layer of a cache of any type. A quantized layer is dequantized to
/// f16 one tile of [`KV_TILE`] positions at a time into per-thread buffers, then takes exactly
/// the f16 path's arithmetic.
#[allow(clippy::too_many_arguments)]
pub fn attention_kv(
    pool: &ThreadPool,
    ops: &F16Ops,
    shape: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    kv: KvLayer<'_>,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let s = *shape;
    let group = s.n_heads / s.n_kv_heads;
    assert_eq!(
        group, scratch.group,
        "attention scratch built for another head layout"
    );
    assert!(scratch.n_threads >= pool.n_threads());
    assert_eq!(
        (scratch.head_dim_k, scratch.head_dim_v),
        (s.head_dim_k, s.head_dim_v)
    );
    assert!(q.len() >= n_tokens * s.n_heads * s.head_dim_k);
    assert!(out.len() >= n_tokens * s.n_heads * s.head_dim_v);
    assert!(pos0 + n_tokens <= s.kv_stride);
    assert!(kv.holds(s.n_kv_heads * s.rows(), s.head_dim_k, s.head_dim_v));
    assert!(
        s.causal || s.window.is_none(),
        "bidirectional attention has no window"
    );
    assert!(
        s.sinks.is_none_or(|k| k.len() >= s.n_heads),
        "one attention sink per query head"
    );
    assert!(
        s.alibi.is_none_or(|k| k.len() >= s.n_heads),
        "one ALiBi slope per query head"
    );
    if let Some(r) = s.ring {
        // Every position a query of the pass sees is still in the ring, and no tile of 64
        // positions wraps.
        let w = s.window.expect("a ring only serves a sliding window");
        assert!(
            r.is_multiple_of(KV_TILE) && r + 1 >= w + n_tokens,
            "ring of {r} rows"
        );
    }
    assert!(
        kv.ty() == KvType::F16
            || (scratch.kq.len() >= scratch.n_threads * KV_TILE * s.head_dim_k
                && scratch.vq.len() >= scratch.n_threads * KV_TILE * s.head_dim_v),
        "attention scratch built for an f16 cache"
    );
    let out = &mut out[..n_tokens * s.n_heads * s.head_dim_v];
    if n_tokens >= TILE_Q
        || s.alibi.is_some()
        || (n_tokens == 1 && !is_short(s.kv_stride, pos0 + 1))
    {
        tiled(pool, ops, &s, q, n_tokens, pos0, kv, out, scratch);
    } else {
        vector(pool, ops, &s, q, n_tokens, pos0, kv, out, scratch);
    }
}

/// Joins a head's attention sink `sink` to its row once every key is in: `m` and `sum` are the
/// row's running maximum and sum of exponentials, `acc` its unnormalized weighted values
/// (f32). As the reference engine does after its last key (`ggml_compute_forward_flash_attn_ext`'s
/// "sinks" step): a sink above the maximum rescales the values by `expf(m − sink)` and the sum
/// becomes `sum·ms + 1` (one fused multiply-add, as its compiled `S = S*ms + vs` is); else the
/// sum takes `expf(sink − m)`.
#[inline]
pub(crate) fn join_sink(sink: f32, m: f32, sum: &mut f32, acc: &mut [f32]) {
    if sink > m {
        let ms = (m - sink).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        *sum = sum.mul_add(ms, 1.0);
    } else {
        *sum = sum.mul_add(1.0, (sink - m).exp());
    }
}

/// ALiBi's slope of query head `h` of `n_heads` with maximum bias `max_bias`, as the
/// reference's softmax and flash attention compute it: `m0 = 2^(−max_bias/n)`,
/// `m1 = 2^(−max_bias/2/n)` with `n` the largest power of two at most `n_heads`; head `h < n`
/// gets `m0^(h+1)`, the others `m1^(2(h−n)+1)`.
pub fn alibi_slope(max_bias: f32, n_heads: usize, h: usize) -> f32 {
    let n = 1usize << n_heads.max(1).ilog2();
    let m0 = 2f32.powf(-max_bias / n as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n as f32);
    if h < n {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n) as i32 + 1)
    }
}

/// ALiBi's slopes of the `n_heads` query heads ([`alibi_slope`]), for [`AttnShape::alibi`].
pub fn alibi_slopes(max_bias: f32, n_heads: usize) -> Vec<f32> {
    (0..n_heads)
        .map(|h| alibi_slope(max_bias, n_heads, h))
        .collect()
}

/// Adds ALiBi's bias to the scaled scores `sc[lo..hi]` of a key tile starting at position
/// `c0`, for the query at position `p` and a head of slope `slope`: `slope · −|p − j|` with the
/// distance rounded to f16 (the reference's mask holds it in f16), then returns the new
/// maximum of the visible scores.
pub fn alibi_bias(sc: &mut [f32], slope: f32, p: usize, c0: usize, lo: usize, hi: usize) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for (i, x) in sc.iter_mut().enumerate().take(hi).skip(lo) {
        let d = f16::from_f32(-(p.abs_diff(c0 + i) as f32)).to_f32();
        *x += slope * d;
        if *x > m {
            m = *x;
        }
    }
    m
}

/// Visible key positions of the query at position `p` of a pass whose last position is
/// `end - 1`.
fn visible(s: &AttnShape, p: usize, end: usize) -> std::ops::Range<usize> {
    if !s.causal {
        return 0..end;
    }
    s.window.map_or(0, |w| (p + 1).saturating_sub(w))..p + 1
}

/// The vector path: one online softmax per query row with an f16 accumulator; a long decode
/// is split into one chunk of positions per thread.
#[allow(clippy::too_many_arguments)]
fn vector(
    pool: &ThreadPool,
    ops: &F16Ops,
    s: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    kv: KvLayer<'_>,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let (group, hdk, hdv) = (scratch.group, s.head_dim_k, s.head_dim_v);
    let sc = ScoreScale::new(s.scale, s.softcap);
    // Items: (token, kv head), each streaming its keys once for the heads of its group; when
    // that leaves threads idle (decode), one item per head instead (rows are independent, so
    // the bits do not change). Single-threaded, one item runs every kv head, the heads'
    // independent chains interleaved key by key. (A quantized cache is dequantized one head's
    // tile at a time: one stream.)
    let quantized = kv.ty() != KvType::F16;
    let streams = if !quantized && n_tokens == 1 && pool.n_threads() == 1 {
        s.n_kv_heads
    } else {
        1
    };
    let base_items = n_tokens * s.n_kv_heads / streams;
    let heads_per_item = if streams == 1 && base_items < 2 * pool.n_threads() {
        1
    } else {
        group
    };
    let subs = group / heads_per_item;
    let n_items = base_items * subs;
    let item_heads = streams * heads_per_item;

    let outs = DisjointSlice::new(out);
    let q16s = DisjointSlice::new(&mut scratch.q16);
    let accs = DisjointSlice::new(&mut scratch.acc16);
    let mss = DisjointSlice::new(&mut scratch.ms);
    let deq = DequantBufs::new(&mut scratch.kq, &mut scratch.vq, quantized, hdk, hdv);
    pool.run_items(n_items, &|tid, item| {
        let (nq, na, nm) = (
            s.n_heads * hdk,
            s.n_heads * hdv,
            (ITEM_TOKENS * group).max(s.n_heads) * 2,
        );
        // SAFETY: thread `tid` is the only user of part `tid` of each per-thread buffer.
        let (q16, acc, ms) = unsafe {
            (
                &mut q16s.part(tid * nq..(tid + 1) * nq)[..item_heads * hdk],
                &mut accs.part(tid * na..(tid + 1) * na)[..item_heads * hdv],
                &mut mss.part(tid * nm..(tid + 1) * nm)[..2 * item_heads],
            )
        };
        // SAFETY: thread `tid` is the only user of its part.
        let (kbuf, vbuf) = unsafe { deq.part(tid) };
        let sub = item % subs;
        let kv_items = s.n_kv_heads / streams;
        // The first kv head of the item (streams > 1: every kv head, so 0).
        let kvh = (item / subs) % kv_items;
        let t = item / (subs * kv_items);
        let vis = visible(s, pos0 + t, pos0 + n_tokens);
        let (lo, hi) = (vis.start, vis.end);
        // Query heads h0..h0+item_heads: of kv head `kvh`, or of every kv head (streams).
        let h0 = kvh * group + sub * heads_per_item;
        let qrow = &q[(t * s.n_heads + h0) * hdk..][..item_heads * hdk];
        for (d, &x) in q16.iter_mut().zip(qrow) {
            *d = f16::from_f32(x).to_f32();
        }
        acc.fill(0.0);
        for m in ms.chunks_exact_mut(2) {
            m[0] = f32::NEG_INFINITY;
            m[1] = 0.0;
        }
        match kv {
            KvLayer::F16 { keys, values } => {
                // One run of keys, or two where a ring wraps: the online softmax visits keys
                // in order either way, so the split changes no bits.
                let rows = s.rows();
                let mut a = lo;
                while a < hi {
                    let r = s.row_of(a);
                    let b = hi.min(a + (rows - r));
                    let run = KeyRun {
                        keys: &keys[(kvh * rows + r) * hdk..],
                        values: &values[(kvh * rows + r) * hdv..],
                        n: b - a,
                        streams,
                        k_stride: rows,
                        v_stride: rows,
                    };
                    (ops.vec_keys)(q16, run, sc, ms, acc);
                    a = b;
                }
            }
            _ => {
                // A tile at a time (cut where a ring wraps): the online softmax visits keys in
                // order either way, so the split changes no bits.
                let rows = s.rows();
                let head0 = kvh * rows;
                let mut a = lo;
                while a < hi {
                    let r = s.row_of(a);
                    let b = hi.min(a + KV_TILE).min(a + (rows - r));
                    let row0 = head0 + r;
                    let keys = kv.rows_f16(KvSide::Keys, row0..row0 + (b - a), hdk, kbuf);
                    let values = kv.rows_f16(KvSide::Values, row0..row0 + (b - a), hdv, vbuf);
                    (ops.vec_keys)(q16, KeyRun::single(keys, values, b - a), sc, ms, acc);
                    a = b;
                }
            }
        }
        let a = (t * s.n_heads + h0) * hdv;
        // SAFETY: item (t, heads h0..) owns these output rows.
        let o = unsafe { outs.part(a..a + item_heads * hdv) };
        for (j, ((o, a), st)) in o
            .chunks_exact_mut(hdv)
            .zip(acc.chunks_exact_mut(hdv))
            .zip(ms.chunks_exact_mut(2))
            .enumerate()
        {
            if let Some(sinks) = s.sinks {
                // (The item's query heads are `h0..h0 + item_heads`, streamed or not.)
                join_sink(sinks[h0 + j], st[0], &mut st[1], a);
            }
            let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
            for (o, a) in o.iter_mut().zip(a.iter()) {
                *o = a * inv;
            }
        }
    });
}

/// Chunks of keys a long decode row is split into (at most), for the pool to share out.
const MAX_CHUNKS: usize = 16;
/// Key tiles per chunk, at least (2048 positions), unless that leaves a single chunk: long
/// streams read the cache fastest (measured: 4 tiles gave SmolLM2 133 tok/s at depth 4096, 16
/// gave 143-153, 32 gave 160), but a shorter row (a sliding window of 512) is still split in
/// two halves, so each thread reads half its keys (Gemma-3's 15 windowed layers at depth 4096:
/// 0.61 → 0.40 ms per token, against both threads reading every key for half the heads).
const MIN_CHUNK_TILES: usize = 32;

/// How the tiled path splits the keys of a decode row: `(chunks, tiles per chunk)`, a
/// function of the visible tiles only (never of the thread count), so every thread count
/// gives the same bits.
fn decode_chunks(s: &AttnShape, pos0: usize, n_tokens: usize) -> (usize, usize) {
    if n_tokens != 1 {
        return (1, usize::MAX);
    }
    let first = visible(s, pos0, pos0 + 1).start / KV_TILE;
    let n_tiles = (pos0 + 1).div_ceil(KV_TILE) - first;
    let per = chunk_tiles(n_tiles);
    (n_tiles.div_ceil(per), per)
}

/// Tiles per chunk of a long decode row of `n_tiles` visible tiles: at most [`MAX_CHUNKS`]
/// chunks of at least [`MIN_CHUNK_TILES`], or two halves of a row too short for two.
fn chunk_tiles(n_tiles: usize) -> usize {
    n_tiles
        .div_ceil(MAX_CHUNKS)
        .max(MIN_CHUNK_TILES.min(n_tiles.div_ceil(2)))
}

/// The tiled path: f32 queries, key tiles of [`KV_TILE`] aligned to multiples of 64
/// positions, an f32 accumulator per query row.
///
/// Items are (block of [`item_tokens`] tokens, kv head, chunk); each converts a key tile once
/// for all its query rows. A decode row over a long context is split into chunks of whole
/// tiles ([`decode_chunks`]), each chunk's unnormalized result (max, sum, accumulator) kept in
/// `scratch.partial`, and the chunks merged in order in f32.
#[allow(clippy::too_many_arguments)]
fn tiled(
    pool: &ThreadPool,
    ops: &F16Ops,
    s: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    kv: KvLayer<'_>,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let (group, hdk, hdv) = (scratch.group, s.head_dim_k, s.head_dim_v);
    let score = ScoreScale::new(s.scale, s.softcap);
    let rows_max = ITEM_TOKENS * group;
    let block = item_tokens(n_tokens, s.n_kv_heads, pool.n_threads());
    let n_blocks = n_tokens.div_ceil(block);
    let (n_chunks, chunk_tiles) = decode_chunks(s, pos0, n_tokens);
    // Only a long decode row comes here with one token.
    let decode = n_tokens == 1;
    // A decode with fewer (kv head, chunk) items than threads splits each group's query heads
    // over several items (`subs`, a divisor of the group; each head's arithmetic is its own, so
    // the bits do not change).
    let base = s.n_kv_heads * n_chunks;
    let subs = if decode {
        (1..=group)
            .filter(|d| group.is_multiple_of(*d))
            .find(|d| base * d >= pool.n_threads())
            .unwrap_or(group)
    } else {
        1
    };
    let hpi = group / subs;
    let n_items = n_blocks * base * subs;
    // Accumulator rows: the output rows (`hdv` apart), or, split, rows of `partial` laid out
    // `[chunk][head][max, sum, acc..]`.
    let pstride = 2 + hdv;
    let (split, acc_stride, acc_off) = if n_chunks > 1 {
        (true, pstride, 2)
    } else {
        (false, hdv, 0)
    };
    assert!(n_chunks <= MAX_CHUNKS);

    let outs = DisjointSlice::new(out);
    let partial = DisjointSlice::new(&mut scratch.partial[..n_chunks * s.n_heads * pstride]);
    let kts = DisjointSlice::new(&mut scratch.kt);
    let scs = DisjointSlice::new(&mut scratch.scores);
    let mss = DisjointSlice::new(&mut scratch.ms);
    let quantized = kv.ty() != KvType::F16;
    let deq = DequantBufs::new(&mut scratch.kq, &mut scratch.vq, quantized, hdk, hdv);
    pool.run_items(n_items, &|tid, item| {
        let (nk, ns, nm) = (hdk * KV_TILE, rows_max * KV_TILE, rows_max * 2);
        // SAFETY: thread `tid` is the only user of part `tid` of each per-thread buffer.
        let (kt, scores, ms) = unsafe {
            (
                kts.part(tid * nk..(tid + 1) * nk),
                scs.part(tid * ns..(tid + 1) * ns),
                mss.part(tid * nm..(tid + 1) * nm),
            )
        };
        // SAFETY: thread `tid` is the only user of its part.
        let (kbuf, vbuf) = unsafe { deq.part(tid) };
        // Later token blocks see more keys: hand out the most expensive items first, so the
        // last items taken are the short ones and the threads finish together.
        let item = n_items - 1 - item;
        let sub = item % subs;
        let chunk = (item / subs) % n_chunks;
        let kvh = (item / (subs * n_chunks)) % s.n_kv_heads;
        let t0 = (item / (subs * base)) * block;
        let t1 = (t0 + block).min(n_tokens);
        let h0 = kvh * group + sub * hpi;
        // Accumulator rows of the item, tokens t0..t1 × heads h0..h0+hpi.
        let mut o_rows: [&mut [f32]; ITEM_TOKENS] = std::array::from_fn(|_| &mut [][..]);
        for t in t0..t1 {
            let rows = if split {
                let a = (chunk * s.n_heads + h0) * pstride;
                // SAFETY: item (kvh, chunk, sub) owns these partial rows (split: one token).
                unsafe { partial.part(a..a + hpi * pstride) }
            } else {
                let a = (t * s.n_heads + h0) * hdv;
                // SAFETY: item (block, kvh, sub) owns these rows; disjoint across items.
                unsafe { outs.part(a..a + hpi * hdv) }
            };
            rows.fill(0.0);
            o_rows[t - t0] = rows;
        }
        for m in ms.chunks_exact_mut(2) {
            m[0] = f32::NEG_INFINITY;
            m[1] = 0.0;
        }
        let head0 = kvh * s.rows();
        let first = visible(s, pos0 + t0, pos0 + n_tokens).start / KV_TILE;
        // One past the last visible key of the item.
        let end = if s.causal { pos0 + t1 } else { pos0 + n_tokens };
        let tiles = if split {
            let a = first + chunk * chunk_tiles;
            a..(a + chunk_tiles).min(end.div_ceil(KV_TILE))
        } else {
            first..end.div_ceil(KV_TILE)
        };
        for tile in tiles {
            let c0 = tile * KV_TILE;
            let c1 = (c0 + KV_TILE).min(end);
            // A tile starts at a multiple of 64, so it never wraps in a ring.
            let rows = head0 + s.row_of(c0)..head0 + s.row_of(c0) + (c1 - c0);
            let ktile = kv.rows_f16(KvSide::Keys, rows.clone(), hdk, &mut *kbuf);
            if !decode {
                // Prompt rows: the keys transposed to [d][key] in f32, shared by every row.
                (ops.key_tile)(ktile, kt);
            }
            let vtile = kv.rows_f16(KvSide::Values, rows, hdv, &mut *vbuf);
            for t in t0..t1 {
                let vis = visible(s, pos0 + t, end);
                let (lo, hi) = (vis.start.max(c0), vis.end.min(c0 + KV_TILE));
                if lo >= hi {
                    continue; // every key of the tile masked for this row
                }
                let r0 = (t - t0) * hpi;
                let sc_rows = &mut scores[r0 * KV_TILE..(r0 + hpi) * KV_TILE];
                let q_rows = &q[(t * s.n_heads + h0) * hdk..][..hpi * hdk];
                if decode {
                    // A decode row: dot products over the key rows in place.
                    (ops.kq_rows)(q_rows, hpi, ktile, sc_rows);
                } else {
                    (ops.kq_tile)(q_rows, kt, sc_rows);
                }
                for j in 0..hpi {
                    let r = r0 + j;
                    let sc: &mut [f32; KV_TILE] = (&mut sc_rows[j * KV_TILE..(j + 1) * KV_TILE])
                        .try_into()
                        .expect("tile row");
                    let mut tile_max = (ops.scale_max)(sc, score, lo - c0, hi - c0);
                    if let Some(slopes) = s.alibi {
                        tile_max = alibi_bias(sc, slopes[h0 + j], pos0 + t, c0, lo - c0, hi - c0);
                    }
                    let acc = &mut o_rows[t - t0]
                        [j * acc_stride + acc_off..j * acc_stride + acc_off + hdv];
                    let (m_old, mut sum) = (ms[2 * r], ms[2 * r + 1]);
                    let m_new = m_old.max(tile_max);
                    if m_new > m_old {
                        let rescale = (m_old - m_new).exp();
                        acc.iter_mut().for_each(|a| *a *= rescale);
                        sum *= rescale;
                    }
                    ms[2 * r] = m_new;
                    let tile_sum = (ops.softmax_tile)(sc, m_new);
                    ms[2 * r + 1] = (sum as f64 + tile_sum) as f32;
                }
                // Every head of the group takes the tile's values in one pass.
                let acc = (&mut o_rows[t - t0][acc_off..], acc_stride);
                let v = (&vtile[(lo - c0) * hdv..(hi - c0) * hdv], hdv);
                (ops.vkq_multi)(Vkq::new(acc, (&sc_rows[lo - c0..], KV_TILE), hpi, v));
            }
        }
        for t in t0..t1 {
            for j in 0..hpi {
                let r = (t - t0) * hpi + j;
                let row = &mut o_rows[t - t0][j * acc_stride..(j + 1) * acc_stride];
                if split {
                    row[0] = ms[2 * r];
                    row[1] = ms[2 * r + 1];
                } else {
                    let mut sum = ms[2 * r + 1];
                    if let Some(sinks) = s.sinks {
                        join_sink(sinks[h0 + j], ms[2 * r], &mut sum, row);
                    }
                    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                    row.iter_mut().for_each(|a| *a *= inv);
                }
            }
        }
    });
    if split {
        merge_chunks(&scratch.partial, n_chunks, s.n_heads, hdv, s.sinks, out);
    }
}

/// Merge the chunks of a split decode row, in chunk order, in f32: `partial` holds
/// `[chunk][head][max, sum, acc..]`, `out` gets one normalized row per head (its sink, if
/// any, joined after the last chunk, as after the last key of an unsplit row).
fn merge_chunks(
    partial: &[f32],
    n_chunks: usize,
    n_heads: usize,
    hdv: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let pstride = 2 + hdv;
    for h in 0..n_heads {
        let o = &mut out[h * hdv..][..hdv];
        o.fill(0.0);
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for chunk in 0..n_chunks {
            let r = &partial[(chunk * n_heads + h) * pstride..][..pstride];
            if r[1] == 0.0 {
                continue;
            }
            let m_new = m.max(r[0]);
            let (s_old, s_new) = ((m - m_new).exp(), (r[0] - m_new).exp());
            for (a, &b) in o.iter_mut().zip(&r[2..]) {
                *a = *a * s_old + b * s_new;
            }
            sum = sum * s_old + r[1] * s_new;
            m = m_new;
        }
        if let Some(sinks) = sinks {
            join_sink(sinks[h], m, &mut sum, o);
        }
        if sum != 0.0 {
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|a| *a *= inv);
        }
    }
}

#[cfg(test)]
mod tests;
