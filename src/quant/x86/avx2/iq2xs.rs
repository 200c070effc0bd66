//! IQ2_XS against Q8_K, decoded the way its layout allows rather than through the shared
//! 2-bit sub-block decoding (`iq2`'s `Sub`, built one group at a time in scalar code):
//!
//! - the sign masks of 16 groups at once: each group's word holds its 7 stored signs in its top
//!   bits, and the eighth (the parity of the seven) comes from a 16-entry byte shuffle, as the
//!   reference's AVX2 kernel finds it;
//! - the grid entries loaded straight from the group words (`& 511`), 4 (256-bit) or 8
//!   (512-bit) to a register;
//! - the signs applied to the activations, the magnitudes (8, 25, 43) multiplied with them by
//!   `vpmaddubsw` (a pair sum is at most 2 · 43 · 127: exact in i16), then each pair times its
//!   16 elements' odd scale `2 ls + 1` into i32 lanes by `vpmaddwd` / `vpdpwssd`, the scales
//!   picked per register by one byte shuffle of the block's 16 scale bytes.
//!
//! On the AVX-512 tiers a register holds two sub-blocks (64 elements): the signs become a
//! 64-bit byte mask (`vpmovwb` of the 16 group masks) and negate the activations by a masked
//! subtraction. Either way the super-block ends as `iq2`'s 8 i32 lanes (lane `l`: elements
//! `4l .. 4l + 4` of every sub-block, each times its half's scale: the same integers, added in
//! another order, so the same bits), and the float steps are `LaneAcc`'s.
//!
//! Batches of [`TILED_MIN_ROWS`] rows or more take, on the AVX-512 VNNI tier, `iq_tile`'s
//! 16-row tiles (a super-block of 16 rows decoded once for every activation row), and on
//! AVX-512 without VNNI this file's `gemm_batch` (each row decoded once per call).

use super::*;
use crate::quant::blocks::BlockIq2Xs;
use crate::quant::iq2_grids::IQ2XS_GRID;
use crate::quant::kquant_order::TILED_MIN_ROWS;

/// Bytes of an IQ2_XS block: f16 `d`, 32 LE u16 (grid index in the low 9 bits, sign index in
/// the top 7), 8 scale bytes (low nibble: the first 16 elements of a sub-block).
const BYTES: usize = 74;

/// `0x80` at the nibbles with an odd number of set bits.
const PARITY: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = (((i % 16) as u8).count_ones() as u8 & 1) << 7;
        i += 1;
    }
    t
};

/// The sign masks of the 16 groups whose words `q` holds, each in the low byte of its 16-bit
/// lane (bit `j`: element `j` of the group negative; the high bytes are zero): the 7 stored
/// bits, and the parity of the 7 in bit 7 (`KSIGNS_IQ2XS`).
#[inline(always)]
unsafe fn sign_words(q: __m256i) -> __m256i {
    let s = _mm256_srli_epi16::<9>(q);
    // Low nibble: bits 0..4 of `s` xor its bits 4..7, whose parity is that of `s`; the byte
    // is below 0x80, so the shuffle reads the table.
    let nib = _mm256_xor_si256(s, _mm256_srli_epi16::<13>(q));
    _mm256_or_si256(s, _mm256_shuffle_epi8(loadu(PARITY.as_ptr()), nib))
}

/// The 16 scale bytes `2 ls + 1` of the block at `p`, one per 16 elements, in element order.
#[inline(always)]
unsafe fn scale_bytes(p: *const u8) -> __m128i {
    let s = _mm_loadl_epi64(p.add(66).cast());
    let m4 = _mm_set1_epi8(0xF);
    let h = _mm_unpacklo_epi8(
        _mm_and_si128(s, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(s), m4),
    );
    _mm_add_epi8(_mm_add_epi8(h, h), _mm_set1_epi8(1))
}

/// The grid entry of the group word at `q`.
#[inline(always)]
unsafe fn grid(q: *const u8) -> i64 {
    let i = core::ptr::read_unaligned(q.cast::<u16>()) & 511;
    // SAFETY: `i < 512`, the table's length.
    *IQ2XS_GRID.get_unchecked(i as usize) as i64
}

