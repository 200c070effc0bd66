//! AArch64 Advanced SIMD (NEON, baseline on every AArch64 CPU) dot products for the quantized
//! weight formats and f32. Integer products use `smull`/`saddlp` (no `sdot`, which is optional
//! hardware), so this runs on any AArch64 core. The formats without kernels here (F16, BF16)
//! and the activation quantizers use the scalar reference. The i-quants: IQ4_NL, IQ4_XS and
//! MXFP4 here, the 2-bit ones in `iq2`, the 3-bit and 1-bit ones in `iq_grid`.
//!
//! Structure mirrors the x86 kernels: a weight block is decoded to bytes (signed for the
//! Q8_0 partners, unsigned for Q8_1 / Q8_K partners) and multiplied 16 bytes at a time with the
//! activation quants; k-quant sub-block minimums / offsets go through Q8_K's `bsums`. The
//! float arithmetic is the x86 kernels' ([`kquant_order`]: the reference engine's x86 order),
//! bit for bit: the exact integers of ggml's 8 AVX2 lanes (elements `4l .. 4l + 4` of each
//! 32) are kept as two 4-lane registers, converted and fused-multiply-added as there, and
//! reduced in ggml's tree. So a model's logits here are those of an x86 machine.
//!
//! [`kquant_order`]: super::kquant_order

mod iq2;
mod iq_grid;

use super::blocks::{q3k_scales, scale_min_k4, BlockIq2S, BlockIq2Xs, BlockIq2Xxs};
use super::{GemmArgs, GgmlType, Isa, Kernels};
use core::arch::aarch64::*;

/// `Σ a·b` of 16 i8 pairs, as four i32 partial sums (|a| <= 128, |b| <= 127: products fit i16).
#[inline(always)]
unsafe fn dot16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let p1 = vmull_high_s8(a, b);
    vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1))
}

/// `Σ a·b` of 16 i8 pairs as ggml's AVX2 lanes: lane `l` the exact sum of elements
/// `4l .. 4l + 4` (products fit i16 as in [`dot16`]).
#[inline(always)]
unsafe fn lanes16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let p1 = vmull_high_s8(a, b);
    vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1))
}

