//! Q4_K against Q8_K over a matrix repacked into 16-row groups (`quant::repack`), for the tiers
//! without VNNI (AVX2, and AVX-512 without VNNI): `q4k_x16` with each group read as two halves
//! of 8 rows, each 32-bit lane of a 256-bit register one weight row.
//!
//! The arithmetic is `q4k_x16`'s line for line (see its doc: the same exact integers, turned
//! into floats where the reference engine does); only the integer dot differs: `maddubs` then
//! `madd` instead of `vpdpbusd`, exact here because the nibbles are at most 15, so a pair of
//! byte products stays within i16. Every output has the bits of the row-major kernel
//! (`avx2::TQ4K`). (Q6_K read this way was slower than its row-major kernel on AVX2: 22.7
//! against 28.6 GiB/s in the matrix-vector benchmark on a Zen 4, so it is not repacked here.)

use super::avx2::{f32_at, loadu, prefetch_ahead, Gemm, Q8K_BYTES};
use super::t32_x16_ymm::{f16x8, HALF};
use crate::quant::repack::Q4K_X16_BYTES;
use core::arch::x86_64::*;

/// `f(j, h)` (the results of activation rows `j .. j + T` against half `h` of the group) for
/// every tile of `T` rows in `rows` (a multiple of `T` long), stored at
/// `out + (j + i)·out_stride + 8h`.
///
/// # Safety
/// `out` has room for every output written; AVX.
#[inline(always)]
unsafe fn tiles<const T: usize>(
    rows: core::ops::Range<usize>,
    out: *mut f32,
    out_stride: usize,
    f: impl Fn(usize, usize) -> [__m256; T],
) {
    debug_assert!(rows.len().is_multiple_of(T));
    for j in rows.step_by(T) {
        for h in 0..2 {
            for (i, v) in f(j, h).iter().enumerate() {
                _mm256_storeu_ps(out.add((j + i) * out_stride + HALF * h), *v);
            }
        }
    }
}

/// Q4_K: one 16-row group (`w`) against `nx` activation rows: `out[j * out_stride + r]` for
/// rows `r < 16`. `n` is a multiple of 256.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` holds `n / 256` repacked super-blocks, each of the
/// `nx` rows at `x + j·x_stride` holds `n / 256` Q8_K blocks, and `out` has room for every
/// output written.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_q4k(g: Gemm) {
    let (n, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = n / 256;
    let xr = |j: usize| x.add(j * x_stride);
    // Rows in the batch's groups of four convert per pair of sub-blocks, the rest per
    // super-block (as `q4k_x16`); two rows at a time either way.
    let full = nx - nx % 4;
    tiles::<2>(0..full, out, out_stride, |j, h| {
        q4k_half::<2, true>(nb, w, [xr(j), xr(j + 1)], h, j == 0 && h == 0)
    });
    tiles::<1>(full..nx, out, out_stride, |j, h| {
        q4k_half::<1, false>(nb, w, [xr(j)], h, j == 0 && h == 0)
    });
}

