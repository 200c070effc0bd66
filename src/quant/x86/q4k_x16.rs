//! Q4_K against Q8_K over a matrix repacked into 16-row groups (`quant::repack`), AVX-512 VNNI:
//! each 32-bit lane of a 512-bit register is one weight row, so the kernel never adds lanes.
//!
//! Per super-block, activation row and weight row it forms the same exact integers as the
//! row-major kernel (`avx2::TQ4K`): per sub-block `s` the dot `Σ q·y` (`vpdpbusd` of the
//! unsigned nibbles against the activation quants, four at a time broadcast to every row),
//! times its 6-bit scale, and the minimum part `m_s · Σ y` from Q8_K's `bsums`. It then turns
//! them into floats where the reference engine does: per pair of sub-blocks for rows in the
//! batch's groups of four (`PAIR`), per super-block for the `nx % 4` rows after them, with the
//! same `d·y_d` products and the same two fused-multiply-add chains subtracted at the end. Every
//! output therefore has `TQ4K`'s bits (`kquant_order::q4k_dot`).

use super::avx2::{f32_at, prefetch_ahead, Gemm, Q8K_BYTES};
use crate::quant::repack::{GROUP, Q4K_X16_BYTES};
use core::arch::x86_64::*;

/// One 16-row group (`w`) against `nx` activation rows: `out[j * out_stride + r]` for rows
/// `r < 16`. `n` is a multiple of 256.
///
/// # Safety
/// The CPU supports AVX-512 F/BW and VNNI; `w` holds `n / 256` repacked super-blocks, each of
/// the `nx` rows at `x + j·x_stride` holds `n / 256` Q8_K blocks, and `out` has room for every
/// output written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub(super) unsafe fn gemm_tf(g: Gemm) {
    let (n, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = n / 256;
    let xr = |j: usize| x.add(j * x_stride);
    let full = nx - nx % 4;
    let mut j = 0;
    while j < full {
        let r = group::<4, true>(nb, w, [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)], j == 0);
        for (t, v) in r.into_iter().enumerate() {
            _mm512_storeu_ps(out.add((j + t) * out_stride), v);
        }
        j += 4;
    }
    for j in full..nx {
        let [v] = group::<1, false>(nb, w, [xr(j)], true);
        _mm512_storeu_ps(out.add(j * out_stride), v);
    }
}

