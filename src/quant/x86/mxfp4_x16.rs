//! MXFP4 over a matrix repacked into 16-row groups (`quant::repack`, [`MXFP4_X16_BYTES`]),
//! AVX-512 VNNI: the layout that `t32_blocks` multiplies, in the block-sum order that is
//! MXFP4's everywhere ([`kquant_order::t32_dot_blocks`](crate::quant::kquant_order::t32_dot_blocks):
//! per block the exact integer dot of all 32 elements, converted and fused-multiply-added with
//! `e_w · d_x`), so every output has the bits of the row-major kernel (`avx2::TMxfp4`).
//!
//! The nibbles are Q4_0's; one byte shuffle per 64 bytes looks them up in the grid of doubled
//! E2M1 values shifted to unsigned bytes (`KVALUES_MXFP4 + 12`, 0 ..= 24), so `vpdpbusd`
//! takes them as stored and each block's integer starts from `−12 · Σ y` (`t32_blocks`'
//! offset); the 16 E8M0 scale bytes widen to the halved scale `2^(e − 128)` of every row in
//! one register.
//!
//! The tiers without AVX-512 VNNI read the same layout 8 rows at a time (`t32_x16_ymm`'s
//! [`Half32`], its block-sum kernel `gemm_blocks`).

use super::avx2::{IDot, Maddubs};
use super::t32_x16::{Group32, Lanes512};
use super::t32_x16_ymm::{nibbles, Half32};
use crate::quant::blocks::KVALUES_MXFP4;
use crate::quant::repack::{MXFP4_X16_BYTES, MXFP4_X16_QS};
use core::arch::x86_64::*;

/// The offset that makes the grid unsigned: its most negative value, −12.
const OFFSET: u8 = 12;

/// The grid plus [`OFFSET`], as unsigned bytes.
const GRID_U8: [u8; 16] = {
    let mut g = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        g[i] = (KVALUES_MXFP4[i] + OFFSET as i8) as u8;
        i += 1;
    }
    g
};

/// MXFP4 × 16.
pub(super) struct Mxfp4;

/// `e8m0_to_f32_half` of 8 scale bytes widened to dwords: `0x0020_0000 << e` below 2 (the
/// subnormals `2^-128`, `2^-127`), `(e − 1) << 23` from 2.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small))
}

impl Group32 for Mxfp4 {
    const BYTES: usize = MXFP4_X16_BYTES;
    const OFFSET: u8 = OFFSET;
}

impl Lanes512 for Mxfp4 {
    #[inline(always)]
    unsafe fn values(sb: *const u8, j: usize) -> [__m512i; 2] {
        let grid = _mm512_broadcast_i32x4(_mm_loadu_si128(GRID_U8.as_ptr().cast()));
        let four = _mm512_set1_epi8(0x0F);
        let q = _mm512_loadu_si512(sb.add(MXFP4_X16_QS + 64 * j).cast());
        let lo = _mm512_and_si512(q, four);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), four);
        [_mm512_shuffle_epi8(grid, lo), _mm512_shuffle_epi8(grid, hi)]
    }

    /// `e8m0_to_f32_half` of the 16 rows' scale bytes: `0x0020_0000 << e` below 2 (the
    /// subnormals `2^-128`, `2^-127`), `(e − 1) << 23` from 2.
    #[inline(always)]
    unsafe fn d(sb: *const u8) -> __m512 {
        let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(sb.cast()));
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
        let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
    }
}

impl Half32 for Mxfp4 {
    #[inline(always)]
    unsafe fn prepared(sb: *const u8, l: usize, h: usize) -> __m256i {
        let grid = _mm256_broadcastsi128_si256(_mm_loadu_si128(GRID_U8.as_ptr().cast()));
        _mm256_shuffle_epi8(grid, nibbles(sb.add(MXFP4_X16_QS), l, h))
    }
    #[inline(always)]
    unsafe fn dot(p: __m256i, y: __m256i, corr: __m256i, l: usize) -> __m256i {
        // Unsigned values up to 24: a pair of products is within 2 · 24 · 128, no i16 wraps.
        let start = _mm256_permutevar8x32_epi32(corr, _mm256_set1_epi32(l as i32));
        Maddubs::dpbusd(start, p, y)
    }
    #[inline(always)]
    unsafe fn d8(sb: *const u8, h: usize) -> __m256 {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sb.add(8 * h).cast()));
        e8m0_half8(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::e8m0_to_f32_half;

    /// [`Mxfp4::d`] of the block at `sb`, stored.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL; `sb` is one whole block of the layout.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    unsafe fn scales(sb: *const u8) -> [f32; 16] {
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), <Mxfp4 as Lanes512>::d(sb));
        out
    }

    /// [`Mxfp4::d8`] of both halves of the block at `sb`, stored.
    ///
    /// # Safety
    /// AVX2, F16C; `sb` is one whole block of the layout.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(sb: *const u8) -> [f32; 16] {
        let mut out = [0f32; 16];
        for h in 0..2 {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), <Mxfp4 as Half32>::d8(sb, h));
        }
        out
    }

    /// The 16 scales of every E8M0 byte, widened in one register (and in two halves), are the
    /// scalar ones bit for bit, and the shifted grid gives back the grid.
    #[test]
    fn scales_and_grid_are_the_scalar_ones() {
        if !super::super::has_avx2() {
            return;
        }
        let wide = super::super::has_avx512vnni();
        for base in (0..256).step_by(16) {
            let mut sb = vec![0u8; MXFP4_X16_BYTES];
            for (r, e) in sb[..16].iter_mut().enumerate() {
                *e = (base + r) as u8;
            }
            // SAFETY: AVX2 detected above; `sb` is one whole block of the layout.
            let halves = unsafe { scales8(sb.as_ptr()) };
            // SAFETY: AVX-512 VNNI detected (`wide`); as above.
            let got = if wide {
                unsafe { scales(sb.as_ptr()) }
            } else {
                halves
            };
            for r in 0..16 {
                let want = e8m0_to_f32_half((base + r) as u8).to_bits();
                assert_eq!(got[r].to_bits(), want, "e = {}", base + r);
                assert_eq!(halves[r].to_bits(), want, "e = {}, 8 rows", base + r);
            }
        }
        for (q, &v) in GRID_U8.iter().enumerate() {
            assert_eq!(v as i32 - OFFSET as i32, KVALUES_MXFP4[q] as i32);
        }
    }
}