/// The magnitudes of the 4 groups whose words start at `q` (32 elements).
#[inline(always)]
unsafe fn grid4(q: *const u8) -> __m256i {
    _mm256_set_epi64x(grid(q.add(6)), grid(q.add(4)), grid(q.add(2)), grid(q))
}

/// The magnitudes of the 8 groups whose words start at `q` (64 elements).
#[inline(always)]
unsafe fn grid8(q: *const u8) -> __m512i {
    _mm512_set_epi64(
        grid(q.add(14)),
        grid(q.add(12)),
        grid(q.add(10)),
        grid(q.add(8)),
        grid(q.add(6)),
        grid(q.add(4)),
        grid(q.add(2)),
        grid(q),
    )
}

/// Byte shuffles of the 16 scale bytes (in every 128-bit lane) to 16-bit scales: register `r`
/// of 16 elements per 128-bit lane takes scale byte `r · LANES + lane`, zero-extended.
const fn scale_shuffles<const R: usize, const B: usize>(lanes: usize) -> [[u8; B]; R] {
    let mut t = [[0u8; B]; R];
    let mut r = 0;
    while r < R {
        let mut i = 0;
        while i < B {
            t[r][i] = if i % 2 == 0 {
                (r * lanes + i / 16) as u8
            } else {
                0x80
            };
            i += 1;
        }
        r += 1;
    }
    t
}

/// The 256-bit registers' scale shuffles (sub-block `r`: scales `2r`, `2r + 1`).
static SCALES256: [[u8; 32]; 8] = scale_shuffles::<8, 32>(2);
/// The 512-bit registers' scale shuffles (sub-blocks `2r`, `2r + 1`: scales `4r .. 4r + 4`).
static SCALES512: [[u8; 64]; 4] = scale_shuffles::<4, 64>(4);

/// Byte `i` of each 128-bit lane picks sign byte `i / 8` of groups 0..2 (low lane) and 2..4
/// (high lane) of the 8 in the lane's words: the first and the second 4 groups.
static SIGN_SHUF: [[u8; 32]; 2] = {
    let mut t = [[0u8; 32]; 2];
    let mut k = 0;
    while k < 2 {
        let mut i = 0;
        while i < 32 {
            t[k][i] = (2 * (4 * k + i / 8)) as u8;
            i += 1;
        }
        k += 1;
    }
    t
};

/// Each byte's bit within its group's sign mask.
const SIGN_BIT: [u8; 32] = [
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, //
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
];

/// One super-block (at `p`) against block `b` of the `NX` activation rows, on 256-bit
/// registers: each row's 8 lanes.
#[inline(always)]
unsafe fn block256<D: IDot, const NX: usize>(p: *const u8, x: Rows<NX>, b: usize) -> [__m256i; NX] {
    let sc = _mm256_broadcastsi128_si256(scale_bytes(p));
    let bit = loadu(SIGN_BIT.as_ptr());
    let one = _mm256_set1_epi8(1);
    let mut lanes = [_mm256_setzero_si256(); NX];
    for h in 0..2 {
        let sw = sign_words(loadu(p.add(2 + 32 * h)));
        let halves = [
            _mm256_permute2x128_si256::<0x00>(sw, sw),
            _mm256_permute2x128_si256::<0x11>(sw, sw),
        ];
        for k in 0..4 {
            let ib = 4 * h + k;
            let g = grid4(p.add(2 + 8 * ib));
            let m = _mm256_shuffle_epi8(halves[k / 2], loadu(SIGN_SHUF[k % 2].as_ptr()));
            let neg = _mm256_cmpeq_epi8(_mm256_and_si256(m, bit), bit);
            let sg = _mm256_or_si256(neg, one);
            let s = _mm256_shuffle_epi8(sc, loadu(SCALES256[ib].as_ptr()));
            for j in 0..NX {
                let y = loadu(x[j].add(b * Q8K_BYTES + 4 + 32 * ib));
                let p16 = _mm256_maddubs_epi16(g, _mm256_sign_epi8(y, sg));
                lanes[j] = D::dpwssd(lanes[j], p16, s);
            }
        }
    }
    lanes
}

