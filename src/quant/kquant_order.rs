//! The float arithmetic of the quantized dot products, written out in plain scalar code: the
//! definition the SIMD kernels (x86 and NEON) and the scalar tier are tested against bit for
//! bit. It is the reference engine's x86 arithmetic, so kiln computes the same on every machine
//! what the reference's golden outputs were computed with, but for the orders listed below as
//! not reproduced and the x86 tiers' whole-block sums ([`t32_dot_blocks`]) over repacked Q4_0
//! and output matrices (`quant::sums_whole_blocks`).
//!
//! The integer part of every dot is exact whatever the order; what differs between the
//! reference engine's kernels is *where* the exact integer sums are turned into floats and
//! how those floats are accumulated. On x86 the reference (ggml-cpu 0.25.3 as vendored by
//! llama-cpp-python 0.3.36, which produced the golden outputs, built with AVX-512 + VNNI) runs:
//!
//! - **Q4_K** through its repacked kernels (`block_q4_Kx8`; every Q4_K matrix whose row count is
//!   a multiple of 8 is repacked at load). Activation rows are processed in groups of four by
//!   `ggml_gemm_q4_K_8x8_q8_K`, which converts and accumulates once per *pair of sub-blocks*
//!   (64 elements); the `n % 4` rows left at the end of a batch (and every decoded token) go
//!   through `ggml_gemv_q4_K_8x8_q8_K`, which does so once per super-block. Both keep the
//!   scale part and the minimum part in two separate fused-multiply-add chains and subtract
//!   them at the end: see [`q4k_dot`].
//! - **Q3_K, Q5_K and Q6_K** (not repacked on x86) through its tiled matmul (`ggml-cpu/tiled`)
//!   when a batch has at least 8 activation rows (per super-block the exact integers, times the
//!   weight's `d`, a minimum's sum fused-multiply-added with `−dmin`, then fused-multiply-added
//!   with the activation's `d`: [`k_dot_tiled`]); smaller batches use its AVX2
//!   `ggml_vec_dot_q*_K_q8_K`, which keeps 8 lanes of 4-element integer sums and fused
//!   multiply-adds per lane per super-block, reduced at the end: [`k_dot_lanes`], with each
//!   format's own handling of its offset or minimums.
//! - **The 32-element formats** through their 8-lane `vec_dot` ([`t32_dot_lanes`]).
//! - **IQ4_NL** through its repacked kernels (`block_iq4_nlx8`, every matrix whose row count is
//!   a multiple of 8, from AVX2 up), Q4_0's code over a lookup table: whole-block sums
//!   ([`t32_dot_blocks`]) for every batch size; kiln uses that order for every IQ4_NL row
//!   (the reference's plain `vec_dot`, for row counts not a multiple of 8, keeps two 8-lane
//!   accumulators instead: not reproduced).
//! - **MXFP4** as IQ4_NL (the reference repacks it into `block_mxfp4x8` and runs the same
//!   kernels with its E8M0 scales): whole-block sums, `(e_w · d_x)` fused with the block's dot.
//! - **IQ4_XS** as Q3_K: the tiled kernel from [`TILED_MIN_ROWS`] rows, its AVX2 `vec_dot`
//!   ([`k_dot_lanes`], an offset format with no offset) below.
//! - **IQ2_XXS, IQ2_XS and IQ2_S** as IQ4_XS, with `d / 8` as the weight's scale: the tiled
//!   kernel takes `d · 0.125` up front; the AVX2 `vec_dot` multiplies its reduced lanes by
//!   `0.125` at the end, the same bits (a power of two, on normal numbers).
//!
//! [`gemm_dot`] picks the right one for row `j` of a batch of `nx` activation rows.
//!
//! Not reproduced: Q4_K matrices whose row count is not a multiple of 8 (the reference does
//! not repack those and uses `ggml_vec_dot_q4_K_q8_K`; kiln uses the repacked order for every
//! Q4_K matrix); Q2_K (the reference repacks it on AVX-512; kiln takes its AVX2 `vec_dot`'s
//! order, [`k_dot_lanes`], for every batch); and Q4_0 (repacked `q4_0_8x8`; kiln sums whole
//! blocks, [`t32_dot_blocks`], as the reference's AVX2 build does). Those stay within
//! float-accumulation noise.
//! The activation quantizer is the same for all of them (`quantize_row_q8_K`; the repacked
//! path's 4-row `ggml_quantize_mat_q8_K_4x8` picks the sign of the scale differently when
//! `+amax` and `-amax` both occur, which negates both the quants and the scale: same dot).

