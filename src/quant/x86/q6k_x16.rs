//! Q6_K against Q8_K over a matrix repacked into 16-row groups (`quant::repack`), AVX-512 VNNI:
//! each 32-bit lane of a 512-bit register is one weight row.
//!
//! The reference engine multiplies Q6_K two ways, and both are reproduced bit for bit
//! (`kquant_order`): batches of 8 rows or more take its tiled kernel (per super-block one exact
//! integer, times the weight's `d`, fused-multiply-added with the activation's `d`:
//! [`tiled`]); smaller batches its `vec_dot`, which keeps 8 lanes of integers, each converted
//! and fused-multiply-added per super-block and reduced at the end ([`lanes`]). Lane `l` of
//! that kernel holds dword `l` of every 32-element chunk, which is exactly dword `l` of this
//! layout, so its 8 lanes become 8 registers of 16 rows.

use super::avx2::{f32_at, prefetch_ahead, Gemm, Q8K_BYTES};
use crate::quant::kquant_order::TILED_MIN_ROWS;
use crate::quant::repack::{q6k_x16_high, q6k_x16_low, GROUP, Q6K_X16_BYTES};
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
    const _: () = assert!(GROUP == 16);
    let nb = n / 256;
    let xr = |j: usize| x.add(j * x_stride);
    let store = |j: usize, v: __m512| _mm512_storeu_ps(out.add(j * out_stride), v);
    if nx < TILED_MIN_ROWS {
        for j in 0..nx {
            store(j, lanes(nb, w, xr(j)));
        }
        return;
    }
    let mut j = 0;
    while j + 8 <= nx {
        let r = tiled::<8>(nb, w, core::array::from_fn(|t| xr(j + t)), j == 0);
        for (t, v) in r.into_iter().enumerate() {
            store(j + t, v);
        }
        j += 8;
    }
    for j in j..nx {
        let [v] = tiled::<1>(nb, w, [xr(j)], false);
        store(j, v);
    }
}

/// The 6-bit values of dword `l` of chunk `c` of super-block `sb`, 4 per row.
#[inline(always)]
unsafe fn quants(sb: *const u8, c: usize, l: usize) -> __m512i {
    let four = _mm512_set1_epi8(0x0F);
    let nib = _mm512_loadu_si512(sb.add(q6k_x16_low(c % 4, l)).cast());
    let low = if c < 4 {
        _mm512_and_si512(nib, four)
    } else {
        _mm512_and_si512(_mm512_srli_epi32::<4>(nib), four)
    };
    let hb = _mm512_loadu_si512(sb.add(q6k_x16_high(c % 2, l)).cast());
    // Bits 2k, 2k+1 of each byte (k = c / 2) moved to bits 4, 5.
    let high = match c / 2 {
        0 => _mm512_slli_epi32::<4>(hb),
        1 => _mm512_slli_epi32::<2>(hb),
        2 => hb,
        _ => _mm512_srli_epi32::<2>(hb),
    };
    // low | (high & 0x30)
    _mm512_ternarylogic_epi32::<0xF8>(low, high, _mm512_set1_epi8(0x30))
}

/// Scales of the pair of 16-element groups `2p, 2p+1` of super-block `sb`: per row a dword of
/// two i16.
#[inline(always)]
unsafe fn scale_pair(sb: *const u8, p: usize) -> __m512i {
    _mm512_cvtepi8_epi16(_mm256_loadu_si256(sb.add(32 + 32 * p).cast()))
}

/// Per row, the scales of a pair (`scale_pair`) each in both i16 halves of a dword: `[group
/// 2p, group 2p + 1]`.
#[inline(always)]
unsafe fn dup_scales(pair: __m512i) -> [__m512i; 2] {
    let low16 = _mm512_set1_epi32(0xFFFF);
    [
        _mm512_ternarylogic_epi32::<0xE4>(pair, _mm512_slli_epi32::<16>(pair), low16),
        _mm512_ternarylogic_epi32::<0xD8>(pair, _mm512_srli_epi32::<16>(pair), low16),
    ]
}

/// Two i16 of activation row `xp`'s block at byte `off`, broadcast.
#[inline(always)]
unsafe fn bcast(xp: *const u8, off: usize) -> __m512i {
    _mm512_set1_epi32(core::ptr::read_unaligned(xp.add(off).cast::<i32>()))
}

