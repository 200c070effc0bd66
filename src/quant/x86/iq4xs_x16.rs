//! IQ4_XS against Q8_K over a matrix repacked into 16-row groups (`quant::repack`), AVX-512
//! VNNI: each 32-bit lane of a 512-bit register is one weight row, so the kernel never adds
//! lanes.
//!
//! The grid values (-127..=113) are looked up shifted by 128 (unsigned bytes 1..=241, one byte
//! shuffle), so that `vpdpbusd` multiplies them with four activation quants broadcast to every
//! row; the shift's part, `128 · Σ y` over the same elements, is the same for all 16 rows and
//! is taken off before the scale. Per super-block, activation row and weight row this forms
//! the row-major kernel's exact integers (`avx2::TIq4Xs`), and turns them into floats as the
//! reference engine does: for batches of [`TILED_MIN_ROWS`] rows or more its tiled kernel's
//! one integer per super-block, times `d_w`, fused-multiply-added with `d_y`
//! ([`kquant_order::k_dot_tiled`]); for smaller batches its `vec_dot`'s 8 lanes (lane `l`:
//! elements `4l .. 4l + 4` of every 32, which is the `l % 4`-th quadruple of the low or high
//! nibbles), each fused-multiply-added with `d_w·d_y` and reduced at the end in ggml's tree
//! ([`kquant_order::k_dot_lanes`]). Every output therefore has `TIq4Xs`'s bits.
//!
//! [`kquant_order::k_dot_tiled`]: crate::quant::kquant_order::k_dot_tiled
//! [`kquant_order::k_dot_lanes`]: crate::quant::kquant_order::k_dot_lanes

use super::avx2::{f32_at, prefetch_ahead, Gemm, Q8K_BYTES};
use crate::quant::blocks::KVALUES_IQ4NL;
use crate::quant::kquant_order::TILED_MIN_ROWS;
use crate::quant::repack::{GROUP, IQ4XS_X16_BYTES, IQ4XS_X16_QS, IQ4XS_X16_SH, IQ4XS_X16_SL};
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
    if nx < TILED_MIN_ROWS {
        for j in 0..nx {
            _mm512_storeu_ps(out.add(j * out_stride), lanes(nb, w, xr(j), j == 0));
        }
        return;
    }
    let mut j = 0;
    while j + 4 <= nx {
        let r = tiled::<4>(nb, w, [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)], j == 0);
        for (t, v) in r.into_iter().enumerate() {
            _mm512_storeu_ps(out.add((j + t) * out_stride), v);
        }
        j += 4;
    }
    macro_rules! rest {
        ($t:literal, [$($k:literal),*]) => {{
            let r = tiled::<$t>(nb, w, [$(xr(j + $k)),*], false);
            for (t, v) in r.into_iter().enumerate() {
                _mm512_storeu_ps(out.add((j + t) * out_stride), v);
            }
        }};
    }
    match nx - j {
        3 => rest!(3, [0, 1, 2]),
        2 => rest!(2, [0, 1]),
        1 => rest!(1, [0]),
        _ => {}
    }
}

/// The grid shifted by 128, as unsigned bytes, in every 128-bit lane (a `vpshufb` table).
#[inline(always)]
unsafe fn grid_u8() -> __m512i {
    let lut: [u8; 16] = core::array::from_fn(|i| (KVALUES_IQ4NL[i] as i32 + 128) as u8);
    _mm512_broadcast_i32x4(_mm_loadu_si128(lut.as_ptr().cast()))
}

/// A super-block of a group: the 16 rows' `d` and the packed scale words.
struct Head {
    d: __m512,
    sl: __m512i,
    sh: __m512i,
}

#[inline(always)]
unsafe fn head(sb: *const u8) -> Head {
    Head {
        d: _mm512_cvtph_ps(_mm256_loadu_si256(sb.cast())),
        sl: _mm512_loadu_si512(sb.add(IQ4XS_X16_SL).cast()),
        sh: _mm512_cvtepu16_epi32(_mm256_loadu_si256(sb.add(IQ4XS_X16_SH).cast())),
    }
}

impl Head {
    /// Sub-block `ib`'s scale `ls - 32`, a row per lane.
    #[inline(always)]
    unsafe fn scale(&self, ib: usize) -> __m512i {
        let lo = _mm512_srl_epi32(self.sl, _mm_cvtsi32_si128(4 * ib as i32));
        let hi = _mm512_srl_epi32(self.sh, _mm_cvtsi32_si128(2 * ib as i32));
        let ls = _mm512_or_si512(
            _mm512_and_si512(lo, _mm512_set1_epi32(0xF)),
            _mm512_slli_epi32::<4>(_mm512_and_si512(hi, _mm512_set1_epi32(3))),
        );
        _mm512_sub_epi32(ls, _mm512_set1_epi32(32))
    }
}

/// The grid values (+128) of quadruple `k` of sub-block `ib`: elements `4k .. 4k + 4` (low
/// nibbles) and `16 + 4k .. 16 + 4k + 4` (high nibbles), a row per lane.
#[inline(always)]
unsafe fn values(sb: *const u8, ib: usize, k: usize, lut: __m512i) -> (__m512i, __m512i) {
    let q = _mm512_loadu_si512(sb.add(IQ4XS_X16_QS + 64 * (4 * ib + k)).cast());
    let m4 = _mm512_set1_epi8(0x0F);
    let lo = _mm512_and_si512(q, m4);
    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
    (_mm512_shuffle_epi8(lut, lo), _mm512_shuffle_epi8(lut, hi))
}