use super::blocks::{
    cast, q3k_scales, scale_min_k4, BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K,
    BlockQ8K, RawBlock, QK_K,
};
use super::iquant::iq4_value;
use super::mxfp4::mxfp4_value;
use super::reference::{q2k_q, q3k_u, q4k_q, q5k_q, q6k_u};
use super::GgmlType;

/// Rows per batch from which the reference multiplies Q3_K, Q5_K and Q6_K through its tiled
/// kernel ([`k_dot_tiled`]).
pub const TILED_MIN_ROWS: usize = 8;

/// Sum of the activation quants of sub-block `s` (32 elements) from the per-16 `bsums`.
#[inline]
fn bsum32(y: &BlockQ8K, s: usize) -> i32 {
    y.bsums[2 * s].get() as i32 + y.bsums[2 * s + 1].get() as i32
}

/// Exact integer parts of one Q4_K super-block against one Q8_K block, per pair of sub-blocks:
/// `(Σ scale·q·y, Σ min·bsum)` for elements `64p .. 64p + 64`.
fn q4k_pairs(b: &BlockQ4K, y: &BlockQ8K) -> [(i32, i32); 4] {
    let mut out = [(0, 0); 4];
    for (p, o) in out.iter_mut().enumerate() {
        for s in [2 * p, 2 * p + 1] {
            let (sc, m) = scale_min_k4(s, &b.scales);
            let dot: i32 = (32 * s..32 * s + 32)
                .map(|i| q4k_q(b, i) * y.qs[i] as i32)
                .sum();
            o.0 += sc as i32 * dot;
            o.1 += m as i32 * bsum32(y, s);
        }
    }
    out
}

/// The reference's repacked Q4_K dot. `per_pair`: the 4-row gemm (one conversion and fused
/// multiply-add per 64 elements); otherwise the gemv (one per super-block).
pub fn q4k_dot(w: &[BlockQ4K], x: &[BlockQ8K], per_pair: bool) -> f32 {
    assert_eq!(w.len(), x.len());
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (b, y) in w.iter().zip(x) {
        let yd = y.d.to_f32();
        let dd = b.d.to_f32() * yd;
        let dm = b.dmin.to_f32() * yd;
        q4k_add(
            q4k_pairs(b, y),
            (dd, dm),
            per_pair,
            (&mut acc, &mut acc_min),
        );
    }
    acc - acc_min
}

/// [`q4k_dot`]'s float step for one super-block: its pairs' exact integers `(s, m)` into the
/// scale chain `acc.0` (times `dd = d·d_y`) and the minimum chain `acc.1` (times
/// `dm = dmin·d_y`), per pair or (`per_pair` false) summed over the super-block first.
#[inline(always)]
pub(super) fn q4k_add(
    pairs: [(i32, i32); 4],
    (dd, dm): (f32, f32),
    per_pair: bool,
    acc: (&mut f32, &mut f32),
) {
    if per_pair {
        for (s, m) in pairs {
            *acc.0 = (s as f32).mul_add(dd, *acc.0);
            *acc.1 = (m as f32).mul_add(dm, *acc.1);
        }
    } else {
        let s: i32 = pairs.iter().map(|p| p.0).sum();
        let m: i32 = pairs.iter().map(|p| p.1).sum();
        *acc.0 = (s as f32).mul_add(dd, *acc.0);
        *acc.1 = (m as f32).mul_add(dm, *acc.1);
    }
}