/// Rows `8h .. 8h + 8` of a Q4_K group against `T` activation rows (`q4k_x16::group`). With
/// `fetch` (the group's first pass) the weights are asked for ahead of the block being read.
#[inline(always)]
unsafe fn q4k_half<const T: usize, const PAIR: bool>(
    nb: usize,
    w: *const u8,
    x: [*const u8; T],
    h: usize,
    fetch: bool,
) -> [__m256; T] {
    let six = _mm256_set1_epi32(0x3F3F_3F3F);
    let four = _mm256_set1_epi32(0x0F0F_0F0F);
    let top = _mm256_set1_epi32(0x3030_3030);
    let byte = _mm256_set1_epi32(0xFF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_min = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let sb = w.add(b * Q4K_X16_BYTES);
        if fetch {
            prefetch_ahead(sb, Q4K_X16_BYTES);
        }
        let d = f16x8(sb, h);
        let dmin = f16x8(sb.add(32), h);
        let wa = loadu(sb.add(64 + 32 * h));
        let wb = loadu(sb.add(128 + 32 * h));
        let wc = loadu(sb.add(192 + 32 * h));
        let hi2 = |v: __m256i| _mm256_and_si256(_mm256_srli_epi32::<2>(v), top);
        let scales = [
            _mm256_and_si256(wa, six),
            _mm256_or_si256(_mm256_and_si256(wc, four), hi2(wa)),
        ];
        let mins = [
            _mm256_and_si256(wb, six),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(wc), four), hi2(wb)),
        ];
        let pick = |v: &[__m256i; 2], s: usize| {
            let sh = _mm_cvtsi32_si128(8 * (s % 4) as i32);
            _mm256_and_si256(_mm256_srl_epi32(v[s / 4], sh), byte)
        };
        let mut dd = [_mm256_setzero_ps(); T];
        let mut dm = [_mm256_setzero_ps(); T];
        let mut bsum = [[0i32; 8]; T];
        for t in 0..T {
            let xp = x[t].add(b * Q8K_BYTES);
            let yd = _mm256_set1_ps(f32_at(xp));
            dd[t] = _mm256_mul_ps(d, yd);
            dm[t] = _mm256_mul_ps(dmin, yd);
            let s = _mm256_madd_epi16(loadu(xp.add(260)), ones);
            _mm256_storeu_si256(bsum[t].as_mut_ptr().cast(), s);
        }
        let mut s_sb = [_mm256_setzero_si256(); T];
        let mut m_sb = [_mm256_setzero_si256(); T];
        for p in 0..4 {
            // A sub-block's pairs add up exactly in i16: a pair is at most 2 · 15 · 128 = 3840
            // in magnitude, 8 of them 30720. One widening per sub-block, not per 4 elements
            // (`vpmaddwd` shares the multiply pipes with `vpmaddubsw` and the FMAs).
            let mut lo = [_mm256_setzero_si256(); T];
            let mut hi = [_mm256_setzero_si256(); T];
            for k in 0..8 {
                let q = loadu(sb.add(256 + 64 * (8 * p + k) + 32 * h));
                let ql = _mm256_and_si256(q, four);
                let qh = _mm256_and_si256(_mm256_srli_epi32::<4>(q), four);
                for t in 0..T {
                    let yp = x[t].add(b * Q8K_BYTES + 4 + 64 * p + 4 * k);
                    let y0 = _mm256_set1_epi32(core::ptr::read_unaligned(yp.cast::<i32>()));
                    let y1 = _mm256_set1_epi32(core::ptr::read_unaligned(yp.add(32).cast::<i32>()));
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(ql, y0));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(qh, y1));
                }
            }
            let lo = lo.map(|v| _mm256_madd_epi16(v, ones));
            let hi = hi.map(|v| _mm256_madd_epi16(v, ones));
            let (s0, s1) = (pick(&scales, 2 * p), pick(&scales, 2 * p + 1));
            let (m0, m1) = (pick(&mins, 2 * p), pick(&mins, 2 * p + 1));
            for t in 0..T {
                let s =
                    _mm256_add_epi32(_mm256_mullo_epi32(lo[t], s0), _mm256_mullo_epi32(hi[t], s1));
                let m = _mm256_add_epi32(
                    _mm256_mullo_epi32(m0, _mm256_set1_epi32(bsum[t][2 * p])),
                    _mm256_mullo_epi32(m1, _mm256_set1_epi32(bsum[t][2 * p + 1])),
                );
                if PAIR {
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd[t], acc[t]);
                    acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm[t], acc_min[t]);
                } else {
                    s_sb[t] = _mm256_add_epi32(s_sb[t], s);
                    m_sb[t] = _mm256_add_epi32(m_sb[t], m);
                }
            }
        }
        if !PAIR {
            for t in 0..T {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_sb[t]), dd[t], acc[t]);
                acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m_sb[t]), dm[t], acc_min[t]);
            }
        }
    }
    core::array::from_fn(|t| _mm256_sub_ps(acc[t], acc_min[t]))
}