/// The block's 256 sign bits as four 64-bit masks in element order (bit `i` of mask `r`:
/// element `64·r + i` is negative), two from each half's 128.
#[inline(always)]
unsafe fn sign_masks(p: *const u8) -> [u64; 4] {
    let mut masks = [0u64; 4];
    for h in 0..2 {
        let signs = _mm256_cvtepi16_epi8(sign_words(loadu(p.add(2 + 32 * h))));
        masks[2 * h] = _mm_cvtsi128_si64(signs) as u64;
        masks[2 * h + 1] = _mm_extract_epi64::<1>(signs) as u64;
    }
    masks
}

/// [`block256`] on 512-bit registers (AVX-512 tiers only), two sub-blocks to a register, its
/// halves added at the end.
#[inline(always)]
unsafe fn block512<D: IDot, const NX: usize>(p: *const u8, x: Rows<NX>, b: usize) -> [__m256i; NX] {
    let sc = _mm512_broadcast_i32x4(scale_bytes(p));
    let zero = _mm512_setzero_si512();
    let mut lanes = [zero; NX];
    for (r, m) in sign_masks(p).into_iter().enumerate() {
        let g = grid8(p.add(2 + 16 * r));
        let s = _mm512_shuffle_epi8(sc, _mm512_loadu_si512(SCALES512[r].as_ptr().cast()));
        for j in 0..NX {
            let y = _mm512_loadu_si512(x[j].add(b * Q8K_BYTES + 4 + 64 * r).cast());
            let ys = _mm512_mask_sub_epi8(y, m, zero, y);
            lanes[j] = D::dpwssd512(lanes[j], _mm512_maddubs_epi16(g, ys), s);
        }
    }
    lanes.map(|v| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)))
}

/// IQ2_XS rows against Q8_K rows; `TILED` selects the tiled kernel's per-super-block order.
pub(in crate::quant::x86) struct TIq2XsOrder<const TILED: bool>;

/// IQ2_XS rows against Q8_K rows: 8 lanes for single rows and small batches, the tiled order
/// from [`TILED_MIN_ROWS`] rows.
pub(in crate::quant::x86) type TIq2Xs = TIq2XsOrder<false>;

impl<const TILED: bool> Tile for TIq2XsOrder<TILED> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = BYTES;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        let mut acc = LaneAcc::<NX, TILED>::new();
        for b in 0..n / 256 {
            let p = w.add(b * BYTES);
            // `d / 8`: exact, as `iq2`'s.
            let wd = _mm_cvtss_f32(f16x2_at(p)) * 0.125;
            let lanes = if D::AVX512 {
                block512::<D, NX>(p, x, b)
            } else {
                block256::<D, NX>(p, x, b)
            };
            for j in 0..NX {
                acc.add(j, lanes[j], wd, f32_at(x[j].add(b * Q8K_BYTES)));
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
        } else if D::AVX512 {
            gemm_batch::<D>(g)
        } else {
            gemm_decoded::<BlockIq2Xs, D>(g)
        }
    }
}

/// A super-block for [`gemm_tile16`] (AVX-512 tiers): the signed magnitudes by
/// [`sign_masks`] and [`grid8`], each scale `2 ls + 1` per 16 elements, and `d / 8`.
impl<const TILED: bool> TileFormat for TIq2XsOrder<TILED> {
    const BYTES: usize = BYTES;

    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [__m512i; 4], s: *mut i32) -> f32 {
        let zero = _mm512_setzero_si512();
        let c128 = _mm512_set1_epi8(-128);
        for (r, m) in sign_masks(p).into_iter().enumerate() {
            let g = grid8(p.add(2 + 16 * r));
            q[r] = _mm512_xor_si512(_mm512_mask_sub_epi8(g, m, zero, g), c128);
        }
        let sc: [u8; 16] = core::mem::transmute(scale_bytes(p));
        for (g, &v) in sc.iter().enumerate() {
            *s.add(16 * g) = v as i32;
        }
        _mm_cvtss_f32(f16x2_at(p)) * 0.125
    }
}