/// ggml's sum of its 8 lanes (`a[0]`: lanes 0..4, `a[1]`: 4..8):
/// `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))` ([`kquant_order::hsum8`]).
///
/// [`kquant_order::hsum8`]: super::kquant_order::hsum8
#[inline(always)]
unsafe fn hsum8(a: [float32x4_t; 2]) -> f32 {
    let s = vaddq_f32(a[0], a[1]);
    let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

/// Sub-block `ib`'s 32 weights (`q`: elements 0..16 and 16..32) times the Q8_K activations of
/// the super-block at `xp`, into ggml's 8 lanes, each half times its scale `sc`.
#[inline(always)]
unsafe fn mla_sub_block(
    lanes: &mut [int32x4_t; 2],
    q: [int8x16_t; 2],
    xp: *const u8,
    ib: usize,
    sc: [i32; 2],
) {
    let y0 = vld1q_s8(xp.add(4 + 32 * ib).cast());
    let y1 = vld1q_s8(xp.add(20 + 32 * ib).cast());
    lanes[0] = vmlaq_n_s32(lanes[0], lanes16(q[0], y0), sc[0]);
    lanes[1] = vmlaq_n_s32(lanes[1], lanes16(q[1], y1), sc[1]);
}

/// A row's float sum over super-blocks of one scale each, from their 8 lanes of integer sums:
/// each converted and fused-multiply-added with `d_w·d_y` ([`kquant_order::k_dot_lanes`]), or
/// with `tiled` summed whole, times `d_w`, then fused-multiply-added with `d_y`
/// ([`kquant_order::k_dot_tiled`]).
///
/// [`kquant_order::k_dot_lanes`]: super::kquant_order::k_dot_lanes
/// [`kquant_order::k_dot_tiled`]: super::kquant_order::k_dot_tiled
struct LaneSum {
    acc: [float32x4_t; 2],
    acc_t: f32,
    tiled: bool,
}

impl LaneSum {
    #[inline(always)]
    unsafe fn new(tiled: bool) -> Self {
        LaneSum {
            acc: [vdupq_n_f32(0.0); 2],
            acc_t: 0.0,
            tiled,
        }
    }

    /// One super-block: its lanes, its weight scale `d` and its activations' scale `yd`.
    #[inline(always)]
    unsafe fn add(&mut self, lanes: [int32x4_t; 2], d: f32, yd: f32) {
        if self.tiled {
            let r = vaddvq_s32(vaddq_s32(lanes[0], lanes[1])) as f32 * d;
            self.acc_t = r.mul_add(yd, self.acc_t);
        } else {
            let f = d * yd;
            self.acc[0] = vfmaq_n_f32(self.acc[0], vcvtq_f32_s32(lanes[0]), f);
            self.acc[1] = vfmaq_n_f32(self.acc[1], vcvtq_f32_s32(lanes[1]), f);
        }
    }

    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        if self.tiled {
            self.acc_t
        } else {
            hsum8(self.acc)
        }
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits(core::ptr::read_unaligned(p.cast::<u16>())).to_f32()
}

/// Bits 0..16 of `bits` (LE) as 16 bytes: `set` where the bit is set, else 0.
#[inline(always)]
unsafe fn bits16(bits: u16, set: u8) -> uint8x16_t {
    const MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let [b0, b1] = bits.to_le_bytes();
    let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    vandq_u8(vtstq_u8(v, vld1q_u8(MASK.as_ptr())), vdupq_n_u8(set))
}

/// `(v >> s) & mask` on bytes.
#[inline(always)]
unsafe fn shr_and(v: uint8x16_t, s: usize, mask: u8) -> uint8x16_t {
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(s as i8))), vdupq_n_u8(mask))
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats.

/// One 32-element weight format: block size, partner layout, decode to two 16-byte halves.
trait Blk32 {
    const SIZE: usize;
    /// Pairs with Q8_1 (unsigned quants plus `m * s`) rather than Q8_0.
    const HAS_MIN: bool;
    /// Elements 0..16 and 16..32 as i8 (unsigned formats are <= 31, so they fit).
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t);
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(p);
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

impl Blk32 for Q4_0 {
    const SIZE: usize = 18;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(p.add(2));
        let eight = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(lo), eight),
            vsubq_s8(vreinterpretq_s8_u8(hi), eight),
        )
    }
}

impl Blk32 for Q4_1 {
    const SIZE: usize = 20;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(p.add(4));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Blk32 for Q5_0 {
    const SIZE: usize = 22;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let qh = core::ptr::read_unaligned(p.add(2).cast::<u32>());
        let (lo, hi) = nibbles(p.add(6));
        let lo = vorrq_u8(lo, bits16(qh as u16, 0x10));
        let hi = vorrq_u8(hi, bits16((qh >> 16) as u16, 0x10));
        let sixteen = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(lo), sixteen),
            vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
        )
    }
}

impl Blk32 for Q5_1 {
    const SIZE: usize = 24;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let qh = core::ptr::read_unaligned(p.add(4).cast::<u32>());
        let (lo, hi) = nibbles(p.add(8));
        let lo = vorrq_u8(lo, bits16(qh as u16, 0x10));
        let hi = vorrq_u8(hi, bits16((qh >> 16) as u16, 0x10));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Blk32 for Q8_0 {
    const SIZE: usize = 34;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        (vld1q_s8(p.add(2).cast()), vld1q_s8(p.add(18).cast()))
    }
}