/// One k-quant super-block against its Q8_K partner, split as the reference's AVX2 `vec_dot`
/// splits it (and kiln's `TK` kernels, on every tier, every k-quant but Q4_K): the block is
/// quants `u` with a scale per 16 elements, and a coefficient `corr` per 16-element activation
/// sum (`bsums`) that carries the sub-block minimums (Q2_K, Q5_K) or the quants' offset (Q6_K:
/// −32; Q3_K's −4 stays inside `u`, element by element). Lane `l` holds the exact Σ scale·u·y
/// over elements `4l .. 4l + 4` of every 32-element chunk (`s`) and
/// `corr[2l]·bsum[2l] + corr[2l+1]·bsum[2l+1]` (`m`).
struct KLanes {
    /// The weight's `d`.
    d: f32,
    /// The coefficient of `m`: `−dmin` (minimum formats), or `d` (offset formats).
    dm: f32,
    /// An offset format: `s + m` is summed as integers before its conversion.
    offset: bool,
    s: [i32; 8],
    m: [i32; 8],
}

impl KLanes {
    fn new(
        (d, dm, offset): (f32, f32, bool),
        u: impl Fn(usize) -> i32,
        scale: impl Fn(usize) -> i32,
        corr: impl Fn(usize) -> i32,
        y: &BlockQ8K,
    ) -> KLanes {
        let mut s = [0i32; 8];
        for (i, &q) in y.qs.iter().enumerate() {
            s[(i % 32) / 4] += scale(i / 16) * u(i) * q as i32;
        }
        let bs = |g: usize| corr(g) * y.bsums[g].get() as i32;
        let m = core::array::from_fn(|l| bs(2 * l) + bs(2 * l + 1));
        KLanes {
            d,
            dm,
            offset,
            s,
            m,
        }
    }

    /// Super-block `b` of a row of `ty` (Q2_K, Q3_K, Q5_K or Q6_K) against `y`.
    fn of(ty: GgmlType, w: &[u8], b: usize, y: &BlockQ8K) -> KLanes {
        match ty {
            GgmlType::Q2K => {
                let k = block::<BlockQ2K>(w, b);
                let f = (k.d.to_f32(), -k.dmin.to_f32(), false);
                let sc = |g: usize| k.scales[g];
                let u = |i| q2k_q(k, i);
                KLanes::new(f, u, |g| (sc(g) & 0xF) as i32, |g| (sc(g) >> 4) as i32, y)
            }
            GgmlType::Q3K => {
                let k = block::<BlockQ3K>(w, b);
                let sc = q3k_scales(&k.scales);
                let d = k.d.to_f32();
                // The offset inside the lanes, element by element (`m` zero), as the
                // reference's `vec_dot` subtracts it.
                let q = |i| q3k_u(k, i) - 4;
                KLanes::new((d, d, true), q, |g| sc[g] as i32, |_| 0, y)
            }
            GgmlType::Q5K => {
                let k = block::<BlockQ5K>(w, b);
                let f = (k.d.to_f32(), -k.dmin.to_f32(), false);
                let sm = |g: usize| scale_min_k4(g / 2, &k.scales);
                let u = |i| q5k_q(k, i);
                KLanes::new(f, u, |g| sm(g).0 as i32, |g| sm(g).1 as i32, y)
            }
            GgmlType::Q6K => {
                let k = block::<BlockQ6K>(w, b);
                let d = k.d.to_f32();
                let sc = |g: usize| k.scales[g] as i32;
                let u = |i| q6k_u(k, i);
                KLanes::new((d, d, true), u, sc, |g| -32 * sc(g), y)
            }
            GgmlType::IQ4XS => {
                let k = block::<BlockIq4Xs>(w, b);
                let d = k.d.to_f32();
                let u = |i: usize| iq4_value(&k.qs[16 * (i / 32)..], i % 32);
                KLanes::new((d, d, true), u, |g| k.scale(g / 2), |_| 0, y)
            }
            GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S => {
                // Each element's integer weight carries its scale; `d / 8` is the float one.
                let (d, u) = super::iq2::lanes_parts(ty, w, b);
                KLanes::new((d, d, true), |i| u[i], |_| 1, |_| 0, y)
            }
            _ => panic!("{ty}: no 8-lane k-quant order"),
        }
    }
}