// ---------------------------------------------------------------------------------------------
// Batches on the AVX-512 tiers: the tiled order over weight rows decoded once.

/// A thread's buffers for [`gemm_batch`], kept between calls.
#[derive(Default)]
struct Batch {
    /// The weight row: per super-block 4 registers of signed magnitudes (±8, ±25, ±43), then
    /// their 4 registers of 16-bit scales.
    w: Vec<__m512i>,
    /// Per super-block: `d / 8`, and the integer the activations' offset adds (below).
    wd: Vec<f32>,
    off: Vec<i32>,
    /// The activation rows' quants plus 128 (unsigned bytes), row after row.
    xu: Vec<__m512i>,
    /// The activation rows' scales: super-block `b` of row `j` at `b · rows + j`, `rows` the
    /// batch rounded up to 4 (zeros after its last row).
    yd: Vec<f32>,
}

std::thread_local! {
    static BATCH: core::cell::Cell<Batch> = const {
        core::cell::Cell::new(Batch {
            w: Vec::new(),
            wd: Vec::new(),
            off: Vec::new(),
            xu: Vec::new(),
            yd: Vec::new(),
        })
    };
}

/// The 4 lanes' sums of `v[0..4]` (each 16 i32 lanes), in one register.
#[inline(always)]
unsafe fn sums4(v: [__m512i; 4]) -> __m128i {
    let f =
        v.map(|v| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)));
    let ab = _mm256_hadd_epi32(f[0], f[1]);
    let cd = _mm256_hadd_epi32(f[2], f[3]);
    let s = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// Weight row `wr` (`nb` super-blocks) into `bt.w`, `bt.wd`, `bt.off`. The activations come
/// as `y + 128` (unsigned, for `vpmaddubsw`: a pair sum stays within 2 · 255 · 43), which adds
/// `128 · Σ s·w` to a super-block's integer: `off`, computed the same way.
#[inline(always)]
unsafe fn decode_row(wr: *const u8, nb: usize, bt: &mut Batch) {
    let zero = _mm512_setzero_si512();
    let c128 = _mm512_set1_epi8(-128);
    bt.w.clear();
    bt.wd.clear();
    bt.off.clear();
    for b in 0..nb {
        let p = wr.add(b * BYTES);
        bt.wd.push(_mm_cvtss_f32(f16x2_at(p)) * 0.125);
        let sc = _mm512_broadcast_i32x4(scale_bytes(p));
        let mut q = [zero; 4];
        let mut s = [zero; 4];
        for (r, m) in sign_masks(p).into_iter().enumerate() {
            let g = grid8(p.add(2 + 16 * r));
            q[r] = _mm512_mask_sub_epi8(g, m, zero, g);
            s[r] = _mm512_shuffle_epi8(sc, _mm512_loadu_si512(SCALES512[r].as_ptr().cast()));
        }
        let mut off = zero;
        for r in 0..4 {
            let p16 = _mm512_maddubs_epi16(c128, q[r]);
            off = _mm512_add_epi32(off, _mm512_madd_epi16(p16, s[r]));
        }
        bt.off.push(_mm512_reduce_add_epi32(off));
        bt.w.extend_from_slice(&q);
        bt.w.extend_from_slice(&s);
    }
}

/// The decoded weight row against activation rows `j .. j + NX` (`NX` <= 4): each super-block's
/// integer summed whole, then `(Σ · d_w) · d_y` fused into the row's sum, as
/// [`LaneAcc`]'s tiled order does.
#[inline(always)]
unsafe fn batch_tile<D: IDot, const NX: usize>(
    bt: &Batch,
    nb: usize,
    j: usize,
    rows: usize,
) -> __m128 {
    let zero = _mm512_setzero_si512();
    let mut acc = _mm_setzero_ps();
    let xr: [*const __m512i; NX] = core::array::from_fn(|t| bt.xu.as_ptr().add((j + t) * 4 * nb));
    for b in 0..nb {
        let (q, s) = (&bt.w[8 * b..8 * b + 4], &bt.w[8 * b + 4..8 * b + 8]);
        let mut l = [zero; 4];
        for r in 0..4 {
            for t in 0..NX {
                let y = *xr[t].add(4 * b + r);
                l[t] = D::dpwssd512(l[t], _mm512_maddubs_epi16(y, q[r]), s[r]);
            }
        }
        let sums = _mm_sub_epi32(sums4(l), _mm_set1_epi32(bt.off[b]));
        let r = _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_set1_ps(bt.wd[b]));
        acc = _mm_fmadd_ps(r, _mm_loadu_ps(bt.yd.as_ptr().add(b * rows + j)), acc);
    }
    acc
}

