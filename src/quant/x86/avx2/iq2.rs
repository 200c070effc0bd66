//! IQ2_XXS and IQ2_S against Q8_K on 256-bit registers (IQ2_XS's single rows and small
//! batches: `iq2xs`; its batches decode here). Each 32-element sub-block is
//! decoded as the scalar code decodes it (`quant::iq2`: four grid entries of 8 magnitudes, four
//! sign masks, two 4-bit scales); the magnitudes (<= 43) multiply the activations with their
//! signs applied (`vpsignb`), as the reference's AVX2 kernels do, into 8 i32 lanes (elements
//! `4l .. 4l + 4`), each times its half's odd scale `2 ls + 1`. The float arithmetic is
//! `kquant_order`'s for these formats: per super-block the 8 lanes fused-multiply-added with
//! `d/8 · d_y` ([`crate::quant::kquant_order::k_dot_lanes`]), or from [`TILED_MIN_ROWS`]
//! activation rows the super-block's integers summed whole
//! ([`crate::quant::kquant_order::k_dot_tiled`]). In that tiled order a batch decodes each
//! weight row once into a thread's buffer ([`gemm_decoded`]) rather than once per four
//! activation rows: the grid lookups and sign masks are most of a tile's work. On the AVX-512
//! VNNI tier such batches take `iq_tile`'s 16-row tiles instead (a super-block of 16 rows
//! decoded once for every activation row of the call).

use super::*;
use crate::quant::blocks::{BlockIq2S, BlockIq2Xxs, RawBlock};
use crate::quant::iq2::{Iq2Block, Sub};
use crate::quant::kquant_order::TILED_MIN_ROWS;

/// The 32 magnitudes of a sub-block, in element order.
#[inline(always)]
unsafe fn magnitudes(s: &Sub) -> __m256i {
    let g = s.grid.map(|v| v as i64);
    _mm256_set_epi64x(g[3], g[2], g[1], g[0])
}

/// The sub-block's signs as `vpsignb` operands: -1 for a negative element, else 1.
#[inline(always)]
unsafe fn signs(s: &Sub) -> __m256i {
    // Byte `i` of each 128-bit lane picks sign byte `i / 8` of that lane's half.
    const SHUF: [u8; 32] = [
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    ];
    const BIT: [u8; 32] = [
        1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, //
        1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
    ];
    let bytes = _mm256_set1_epi32(i32::from_le_bytes(s.signs));
    let bytes = _mm256_shuffle_epi8(bytes, loadu(SHUF.as_ptr()));
    let bit = loadu(BIT.as_ptr());
    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_or_si256(neg, _mm256_set1_epi8(1))
}

/// IQ2_XXS, IQ2_XS or IQ2_S rows against Q8_K rows; `TILED` selects the tiled kernel's
/// per-super-block order.
pub(in crate::quant::x86) struct TIq2Order<B, const TILED: bool>(core::marker::PhantomData<B>);

/// A 2-bit i-quant's tile: 8 lanes for single rows and small batches, the tiled order from
/// [`TILED_MIN_ROWS`] rows.
pub(in crate::quant::x86) type TIq2<B> = TIq2Order<B, false>;

/// IQ2_XXS rows against Q8_K rows.
pub(in crate::quant::x86) type TIq2Xxs = TIq2<BlockIq2Xxs>;
/// IQ2_S rows against Q8_K rows.
pub(in crate::quant::x86) type TIq2S = TIq2<BlockIq2S>;

impl<B: Iq2Block + RawBlock, const TILED: bool> Tile for TIq2Order<B, TILED> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = core::mem::size_of::<B>();
    const X_BYTES: usize = 292;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        let mut acc = LaneAcc::<NX, TILED>::new();
        for b in 0..n / 256 {
            // SAFETY: the caller's row holds `n / 256` whole blocks; `B` is a `RawBlock`
            // (alignment 1, any bit pattern).
            let blk = &*w.add(b * Self::W_BYTES).cast::<B>();
            let wd = blk.d() * 0.125;
            let mut lanes = [_mm256_setzero_si256(); NX];
            for ib in 0..8 {
                let s = blk.sub(ib);
                let q = magnitudes(&s);
                let sg = signs(&s);
                let sc = _mm256_set_epi32(
                    s.scale(1),
                    s.scale(1),
                    s.scale(1),
                    s.scale(1),
                    s.scale(0),
                    s.scale(0),
                    s.scale(0),
                    s.scale(0),
                );
                for j in 0..NX {
                    let y = loadu(x[j].add(b * Self::X_BYTES + 4 + 32 * ib));
                    let p = D::dpbusd(_mm256_setzero_si256(), q, _mm256_sign_epi8(y, sg));
                    lanes[j] = _mm256_add_epi32(lanes[j], _mm256_mullo_epi32(p, sc));
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
        if TILED || g.nx < TILED_MIN_ROWS {
            gemm_tiles::<Self, D>(g)
        } else if D::VNNI {
            gemm_tile16::<Self>(g)
        } else {
            gemm_decoded::<B, D>(g)
        }
    }
}

/// A super-block for [`gemm_tile16`] (AVX-512 tiers), from the scalar code's sub-blocks: two
/// sub-blocks' 8 grid entries to a register, their 64 sign bits (the sign bytes in element
/// order) as a byte mask, each half's scale `2 ls + 1`, and `d / 8`.
impl<B: Iq2Block + RawBlock, const TILED: bool> TileFormat for TIq2Order<B, TILED> {
    const BYTES: usize = core::mem::size_of::<B>();

    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [__m512i; 4], s: *mut i32) -> f32 {
        // SAFETY: the caller's row holds the whole block; `B` is a `RawBlock` (alignment 1,
        // any bits).
        let blk = &*p.cast::<B>();
        let zero = _mm512_setzero_si512();
        let c128 = _mm512_set1_epi8(-128);
        for (r, q) in q.iter_mut().enumerate() {
            let (a, b) = (blk.sub(2 * r), blk.sub(2 * r + 1));
            let g: [i64; 8] =
                core::array::from_fn(|i| (if i < 4 { a.grid[i] } else { b.grid[i - 4] }) as i64);
            let g = _mm512_set_epi64(g[7], g[6], g[5], g[4], g[3], g[2], g[1], g[0]);
            let m = u32::from_le_bytes(a.signs) as u64 | (u32::from_le_bytes(b.signs) as u64) << 32;
            *q = _mm512_xor_si512(_mm512_mask_sub_epi8(g, m, zero, g), c128);
            for (h, sub) in [a, b].iter().enumerate() {
                for k in 0..2 {
                    *s.add(16 * (4 * r + 2 * h + k)) = sub.scale(k);
                }
            }
        }
        blk.d() * 0.125
    }
}

