//! IQ4_NL and MXFP4 against Q8_0 and IQ4_XS against Q8_K on 256-bit registers: the 4-bit indices are
//! looked up in the 16-value grid with one byte shuffle, and the signed grid values (|v| <=
//! 127, so no adjacent-pair sum leaves i16) multiply the activations through the sign trick.
//! The float arithmetic is `kquant_order`'s for these formats: IQ4_NL and MXFP4 sum each block's whole
//! integer dot ([`crate::quant::kquant_order::t32_dot_blocks`]); IQ4_XS keeps 8 integer lanes
//! per super-block ([`crate::quant::kquant_order::k_dot_lanes`]), or from
//! [`TILED_MIN_ROWS`] activation rows sums the super-block's integers whole
//! ([`crate::quant::kquant_order::k_dot_tiled`]).

use super::*;
use crate::quant::blocks::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::kquant_order::TILED_MIN_ROWS;

/// The 16 grid values in both 128-bit lanes (a `vpshufb` table).
#[inline(always)]
unsafe fn grid_of(values: &[i8; 16]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(values.as_ptr().cast()))
}

/// IQ4_NL's grid.
#[inline(always)]
unsafe fn grid() -> __m256i {
    grid_of(&KVALUES_IQ4NL)
}

/// The 32 grid values of the 16 bytes of indices at `p`, in element order.
#[inline(always)]
unsafe fn values32(p: *const u8, lut: __m256i) -> __m256i {
    _mm256_shuffle_epi8(lut, nibbles32(p))
}

/// `q · y` of 32 signed weights (`aq` = |q|) and 32 activations at `y`, as 8 i32 lanes
/// (lane `l`: elements `4l .. 4l + 4`).
#[inline(always)]
unsafe fn idot<D: IDot>(q: __m256i, aq: __m256i, y: *const u8) -> __m256i {
    D::dpbusd(_mm256_setzero_si256(), aq, _mm256_sign_epi8(loadu(y), q))
}

/// A 32-element format of 4-bit indices into a 16-value grid of signed integers with one scale
/// per block, multiplied against Q8_0: its block's bytes, grid and scale.
pub(in crate::quant::x86) trait Lut32 {
    /// Bytes per block.
    const W_BYTES: usize;
    /// Offset of the 16 bytes of indices within a block.
    const QS: usize;
    /// The grid (every value within ±127, so no adjacent-pair sum leaves i16).
    const GRID: [i8; 16];
    /// The scale of the block at `p`, in f32.
    unsafe fn scale(p: *const u8) -> f32;
}

/// IQ4_NL: 18-byte blocks, an f16 `d` then the indices.
pub(in crate::quant::x86) struct Iq4Nl;

impl Lut32 for Iq4Nl {
    const W_BYTES: usize = 18;
    const QS: usize = 2;
    const GRID: [i8; 16] = KVALUES_IQ4NL;
    #[inline(always)]
    unsafe fn scale(p: *const u8) -> f32 {
        _mm_cvtss_f32(f16x2_at(p))
    }
}

/// MXFP4: 17-byte blocks, an E8M0 byte then the indices; the doubled E2M1 values and the
/// halved scale, as ggml keeps them.
pub(in crate::quant::x86) struct Mxfp4;

impl Lut32 for Mxfp4 {
    const W_BYTES: usize = 17;
    const QS: usize = 1;
    const GRID: [i8; 16] = KVALUES_MXFP4;
    #[inline(always)]
    unsafe fn scale(p: *const u8) -> f32 {
        e8m0_to_f32_half(*p)
    }
}

/// The rows of a [`Lut32`] format against Q8_0 rows, in whole-block sums.
pub(in crate::quant::x86) struct TLut32<F>(core::marker::PhantomData<F>);

/// IQ4_NL rows against Q8_0 rows.
pub(in crate::quant::x86) type TIq4Nl = TLut32<Iq4Nl>;

/// MXFP4 rows against Q8_0 rows.
pub(in crate::quant::x86) type TMxfp4 = TLut32<Mxfp4>;

impl<F: Lut32> Tile for TLut32<F> {
    const BLOCK: usize = 32;
    const W_BYTES: usize = F::W_BYTES;
    const X_BYTES: usize = 34;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        let lut = grid_of(&F::GRID);
        let mut acc = [0f32; NX];
        for b in 0..n / 32 {
            let wp = w.add(b * Self::W_BYTES);
            let q = values32(wp.add(F::QS), lut);
            let aq = _mm256_sign_epi8(q, q);
            let wd = F::scale(wp);
            for j in 0..NX {
                let xp = x[j].add(b * Self::X_BYTES);
                let dot = hsum_epi32(idot::<D>(q, aq, xp.add(2)));
                let xd = _mm_cvtss_f32(f16x2_at(xp));
                acc[j] = (wd * xd).mul_add(dot as f32, acc[j]);
            }
        }
        acc
    }
}