/// Dot of `nb` weight blocks at `w` with their Q8_0 / Q8_1 partners at `x`, in ggml's 8
/// lanes ([`kquant_order::t32_dot_lanes`]): per block each lane's integer fused-multiply-added
/// with `d_w · d_x`; a minimum's `m_w · s_x` summed apart and added after the lanes.
///
/// [`kquant_order::t32_dot_lanes`]: super::kquant_order::t32_dot_lanes
#[inline(always)]
unsafe fn dot32<F: Blk32>(nb: usize, w: *const u8, x: *const u8) -> f32 {
    let (xb, xq) = if F::HAS_MIN { (36, 4) } else { (34, 2) };
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut ms = 0f32;
    for b in 0..nb {
        let wp = w.add(b * F::SIZE);
        let xp = x.add(b * xb);
        let (lo, hi) = F::quants(wp);
        let y0 = vld1q_s8(xp.add(xq).cast());
        let y1 = vld1q_s8(xp.add(xq + 16).cast());
        let prod = f16_at(wp) * f16_at(xp);
        acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(lanes16(lo, y0)), prod);
        acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(lanes16(hi, y1)), prod);
        if F::HAS_MIN {
            ms = f16_at(wp.add(2)).mul_add(f16_at(xp.add(2)), ms);
        }
    }
    if F::HAS_MIN {
        hsum8(acc) + ms
    } else {
        hsum8(acc)
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants: chunks of 32 unsigned quants, scales per 16, correction through bsums.

struct KPrep {
    d: f32,
    dm: f32,
    /// Scale of each group of 16 elements.
    sc: [i32; 16],
    /// Coefficient of each bsum.
    corr: [i32; 16],
}

trait BlkK {
    const SIZE: usize;
    /// Offset formats add the correction to the integer sum (`dm == d`).
    const INT_CORR: bool;
    /// Batches of at least this many rows reduce each super-block's integers first (the
    /// reference's tiled kernel: Q3_K, Q5_K and Q6_K, as on x86).
    const TILED_FROM: usize = usize::MAX;
    /// An offset subtracted inside the lanes, element by element (Q3_K's 4, whose `corr` is
    /// then zero), as the reference's `vec_dot` does.
    const LANE_OFFSET: i8 = 0;
    /// A minimum format's single rows: the minimums' lanes before the scales' (Q2_K).
    const MINS_FIRST: bool = false;
    /// A minimum format's single rows: the minimums summed apart, one scalar chain added after
    /// the lanes (Q5_K).
    const MINS_APART: bool = false;
    unsafe fn prep(p: *const u8) -> KPrep;
    /// Elements `32k .. 32k+16` and `32k+16 .. 32k+32` as unsigned bytes (<= 63).
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t);
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;

/// Bytes of a block's scale field as a fixed-size array.
#[inline(always)]
unsafe fn arr<const N: usize>(p: *const u8) -> [u8; N] {
    core::ptr::read_unaligned(p.cast::<[u8; N]>())
}

/// Q4_K / Q5_K: 6-bit scales and mins per 32, spread to per-16 groups.
#[inline(always)]
unsafe fn prep_k4(p: *const u8) -> KPrep {
    let packed: [u8; 12] = arr(p.add(4));
    let mut sc = [0i32; 16];
    let mut corr = [0i32; 16];
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &packed);
        sc[2 * j] = s as i32;
        sc[2 * j + 1] = s as i32;
        corr[2 * j] = m as i32;
        corr[2 * j + 1] = m as i32;
    }
    KPrep {
        d: f16_at(p),
        dm: -f16_at(p.add(2)),
        sc,
        corr,
    }
}

impl BlkK for Q2K {
    const SIZE: usize = 84;
    const INT_CORR: bool = false;
    const MINS_FIRST: bool = true;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let raw: [u8; 16] = arr(p);
        let mut sc = [0i32; 16];
        let mut corr = [0i32; 16];
        for g in 0..16 {
            sc[g] = (raw[g] & 0xF) as i32;
            corr[g] = (raw[g] >> 4) as i32;
        }
        KPrep {
            d: f16_at(p.add(80)),
            dm: -f16_at(p.add(82)),
            sc,
            corr,
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t) {
        let q = p.add(16 + 32 * (k / 4));
        let s = 2 * (k % 4);
        (
            shr_and(vld1q_u8(q), s, 3),
            shr_and(vld1q_u8(q.add(16)), s, 3),
        )
    }
}