/// ggml's 8-lane horizontal sum (defined beside the reference dots, which `iq_order` shares).
pub use super::reference::hsum8;

/// The reference's AVX2 `ggml_vec_dot_q*_K_q8_K` for Q2_K, Q3_K, Q5_K and Q6_K (its single
/// rows): per super-block, each of the 8 integer lanes ([`KLanes`]) is converted and
/// fused-multiply-added with `d_w·d_y`, and the lanes are reduced at the end ([`hsum8`]). An
/// offset format's lane is `s + m` (Q6_K's offset through the `bsums`, Q3_K's inside `s`);
/// Q2_K fused-multiply-adds its minimums' lanes `m` (with `−dmin_w·d_y`) before `s`; Q5_K sums
/// its minimums apart, `Σ m` fused-multiply-added per super-block into one scalar added after
/// the lanes. `w` holds `x.len()` blocks of `ty`.
pub fn k_dot_lanes(ty: GgmlType, w: &[u8], x: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (b, y) in x.iter().enumerate() {
        let k = KLanes::of(ty, w, b, y);
        let yd = y.d.to_f32();
        if ty == GgmlType::Q5K {
            let m: i32 = k.m.iter().sum();
            mins = (k.dm * yd).mul_add(m as f32, mins);
        }
        for (l, a) in acc.iter_mut().enumerate() {
            match ty {
                _ if k.offset => *a = (yd * k.d).mul_add((k.s[l] + k.m[l]) as f32, *a),
                GgmlType::Q2K => {
                    *a = (k.dm * yd).mul_add(k.m[l] as f32, *a);
                    *a = (k.d * yd).mul_add(k.s[l] as f32, *a);
                }
                _ => *a = (k.d * yd).mul_add(k.s[l] as f32, *a),
            }
        }
    }
    if ty == GgmlType::Q5K {
        hsum8(acc) + mins
    } else {
        hsum8(acc)
    }
}

/// The reference's tiled kernel (`ggml-cpu/tiled`, batches of [`TILED_MIN_ROWS`] rows or more)
/// for Q3_K, Q5_K and Q6_K: per super-block the exact integers summed, `s` (with an offset
/// format's offset) times the weight's `d`, a minimum format's `m` then fused-multiply-added
/// with `−dmin` (its `fnmadd`), and the result fused-multiply-added with the activation's `d`
/// (the reference's `buf + r·d1`, which its compiler contracts). `w` holds `x.len()` blocks
/// of `ty`.
pub fn k_dot_tiled(ty: GgmlType, w: &[u8], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in x.iter().enumerate() {
        let k = KLanes::of(ty, w, b, y);
        let (s, m): (i32, i32) = (k.s.iter().sum(), k.m.iter().sum());
        let r = if k.offset {
            (s + m) as f32 * k.d
        } else {
            k.dm.mul_add(m as f32, s as f32 * k.d)
        };
        acc = r.mul_add(y.d.to_f32(), acc);
    }
    acc
}

/// Whether the reference takes `ty`'s products of a batch of `nx` rows through its tiled
/// kernel ([`k_dot_tiled`]): Q3_K, Q5_K, Q6_K, IQ4_XS and the 3- and 1-bit i-quants
/// (`iq_order`) from [`TILED_MIN_ROWS`] rows (Q2_K and Q4_K it repacks on x86 instead).
#[inline]
pub fn tiled(ty: GgmlType, nx: usize) -> bool {
    (matches!(
        ty,
        GgmlType::Q3K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::IQ4XS
            | GgmlType::IQ2XXS
            | GgmlType::IQ2XS
            | GgmlType::IQ2S
    ) || super::iq_order::handles(ty))
        && nx >= TILED_MIN_ROWS
}

