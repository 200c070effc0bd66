//! The reference engine's float arithmetic for Q4_K and Q6_K dot products (and, in
//! [`t32_dot_lanes`], for the 32-element formats), written out in plain scalar code: the definition the
//! SIMD kernels are tested against bit for bit.
//!
//! The integer part of every k-quant dot is exact whatever the order; what differs between
//! the reference engine's kernels is *where* the exact integer sums are turned into floats and
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
//! - **Q6_K** (not repacked on x86) through its "tiled" matmul when a batch has at least 8
//!   activation rows (one exact integer per super-block, scaled by the weight's `d`, then
//!   fused-multiply-added with the activation's `d`: [`q6k_dot_tiled`]); smaller batches use
//!   `ggml_vec_dot_q6_K_q8_K`, whose AVX2 code keeps 8 lanes of 4-element integer sums and one
//!   fused multiply-add per lane per super-block, reduced at the end: [`q6k_dot_lanes`].
//!
//! [`gemm_dot`] picks the right one for row `j` of a batch of `nx` activation rows.
//!
//! Not reproduced: Q4_K matrices whose row count is not a multiple of 8 (the reference does
//! not repack those and uses `ggml_vec_dot_q4_K_q8_K`; kiln uses the repacked order for every
//! Q4_K matrix), the other k-quants (Q2_K is repacked on AVX-512, Q3_K/Q5_K go through the
//! tiled kernel), and Q4_0 (repacked `q4_0_8x8`). Those stay within float-accumulation noise.
//! The activation quantizer is the same for all of them (`quantize_row_q8_K`; the repacked
//! path's 4-row `ggml_quantize_mat_q8_K_4x8` picks the sign of the scale differently when
//! `+amax` and `-amax` both occur, which negates both the quants and the scale: same dot).

use super::blocks::{scale_min_k4, BlockQ4K, BlockQ6K, BlockQ8K, QK_K};
use super::GgmlType;

/// Rows per batch from which the reference multiplies Q6_K through its tiled kernel.
pub const Q6K_TILED_MIN_ROWS: usize = 8;

/// Q4_K element i: nibble of `qs[32*(i/64) + i%32]`, low for the first 32 of each 64.
#[inline]
fn q4k_q(b: &BlockQ4K, i: usize) -> i32 {
    let byte = b.qs[32 * (i / 64) + i % 32];
    (if (i % 64) < 32 { byte & 0xF } else { byte >> 4 }) as i32
}

/// Q6_K element i as an unsigned 0..64 value (signed value + 32).
#[inline]
fn q6k_u(b: &BlockQ6K, i: usize) -> i32 {
    let (half, r) = (i / 128, i % 128);
    let (c, l) = (r / 32, r % 32);
    let ql = b.ql[64 * half + 32 * (c % 2) + l];
    let low = if c < 2 { ql & 0xF } else { ql >> 4 };
    let high = (b.qh[32 * half + l] >> (2 * c)) & 3;
    (low | (high << 4)) as i32
}

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
        let pairs = q4k_pairs(b, y);
        if per_pair {
            for (s, m) in pairs {
                acc = (s as f32).mul_add(dd, acc);
                acc_min = (m as f32).mul_add(dm, acc_min);
            }
        } else {
            let s: i32 = pairs.iter().map(|p| p.0).sum();
            let m: i32 = pairs.iter().map(|p| p.1).sum();
            acc = (s as f32).mul_add(dd, acc);
            acc_min = (m as f32).mul_add(dm, acc_min);
        }
    }
    acc - acc_min
}

/// Exact integer Σ scale·(q-32)·y of one Q6_K super-block, split into ggml's 8 AVX2 lanes:
/// lane `l` holds elements `4(l%4)+(l/4)*16 .. +4` of every 32-element chunk (scale-weighted),
/// minus `32·(bsum[2l]·scale[2l] + bsum[2l+1]·scale[2l+1])`.
fn q6k_lanes(b: &BlockQ6K, y: &BlockQ8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (l, lane) in lanes.iter_mut().enumerate() {
        for c in 0..8 {
            for e in 4 * l..4 * l + 4 {
                let i = 32 * c + e;
                *lane += b.scales[i / 16] as i32 * q6k_u(b, i) * y.qs[i] as i32;
            }
        }
        *lane -= 32
            * (y.bsums[2 * l].get() as i32 * b.scales[2 * l] as i32
                + y.bsums[2 * l + 1].get() as i32 * b.scales[2 * l + 1] as i32);
    }
    lanes
}