/// A batch in the tiled order (AVX-512 tiers): the activation rows once as unsigned bytes,
/// then each weight row decoded once into signed magnitudes and scales and multiplied with
/// the activation rows four at a time: 2 operations per 64 products and row.
#[inline(always)]
unsafe fn gemm_batch<D: IDot>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = n / 256;
    let rows = nx.div_ceil(4) * 4;
    let mut bt = BATCH.with(|b| b.take());
    bt.xu.clear();
    bt.yd.clear();
    bt.yd.resize(nb * rows, 0.0);
    let c128 = _mm512_set1_epi8(-128);
    for j in 0..nx {
        let xr = x.add(j * x_stride);
        for b in 0..nb {
            bt.yd[b * rows + j] = f32_at(xr.add(b * Q8K_BYTES));
            for r in 0..4 {
                let y = _mm512_loadu_si512(xr.add(b * Q8K_BYTES + 4 + 64 * r).cast());
                bt.xu.push(_mm512_xor_si512(y, c128));
            }
        }
    }
    for i in 0..nw {
        decode_row(w.add(i * w_stride), nb, &mut bt);
        let mut j = 0;
        let put = |j: usize, k: usize, v: __m128| {
            let v: [f32; 4] = core::mem::transmute(v);
            for (t, &v) in v.iter().enumerate().take(k) {
                *out.add((j + t) * out_stride + i) = v;
            }
        };
        while j + 4 <= nx {
            put(j, 4, batch_tile::<D, 4>(&bt, nb, j, rows));
            j += 4;
        }
        match nx - j {
            3 => put(j, 3, batch_tile::<D, 3>(&bt, nb, j, rows)),
            2 => put(j, 2, batch_tile::<D, 2>(&bt, nb, j, rows)),
            1 => put(j, 1, batch_tile::<D, 1>(&bt, nb, j, rows)),
            _ => {}
        }
    }
    BATCH.with(|b| b.set(bt));
}

#[cfg(test)]
mod tests {
    use crate::quant::iq2_grids::IQ2XS_GRID;
    use crate::quant::kquant_order::row_dot;
    use crate::quant::tests::Rng;
    use crate::quant::{kernels_for, GemmArgs, GgmlType, Isa};

    /// A Q8_K block's sums of 16 (bytes 260..292) from its quants, as quantizing writes them.
    fn fill_sums(blk: &mut [u8]) {
        for g in 0..16 {
            let sum: i16 = blk[4 + 16 * g..20 + 16 * g]
                .iter()
                .map(|&q| q as i8 as i16)
                .sum();
            blk[260 + 2 * g..262 + 2 * g].copy_from_slice(&sum.to_le_bytes());
        }
    }