/// The 16 rows' results for `T` activation rows, converted per pair of sub-blocks (`PAIR`) or
/// per super-block. With `fetch` (the group's first pass, or a single row's) it asks for the
/// weights ahead of the block being read, as a decode row does: a small batch streams them
/// from memory as a row does (a 4-row prompt stalled on them without it).
#[inline(always)]
unsafe fn group<const T: usize, const PAIR: bool>(
    nb: usize,
    w: *const u8,
    x: [*const u8; T],
    fetch: bool,
) -> [__m512; T] {
    const _: () = assert!(GROUP == 16);
    let six = _mm512_set1_epi32(0x3F3F_3F3F);
    let four = _mm512_set1_epi32(0x0F0F_0F0F);
    let top = _mm512_set1_epi32(0x3030_3030);
    // `vpshufb` controls (which index bytes of their 128-bit lane): byte `k` of every dword
    // to the dword's low byte, the rest zeroed; bytes `k`, `k + 1` (k = 0, 2) to the low bytes
    // of the dword's two i16.
    let dword = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 4, 8, 12));
    let byte_of: [__m512i; 4] = core::array::from_fn(|k| {
        _mm512_add_epi32(_mm512_set1_epi32(0x8080_8000u32 as i32 | k as i32), dword)
    });
    let pair_of: [__m512i; 2] = core::array::from_fn(|h| {
        let k = 2 * h as i32;
        let sel = _mm512_set1_epi32(0x8000_8000u32 as i32 | ((k + 1) << 16) | k);
        _mm512_add_epi32(sel, _mm512_or_si512(dword, _mm512_slli_epi32::<16>(dword)))
    });
    // Sub-block `s`'s byte of each row's dword of `v` (`[sub-blocks 0-3, sub-blocks 4-7]`)
    // as an i32.
    let pick = |v: &[__m512i; 2], s: usize| _mm512_shuffle_epi8(v[s / 4], byte_of[s % 4]);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let sb = w.add(b * Q4K_X16_BYTES);
        if fetch {
            prefetch_ahead(sb, Q4K_X16_BYTES);
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sb.cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(sb.add(32).cast()));
        // The packed 6-bit scales and minimums, a row per lane, a sub-block per byte
        // (`blocks::scale_min_k4`): [sub-blocks 0-3, sub-blocks 4-7].
        let wa = _mm512_loadu_si512(sb.add(64).cast());
        let wb = _mm512_loadu_si512(sb.add(128).cast());
        let wc = _mm512_loadu_si512(sb.add(192).cast());
        let hi2 = |v: __m512i| _mm512_and_si512(_mm512_srli_epi32::<2>(v), top);
        let scales = [
            _mm512_and_si512(wa, six),
            _mm512_or_si512(_mm512_and_si512(wc, four), hi2(wa)),
        ];
        let mins = [
            _mm512_and_si512(wb, six),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(wc), four), hi2(wb)),
        ];
        // Per activation row: d·y_d, dmin·y_d, and the sums of y of sub-blocks 2p and 2p + 1
        // as the two i16 of dword p (the reference's `_mm_hadd_epi16` of the `bsums`).
        let mut dd = [_mm512_setzero_ps(); T];
        let mut dm = [_mm512_setzero_ps(); T];
        let mut bsum = [[0i32; 4]; T];
        for t in 0..T {
            let xp = x[t].add(b * Q8K_BYTES);
            let yd = _mm512_set1_ps(f32_at(xp));
            dd[t] = _mm512_mul_ps(d, yd);
            dm[t] = _mm512_mul_ps(dmin, yd);
            let s = _mm_hadd_epi16(
                _mm_loadu_si128(xp.add(260).cast()),
                _mm_loadu_si128(xp.add(276).cast()),
            );
            _mm_storeu_si128(bsum[t].as_mut_ptr().cast(), s);
        }
        let mut s_sb = [_mm512_setzero_si512(); T];
        let mut m_sb = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            // Σ q·y of sub-blocks 2p (low nibbles) and 16 × that of 2p+1 (high nibbles, left
            // in place: exact, shifted back once below).
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for k in 0..8 {
                let q = _mm512_loadu_si512(sb.add(256 + 64 * (8 * p + k)).cast());
                let ql = _mm512_and_si512(q, four);
                let qh = _mm512_andnot_si512(four, q);
                for t in 0..T {
                    let yp = x[t].add(b * Q8K_BYTES + 4 + 64 * p + 4 * k);
                    let y0 = _mm512_set1_epi32(core::ptr::read_unaligned(yp.cast::<i32>()));
                    let y1 = _mm512_set1_epi32(core::ptr::read_unaligned(yp.add(32).cast::<i32>()));
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ql, y0);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], qh, y1);
                }
            }
            // Sub-blocks 2p and 2p + 1: their scales as i32, their minimums as a dword's two
            // i16 (bytes 2p mod 4 and the next of the rows' dwords).
            let (s0, s1) = (pick(&scales, 2 * p), pick(&scales, 2 * p + 1));
            let mp = _mm512_shuffle_epi8(mins[p / 2], pair_of[p % 2]);
            for t in 0..T {
                let hi = _mm512_srai_epi32::<4>(hi[t]);
                let s = _mm512_add_epi32(_mm512_mullo_epi32(lo[t], s0), _mm512_mullo_epi32(hi, s1));
                let y = _mm512_set1_epi32(bsum[t][p]);
                if PAIR {
                    let m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp, y);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd[t], acc[t]);
                    acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm[t], acc_min[t]);
                } else {
                    s_sb[t] = _mm512_add_epi32(s_sb[t], s);
                    m_sb[t] = _mm512_dpwssd_epi32(m_sb[t], mp, y);
                }
            }
        }
        if !PAIR {
            for t in 0..T {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_sb[t]), dd[t], acc[t]);
                acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m_sb[t]), dm[t], acc_min[t]);
            }
        }
    }
    core::array::from_fn(|t| _mm512_sub_ps(acc[t], acc_min[t]))
}