impl BlkK for Q3K {
    const SIZE: usize = 110;
    const INT_CORR: bool = true;
    const TILED_FROM: usize = super::kquant_order::TILED_MIN_ROWS;
    const LANE_OFFSET: i8 = 4;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let s = q3k_scales(&arr(p.add(96)));
        let mut sc = [0i32; 16];
        let mut corr = [0i32; 16];
        for g in 0..16 {
            sc[g] = s[g] as i32;
            corr[g] = 0; // (the offset: `LANE_OFFSET`)
        }
        let d = f16_at(p.add(108));
        KPrep { d, dm: d, sc, corr }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t) {
        let q = p.add(32 + 32 * (k / 4));
        let s = 2 * (k % 4);
        let h = |o: usize| vshlq_n_u8::<2>(shr_and(vld1q_u8(p.add(o)), k, 1));
        (
            vorrq_u8(shr_and(vld1q_u8(q), s, 3), h(0)),
            vorrq_u8(shr_and(vld1q_u8(q.add(16)), s, 3), h(16)),
        )
    }
}

impl BlkK for Q4K {
    const SIZE: usize = 144;
    const INT_CORR: bool = false;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        prep_k4(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t) {
        let q = p.add(16 + 32 * (k / 2));
        let s = 4 * (k % 2);
        (
            shr_and(vld1q_u8(q), s, 0x0F),
            shr_and(vld1q_u8(q.add(16)), s, 0x0F),
        )
    }
}

impl BlkK for Q5K {
    const SIZE: usize = 176;
    const INT_CORR: bool = false;
    const TILED_FROM: usize = super::kquant_order::TILED_MIN_ROWS;
    const MINS_APART: bool = true;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        prep_k4(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t) {
        let q = p.add(48 + 32 * (k / 2));
        let s = 4 * (k % 2);
        let h = |o: usize| vshlq_n_u8::<4>(shr_and(vld1q_u8(p.add(16 + o)), k, 1));
        (
            vorrq_u8(shr_and(vld1q_u8(q), s, 0x0F), h(0)),
            vorrq_u8(shr_and(vld1q_u8(q.add(16)), s, 0x0F), h(16)),
        )
    }
}

impl BlkK for Q6K {
    const SIZE: usize = 210;
    const INT_CORR: bool = true;
    const TILED_FROM: usize = super::kquant_order::TILED_MIN_ROWS;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let s: [u8; 16] = arr(p.add(192));
        let mut sc = [0i32; 16];
        let mut corr = [0i32; 16];
        for g in 0..16 {
            sc[g] = s[g] as i8 as i32;
            corr[g] = -32 * sc[g];
        }
        let d = f16_at(p.add(208));
        KPrep { d, dm: d, sc, corr }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> (uint8x16_t, uint8x16_t) {
        let (h, c) = (k / 4, k % 4);
        let ql = p.add(64 * h + 32 * (c % 2));
        let qh = p.add(128 + 32 * h);
        let part = |o: usize| {
            let low = shr_and(vld1q_u8(ql.add(o)), 4 * (c / 2), 0x0F);
            let high = shr_and(vld1q_u8(qh.add(o)), 2 * c, 3);
            vorrq_u8(low, vshlq_n_u8::<4>(high))
        };
        (part(0), part(16))
    }
}

/// Q8_K block: f32 d at 0, quants at 4, 16 i16 bsums at 260.
const Q8K_BYTES: usize = 292;

/// The bsum coefficients' lanes of a super-block: lane `l` is
/// `corr[2l]·bsum[2l] + corr[2l+1]·bsum[2l+1]`, as `vpmaddwd` pairs them on x86.
#[inline(always)]
unsafe fn corr_lanes(corr: &[i32; 16], xp: *const u8) -> [int32x4_t; 2] {
    let bs =
        |g: usize| corr[g] * core::ptr::read_unaligned(xp.add(260 + 2 * g).cast::<i16>()) as i32;
    let m: [i32; 8] = core::array::from_fn(|l| bs(2 * l) + bs(2 * l + 1));
    [vld1q_s32(m.as_ptr()), vld1q_s32(m.as_ptr().add(4))]
}

