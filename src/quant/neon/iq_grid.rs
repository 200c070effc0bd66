//! IQ3_XXS, IQ3_S, IQ1_S and IQ1_M against Q8_K on NEON. Each 32-element sub-block is decoded
//! as the x86 kernels decode it (`x86/avx2/iq_grid.rs`): its grid entries gathered by scalar
//! loads into two 16-byte registers (4 bytes per IQ3 entry, 8 per IQ1 entry), the signs applied
//! to the weights (IQ3's magnitudes are at most 62, IQ1's values -1..=1, so every product with
//! an activation fits i16), multiplied with the activations into ggml's 8 lanes (elements
//! `4l .. 4l + 4`), each times its sub-block's odd scale; the 1-bit formats' shifts (±1/8) are
//! a second product of the activations with ±1. The float arithmetic is
//! [`iq_order`](crate::quant::iq_order)'s, bit for bit: 8 lanes per super-block for single rows
//! and small batches (`dot_lanes`), from [`TILED_MIN_ROWS`] activation rows the super-block's
//! whole integer (`dot_tiled`).

use super::{f16_at, hsum8, lanes16, Row, Q8K_BYTES};
use crate::quant::iq_grids::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::iq_signs::KSIGNS_IQ2XS;
use crate::quant::kquant_order::TILED_MIN_ROWS;
use core::arch::aarch64::*;

/// One 32-element sub-block decoded: elements 0..16 and 16..32 as signed bytes, the odd scale
/// of each half, and (1-bit formats) the shift's sign of each element as ±1.
pub(super) struct Chunk {
    q: [int8x16_t; 2],
    sc: [i32; 2],
    dl: [int8x16_t; 2],
}

impl Chunk {
    /// An IQ3 sub-block: the 4-byte grid entries `g(0..8)`, negated by the sign bits of each
    /// half, its one odd scale; no shifts.
    #[inline(always)]
    unsafe fn iq3(g: impl Fn(usize) -> u32, signs: [u16; 2], sc: i32) -> Chunk {
        Chunk {
            q: [
                apply_signs(grid3([g(0), g(1), g(2), g(3)]), signs[0]),
                apply_signs(grid3([g(4), g(5), g(6), g(7)]), signs[1]),
            ],
            sc: [sc, sc],
            dl: [vdupq_n_s8(0); 2],
        }
    }

    /// An IQ1 sub-block: the 8-byte grid entries at the indices `idx(0..4)`, the odd scale and
    /// the shifts' signs of each half.
    #[inline(always)]
    unsafe fn iq1(idx: impl Fn(usize) -> usize, sc: [i32; 2], dl: [int8x16_t; 2]) -> Chunk {
        Chunk {
            q: [grid1(idx(0), idx(1)), grid1(idx(2), idx(3))],
            sc,
            dl,
        }
    }
}

/// A 256-element format of grid entries (`iq_order`'s terms).
pub(super) trait IqGrid {
    const W_BYTES: usize;
    /// The tiled kernel's factor on `d_w`, and the reduced lanes' factor.
    const FACTOR: f32;
    const LANE_FACTOR: f32;
    /// 0: no shifts; 1: the shifts' sum apart as a scalar (IQ1_S); 2: in lanes (IQ1_M).
    const SHIFT: u8;
    /// The super-block scale of the block at `p` (an f16 at its start, unless the format says
    /// otherwise).
    #[inline(always)]
    unsafe fn d(p: *const u8) -> f32 {
        f16_at(p)
    }
    /// Sub-block `ib` (0..8) of the block at `p`.
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk;
}

/// 16 bytes `m`, negated where bit `j` of `bits` (LE) is set.
#[inline(always)]
unsafe fn apply_signs(m: int8x16_t, bits: u16) -> int8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let [b0, b1] = bits.to_le_bytes();
    let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let neg = vreinterpretq_s8_u8(vtstq_u8(v, vld1q_u8(BIT.as_ptr())));
    // (m ^ -1) - (-1) = -m where negative; m where not.
    vsubq_s8(veorq_s8(m, neg), neg)
}

/// Four 4-byte IQ3 grid entries as 16 bytes, in element order.
#[inline(always)]
unsafe fn grid3(g: [u32; 4]) -> int8x16_t {
    vreinterpretq_s8_u32(vld1q_u32(g.as_ptr()))
}

