//! IQ3_XXS, IQ3_S, IQ1_S and IQ1_M against Q8_K on 256-bit registers. Each 32-element
//! sub-block is decoded as the reference's AVX2 `vec_dot` decodes it: the grid entries of its
//! groups gathered by scalar loads into one register (4 bytes per IQ3 entry, 8 per IQ1 entry),
//! the signs applied to the activations (`vpsignb`), so that the unsigned grid magnitudes
//! (at most 62: no adjacent-pair sum leaves i16) multiply them; the 1-bit formats' shifts
//! (±1/8) are a second product of the activations with ±1. The float arithmetic is
//! `iq_order`'s: 8 lanes per super-block for single rows and small batches
//! ([`crate::quant::iq_order`]'s `dot_lanes`), from [`TILED_MIN_ROWS`] activation rows the
//! super-block's whole integer (`dot_tiled`).

use super::*;
use crate::quant::iq_grids::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::iq_signs::KSIGNS_IQ2XS;
use crate::quant::kquant_order::TILED_MIN_ROWS;

/// One 32-element sub-block decoded: the activations' product with it is
/// `dpbusd(a, sign(y, s))` (lane `l`: elements `4l .. 4l + 4`) times `sc`, and, for the 1-bit
/// formats, the shifts' `dpbusd(1, sign(y, dl))` times `sc`.
pub(in crate::quant::x86) struct Chunk {
    /// Unsigned magnitudes (u8, at most 62).
    a: __m256i,
    /// The sign of each element (any byte whose sign `vpsignb` applies; 0 zeroes the element).
    s: __m256i,
    /// The scale of each i32 lane.
    sc: __m256i,
    /// The shifts' signs, ±1 per byte (1-bit formats).
    dl: __m256i,
}

impl Chunk {
    /// An IQ3 sub-block: the 8 grid entries `g(k)` (4 magnitudes each, element order), the
    /// 32 sign bits and one scale; no shifts.
    #[inline(always)]
    unsafe fn iq3(g: impl Fn(usize) -> i32, bits: u32, sc: i32) -> Chunk {
        Chunk {
            a: _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0)),
            s: signs32(bits),
            sc: _mm256_set1_epi32(sc),
            dl: _mm256_setzero_si256(),
        }
    }

    /// An IQ1 sub-block: the signed grid values `v` (magnitudes and signs), the lanes'
    /// scales and the shifts' signs.
    #[inline(always)]
    unsafe fn iq1(v: __m256i, sc: __m256i, dl: __m256i) -> Chunk {
        Chunk {
            a: _mm256_abs_epi8(v),
            s: v,
            sc,
            dl,
        }
    }
}

/// A 256-element format of grid entries (`iq_order`'s terms).
pub(in crate::quant::x86) trait IqGrid {
    const W_BYTES: usize;
    /// The tiled kernel's factor on `d_w`, and the reduced lanes' factor.
    const FACTOR: f32;
    const LANE_FACTOR: f32;
    /// 0: no shifts; 1: the shifts' sum apart as a scalar (IQ1_S); 2: in lanes (IQ1_M).
    const SHIFT: u8;
    /// The super-block scale of the block at `p`: an f16 at its start, unless the format
    /// says otherwise.
    #[inline(always)]
    unsafe fn d(p: *const u8) -> f32 {
        _mm_cvtss_f32(f16x2_at(p))
    }
    /// Sub-block `ib` (0..8) of the block at `p`.
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk;
}

/// 32 sign bits (bit `j`: element `j` negative) as bytes -1 / +1.
#[inline(always)]
unsafe fn signs32(bits: u32) -> __m256i {
    _mm256_or_si256(bits32_of(bits), _mm256_set1_epi8(1))
}

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    core::ptr::read_unaligned(p.cast::<u16>())
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    core::ptr::read_unaligned(p.cast::<u32>())
}