/// A k-quant row in ggml's AVX2 `vec_dot` order ([`kquant_order::k_dot_lanes`]): per
/// super-block the 8 lanes of Σ scale·u·y (lane `l`: elements `4l .. 4l + 4` of every
/// 32-element chunk) and of the bsum correction ([`corr_lanes`]), converted and
/// fused-multiply-added as each format's `vec_dot` does (`LANE_OFFSET`, `MINS_FIRST`,
/// `MINS_APART`); with `tiled` (Q3_K, Q5_K and Q6_K in batches of 8 rows or more,
/// [`kquant_order::k_dot_tiled`]) each super-block's integers summed first instead.
///
/// [`kquant_order::k_dot_lanes`]: super::kquant_order::k_dot_lanes
/// [`kquant_order::k_dot_tiled`]: super::kquant_order::k_dot_tiled
#[inline(always)]
unsafe fn dot_k<F: BlkK>(nb: usize, w: *const u8, x: *const u8, tiled: bool) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 2];
    let (mut tot, mut mins) = (0f32, 0f32);
    for b in 0..nb {
        let wp = w.add(b * F::SIZE);
        let xp = x.add(b * Q8K_BYTES);
        let pr = F::prep(wp);
        let mut s = [vdupq_n_s32(0); 2];
        for k in 0..8 {
            let (lo, hi) = F::chunk(wp, k);
            let off = vdupq_n_s8(F::LANE_OFFSET);
            let (lo, hi) = (
                vsubq_s8(vreinterpretq_s8_u8(lo), off),
                vsubq_s8(vreinterpretq_s8_u8(hi), off),
            );
            let y = xp.add(4 + 32 * k);
            let p0 = lanes16(lo, vld1q_s8(y.cast()));
            let p1 = lanes16(hi, vld1q_s8(y.add(16).cast()));
            s[0] = vmlaq_n_s32(s[0], p0, pr.sc[2 * k]);
            s[1] = vmlaq_n_s32(s[1], p1, pr.sc[2 * k + 1]);
        }
        let m = corr_lanes(&pr.corr, xp);
        let yd = core::ptr::read_unaligned(xp.cast::<f32>());
        if F::INT_CORR {
            let t = [vaddq_s32(s[0], m[0]), vaddq_s32(s[1], m[1])];
            if tiled {
                let r = vaddvq_s32(vaddq_s32(t[0], t[1])) as f32 * pr.d;
                tot = r.mul_add(yd, tot);
            } else {
                for h in 0..2 {
                    acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(t[h]), yd * pr.d);
                }
            }
        } else if tiled {
            let (s, m) = (vaddq_s32(s[0], s[1]), vaddq_s32(m[0], m[1]));
            let r = pr
                .dm
                .mul_add(vaddvq_s32(m) as f32, vaddvq_s32(s) as f32 * pr.d);
            tot = r.mul_add(yd, tot);
        } else {
            if F::MINS_APART {
                let m = vaddvq_s32(vaddq_s32(m[0], m[1]));
                mins = (pr.dm * yd).mul_add(m as f32, mins);
            }
            for h in 0..2 {
                if F::MINS_FIRST {
                    acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(m[h]), pr.dm * yd);
                }
                acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(s[h]), pr.d * yd);
                if !F::MINS_APART && !F::MINS_FIRST {
                    acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(m[h]), pr.dm * yd);
                }
            }
        }
    }
    if tiled {
        tot
    } else if F::MINS_APART {
        hsum8(acc) + mins
    } else {
        hsum8(acc)
    }
}

