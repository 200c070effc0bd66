//! Prompt products of the i-quants on the AVX-512 VNNI tier: 16 weight rows at a time, one
//! super-block of them decoded ONCE into a small tile of bytes, then every activation row of
//! the call multiplied over that tile.
//!
//! The tile holds the 16 rows' 256 values each plus 128 (unsigned bytes) with the rows in the
//! 16 lanes of a 512-bit register (register `k`: elements `4k .. 4k + 4` of every row, 64
//! registers, 4 KiB), so `vpdpbusd` of one register with four activation quants broadcast to
//! every lane adds four products to each of the 16 rows and nothing is ever summed across
//! lanes. Per sub-block of 16 elements (the formats' scale granularity) the 16
//! lanes' sums are multiplied by the lanes' integer scales and added up per super-block in
//! i32: each lane then holds `Σ_g s_g · Σ (w + 128) · y`, and the offset's part,
//! `128 · Σ_g s_g · Σ y`, comes from the Q8_K row's sums of 16 by `vpdpwssd` against the
//! lanes' scales in pairs. The result is the exact integer of the row-major kernels (integer
//! sums in another order), turned into a float as the tiled order does: times the row's
//! multiplier, then fused-multiply-added with the activation's `d` into the row's sum, super-block
//! after super-block ([`crate::quant::kquant_order::TILED_MIN_ROWS`] rows or more only).
//!
//! Each format says only how one super-block of one row decodes ([`TileFormat::decode`]); the
//! transposition into lanes and the product are shared.

use super::*;

/// Weight rows per tile: the lanes of a 512-bit register of i32.
const LANES: usize = 16;

/// Activation rows per pass over a tile.
const PASS: usize = 8;

/// A format whose super-blocks of 256 elements decode to signed bytes and an integer scale
/// per 16 elements.
pub(super) trait TileFormat {
    /// Bytes of a super-block.
    const BYTES: usize;
    /// The super-block at `p`: its 256 values plus 128 as unsigned bytes in element order
    /// (`q`), the integer scale of each 16 elements (`s[16 · g]`, `g < 16`: the callers'
    /// stride), and the float the super-block's integer is multiplied by.
    unsafe fn decode(p: *const u8, q: &mut [__m512i; 4], s: *mut i32) -> f32;
}

/// One super-block of 16 weight rows, decoded.
struct TileBuf {
    /// Register `k`: elements `4k .. 4k + 4` of each row (lane `r`: row `r`), plus 128.
    q: [__m512i; 64],
    /// The scale of elements `16g .. 16g + 16`, lane `r`: row `r`.
    s: [__m512i; 16],
    /// Lane `r`: row `r`'s scales of elements `32k .. 32k + 16` and `32k + 16 .. 32k + 32` as
    /// the low and high 16 bits ([`TileBuf::pair_scales`]).
    sp: [__m512i; 8],
    /// Lane `r`: row `r`'s multiplier.
    d: __m512,
}

impl TileBuf {
    #[inline(always)]
    unsafe fn new() -> Self {
        TileBuf {
            q: [_mm512_setzero_si512(); 64],
            s: [_mm512_setzero_si512(); 16],
            sp: [_mm512_setzero_si512(); 8],
            d: _mm512_setzero_ps(),
        }
    }

    /// `sp` from `s`.
    #[inline(always)]
    unsafe fn pair_scales(&mut self) {
        for k in 0..8 {
            let lo = _mm512_and_si512(self.s[2 * k], _mm512_set1_epi32(0xFFFF));
            self.sp[k] = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(self.s[2 * k + 1]));
        }
    }
}