/// A sub-block decoded: magnitudes, `vpsignb` signs and each i32 lane's scale.
#[derive(Clone, Copy)]
struct Decoded {
    q: __m256i,
    s: __m256i,
    sc: __m256i,
}

/// A weight row decoded: 8 sub-blocks per super-block, and each super-block's `d/8`.
#[derive(Default)]
struct Row {
    sub: Vec<Decoded>,
    wd: Vec<f32>,
}

std::thread_local! {
    /// A thread's decoded weight row (the tiled order's batches), kept between calls.
    static ROW: core::cell::Cell<Row> = const {
        core::cell::Cell::new(Row {
            sub: Vec::new(),
            wd: Vec::new(),
        })
    };
}

/// The tiled order over a batch: each weight row decoded once into [`Decoded`] sub-blocks
/// (the grid lookups and sign masks are most of a tile's work), then multiplied with the
/// activation rows four at a time, as [`TIq2Order`]'s tiled tile does (the same integers, the
/// same float steps: the same bits).
#[inline(always)]
pub(super) unsafe fn gemm_decoded<B: Iq2Block + RawBlock, D: IDot>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = n / 256;
    let size = core::mem::size_of::<B>();
    let mut row = ROW.with(|r| r.take());
    let xr = |j: usize| x.add(j * x_stride);
    for i in 0..nw {
        let wr = w.add(i * w_stride);
        row.sub.clear();
        row.wd.clear();
        for b in 0..nb {
            // SAFETY: the row holds `nb` whole blocks; `B` is a `RawBlock` (alignment 1, any
            // bits).
            let blk = &*wr.add(b * size).cast::<B>();
            row.wd.push(blk.d() * 0.125);
            for ib in 0..8 {
                let s = blk.sub(ib);
                let (s0, s1) = (s.scale(0), s.scale(1));
                row.sub.push(Decoded {
                    q: magnitudes(&s),
                    s: signs(&s),
                    sc: _mm256_set_epi32(s1, s1, s1, s1, s0, s0, s0, s0),
                });
            }
        }
        let mut j = 0;
        while j + 4 <= nx {
            let r = decoded_tile::<D, 4>(&row, [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)]);
            for (t, v) in r.into_iter().enumerate() {
                *out.add((j + t) * out_stride + i) = v;
            }
            j += 4;
        }
        macro_rules! rest {
            ($nx:literal, [$($t:literal),*]) => {{
                let r = decoded_tile::<D, $nx>(&row, [$(xr(j + $t)),*]);
                for (t, v) in r.into_iter().enumerate() {
                    *out.add((j + t) * out_stride + i) = v;
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
    ROW.with(|r| r.set(row));
}

/// A decoded weight row against `NX` activation rows in the tiled order.
#[inline(always)]
unsafe fn decoded_tile<D: IDot, const NX: usize>(row: &Row, x: [*const u8; NX]) -> [f32; NX] {
    let mut acc = LaneAcc::<NX, true>::new();
    for (b, (sub, &d)) in row.sub.chunks_exact(8).zip(&row.wd).enumerate() {
        let mut lanes = [_mm256_setzero_si256(); NX];
        for (ib, c) in sub.iter().enumerate() {
            for j in 0..NX {
                let y = loadu(x[j].add(b * 292 + 4 + 32 * ib));
                let p = D::dpbusd(_mm256_setzero_si256(), c.q, _mm256_sign_epi8(y, c.s));
                lanes[j] = _mm256_add_epi32(lanes[j], _mm256_mullo_epi32(p, c.sc));
            }
        }
        for j in 0..NX {
            acc.add(j, lanes[j], d, f32_at(x[j].add(b * 292)));
        }
    }
    acc.finish()
}