/// Q4_K in the reference's repacked order ([`kquant_order::q4k_dot`]): per super-block and
/// pair of sub-blocks the exact Σ scale·q·y and Σ min·bsum, fused-multiply-added into two
/// chains per pair (`per_pair`: rows in a batch's groups of four) or per super-block, and
/// subtracted at the end.
///
/// [`kquant_order::q4k_dot`]: super::kquant_order::q4k_dot
#[inline(always)]
unsafe fn dot_q4k(nb: usize, w: *const u8, x: *const u8, per_pair: bool) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for b in 0..nb {
        let wp = w.add(b * Q4K::SIZE);
        let xp = x.add(b * Q8K_BYTES);
        let packed: [u8; 12] = arr(wp.add(4));
        let yd = core::ptr::read_unaligned(xp.cast::<f32>());
        let dd = f16_at(wp) * yd;
        let dm = f16_at(wp.add(2)) * yd;
        let bsum = |g: usize| core::ptr::read_unaligned(xp.add(260 + 2 * g).cast::<i16>()) as i32;
        let mut pairs = [(0i32, 0i32); 4];
        for k in 0..8 {
            let (sc, mn) = scale_min_k4(k, &packed);
            let (lo, hi) = Q4K::chunk(wp, k);
            let y = xp.add(4 + 32 * k);
            let p0 = dot16(vreinterpretq_s8_u8(lo), vld1q_s8(y.cast()));
            let p1 = dot16(vreinterpretq_s8_u8(hi), vld1q_s8(y.add(16).cast()));
            let pair = &mut pairs[k / 2];
            pair.0 += sc as i32 * vaddvq_s32(vaddq_s32(p0, p1));
            pair.1 += mn as i32 * (bsum(2 * k) + bsum(2 * k + 1));
        }
        super::kquant_order::q4k_add(pairs, (dd, dm), per_pair, (&mut acc, &mut acc_min));
    }
    acc - acc_min
}

/// f32 · f32 with four accumulators.
#[inline(always)]
unsafe fn dot_f32(n: usize, w: *const u8, x: *const u8) -> f32 {
    let (w, x) = (w.cast::<f32>(), x.cast::<f32>());
    let mut a = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (u, a) in a.iter_mut().enumerate() {
            *a = vfmaq_f32(*a, vld1q_f32(w.add(i + 4 * u)), vld1q_f32(x.add(i + 4 * u)));
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
    while i < n {
        sum += core::ptr::read_unaligned(w.add(i)) * core::ptr::read_unaligned(x.add(i));
        i += 1;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// IQ4_NL, MXFP4 and IQ4_XS: 4-bit indices into a 16-value grid (one `tbl` lookup), signed
// values (|v| <= 127) multiplied as the legacy formats' quants.

/// The 32 grid values of the 16 bytes of indices at `p`: elements 0..16 and 16..32.
#[inline(always)]
unsafe fn iq4_values(p: *const u8, grid: int8x16_t) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(p);
    (vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi))
}

/// A 32-element format of 4-bit indices into a 16-value grid with one scale per block
/// (IQ4_NL: an f16 `d`; MXFP4: an E8M0 byte, the grid doubled and the scale halved) against
/// Q8_0 in whole-block sums ([`kquant_order::t32_dot_blocks`]).
///
/// [`kquant_order::t32_dot_blocks`]: super::kquant_order::t32_dot_blocks
#[inline(always)]
unsafe fn dot_lut32<const MX: bool>(nb: usize, w: *const u8, x: *const u8) -> f32 {
    let (values, bytes, qs) = if MX {
        (&super::blocks::KVALUES_MXFP4, 17, 1)
    } else {
        (&super::blocks::KVALUES_IQ4NL, 18, 2)
    };
    let grid = vld1q_s8(values.as_ptr());
    let mut acc = 0f32;
    for b in 0..nb {
        let wp = w.add(b * bytes);
        let xp = x.add(b * 34);
        let (q0, q1) = iq4_values(wp.add(qs), grid);
        let y0 = vld1q_s8(xp.add(2).cast());
        let y1 = vld1q_s8(xp.add(18).cast());
        let dot = vaddvq_s32(vaddq_s32(dot16(q0, y0), dot16(q1, y1)));
        let d = if MX {
            super::blocks::e8m0_to_f32_half(*wp)
        } else {
            f16_at(wp)
        };
        acc = (d * f16_at(xp)).mul_add(dot as f32, acc);
    }
    acc
}

/// IQ4_XS against Q8_K: per super-block ggml's 8 lanes of `Σ (ls - 32)·v·y`, converted and
/// fused-multiply-added with `d_w · d_y` ([`kquant_order::k_dot_lanes`]), or with `tiled` the
/// super-block's integers summed whole ([`kquant_order::k_dot_tiled`]).
///
/// [`kquant_order::k_dot_lanes`]: super::kquant_order::k_dot_lanes
/// [`kquant_order::k_dot_tiled`]: super::kquant_order::k_dot_tiled
#[inline(always)]
unsafe fn dot_iq4xs(nb: usize, w: *const u8, x: *const u8, tiled: bool) -> f32 {
    let grid = vld1q_s8(super::blocks::KVALUES_IQ4NL.as_ptr());
    let mut sum = LaneSum::new(tiled);
    for b in 0..nb {
        let wp = w.add(b * 136);
        let xp = x.add(b * Q8K_BYTES);
        let h = core::ptr::read_unaligned(wp.add(2).cast::<u16>()) as u32;
        let l = core::ptr::read_unaligned(wp.add(4).cast::<u32>());
        let mut lanes = [vdupq_n_s32(0); 2];
        for ib in 0..8 {
            let ls = (((l >> (4 * ib)) & 0xF) | (((h >> (2 * ib)) & 3) << 4)) as i32 - 32;
            let (q0, q1) = iq4_values(wp.add(8 + 16 * ib), grid);
            mla_sub_block(&mut lanes, [q0, q1], xp, ib, [ls, ls]);
        }
        let d = f16_at(wp);
        let yd = core::ptr::read_unaligned(xp.cast::<f32>());
        sum.add(lanes, d, yd);
    }
    sum.sum()
}

struct RIq4Nl;
struct RIq4Xs;
struct RMxfp4;

impl Row for RIq4Nl {
    const BLOCK: usize = 32;
    const W: usize = 18;
    const X: usize = 34;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, _: usize, _: usize) -> f32 {
        dot_lut32::<false>(n / 32, w, x)
    }
}