/// Two 8-byte IQ1 grid entries (values -1..=1) as 16 bytes, in element order.
#[inline(always)]
unsafe fn grid1(a: usize, b: usize) -> int8x16_t {
    vreinterpretq_s8_u64(vcombine_u64(
        vcreate_u64(IQ1S_GRID[a]),
        vcreate_u64(IQ1S_GRID[b]),
    ))
}

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    core::ptr::read_unaligned(p.cast::<u16>())
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    core::ptr::read_unaligned(p.cast::<u32>())
}

/// IQ3_XXS: 98-byte blocks, f16 `d`, 64 grid indices, 8 words of signs and scale.
pub(super) struct Iq3Xxs;

impl IqGrid for Iq3Xxs {
    const W_BYTES: usize = 98;
    const FACTOR: f32 = 0.25;
    const LANE_FACTOR: f32 = 0.25;
    const SHIFT: u8 = 0;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk {
        let q = p.add(2 + 8 * ib);
        let g = |k: usize| IQ3XXS_GRID[*q.add(k) as usize];
        let aux = u32_at(p.add(2 + 64 + 4 * ib));
        let sign = |l: u32| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize] as u16;
        let sc = 2 * (aux >> 28) as i32 + 1;
        Chunk::iq3(g, [sign(0) | sign(1) << 8, sign(2) | sign(3) << 8], sc)
    }
}

/// IQ3_S: 110-byte blocks, f16 `d`, 64 index bytes, 8 bytes of ninth bits, 32 bytes of signs,
/// 4 bytes of scale nibbles.
pub(super) struct Iq3S;