/// An [`IqGrid`] format `$t`: `$bytes`-byte blocks, the factors `$factor` (tiled) and `$lane`
/// (lanes), shifts `$shift`; `$chunk` decodes sub-block `$ib` of the block at `$p`, and `$d`,
/// where given, reads its scale.
macro_rules! iq_grid {
    (
        $(#[$doc:meta])* $t:ident: $bytes:literal bytes, factor $factor:literal,
        lanes $lane:literal, shift $shift:literal,
        $(d |$dp:ident| $d:block,)? chunk |$p:ident, $ib:ident| $chunk:block
    ) => {
        $(#[$doc])*
        pub(in crate::quant::x86) struct $t;

        impl IqGrid for $t {
            const W_BYTES: usize = $bytes;
            const FACTOR: f32 = $factor;
            const LANE_FACTOR: f32 = $lane;
            const SHIFT: u8 = $shift;
            $(
                #[inline(always)]
                unsafe fn d($dp: *const u8) -> f32 $d
            )?
            #[inline(always)]
            unsafe fn chunk($p: *const u8, $ib: usize) -> Chunk $chunk
        }
    };
}

iq_grid! {
    /// IQ3_XXS: 98-byte blocks, f16 `d`, 64 grid indices, 8 words of signs and scale.
    Iq3Xxs: 98 bytes, factor 0.25, lanes 0.25, shift 0,
    chunk |p, ib| {
        let q = p.add(2 + 8 * ib);
        let aux = u32_at(p.add(2 + 64 + 4 * ib));
        let sign = |l: u32| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize] as u32;
        let bits = sign(0) | sign(1) << 8 | sign(2) << 16 | sign(3) << 24;
        Chunk::iq3(
            |k| IQ3XXS_GRID[*q.add(k) as usize] as i32,
            bits,
            2 * (aux >> 28) as i32 + 1,
        )
    }
}

iq_grid! {
    /// IQ3_S: 110-byte blocks, f16 `d`, 64 index bytes, 8 bytes of ninth bits, 32 bytes of
    /// signs, 4 bytes of scale nibbles.
    Iq3S: 110 bytes, factor 1.0, lanes 1.0, shift 0,
    chunk |p, ib| {
        let q = p.add(2 + 8 * ib);
        let qh = *p.add(66 + ib) as usize;
        let ls = (*p.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xF;
        Chunk::iq3(
            |k| IQ3S_GRID[*q.add(k) as usize | ((qh >> k) & 1) << 8] as i32,
            u32_at(p.add(74 + 4 * ib)),
            1 + 2 * ls as i32,
        )
    }
}

/// Four IQ1 grid entries (8 values in -1..=1 each) in element order.
#[inline(always)]
unsafe fn grid4(idx: [usize; 4]) -> __m256i {
    let g = |k: usize| IQ1S_GRID[idx[k]] as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

iq_grid! {
    /// IQ1_S: 50-byte blocks, f16 `d`, 32 index bytes, 8 LE u16 of top bits, scale and shift.
    Iq1S: 50 bytes, factor 0.125, lanes 1.0, shift 1,
    chunk |p, ib| {
        let q = p.add(2 + 4 * ib);
        let qh = u16_at(p.add(34 + 2 * ib)) as usize;
        let idx = core::array::from_fn(|l| *q.add(l) as usize | ((qh >> (3 * l)) & 7) << 8);
        let dl = if qh & 0x8000 != 0 { -1 } else { 1 };
        Chunk::iq1(
            grid4(idx),
            _mm256_set1_epi32(2 * ((qh >> 12) & 7) as i32 + 1),
            _mm256_set1_epi8(dl),
        )
    }
}

iq_grid! {
    /// IQ1_M: 56-byte blocks, 32 index bytes, 16 bytes of nibbles (top bits and shift), 4 LE
    /// u16 of 3-bit scales whose top nibbles hold the f16 `d`.
    Iq1M: 56 bytes, factor 0.125, lanes 1.0, shift 2,
    d |p| {
        let sc = |k: usize| u16_at(p.add(48 + 2 * k));
        let bits =
            (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    },
    chunk |p, ib| {
        let q = p.add(4 * ib);
        let qh = u16_at(p.add(32 + 2 * ib)) as usize;
        let nib = |l: usize| (qh >> (4 * l)) & 0xF;
        let idx = core::array::from_fn(|l| *q.add(l) as usize | (nib(l) & 7) << 8);
        let shift = |l: usize| {
            if nib(l) & 8 != 0 {
                -1i64
            } else {
                0x0101_0101_0101_0101
            }
        };
        let w = u16_at(p.add(48 + 2 * (ib / 2))) as i32 >> (6 * (ib % 2));
        let (s0, s1) = (2 * (w & 7) + 1, 2 * ((w >> 3) & 7) + 1);
        Chunk::iq1(
            grid4(idx),
            _mm256_set_epi32(s1, s1, s1, s1, s0, s0, s0, s0),
            _mm256_set_epi64x(shift(3), shift(2), shift(1), shift(0)),
        )
    }
}

/// The rows of an [`IqGrid`] format against Q8_K rows; `TILED` selects the tiled kernel's
/// per-super-block order.
pub(in crate::quant::x86) struct TIqOrder<F, const TILED: bool>(core::marker::PhantomData<F>);

/// IQ3_XXS rows against Q8_K rows.
pub(in crate::quant::x86) type TIq3Xxs = TIqOrder<Iq3Xxs, false>;
/// IQ3_S rows against Q8_K rows.
pub(in crate::quant::x86) type TIq3S = TIqOrder<Iq3S, false>;
/// IQ1_S rows against Q8_K rows.
pub(in crate::quant::x86) type TIq1S = TIqOrder<Iq1S, false>;
/// IQ1_M rows against Q8_K rows.
pub(in crate::quant::x86) type TIq1M = TIqOrder<Iq1M, false>;

impl<F: IqGrid, const TILED: bool> Tile for TIqOrder<F, TILED> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = F::W_BYTES;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        let zero = _mm256_setzero_si256();
        let ones = _mm256_set1_epi8(1);
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut acc_m = [_mm256_setzero_ps(); NX];
        let mut acc_s = [0f32; NX];
        for b in 0..n / 256 {
            let wp = w.add(b * F::W_BYTES);
            let wd = F::d(wp);
            let mut s = [zero; NX];
            let mut m = [zero; NX];
            for ib in 0..8 {
                let c = F::chunk(wp, ib);
                for j in 0..NX {
                    let y = loadu(x[j].add(b * Q8K_BYTES + 4 + 32 * ib));
                    let p = D::dpbusd(zero, c.a, _mm256_sign_epi8(y, c.s));
                    s[j] = _mm256_add_epi32(s[j], _mm256_mullo_epi32(p, c.sc));
                    if F::SHIFT != 0 {
                        let p = D::dpbusd(zero, ones, _mm256_sign_epi8(y, c.dl));
                        m[j] = _mm256_add_epi32(m[j], _mm256_mullo_epi32(p, c.sc));
                    }
                }
            }
            for j in 0..NX {
                let yd = f32_at(x[j].add(b * Q8K_BYTES));
                if TILED {
                    let t = if F::SHIFT != 0 {
                        8 * hsum_epi32(s[j]) + hsum_epi32(m[j])
                    } else {
                        hsum_epi32(s[j])
                    };
                    let r = t as f32 * (wd * F::FACTOR);
                    acc_s[j] = r.mul_add(yd, acc_s[j]);
                    continue;
                }
                let d = wd * yd;
                let dv = _mm256_set1_ps(d);
                acc[j] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s[j]), acc[j]);
                match F::SHIFT {
                    1 => acc_s[j] = d.mul_add(hsum_epi32(m[j]) as f32, acc_s[j]),
                    2 => acc_m[j] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(m[j]), acc_m[j]),
                    _ => {}
                }
            }
        }
        core::array::from_fn(|j| match (TILED, F::SHIFT) {
            (true, _) => acc_s[j],
            (false, 1) => hsum_ps(acc[j]) + 0.125 * acc_s[j],
            (false, 2) => hsum_ps(acc[j]) + 0.125 * hsum_ps(acc_m[j]),
            _ => F::LANE_FACTOR * hsum_ps(acc[j]),
        })
    }

    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        if !TILED && g.nx >= TILED_MIN_ROWS {
            gemm_tiles::<TIqOrder<F, true>, D>(g)
        } else {
            gemm_tiles::<Self, D>(g)
        }
    }
}