impl Row for RMxfp4 {
    const BLOCK: usize = 32;
    const W: usize = 17;
    const X: usize = 34;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, _: usize, _: usize) -> f32 {
        dot_lut32::<true>(n / 32, w, x)
    }
}

impl Row for RIq4Xs {
    const BLOCK: usize = 256;
    const W: usize = 136;
    const X: usize = Q8K_BYTES;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, _: usize) -> f32 {
        let tiled = super::kquant_order::tiled(GgmlType::IQ4XS, nx);
        dot_iq4xs(n / 256, w, x, tiled)
    }
}

// ---------------------------------------------------------------------------------------------
// Safe entry points and the table.

/// A row kernel: elements per block, bytes per weight / activation block, the dot itself for
/// row `j` of a batch of `nx` activation rows (Q4_K's and Q6_K's arithmetic depends on them,
/// as the reference's does).
trait Row {
    const BLOCK: usize;
    const W: usize;
    const X: usize;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, j: usize) -> f32;
}

struct R32<F>(core::marker::PhantomData<F>);
struct RK<F>(core::marker::PhantomData<F>);
struct RQ4K;
struct RF32;

impl<F: Blk32> Row for R32<F> {
    const BLOCK: usize = 32;
    const W: usize = F::SIZE;
    const X: usize = if F::HAS_MIN { 36 } else { 34 };
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, _: usize, _: usize) -> f32 {
        dot32::<F>(n / 32, w, x)
    }
}

impl<F: BlkK> Row for RK<F> {
    const BLOCK: usize = 256;
    const W: usize = F::SIZE;
    const X: usize = Q8K_BYTES;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, _: usize) -> f32 {
        dot_k::<F>(n / 256, w, x, nx >= F::TILED_FROM)
    }
}