/// ggml's 8-lane horizontal sum: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
#[inline]
pub fn hsum8(v: [f32; 8]) -> f32 {
    let s: [f32; 4] = core::array::from_fn(|i| v[i + 4] + v[i]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// `ggml_vec_dot_q6_K_q8_K` (x86 AVX2): per super-block, each of 8 integer lanes is converted
/// and fused-multiply-added with `d_y·d_w`; the lanes are reduced at the end.
pub fn q6k_dot_lanes(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    for (b, y) in w.iter().zip(x) {
        let d = y.d.to_f32() * b.d.to_f32();
        for (a, s) in acc.iter_mut().zip(q6k_lanes(b, y)) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(acc)
}

/// The reference's tiled Q6_K kernel (batches of 8 rows or more): per super-block the exact
/// integer sum times the weight's `d`, then fused-multiply-added with the activation's `d`.
pub fn q6k_dot_tiled(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = 0f32;
    for (b, y) in w.iter().zip(x) {
        let s: i32 = q6k_lanes(b, y).iter().sum();
        let r = s as f32 * b.d.to_f32();
        acc = r.mul_add(y.d.to_f32(), acc);
    }
    acc
}

/// How the reference computes row `j` of a batch of `nx` activation rows against a Q4_K matrix:
/// `true` for the 4-row gemm (per-pair accumulation), `false` for the gemv tail.
#[inline]
pub fn q4k_row_uses_gemm(nx: usize, j: usize) -> bool {
    j < nx - nx % 4
}

/// The reference engine's result for row `j` of a batch of `nx` activation rows, for the
/// formats whose order is reproduced exactly here (Q4_K, Q6_K); `None` for the others.
pub fn gemm_dot(ty: GgmlType, w: &[u8], x: &[u8], n: usize, nx: usize, j: usize) -> Option<f32> {
    use super::blocks::cast;
    use std::mem::size_of;
    if !matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
        return None;
    }
    let nb = n / QK_K;
    let xb = cast::<BlockQ8K>(&x[..nb * size_of::<BlockQ8K>()])?;
    match ty {
        GgmlType::Q4K => {
            let wb = cast::<BlockQ4K>(&w[..nb * size_of::<BlockQ4K>()])?;
            Some(q4k_dot(wb, xb, q4k_row_uses_gemm(nx, j)))
        }
        GgmlType::Q6K => {
            let wb = cast::<BlockQ6K>(&w[..nb * size_of::<BlockQ6K>()])?;
            Some(if nx >= Q6K_TILED_MIN_ROWS {
                q6k_dot_tiled(wb, xb)
            } else {
                q6k_dot_lanes(wb, xb)
            })
        }
        _ => None,
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
    let (wb, xb) = t32_blocks(ty, w, x, n);
    let mut acc = [0f32; 8];
    let mut ms = 0f32;
    for (&(d, m, q), &(yd, ys, yq)) in wb.iter().zip(&xb) {
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
    let (wb, xb) = t32_blocks(ty, w, x, n);
    let (mut acc, mut ms) = (0f32, 0f32);
    for (&(d, m, q), &(yd, ys, yq)) in wb.iter().zip(&xb) {
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

/// Weight blocks `(d, m, quants)` and activation blocks `(d, s, quants)` of a 32-element
/// format's row pair, scales in f32 (`m`, `s`: 0 where the format has none).
#[allow(clippy::type_complexity)]
fn t32_blocks(
    ty: GgmlType,
    w: &[u8],
    x: &[u8],
    n: usize,
) -> (Vec<(f32, f32, [i32; 32])>, Vec<(f32, f32, [i8; 32])>) {
    use super::blocks::{cast, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
    use super::reference::{bit5, nibble};
    use std::mem::size_of;
    let nb = n / 32;
    // Each weight block's f16 scale and minimum in f32 and its 32 quants.
    fn blocks<B: super::blocks::RawBlock>(
        w: &[u8],
        nb: usize,
        f: impl Fn(&B) -> (f32, f32, [i32; 32]),
    ) -> Vec<(f32, f32, [i32; 32])> {
        cast::<B>(&w[..nb * size_of::<B>()])
            .expect("weight blocks")
            .iter()
            .map(f)
            .collect()
    }
    let wb = match ty {
        GgmlType::Q4_0 => blocks(w, nb, |b: &BlockQ4_0| {
            (
                b.d.to_f32(),
                0.0,
                core::array::from_fn(|i| nibble(&b.qs, i) - 8),
            )
        }),
        GgmlType::Q4_1 => blocks(w, nb, |b: &BlockQ4_1| {
            (
                b.d.to_f32(),
                b.m.to_f32(),
                core::array::from_fn(|i| nibble(&b.qs, i)),
            )
        }),
        GgmlType::Q5_0 => blocks(w, nb, |b: &BlockQ5_0| {
            let q = |i| (nibble(&b.qs, i) | (bit5(&b.qh, i) << 4)) - 16;
            (b.d.to_f32(), 0.0, core::array::from_fn(q))
        }),
        GgmlType::Q5_1 => blocks(w, nb, |b: &BlockQ5_1| {
            let q = |i| nibble(&b.qs, i) | (bit5(&b.qh, i) << 4);
            (b.d.to_f32(), b.m.to_f32(), core::array::from_fn(q))
        }),
        GgmlType::Q8_0 => blocks(w, nb, |b: &BlockQ8_0| {
            (b.d.to_f32(), 0.0, b.qs.map(i32::from))
        }),
        _ => panic!("{ty}: not a 32-element format"),
    };
    // Each activation block's `d`, `s` (Q8_1 only) and quants.
    let xb: Vec<(f32, f32, [i8; 32])> = if super::dot_type(ty) == GgmlType::Q8_1 {
        cast::<BlockQ8_1>(&x[..nb * size_of::<BlockQ8_1>()])
            .expect("Q8_1 blocks")
            .iter()
            .map(|y| (y.d.to_f32(), y.s.to_f32(), y.qs))
            .collect()
    } else {
        cast::<BlockQ8_0>(&x[..nb * size_of::<BlockQ8_0>()])
            .expect("Q8_0 blocks")
            .iter()
            .map(|y| (y.d.to_f32(), 0.0, y.qs))
            .collect()
    };
    (wb, xb)
}