/// `-128 ·` the sum of each quadruple of the 256 activation quants at `q`.
#[inline(always)]
unsafe fn quad_shifts(q: *const u8) -> [i32; 64] {
    let mut out = [0i32; 64];
    let c = _mm512_set1_epi8(-128);
    for h in 0..4 {
        let y = _mm512_loadu_si512(q.add(64 * h).cast());
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, y);
        let s = _mm512_sub_epi32(_mm512_setzero_si512(), s);
        _mm512_storeu_si512(out.as_mut_ptr().add(16 * h).cast(), s);
    }
    out
}

/// The tiled order for `T` activation rows: per super-block the 16 rows' whole integers. With
/// `fetch` (the group's first pass) it asks for the weights ahead of the block being read.
#[inline(always)]
unsafe fn tiled<const T: usize>(
    nb: usize,
    w: *const u8,
    x: [*const u8; T],
    fetch: bool,
) -> [__m512; T] {
    const _: () = assert!(GROUP == 16);
    let lut = grid_u8();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let sb = w.add(b * IQ4XS_X16_BYTES);
        if fetch {
            prefetch_ahead(sb, IQ4XS_X16_BYTES);
        }
        let h = head(sb);
        // Per sub-block and activation row, `-128 · Σ y` (from Q8_K's sums of 16).
        let bsum = |t: usize, g: usize| {
            let p = x[t].add(b * Q8K_BYTES + 260 + 2 * g);
            core::ptr::read_unaligned(p.cast::<i16>()) as i32
        };
        let shift: [[i32; T]; 8] = core::array::from_fn(|ib| {
            core::array::from_fn(|t| -128 * (bsum(t, 2 * ib) + bsum(t, 2 * ib + 1)))
        });
        let mut tot = [_mm512_setzero_si512(); T];
        for (ib, sh) in shift.iter().enumerate() {
            let mut s: [__m512i; T] = core::array::from_fn(|t| _mm512_set1_epi32(sh[t]));
            for k in 0..4 {
                let (lo, hi) = values(sb, ib, k, lut);
                for t in 0..T {
                    let yp = x[t].add(b * Q8K_BYTES + 4 + 32 * ib + 4 * k);
                    let y0 = _mm512_set1_epi32(core::ptr::read_unaligned(yp.cast::<i32>()));
                    let y1 = _mm512_set1_epi32(core::ptr::read_unaligned(yp.add(16).cast::<i32>()));
                    s[t] = _mm512_dpbusd_epi32(s[t], lo, y0);
                    s[t] = _mm512_dpbusd_epi32(s[t], hi, y1);
                }
            }
            let ls = h.scale(ib);
            for t in 0..T {
                tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(s[t], ls));
            }
        }
        for t in 0..T {
            let yd = _mm512_set1_ps(f32_at(x[t].add(b * Q8K_BYTES)));
            let r = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[t]), h.d);
            acc[t] = _mm512_fmadd_ps(r, yd, acc[t]);
        }
    }
    acc
}

/// The `vec_dot` order for one activation row: per super-block 8 lanes of integers per
/// weight row, each fused-multiply-added with `d_w·d_y`, reduced as ggml's `hsum8`. With
/// `fetch` it asks for the weights ahead of the block being read.
#[inline(always)]
unsafe fn lanes(nb: usize, w: *const u8, x: *const u8, fetch: bool) -> __m512 {
    let lut = grid_u8();
    let mut acc = [_mm512_setzero_ps(); 8];
    for b in 0..nb {
        let sb = w.add(b * IQ4XS_X16_BYTES);
        if fetch {
            prefetch_ahead(sb, IQ4XS_X16_BYTES);
        }
        let h = head(sb);
        let xb = x.add(b * Q8K_BYTES);
        let shifts = quad_shifts(xb.add(4));
        let mut lane = [_mm512_setzero_si512(); 8];
        for ib in 0..8 {
            let ls = h.scale(ib);
            for k in 0..4 {
                let (lo, hi) = values(sb, ib, k, lut);
                for (l, v) in [(k, lo), (4 + k, hi)] {
                    let yp = xb.add(4 + 32 * ib + 4 * l);
                    let y = _mm512_set1_epi32(core::ptr::read_unaligned(yp.cast::<i32>()));
                    let shift = _mm512_set1_epi32(shifts[8 * ib + l]);
                    let p = _mm512_dpbusd_epi32(shift, v, y);
                    lane[l] = _mm512_add_epi32(lane[l], _mm512_mullo_epi32(p, ls));
                }
            }
        }
        let f = _mm512_mul_ps(h.d, _mm512_set1_ps(f32_at(xb)));
        for l in 0..8 {
            acc[l] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(lane[l]), acc[l]);
        }
    }
    let s: [__m512; 4] = core::array::from_fn(|i| _mm512_add_ps(acc[i + 4], acc[i]));
    _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
}