impl Row for RQ4K {
    const BLOCK: usize = 256;
    const W: usize = Q4K::SIZE;
    const X: usize = Q8K_BYTES;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, j: usize) -> f32 {
        let per_pair = super::kquant_order::q4k_row_uses_gemm(nx, j);
        dot_q4k(n / 256, w, x, per_pair)
    }
}

impl Row for RF32 {
    const BLOCK: usize = 1;
    const W: usize = 4;
    const X: usize = 4;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, _: usize, _: usize) -> f32 {
        dot_f32(n, w, x)
    }
}

fn rows<R: Row>(n: usize) -> (usize, usize) {
    assert!(
        n.is_multiple_of(R::BLOCK),
        "row of {n} elements is not whole {}-blocks",
        R::BLOCK
    );
    (n / R::BLOCK * R::W, n / R::BLOCK * R::X)
}

fn vec_dot<R: Row>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (rw, rx) = rows::<R>(n);
    assert!(
        w.len() >= rw && x.len() >= rx,
        "vec_dot buffers shorter than the row"
    );
    // SAFETY: NEON is baseline on AArch64; both rows hold `n` elements (checked above) and the
    // kernel reads only within them.
    unsafe { R::dot(n, w.as_ptr(), x.as_ptr(), 1, 0) }
}

fn gemm<R: Row>(g: GemmArgs) {
    let (rw, rx) = rows::<R>(g.n);
    g.check(rw, rx);
    let (w, x) = (g.w.as_ptr(), g.x.as_ptr());
    for i in 0..g.nw {
        for j in 0..g.nx {
            let (wi, xj) = (i * g.w_stride, j * g.x_stride);
            // SAFETY: `check` verified rows i of `w` and j of `x` lie inside the buffers.
            g.out[j * g.out_stride + i] = unsafe { R::dot(g.n, w.add(wi), x.add(xj), g.nx, j) };
        }
    }
}

/// The NEON table for `scalar.weight`. F16 and BF16 (and every activation quantizer) use the
/// portable reference code inside this table.
pub(super) fn kernels(scalar: Kernels) -> Kernels {
    macro_rules! t {
        ($r:ty) => {
            Kernels {
                isa: Isa::Neon,
                vec_dot: vec_dot::<$r>,
                gemm: gemm::<$r>,
                ..scalar
            }
        };
    }
    let portable = Kernels {
        isa: Isa::Neon,
        ..scalar
    };
    match scalar.weight {
        GgmlType::F32 => t!(RF32),
        GgmlType::Q4_0 => t!(R32<Q4_0>),
        GgmlType::Q4_1 => t!(R32<Q4_1>),
        GgmlType::Q5_0 => t!(R32<Q5_0>),
        GgmlType::Q5_1 => t!(R32<Q5_1>),
        GgmlType::Q8_0 => t!(R32<Q8_0>),
        GgmlType::Q2K => t!(RK<Q2K>),
        GgmlType::Q3K => t!(RK<Q3K>),
        GgmlType::Q4K => t!(RQ4K),
        GgmlType::Q5K => t!(RK<Q5K>),
        GgmlType::Q6K => t!(RK<Q6K>),
        GgmlType::IQ4NL => t!(RIq4Nl),
        GgmlType::MXFP4 => t!(RMxfp4),
        GgmlType::IQ4XS => t!(RIq4Xs),
        GgmlType::IQ2XXS => t!(iq2::RIq2<BlockIq2Xxs>),
        GgmlType::IQ2XS => t!(iq2::RIq2<BlockIq2Xs>),
        GgmlType::IQ2S => t!(iq2::RIq2<BlockIq2S>),
        GgmlType::IQ3XXS => t!(iq_grid::RIq3Xxs),
        GgmlType::IQ3S => t!(iq_grid::RIq3S),
        GgmlType::IQ1S => t!(iq_grid::RIq1S),
        GgmlType::IQ1M => t!(iq_grid::RIq1M),
        _ => portable,
    }
}