/// `a[r]`'s 32-bit element `c` to `out[c]`'s element `r`, for 16 registers.
#[inline(always)]
unsafe fn transpose16(a: &[__m512i; 16], out: &mut [__m512i]) {
    // Pairs of rows interleaved by 32 bits, then quadruples by 64 bits: `s[q][e]`'s 128-bit
    // lane `l` holds rows `4q .. 4q + 4` of element `4l + e`.
    let t: [__m512i; 16] = core::array::from_fn(|i| {
        let (x, y) = (a[i & !1], a[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    let s: [[__m512i; 4]; 4] = core::array::from_fn(|q| {
        let (lo0, hi0, lo1, hi1) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
        [
            _mm512_unpacklo_epi64(lo0, lo1),
            _mm512_unpackhi_epi64(lo0, lo1),
            _mm512_unpacklo_epi64(hi0, hi1),
            _mm512_unpackhi_epi64(hi0, hi1),
        ]
    });
    // Then the 4 x 4 128-bit lanes of each `e` transposed.
    for e in 0..4 {
        let x0 = _mm512_shuffle_i32x4::<0x44>(s[0][e], s[1][e]);
        let x1 = _mm512_shuffle_i32x4::<0xEE>(s[0][e], s[1][e]);
        let x2 = _mm512_shuffle_i32x4::<0x44>(s[2][e], s[3][e]);
        let x3 = _mm512_shuffle_i32x4::<0xEE>(s[2][e], s[3][e]);
        out[e] = _mm512_shuffle_i32x4::<0x88>(x0, x2);
        out[4 + e] = _mm512_shuffle_i32x4::<0xDD>(x0, x2);
        out[8 + e] = _mm512_shuffle_i32x4::<0x88>(x1, x3);
        out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(x1, x3);
    }
}

/// Super-block `b` of the rows at `w` (`rows` of them, 1..=16; the lanes past them repeat
/// the last row) into `t`.
#[inline(always)]
unsafe fn decode_tile<F: TileFormat>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    b: usize,
    t: &mut TileBuf,
) {
    let zero = _mm512_setzero_si512();
    let mut q = [[zero; 4]; LANES];
    let mut s = [0i32; 16 * LANES];
    let mut d = [0f32; LANES];
    for r in 0..LANES {
        let p = w.add(r.min(rows - 1) * w_stride + b * F::BYTES);
        d[r] = F::decode(p, &mut q[r], s.as_mut_ptr().add(r));
    }
    for (c, tq) in t.q.chunks_exact_mut(16).enumerate() {
        let col: [__m512i; 16] = core::array::from_fn(|r| q[r][c]);
        transpose16(&col, tq);
    }
    for g in 0..16 {
        t.s[g] = _mm512_loadu_si512(s.as_ptr().add(16 * g).cast());
    }
    t.pair_scales();
    t.d = _mm512_loadu_ps(d.as_ptr());
}

/// The four bytes at `p` in every lane.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    _mm512_set1_epi32(core::ptr::read_unaligned(p.cast::<i32>()))
}

/// The tile against the `T` activation blocks at `x`: each row's 16 lanes' integers, times
/// the rows' multipliers, fused into the sums at `out + t · out_stride` (lanes in `m`; the sums
/// start at zero with the first super-block).
#[inline(always)]
#[allow(clippy::incompatible_msrv)]
unsafe fn pass<const T: usize>(
    tile: &TileBuf,
    x: [*const u8; T],
    out: *mut f32,
    out_stride: usize,
    m: __mmask16,
    first: bool,
) {
    let zero = _mm512_setzero_si512();
    // `−128 · Σ_g s_g · Σ y` over the sub-blocks, from the Q8_K sums.
    let mut tot = [zero; T];
    for k in 0..8 {
        for t in 0..T {
            tot[t] = _mm512_dpwssd_epi32(tot[t], tile.sp[k], bcast(x[t].add(260 + 4 * k)));
        }
    }
    for v in &mut tot {
        *v = _mm512_sub_epi32(zero, _mm512_slli_epi32::<7>(*v));
    }
    for g in 0..16 {
        let mut a = [zero; T];
        for k in 4 * g..4 * g + 4 {
            let wq = tile.q[k];
            for t in 0..T {
                a[t] = _mm512_dpbusd_epi32(a[t], wq, bcast(x[t].add(4 + 4 * k)));
            }
        }
        let s = tile.s[g];
        for t in 0..T {
            tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(a[t], s));
        }
    }
    for t in 0..T {
        let o = out.add(t * out_stride);
        let acc = if first {
            _mm512_setzero_ps()
        } else {
            _mm512_maskz_loadu_ps(m, o)
        };
        let r = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[t]), tile.d);
        let yd = _mm512_set1_ps(f32_at(x[t]));
        _mm512_mask_storeu_ps(o, m, _mm512_fmadd_ps(r, yd, acc));
    }
}

/// The tile against super-block `b` of the `nx` activation rows
/// at `x` (stride `x_stride`), into the sums at `out` (lanes in `m`; `first`: the row's first
/// super-block), [`PASS`] rows at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_rows(
    tile: &TileBuf,
    x: *const u8,
    x_stride: usize,
    nx: usize,
    b: usize,
    (out, out_stride): (*mut f32, usize),
    m: __mmask16,
    first: bool,
) {
    let xb = |j: usize| x.add(j * x_stride + b * Q8K_BYTES);
    let o = |j: usize| out.add(j * out_stride);
    let mut j = 0;
    while j + PASS <= nx {
        let xs: [*const u8; PASS] = core::array::from_fn(|t| xb(j + t));
        pass::<PASS>(tile, xs, o(j), out_stride, m, first);
        j += PASS;
    }
    macro_rules! rest {
        ($t:literal) => {{
            let xs: [*const u8; $t] = core::array::from_fn(|t| xb(j + t));
            pass::<$t>(tile, xs, o(j), out_stride, m, first);
        }};
    }
    match nx - j {
        7 => rest!(7),
        6 => rest!(6),
        5 => rest!(5),
        4 => rest!(4),
        3 => rest!(3),
        2 => rest!(2),
        1 => rest!(1),
        _ => {}
    }
}

/// `nw x nx` dots (`nx` at least [`crate::quant::kquant_order::TILED_MIN_ROWS`]) in the
/// tiled order, 16 weight rows at a time; the sums are kept in `out` between super-blocks.
#[inline(always)]
pub(super) unsafe fn gemm_tile16<F: TileFormat>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    let mut tile = TileBuf::new();
    for i in (0..nw).step_by(LANES) {
        let rows = (nw - i).min(LANES);
        let m: __mmask16 = if rows == LANES {
            !0
        } else {
            (1u16 << rows) - 1
        };
        let wi = w.add(i * w_stride);
        for b in 0..n / 256 {
            decode_tile::<F>(wi, w_stride, rows, b, &mut tile);
            let o = (out.add(i), out_stride);
            tile_rows(&tile, x, x_stride, nx, b, o, m, b == 0);
        }
    }
}