impl IqGrid for Iq3S {
    const W_BYTES: usize = 110;
    const FACTOR: f32 = 1.0;
    const LANE_FACTOR: f32 = 1.0;
    const SHIFT: u8 = 0;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk {
        let q = p.add(2 + 8 * ib);
        let qh = *p.add(66 + ib) as usize;
        let g = |k: usize| IQ3S_GRID[*q.add(k) as usize | ((qh >> k) & 1) << 8];
        let ls = (*p.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xF;
        let sc = 1 + 2 * ls as i32;
        let s = p.add(74 + 4 * ib);
        Chunk::iq3(g, [u16_at(s), u16_at(s.add(2))], sc)
    }
}

/// IQ1_S: 50-byte blocks, f16 `d`, 32 index bytes, 8 LE u16 of top bits, scale and shift.
pub(super) struct Iq1S;

impl IqGrid for Iq1S {
    const W_BYTES: usize = 50;
    const FACTOR: f32 = 0.125;
    const LANE_FACTOR: f32 = 1.0;
    const SHIFT: u8 = 1;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk {
        let q = p.add(2 + 4 * ib);
        let qh = u16_at(p.add(34 + 2 * ib)) as usize;
        let idx = |l: usize| *q.add(l) as usize | ((qh >> (3 * l)) & 7) << 8;
        let dl = vdupq_n_s8(if qh & 0x8000 != 0 { -1 } else { 1 });
        let sc = 2 * ((qh >> 12) & 7) as i32 + 1;
        Chunk::iq1(idx, [sc, sc], [dl, dl])
    }
}

/// IQ1_M: 56-byte blocks, 32 index bytes, 16 bytes of nibbles (top bits and shift), 4 LE u16
/// of 3-bit scales whose top nibbles hold the f16 `d`.
pub(super) struct Iq1M;

impl IqGrid for Iq1M {
    const W_BYTES: usize = 56;
    const FACTOR: f32 = 0.125;
    const LANE_FACTOR: f32 = 1.0;
    const SHIFT: u8 = 2;
    #[inline(always)]
    unsafe fn d(p: *const u8) -> f32 {
        let sc = |k: usize| u16_at(p.add(48 + 2 * k));
        let bits =
            (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
        half::f16::from_bits(bits).to_f32()
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, ib: usize) -> Chunk {
        let q = p.add(4 * ib);
        let qh = u16_at(p.add(32 + 2 * ib)) as usize;
        let nib = |l: usize| (qh >> (4 * l)) & 0xF;
        let idx = |l: usize| *q.add(l) as usize | (nib(l) & 7) << 8;
        let shift = |l: usize| if nib(l) & 8 != 0 { -1i8 } else { 1 };
        let dl = |a: usize, b: usize| vcombine_s8(vdup_n_s8(shift(a)), vdup_n_s8(shift(b)));
        let w = u16_at(p.add(48 + 2 * (ib / 2))) as i32 >> (6 * (ib % 2));
        let sc = [2 * (w & 7) + 1, 2 * ((w >> 3) & 7) + 1];
        Chunk::iq1(idx, sc, [dl(0, 1), dl(2, 3)])
    }
}

/// A row of `nb` super-blocks of `F` against Q8_K: per super-block 8 lanes of `Σ sc·q·y` (and
/// of `Σ sc·δ·y`), converted and fused-multiply-added with `d_w·d_y` (`iq_order::dot_lanes`),
/// or with `tiled` the super-block's whole integer times `d_w` and the format's factor,
/// fused-multiply-added with `d_y` (`iq_order::dot_tiled`).
#[inline(always)]
unsafe fn dot_iq<F: IqGrid>(nb: usize, w: *const u8, x: *const u8, tiled: bool) -> f32 {
    let zero = vdupq_n_f32(0.0);
    let (mut acc, mut acc_m) = ([zero; 2], [zero; 2]);
    let mut acc_s = 0f32;
    for b in 0..nb {
        let wp = w.add(b * F::W_BYTES);
        let xp = x.add(b * Q8K_BYTES);
        let mut s = [vdupq_n_s32(0); 2];
        let mut m = [vdupq_n_s32(0); 2];
        for ib in 0..8 {
            let c = F::chunk(wp, ib);
            for h in 0..2 {
                let y = vld1q_s8(xp.add(4 + 32 * ib + 16 * h).cast());
                s[h] = vmlaq_n_s32(s[h], lanes16(c.q[h], y), c.sc[h]);
                if F::SHIFT != 0 {
                    m[h] = vmlaq_n_s32(m[h], lanes16(c.dl[h], y), c.sc[h]);
                }
            }
        }
        let wd = F::d(wp);
        let yd = core::ptr::read_unaligned(xp.cast::<f32>());
        if tiled {
            let si = vaddvq_s32(vaddq_s32(s[0], s[1]));
            let t = if F::SHIFT != 0 {
                8 * si + vaddvq_s32(vaddq_s32(m[0], m[1]))
            } else {
                si
            };
            let r = t as f32 * (wd * F::FACTOR);
            acc_s = r.mul_add(yd, acc_s);
            continue;
        }
        let d = wd * yd;
        for h in 0..2 {
            acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(s[h]), d);
            if F::SHIFT == 2 {
                acc_m[h] = vfmaq_n_f32(acc_m[h], vcvtq_f32_s32(m[h]), d);
            }
        }
        if F::SHIFT == 1 {
            acc_s = d.mul_add(vaddvq_s32(vaddq_s32(m[0], m[1])) as f32, acc_s);
        }
    }
    match (tiled, F::SHIFT) {
        (true, _) => acc_s,
        (false, 1) => hsum8(acc) + 0.125 * acc_s,
        (false, 2) => hsum8(acc) + 0.125 * hsum8(acc_m),
        _ => F::LANE_FACTOR * hsum8(acc),
    }
}

/// The rows of an [`IqGrid`] format against Q8_K rows.
pub(super) struct RIq<F>(core::marker::PhantomData<F>);

/// IQ3_XXS rows against Q8_K rows.
pub(super) type RIq3Xxs = RIq<Iq3Xxs>;
/// IQ3_S rows against Q8_K rows.
pub(super) type RIq3S = RIq<Iq3S>;
/// IQ1_S rows against Q8_K rows.
pub(super) type RIq1S = RIq<Iq1S>;
/// IQ1_M rows against Q8_K rows.
pub(super) type RIq1M = RIq<Iq1M>;

impl<F: IqGrid> Row for RIq<F> {
    const BLOCK: usize = 256;
    const W: usize = F::W_BYTES;
    const X: usize = Q8K_BYTES;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, _: usize) -> f32 {
        dot_iq::<F>(n / 256, w, x, nx >= TILED_MIN_ROWS)
    }
}