    /// IQ2_XS blocks at the extremes the kernels' integer steps must hold exactly: the grid
    /// entries with the most 43s (and the first and last index), the scales at 15 and 0 (and
    /// mixed), each of the 128 sign indices once, against activations of ±127 (a Q8_K row's
    /// extremes); every tier's single-row, small-batch and batch kernels give the exact
    /// order's bits.
    #[test]
    fn iq2xs_kernels_are_exact_on_extreme_blocks() {
        let ty = GgmlType::IQ2XS;
        let big = |g: u64| g.to_le_bytes().iter().filter(|&&b| b == 43).count();
        let most = (0..512).map(|i| big(IQ2XS_GRID[i])).max().unwrap();
        let heavy: Vec<u16> = (0..512u16)
            .filter(|&i| big(IQ2XS_GRID[i as usize]) == most)
            .collect();
        let mut rng = Rng(0x1a2b);
        let n = 4 * 256;
        let mut w = vec![0u8; ty.row_bytes(n).unwrap()];
        for (b, blk) in w.chunks_exact_mut(74).enumerate() {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.75).to_le_bytes());
            for g in 0..32 {
                let grid = match g % 8 {
                    6 => 0,
                    7 => 511,
                    _ => heavy[rng.next() as usize % heavy.len()],
                };
                let idx = grid | (((32 * b + g) as u16 % 128) << 9);
                blk[2 + 2 * g..4 + 2 * g].copy_from_slice(&idx.to_le_bytes());
            }
            blk[66..].fill([0xFF, 0x00, 0xF0, 0x0F][b]);
        }
        let nx = 9;
        let mut x = vec![0u8; nx * 292 * 4];
        for blk in x.chunks_exact_mut(292) {
            blk[..4].copy_from_slice(&0.5f32.to_le_bytes());
            for q in &mut blk[4..260] {
                *q = if rng.next() & 1 == 0 {
                    127
                } else {
                    -127i8 as u8
                };
            }
            fill_sums(blk);
        }
        let rx = 292 * 4;
        for isa in Isa::available() {
            let Ok(k) = kernels_for(ty, isa) else {
                continue;
            };
            for batch in [1, 3, nx] {
                let mut out = vec![f32::NAN; batch];
                (k.gemm)(GemmArgs::new(
                    n,
                    (&w, w.len(), 1),
                    (&x, rx, batch),
                    (&mut out, 1),
                ));
                for (j, &got) in out.iter().enumerate() {
                    let want = row_dot(ty, &w, &x[j * rx..], n, batch, j).unwrap();
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa:?} {batch} rows, row {j}"
                    );
                    if batch == 1 {
                        let v = (k.vec_dot)(n, &w, &x[j * rx..]);
                        assert_eq!(v.to_bits(), want.to_bits(), "{isa:?} vec_dot");
                    }
                }
            }
        }
    }

    /// Random IQ2_XS rows (any grid index, signs and scales) against activation rows of random
    /// quants, often at a Q8_K row's extremes (±127), in batches that fill the 8-row passes
    /// and leave every remainder: every tier's output has the exact order's bits, for each
    /// weight row of the call.
    #[test]
    fn iq2xs_batches_are_exact_on_random_blocks() {
        let ty = GgmlType::IQ2XS;
        let mut rng = Rng(0x5eed);
        let (n, nw) = (2 * 256, 19);
        let rw = ty.row_bytes(n).unwrap();
        let mut w = vec![0u8; nw * rw];
        for blk in w.chunks_exact_mut(74) {
            for b in blk.iter_mut() {
                *b = rng.next() as u8;
            }
            let d = 0.01 + (rng.next() % 1000) as f32 / 997.0;
            blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        }
        let max_nx = 512;
        let rx = 292 * 2;
        let mut x = vec![0u8; max_nx * rx];
        for blk in x.chunks_exact_mut(292) {
            let d = 0.001 + (rng.next() % 1000) as f32 / 1009.0;
            blk[..4].copy_from_slice(&d.to_le_bytes());
            for q in &mut blk[4..260] {
                *q = match rng.next() % 8 {
                    0 => -127i8 as u8,
                    1 => 127,
                    _ => match rng.next() as u8 {
                        0x80 => 0x81,
                        q => q,
                    },
                };
            }
            fill_sums(blk);
        }
        for isa in Isa::available() {
            let Ok(k) = kernels_for(ty, isa) else {
                continue;
            };
            for batch in [8, 13, 16, 17, 24, 35, max_nx] {
                let mut out = vec![f32::NAN; batch * nw];
                (k.gemm)(GemmArgs::new(
                    n,
                    (&w, rw, nw),
                    (&x, rx, batch),
                    (&mut out, nw),
                ));
                for j in 0..batch {
                    for i in 0..nw {
                        let want = row_dot(ty, &w[i * rw..], &x[j * rx..], n, batch, j).unwrap();
                        let got = out[j * nw + i];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{isa:?} {batch} rows, weight row {i}, row {j}"
                        );
                    }
                }
            }
        }
    }
}