/// The reference's tiled arithmetic for `T` activation rows; with `fetch` (the group's first
/// pass) the weights are asked for ahead of the block being read (where the CPU gains from
/// it: `avx2::asks_ahead`).
#[inline(always)]
unsafe fn tiled<const T: usize>(
    nb: usize,
    w: *const u8,
    x: [*const u8; T],
    fetch: bool,
) -> [__m512; T] {
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let sb = w.add(b * Q6K_X16_BYTES);
        if fetch {
            prefetch_ahead(sb, Q6K_X16_BYTES);
        }
        let xp: [*const u8; T] = core::array::from_fn(|t| x[t].add(b * Q8K_BYTES));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(sb.cast()));
        // Σ_g scale_g · Σ u·y, and Σ_g scale_g · bsum_g (for the −32 offset).
        let mut s = [_mm512_setzero_si512(); T];
        let mut corr = [_mm512_setzero_si512(); T];
        for c in 0..8 {
            let pair = scale_pair(sb, c);
            for t in 0..T {
                corr[t] = _mm512_dpwssd_epi32(corr[t], pair, bcast(xp[t], 260 + 4 * c));
            }
            let scales = [
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)),
                _mm512_srai_epi32::<16>(pair),
            ];
            for (half, sc) in scales.into_iter().enumerate() {
                let mut g = [_mm512_setzero_si512(); T];
                for l in 4 * half..4 * half + 4 {
                    let q = quants(sb, c, l);
                    for t in 0..T {
                        g[t] = _mm512_dpbusd_epi32(g[t], q, bcast(xp[t], 4 + 32 * c + 4 * l));
                    }
                }
                for t in 0..T {
                    s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(g[t], sc));
                }
            }
        }
        for t in 0..T {
            let total = _mm512_sub_epi32(s[t], _mm512_slli_epi32::<5>(corr[t]));
            let r = _mm512_mul_ps(_mm512_cvtepi32_ps(total), d);
            acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(f32_at(xp[t])), acc[t]);
        }
    }
    acc
}

/// The reference's `vec_dot` arithmetic for one activation row: 8 lanes, reduced at the end as
/// `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
#[inline(always)]
unsafe fn lanes(nb: usize, w: *const u8, x: *const u8) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 8];
    for b in 0..nb {
        let sb = w.add(b * Q6K_X16_BYTES);
        prefetch_ahead(sb, Q6K_X16_BYTES);
        let xp = x.add(b * Q8K_BYTES);
        let d = _mm512_mul_ps(
            _mm512_set1_ps(f32_at(xp)),
            _mm512_cvtph_ps(_mm256_loadu_si256(sb.cast())),
        );
        let mut lane = [_mm512_setzero_si512(); 8];
        // Chunks c and c + 4 share their low-bit lines: taken together, the super-block's
        // lines are first touched front to back (integer sums: any order gives the same
        // lanes).
        for c in 0..4 {
            // Each row's scale of group 2c' (then 2c'+1) in both i16 halves of its dword, for
            // chunks c' = c and c + 4.
            let dups = [
                dup_scales(scale_pair(sb, c)),
                dup_scales(scale_pair(sb, c + 4)),
            ];
            for (l, v) in lane.iter_mut().enumerate() {
                for (h, dup) in dups.iter().enumerate() {
                    let ch = c + 4 * h;
                    let q = quants(sb, ch, l);
                    let p = _mm512_maddubs_epi16(q, bcast(xp, 4 + 32 * ch + 4 * l));
                    *v = _mm512_dpwssd_epi32(*v, p, dup[l / 4]);
                }
            }
        }
        for (l, (v, a)) in lane.iter().zip(acc.iter_mut()).enumerate() {
            // Lane l's share of the −32 offset: groups 2l and 2l+1.
            let m = _mm512_madd_epi16(scale_pair(sb, l), bcast(xp, 260 + 4 * l));
            let v = _mm512_sub_epi32(*v, _mm512_slli_epi32::<5>(m));
            *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(v), *a);
        }
    }
    let s: [__m512; 4] = core::array::from_fn(|i| _mm512_add_ps(acc[i + 4], acc[i]));
    _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
}