/// How the reference computes row `j` of a batch of `nx` activation rows against a Q4_K matrix:
/// `true` for the 4-row gemm (per-pair accumulation), `false` for the gemv tail.
#[inline]
pub fn q4k_row_uses_gemm(nx: usize, j: usize) -> bool {
    j < nx - nx % 4
}

/// kiln's result for row `j` of a batch of `nx` activation rows against a k-quant row, on
/// every tier: the reference engine's x86 order (batch-dependent for Q3_K to Q6_K; Q2_K in its
/// AVX2 `vec_dot`'s); `None` for the other formats.
pub fn gemm_dot(ty: GgmlType, w: &[u8], x: &[u8], n: usize, nx: usize, j: usize) -> Option<f32> {
    use std::mem::size_of;
    if ty.block_size() != QK_K {
        return None;
    }
    let nb = n / QK_K;
    let xb = cast::<BlockQ8K>(&x[..nb * size_of::<BlockQ8K>()])?;
    let w = &w[..ty.row_bytes(n)?];
    Some(match ty {
        GgmlType::Q4K => {
            let wb = cast::<BlockQ4K>(w)?;
            q4k_dot(wb, xb, q4k_row_uses_gemm(nx, j))
        }
        _ if super::iq_order::handles(ty) => super::iq_order::row_dot(ty, w, xb, tiled(ty, nx))?,
        _ if tiled(ty, nx) => k_dot_tiled(ty, w, xb),
        _ => k_dot_lanes(ty, w, xb),
    })
}

/// kiln's result for row `j` of a batch of `nx` activation rows against a row of any block
/// format: [`gemm_dot`] for the k-quants, [`t32_dot_lanes`] for the 32-element formats (the
/// order of every tier's plain rows); `None` for the float formats.
pub fn row_dot(ty: GgmlType, w: &[u8], x: &[u8], n: usize, nx: usize, j: usize) -> Option<f32> {
    match ty.block_size() {
        32 if matches!(ty, GgmlType::IQ4NL | GgmlType::MXFP4) => Some(t32_dot_blocks(ty, w, x, n)),
        32 => Some(t32_dot_lanes(ty, w, x, n)),
        _ => gemm_dot(ty, w, x, n, nx, j),
    }
}

/// The reference engine's dot of a 32-element format (its AVX2 `vec_dot`, every batch size),
/// in scalar code: 8 lanes, lane `l` taking per block the exact integer dot of elements
/// `4l .. 4l + 4`, converted and fused-multiply-added with `d_w · d_x` (an f32 product of the
/// two f16 scales), then added as `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`. Q4_0, Q5_0 and
/// Q8_0 pair with Q8_0 activations and take signed quants; Q4_1 and Q5_1 pair with Q8_1, take
/// the unsigned quants and add `m_w · s_x` per block into a separate sum (fused), added after
/// the lanes. `w` and `x` hold `n / 32` blocks.
pub fn t32_dot_lanes(ty: GgmlType, w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = [0f32; 8];
    let mut ms = 0f32;
    for b in 0..n / 32 {
        let ((d, m, q), (yd, ys, yq)) = t32_block(ty, w, x, b);
        let prod = d * yd;
        for (l, a) in acc.iter_mut().enumerate() {
            let dot: i32 = (4 * l..4 * l + 4).map(|i| q[i] * i32::from(yq[i])).sum();
            *a = prod.mul_add(dot as f32, *a);
        }
        ms = m.mul_add(ys, ms);
    }
    if super::dot_type(ty) == GgmlType::Q8_1 {
        hsum8(acc) + ms
    } else {
        hsum8(acc)
    }
}

