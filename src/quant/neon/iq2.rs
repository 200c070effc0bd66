//! IQ2_XXS, IQ2_XS and IQ2_S against Q8_K on NEON. Each 32-element sub-block is decoded as the
//! scalar code decodes it (`quant::iq2`); its magnitudes (<= 43) take their signs as bytes and
//! multiply the activations as the other formats' quants do, into ggml's 8 lanes (elements
//! `4l .. 4l + 4`), each times its half's odd scale `2 ls + 1`; the float arithmetic is the x86
//! kernels' ([`kquant_order::k_dot_lanes`] with the weight's scale `d / 8`, or
//! [`kquant_order::k_dot_tiled`] for batches the reference tiles).
//!
//! [`kquant_order::k_dot_lanes`]: crate::quant::kquant_order::k_dot_lanes
//! [`kquant_order::k_dot_tiled`]: crate::quant::kquant_order::k_dot_tiled

use super::{mla_sub_block, LaneSum, Row, Q8K_BYTES};
use crate::quant::blocks::RawBlock;
use crate::quant::iq2::Iq2Block;
use core::arch::aarch64::*;

/// 16 signed weights: the magnitudes of two grid entries, negated where their sign masks
/// have a bit set.
#[inline(always)]
unsafe fn signed16(g: [u64; 2], s: [u8; 2]) -> int8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let m = vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(g[0]), vcreate_u8(g[1])));
    let signs = vcombine_u8(vdup_n_u8(s[0]), vdup_n_u8(s[1]));
    let neg = vreinterpretq_s8_u8(vtstq_u8(signs, vld1q_u8(BIT.as_ptr())));
    // (m ^ -1) - (-1) = -m where negative; m where not.
    vsubq_s8(veorq_s8(m, neg), neg)
}

/// A row of `nb` super-blocks `B` against Q8_K: per super-block ggml's 8 lanes, converted and
/// fused-multiply-added with `d/8 · d_y`, or with `tiled` the super-block's integers summed
/// whole, times `d/8`, then fused-multiply-added with `d_y`.
#[inline(always)]
unsafe fn dot_iq2<B: Iq2Block + RawBlock>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    tiled: bool,
) -> f32 {
    let size = core::mem::size_of::<B>();
    let mut sum = LaneSum::new(tiled);
    for b in 0..nb {
        // SAFETY: the row holds `nb` whole blocks; `B` is a `RawBlock` (alignment 1, any bits).
        let blk = &*w.add(b * size).cast::<B>();
        let xp = x.add(b * Q8K_BYTES);
        let mut lanes = [vdupq_n_s32(0); 2];
        for ib in 0..8 {
            let s = blk.sub(ib);
            let q0 = signed16([s.grid[0], s.grid[1]], [s.signs[0], s.signs[1]]);
            let q1 = signed16([s.grid[2], s.grid[3]], [s.signs[2], s.signs[3]]);
            mla_sub_block(&mut lanes, [q0, q1], xp, ib, [s.scale(0), s.scale(1)]);
        }
        let d = blk.d() * 0.125;
        let yd = core::ptr::read_unaligned(xp.cast::<f32>());
        sum.add(lanes, d, yd);
    }
    sum.sum()
}

/// IQ2_XXS, IQ2_XS or IQ2_S rows (`B`) against Q8_K rows.
pub(super) struct RIq2<B>(core::marker::PhantomData<B>);

impl<B: Iq2Block + RawBlock> Row for RIq2<B> {
    const BLOCK: usize = 256;
    const W: usize = core::mem::size_of::<B>();
    const X: usize = Q8K_BYTES;
    unsafe fn dot(n: usize, w: *const u8, x: *const u8, nx: usize, _: usize) -> f32 {
        let tiled = crate::quant::kquant_order::tiled(B::TYPE, nx);
        dot_iq2::<B>(n / 256, w, x, tiled)
    }
}