/// IQ4_XS rows (136-byte super-blocks: f16 `d`, `scales_h`, `scales_l`, 128 bytes of
/// indices) against Q8_K rows; `TILED` selects the tiled kernel's per-super-block order.
pub(in crate::quant::x86) struct TIq4XsOrder<const TILED: bool>;

/// IQ4_XS's tile: 8 lanes for single rows and small batches, the tiled order from
/// [`TILED_MIN_ROWS`] rows.
pub(in crate::quant::x86) type TIq4Xs = TIq4XsOrder<false>;

/// The 8 sub-block scales (`ls - 32`) of the IQ4_XS super-block at `p`.
#[inline(always)]
unsafe fn xs_scales(p: *const u8) -> [i32; 8] {
    let h = core::ptr::read_unaligned(p.add(2).cast::<u16>());
    let l = core::ptr::read_unaligned(p.add(4).cast::<u32>());
    core::array::from_fn(|j| {
        let ls = ((l >> (4 * j)) & 0xF) | ((((h >> (2 * j)) & 3) as u32) << 4);
        ls as i32 - 32
    })
}

/// The reference's float order over a row of Q8_K super-blocks, for the kernels whose
/// super-block ends in 8 integer lanes per activation row (IQ4_XS, the 2-bit i-quants): single
/// rows and small batches fused-multiply-add each lane with `d_w·d_y` and reduce the lanes at
/// the end; `TILED` (the reference's tiled kernel) reduces each super-block's lanes to one
/// integer first and accumulates `(Σ·d_w)·d_y`.
pub(super) struct LaneAcc<const NX: usize, const TILED: bool> {
    acc: [__m256; NX],
    acc_t: [f32; NX],
}

impl<const NX: usize, const TILED: bool> LaneAcc<NX, TILED> {
    #[inline(always)]
    pub(super) unsafe fn new() -> Self {
        LaneAcc {
            acc: [_mm256_setzero_ps(); NX],
            acc_t: [0f32; NX],
        }
    }

    /// Row `j`'s super-block: its integer `lanes`, the weight's scale `wd`, the activation's `yd`.
    #[inline(always)]
    pub(super) unsafe fn add(&mut self, j: usize, lanes: __m256i, wd: f32, yd: f32) {
        if TILED {
            let r = hsum_epi32(lanes) as f32 * wd;
            self.acc_t[j] = r.mul_add(yd, self.acc_t[j]);
        } else {
            let f = _mm256_set1_ps(wd * yd);
            self.acc[j] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(lanes), self.acc[j]);
        }
    }

    /// Every row's dot.
    #[inline(always)]
    pub(super) unsafe fn finish(self) -> [f32; NX] {
        if TILED {
            self.acc_t
        } else {
            core::array::from_fn(|j| hsum_ps(self.acc[j]))
        }
    }
}

impl<const TILED: bool> Tile for TIq4XsOrder<TILED> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = 136;
    const X_BYTES: usize = 292;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        let lut = grid();
        let mut acc = LaneAcc::<NX, TILED>::new();
        for b in 0..n / 256 {
            let wp = w.add(b * Self::W_BYTES);
            let wd = _mm_cvtss_f32(f16x2_at(wp));
            let sc = xs_scales(wp);
            let mut lanes = [_mm256_setzero_si256(); NX];
            for (ib, &s) in sc.iter().enumerate() {
                let q = values32(wp.add(8 + 16 * ib), lut);
                let aq = _mm256_sign_epi8(q, q);
                let ls = _mm256_set1_epi32(s);
                for j in 0..NX {
                    let y = x[j].add(b * Self::X_BYTES + 4 + 32 * ib);
                    let p = _mm256_mullo_epi32(idot::<D>(q, aq, y), ls);
                    lanes[j] = _mm256_add_epi32(lanes[j], p);
                }
            }
            for j in 0..NX {
                acc.add(j, lanes[j], wd, f32_at(x[j].add(b * Self::X_BYTES)));
            }
        }
        acc.finish()
    }

    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        if !TILED && g.nx >= TILED_MIN_ROWS {
            gemm_tiles::<TIq4XsOrder<true>, D>(g)
        } else {
            gemm_tiles::<Self, D>(g)
        }
    }
}