/// The AMX tier's dot of a 32-element format (`x86::amx`), in scalar code: one lane, taking
/// per block the exact integer dot of all 32 elements, converted and fused-multiply-added with
/// `d_w · d_x`; the minimum's `m_w · s_x` summed apart (fused) and added at the end, as in
/// [`t32_dot_lanes`]. An AMX tile product yields a block's whole integer dot, so this order,
/// unlike the reference's 8 lanes, is one a tile kernel can keep.
pub fn t32_dot_blocks(ty: GgmlType, w: &[u8], x: &[u8], n: usize) -> f32 {
    let (mut acc, mut ms) = (0f32, 0f32);
    for b in 0..n / 32 {
        let ((d, m, q), (yd, ys, yq)) = t32_block(ty, w, x, b);
        let dot: i32 = (0..32).map(|i| q[i] * i32::from(yq[i])).sum();
        acc = (d * yd).mul_add(dot as f32, acc);
        ms = m.mul_add(ys, ms);
    }
    if super::dot_type(ty) == GgmlType::Q8_1 {
        acc + ms
    } else {
        acc
    }
}

/// Block `b` of a row of blocks `B`.
fn block<B: RawBlock>(row: &[u8], b: usize) -> &B {
    let size = core::mem::size_of::<B>();
    &cast::<B>(&row[b * size..(b + 1) * size]).expect("whole blocks")[0]
}

/// Block `b` of a 32-element format's row pair: the weight's `(d, m, quants)` and the
/// activation's `(d, s, quants)`, scales in f32 (`m`, `s`: 0 where the format has none).
#[allow(clippy::type_complexity)]
fn t32_block(
    ty: GgmlType,
    w: &[u8],
    x: &[u8],
    b: usize,
) -> ((f32, f32, [i32; 32]), (f32, f32, [i8; 32])) {
    use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
    use super::reference::{bit5, nibble};
    let wb = match ty {
        GgmlType::Q4_0 => {
            let k = block::<BlockQ4_0>(w, b);
            let q = core::array::from_fn(|i| nibble(&k.qs, i) - 8);
            (k.d.to_f32(), 0.0, q)
        }
        GgmlType::Q4_1 => {
            let k = block::<BlockQ4_1>(w, b);
            let q = core::array::from_fn(|i| nibble(&k.qs, i));
            (k.d.to_f32(), k.m.to_f32(), q)
        }
        GgmlType::Q5_0 => {
            let k = block::<BlockQ5_0>(w, b);
            let q = core::array::from_fn(|i| (nibble(&k.qs, i) | (bit5(&k.qh, i) << 4)) - 16);
            (k.d.to_f32(), 0.0, q)
        }
        GgmlType::Q5_1 => {
            let k = block::<BlockQ5_1>(w, b);
            let q = core::array::from_fn(|i| nibble(&k.qs, i) | (bit5(&k.qh, i) << 4));
            (k.d.to_f32(), k.m.to_f32(), q)
        }
        GgmlType::Q8_0 => {
            let k = block::<BlockQ8_0>(w, b);
            (k.d.to_f32(), 0.0, k.qs.map(i32::from))
        }
        GgmlType::IQ4NL => {
            let k = block::<super::blocks::BlockIq4Nl>(w, b);
            let q = core::array::from_fn(|i| iq4_value(&k.qs, i));
            (k.d.to_f32(), 0.0, q)
        }
        GgmlType::MXFP4 => {
            let k = block::<super::blocks::BlockMxfp4>(w, b);
            let q = core::array::from_fn(|i| mxfp4_value(&k.qs, i));
            (super::blocks::e8m0_to_f32_half(k.e), 0.0, q)
        }
        _ => panic!("{ty}: not a 32-element format"),
    };
    let xb = if super::dot_type(ty) == GgmlType::Q8_1 {
        let y = block::<BlockQ8_1>(x, b);
        (y.d.to_f32(), y.s.to_f32(), y.qs)
    } else {
        let y = block::<BlockQ8_0>(x, b);
        (y.d.to_f32(), 0.0, y.qs)
    };
    (wb, xb)
}
