//! 256-bit kernels for every weight format, written once and generic over the integer dot
//! primitive ([`IDot`]: AVX2 `vpmaddubsw`+`vpmaddwd`, or AVX-512 VNNI `vpdpbusd`/`vpdpwssd`).
//!
//! Every function here is `#[inline(always)]` and `unsafe`: it is only ever inlined into a
//! `#[target_feature]` entry point of a tier in `super` (which enables at least AVX2, FMA and
//! F16C), called only after runtime detection, with pointers whose row lengths were checked by
//! the safe wrapper. The pointers are byte pointers into weight/activation rows; all loads are
//! unaligned.
//!
//! Shape of every kernel: a *tile* is one weight row against `NX` activation rows. Each weight
//! block is decoded once into registers and multiplied with the `NX` activation blocks, so a
//! prefill gemm pays the decode once per `NX` tokens; `vec_dot` is the `NX = 1` tile.

use crate::quant::blocks::{cast_mut, BlockQ8K};
use crate::quant::reference::{self, Quantize};
use core::arch::x86_64::*;

/// `acc + a·b` on 8-bit / 16-bit lanes, accumulated into 32-bit lanes.
pub(super) trait IDot {
    /// The tier has AVX-512BW/VL (byte-masked operations on 256-bit registers).
    const AVX512: bool = false;
    /// `acc[i] += sum_{k<4} a[4i+k] (u8) * b[4i+k] (i8)`. Callers keep every adjacent-pair sum
    /// within i16 (the AVX2 version saturates there): |a| <= 128, |b| <= 127 with pairs that
    /// cannot both be extreme, or a <= 63.
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1]` (i16 inputs).
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// [`IDot::dpwssd`] on 512-bit registers; only called where [`IDot::AVX512`] is true.
    #[inline(always)]
    unsafe fn dpwssd512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
    }

    /// The tier has AVX-512 VNNI: the 512-bit kernels of `avx512.rs` (`t32_tile4`,
    /// `t32_gemm_pairs`, `t32_rows4`) are called only where this is true.
    const VNNI: bool = false;
}

/// AVX2: `vpmaddubsw` then `vpmaddwd` by ones.
pub(super) struct Maddubs;

/// The AVX2 products on an AVX-512 (without VNNI) tier, which may use byte masks elsewhere.
pub(super) struct Maddubs512;

impl IDot for Maddubs512 {
    const AVX512: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        Maddubs::dpbusd(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        Maddubs::dpwssd(acc, a, b)
    }
}

impl IDot for Maddubs {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let p16 = _mm256_maddubs_epi16(a, b);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers.

#[inline(always)]
pub(super) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
pub(super) unsafe fn loadu128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// The two fp16 values at `p`, `p + 2` (unaligned) to f32 in lanes 0 and 1, exactly (F16C).
///
/// The conversion is an `asm!` block on purpose: with the intrinsic, LLVM sees that only one
/// lane is used, narrows the load to 16 bits and merges it into an arbitrary live register
/// (`vpinsrw $0, mem, %xmm0`), creating a false dependency on, typically, the accumulator of
/// the surrounding loop, which serialized the whole dot product. A 32-bit `vmovd` load that
/// the asm consumes whole zeroes the rest of the register instead.
#[inline(always)]
pub(super) unsafe fn f16x2_at(p: *const u8) -> __m128 {
    let v = _mm_cvtsi32_si128(core::ptr::read_unaligned(p.cast::<i32>()));
    let r: __m128;
    core::arch::asm!(
        "vcvtph2ps {r}, {v}",
        v = in(xmm_reg) v,
        r = lateout(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

/// The fp16 in the *last* two bytes before `end` (reads `end - 4 .. end`, so it never reads
/// past a block that ends with its scale).
#[inline(always)]
pub(super) unsafe fn f16_before(end: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_movehdup_ps(f16x2_at(end.sub(4))))
}

/// Lanes 0 and 1 as scalars.
#[inline(always)]
unsafe fn lanes01(v: __m128) -> (f32, f32) {
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline(always)]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    core::ptr::read_unaligned(p.cast::<f32>())
}

#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
pub(super) unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// 16 bytes of packed nibbles -> 32 bytes in element order (low nibbles are elements 0..16).
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // A broadcast load plus a per-lane variable shift, instead of shift + `vinserti128`: the
    // insert would compete for port 5 with the fp16 scale conversions.
    let t = _mm256_broadcastsi128_si256(loadu128(p));
    let t = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(t, _mm256_set1_epi8(0x0F))
}

/// The 32 bits at `p` spread to 32 bytes: 0xFF where the bit is set (element order).
#[inline(always)]
pub(super) unsafe fn bits32(p: *const u8) -> __m256i {
    let x = core::ptr::read_unaligned(p.cast::<u32>());
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Rows addressed by a tile: the weight row and `NX` activation rows.
pub(super) trait Tile {
    /// Elements per block, and bytes per weight / activation block.
    const BLOCK: usize;
    const W_BYTES: usize;
    const X_BYTES: usize;
    /// Dot of one weight row (`n` elements) with `NX` activation rows.
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX];

    /// `nw x nx` dots (see [`gemm_tiles`]); formats may specialise it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm<D: IDot>(
        n: usize,
        w: *const u8,
        w_stride: usize,
        nw: usize,
        x: *const u8,
        x_stride: usize,
        nx: usize,
        out: *mut f32,
        out_stride: usize,
    ) where
        Self: Sized,
    {
        gemm_tiles::<Self, D>(n, w, w_stride, nw, x, x_stride, nx, out, out_stride)
    }
}

/// `nw x nx` dots via tiles of up to 4 activation rows, weight row outermost so the weight row
/// stays in L1 while every activation row passes over it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_tiles<T: Tile, D: IDot>(
    n: usize,
    w: *const u8,
    w_stride: usize,
    nw: usize,
    x: *const u8,
    x_stride: usize,
    nx: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let xr = |j: usize| x.add(j * x_stride);
    for i in 0..nw {
        let wr = w.add(i * w_stride);
        let mut j = 0;
        while j + 4 <= nx {
            let r = T::tile::<D, 4>(n, wr, [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)]);
            for (t, v) in r.into_iter().enumerate() {
                *out.add((j + t) * out_stride + i) = v;
            }
            j += 4;
        }
        macro_rules! rest {
            ($nx:literal, [$($t:literal),*]) => {{
                let r = T::tile::<D, $nx>(n, wr, [$(xr(j + $t)),*]);
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
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats against Q8_0 (signed weights) or Q8_1 (unsigned weights + offset).

/// Decoding of one 32-element weight block.
pub(super) trait Blk32 {
    const SIZE: usize;
    /// Signed quants pair with Q8_0 and use the sign trick (|w| · sign(w)·y, since the byte
    /// multiply is unsigned × signed); unsigned quants pair with Q8_1 and add `m * s`.
    const SIGNED: bool;
    /// The 32 quants in element order.
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i;
    /// Signed formats: `quants + OFFSET` as unsigned bytes (the AVX-512 tiers only; see
    /// `avx512::t32_gemm_pairs`).
    const OFFSET: u8 = 0;
    #[inline(always)]
    unsafe fn uquants(_p: *const u8) -> __m256i {
        unreachable!("uquants of an unsigned format")
    }
    /// Two blocks' unsigned quants (`uquants` of a signed format, `quants` of an unsigned
    /// one) in the two halves of a 512-bit register (AVX-512 VNNI tier only).
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        let (q0, q1) = if Self::SIGNED {
            (Self::uquants(p0), Self::uquants(p1))
        } else {
            (
                Self::quants::<super::avx512::Vnni>(p0),
                Self::quants::<super::avx512::Vnni>(p1),
            )
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1)
    }
}

/// [`nibbles32`] of two blocks at once, one per 256-bit half.
#[inline(always)]
unsafe fn nibbles64(p0: *const u8, p1: *const u8) -> __m512i {
    let t = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(loadu128(p0))),
        _mm256_broadcastsi128_si256(loadu128(p1)),
    );
    let t = _mm512_srlv_epi64(t, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(t, _mm512_set1_epi8(0x0F))
}

/// The fifth bits of two 5-bit blocks (`qh` at `p0 + off`, `p1 + off`) as one 64-bit mask.
#[inline(always)]
unsafe fn qh64(p0: *const u8, p1: *const u8, off: usize) -> u64 {
    let lo = core::ptr::read_unaligned(p0.add(off).cast::<u32>()) as u64;
    let hi = core::ptr::read_unaligned(p1.add(off).cast::<u32>()) as u64;
    lo | (hi << 32)
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;

impl Blk32 for Q4_0 {
    const SIZE: usize = 18;
    const SIGNED: bool = true;
    const OFFSET: u8 = 8;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        nibbles32(p.add(2))
    }
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        nibbles64(p0.add(2), p1.add(2))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8))
    }
}

impl Blk32 for Q4_1 {
    const SIZE: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        nibbles64(p0.add(4), p1.add(4))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        nibbles32(p.add(4))
    }
}

impl Blk32 for Q5_0 {
    const SIZE: usize = 22;
    const SIGNED: bool = true;
    const OFFSET: u8 = 16;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // nibble + 16 where the fifth bit is set: one byte-masked add.
        let qh = core::ptr::read_unaligned(p.add(2).cast::<u32>());
        let q = nibbles32(p.add(6));
        _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        let q = nibbles64(p0.add(6), p1.add(6));
        _mm512_mask_add_epi8(q, qh64(p0, p1, 2), q, _mm512_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        if D::AVX512 {
            // nibble - 16 where the fifth bit is clear: one byte-masked subtract.
            let qh = core::ptr::read_unaligned(p.add(2).cast::<u32>());
            let q = nibbles32(p.add(6));
            _mm256_mask_sub_epi8(q, !qh, q, _mm256_set1_epi8(16))
        } else {
            // nibble | 0xF0 (= nibble - 16 as i8) where the fifth bit is clear.
            let hi = _mm256_andnot_si256(bits32(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nibbles32(p.add(6)), hi)
        }
    }
}

impl Blk32 for Q5_1 {
    const SIZE: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        let q = nibbles64(p0.add(8), p1.add(8));
        _mm512_mask_add_epi8(q, qh64(p0, p1, 4), q, _mm512_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        if D::AVX512 {
            let qh = core::ptr::read_unaligned(p.add(4).cast::<u32>());
            let q = nibbles32(p.add(8));
            _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
        } else {
            let hi = _mm256_and_si256(bits32(p.add(4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles32(p.add(8)), hi)
        }
    }
}

impl Blk32 for Q8_0 {
    const SIZE: usize = 34;
    const SIGNED: bool = true;
    const OFFSET: u8 = 128;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        _mm256_xor_si256(loadu(p.add(2)), _mm256_set1_epi8(0x80u8 as i8))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        loadu(p.add(2))
    }
}

/// Tile adapter for the 32-element formats.
pub(super) struct T32<F>(core::marker::PhantomData<F>);

impl<F: Blk32> T32<F> {
    /// Activation block layout: Q8_0 (d, qs) or Q8_1 (d, s, qs).
    const XB: usize = if F::SIGNED { 34 } else { 36 };
    const XQ: usize = if F::SIGNED { 2 } else { 4 };

    /// Integer dot of one decoded weight block (`q`, and `aq` = |q| for signed formats) with
    /// the activation block at `xp`, as 8 f32 lanes.
    #[inline(always)]
    unsafe fn block<D: IDot>(q: __m256i, aq: __m256i, xp: *const u8) -> __m256 {
        let y = loadu(xp.add(Self::XQ));
        let zero = _mm256_setzero_si256();
        let i = if F::SIGNED {
            D::dpbusd(zero, aq, _mm256_sign_epi8(y, q))
        } else {
            D::dpbusd(zero, q, y)
        };
        _mm256_cvtepi32_ps(i)
    }
}

impl<F: Blk32> T32<F> {
    /// The tile body. Activation block scales come either straight from the activation rows
    /// (`sc` null) or from `sc`, where `sc[r * nb + b]` holds `[d, s]` of block `b` of row `r`
    /// already converted to f32 (exact, so both give identical bits).
    #[inline(always)]
    unsafe fn tile_impl<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
        sc: *const [f32; 2],
    ) -> [f32; NX] {
        let nb = n / 32;
        // The reference engine's order (ggml's x86 `ggml_vec_dot_q*_q8_*`): one accumulator
        // advanced block by block with a fused multiply-add, the offset term `m·s` summed
        // separately (also fused), then `hsum(acc) + summ`. Small models amplify a last-bit
        // difference here into visibly different logits, so the order is kept exactly.
        // `ms` collects `m * s` of the unsigned formats in lane 1 (lane 0 is unused).
        let mut acc = [[_mm256_setzero_ps(); NX]; 1];
        let mut ms = [[_mm_setzero_ps(); NX]; 1];
        // A macro rather than a closure: closures are not inlined reliably, and a kernel body
        // outside the `#[target_feature]` function would call every intrinsic out of line.
        macro_rules! step {
            ($b:expr, $u:expr) => {{
                let wp = w.add($b * F::SIZE);
                let q = F::quants::<D>(wp);
                let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                // Lanes: [d, m] of the weight block (m only for unsigned formats).
                let wdm = f16x2_at(wp);
                for j in 0..NX {
                    let xp = x[j].add($b * Self::XB);
                    let p = Self::block::<D>(q, aq, xp);
                    let xds = if sc.is_null() {
                        f16x2_at(xp)
                    } else {
                        _mm_castsi128_ps(_mm_loadl_epi64(sc.add(j * nb + $b).cast()))
                    };
                    // [d_w * d_x, m * s]. Signed formats multiply lane 0 only: their lane 1
                    // holds quant bytes read as fp16, and a denormal product would cost a
                    // microcode assist.
                    let prod = if F::SIGNED {
                        _mm_mul_ss(wdm, xds)
                    } else {
                        _mm_mul_ps(wdm, xds)
                    };
                    acc[$u][j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), p, acc[$u][j]);
                    if !F::SIGNED {
                        ms[$u][j] = _mm_fmadd_ps(wdm, xds, ms[$u][j]);
                    }
                }
            }};
        }
        for b in 0..nb {
            step!(b, 0);
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = hsum_ps(acc[0][j]);
            if !F::SIGNED {
                out[j] += _mm_cvtss_f32(_mm_movehdup_ps(ms[0][j]));
            }
        }
        out
    }
}

impl<F: Blk32> T32<F> {
    /// `NW` weight rows against the activation row `x`, whose block scales are in `sc`
    /// (converted as for [`Self::tile_impl`]). Each row's result is bit-identical to
    /// `tile_impl::<D, 1>` on that row: the same operations in the same order, only
    /// interleaved with the other rows'.
    #[inline(always)]
    unsafe fn rows_impl<D: IDot, const NW: usize>(
        n: usize,
        w: [*const u8; NW],
        x: *const u8,
        sc: *const [f32; 2],
        prefetch: usize,
    ) -> [f32; NW] {
        let nb = n / 32;
        let mut acc = [_mm256_setzero_ps(); NW];
        let mut ms = [_mm_setzero_ps(); NW];
        for b in 0..nb {
            let xp = x.add(b * Self::XB);
            let xds = _mm_castsi128_ps(_mm_loadl_epi64(sc.add(b).cast()));
            for r in 0..NW {
                let wp = w[r].add(b * F::SIZE);
                // Interleaved rows defeat the hardware's stream detection: fetch ahead by hand
                // (a prefetch never faults, so running past the matrix is harmless).
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(prefetch).cast());
                let q = F::quants::<D>(wp);
                let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                let wdm = f16x2_at(wp);
                let p = Self::block::<D>(q, aq, xp);
                let prod = if F::SIGNED {
                    _mm_mul_ss(wdm, xds)
                } else {
                    _mm_mul_ps(wdm, xds)
                };
                acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), p, acc[r]);
                if !F::SIGNED {
                    ms[r] = _mm_fmadd_ps(wdm, xds, ms[r]);
                }
            }
        }
        let mut out = [0f32; NW];
        for r in 0..NW {
            out[r] = hsum_ps(acc[r]);
            if !F::SIGNED {
                out[r] += _mm_cvtss_f32(_mm_movehdup_ps(ms[r]));
            }
        }
        out
    }
}

/// Most activation blocks per row whose scales [`T32`]'s gemm converts ahead (rows up to
/// 16384 elements; longer rows convert on the fly).
const PREP_BLOCKS: usize = 512;
/// Weight rows per chunk in [`T32`]'s gemm: small enough to stay in L2 while every tile of
/// activation rows passes over it.
const ROW_CHUNK: usize = 64;

impl<F: Blk32> Tile for T32<F> {
    const BLOCK: usize = 32;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Self::XB;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        Self::tile_impl::<D, NX>(n, w, x, core::ptr::null())
    }

    /// Converts the fp16 scales of each tile of (up to 4) activation rows once, then runs that
    /// tile against a chunk of weight rows: the per-block scale conversion, a large share of
    /// the work of a 32-element block, is paid once per chunk instead of once per weight row.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(
        n: usize,
        w: *const u8,
        w_stride: usize,
        nw: usize,
        x: *const u8,
        x_stride: usize,
        nx: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let nb = n / 32;
        if D::VNNI && nx >= 8 {
            // Whole tiles of 16, then 8, activation rows through the pair kernel, the rest
            // below.
            let n16 = nx / 16 * 16;
            super::avx512::t32_gemm_pairs::<F, 8>(
                n, w, w_stride, nw, x, x_stride, n16, out, out_stride,
            );
            let n8 = nx / 8 * 8;
            let (xs, os) = (x.add(n16 * x_stride), out.add(n16 * out_stride));
            super::avx512::t32_gemm_pairs::<F, 4>(
                n,
                w,
                w_stride,
                nw,
                xs,
                x_stride,
                n8 - n16,
                os,
                out_stride,
            );
            if n8 == nx {
                return;
            }
            let (x, out, nx) = (x.add(n8 * x_stride), out.add(n8 * out_stride), nx - n8);
            return Self::gemm::<D>(n, w, w_stride, nw, x, x_stride, nx, out, out_stride);
        }
        if nb > PREP_BLOCKS {
            return gemm_tiles::<Self, D>(n, w, w_stride, nw, x, x_stride, nx, out, out_stride);
        }
        // [d, s] per block, for the 4 rows of a tile (16 KiB). Left uninitialized: zeroing it
        // cost more than a whole decode-step matvec; only entries written below are read.
        let mut sc = [core::mem::MaybeUninit::<[f32; 2]>::uninit(); 4 * PREP_BLOCKS];
        // The same, per block [d_0..d_3, s_0..s_3] of a full tile, for `avx512::t32_tile4`.
        let mut sc4 = [core::mem::MaybeUninit::<[f32; 8]>::uninit(); PREP_BLOCKS];
        let xr = |j: usize| x.add(j * x_stride);
        let mut i0 = 0;
        while i0 < nw {
            let i1 = (i0 + ROW_CHUNK).min(nw);
            let mut j = 0;
            while j < nx {
                let t = (nx - j).min(4);
                for r in 0..t {
                    for b in 0..nb {
                        let v = f16x2_at(xr(j + r).add(b * Self::XB));
                        _mm_storel_epi64(
                            sc.as_mut_ptr().add(r * nb + b).cast(),
                            _mm_castps_si128(v),
                        );
                    }
                }
                let scp = sc.as_ptr().cast::<[f32; 2]>();
                if D::VNNI && t == 4 {
                    for (b, slot) in sc4[..nb].iter_mut().enumerate() {
                        let mut v = [0f32; 8];
                        for r in 0..4 {
                            let ds = *scp.add(r * nb + b);
                            v[r] = ds[0];
                            v[4 + r] = ds[1];
                        }
                        slot.write(v);
                    }
                    let sc4p = sc4.as_ptr().cast::<[f32; 8]>();
                    for i in i0..i1 {
                        let wr = w.add(i * w_stride);
                        let x4 = [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)];
                        let r = super::avx512::t32_tile4::<F, D>(n, wr, x4, sc4p);
                        for (k, v) in r.into_iter().enumerate() {
                            *out.add((j + k) * out_stride + i) = v;
                        }
                    }
                    j += t;
                    continue;
                }
                let mut i = i0;
                if t == 1 {
                    // One activation row (decode): four weight rows at a time, each with its
                    // own accumulator chain, so the chains overlap instead of waiting on one
                    // another; every row's arithmetic is unchanged.
                    while i + 4 <= i1 {
                        let wr = [0, 1, 2, 3].map(|k| w.add((i + k) * w_stride));
                        let r = if D::VNNI {
                            super::avx512::t32_rows4::<F>(n, wr, xr(j), scp, 64 * w_stride)
                        } else {
                            Self::rows_impl::<D, 4>(n, wr, xr(j), scp, 32 * w_stride)
                        };
                        for (k, v) in r.into_iter().enumerate() {
                            *out.add(j * out_stride + i + k) = v;
                        }
                        i += 4;
                    }
                }
                for i in i..i1 {
                    let wr = w.add(i * w_stride);
                    macro_rules! run {
                        ($nx:literal, [$($t:literal),*]) => {{
                            let r = Self::tile_impl::<D, $nx>(n, wr, [$(xr(j + $t)),*], scp);
                            for (t, v) in r.into_iter().enumerate() {
                                *out.add((j + t) * out_stride + i) = v;
                            }
                        }};
                    }
                    match t {
                        4 => run!(4, [0, 1, 2, 3]),
                        3 => run!(3, [0, 1, 2]),
                        2 => run!(2, [0, 1]),
                        _ => run!(1, [0]),
                    }
                }
                j += t;
            }
            i0 = i1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants against Q8_K. Each super-block is 8 chunks of 32 elements. A format provides the
// chunks as *unsigned* bytes (<= 63, so `vpmaddubsw` cannot saturate) and 16-bit scales; signed
// values and sub-block minimums are applied through Q8_K's `bsums` (sums of 16 activations):
//
//   dot = d·yd · Σ_chunks Σ scale·u·y  +  dm·yd · Σ_groups corr[g]·bsums[g]
//
// where for offset formats (Q3_K: u-4, Q6_K: u-32) `corr = -offset·scale` and `dm = d` (the
// two integer sums are added exactly), and for min formats (Q2_K, Q4_K, Q5_K) `corr = min`
// and `dm = -dmin`.

/// Per-super-block decoded scale data.
pub(super) struct KPrep {
    pub d: f32,
    pub dm: f32,
    /// Scales as i16, 8 per 128-bit lane, broadcast to both lanes. Per-16 formats: `[0]` holds
    /// scales 0..8, `[1]` scales 8..16. Per-32 formats: `[0]` holds the 8 scales.
    pub sc: [__m256i; 2],
    /// 16 i16 coefficients of the 16 bsums.
    pub corr: __m256i,
}

pub(super) trait BlkK {
    const SIZE: usize;
    /// Scales per 16 elements (else per 32).
    const PER16: bool;
    /// Offset format: the correction is added to the integer sum.
    const INT_CORR: bool;
    /// Batches of at least this many rows use the per-super-block arithmetic of the
    /// reference's tiled kernel (only Q6_K, whose order is reproduced: `kquant_order`).
    const TILED_FROM: usize = usize::MAX;
    unsafe fn prep(p: *const u8) -> KPrep;
    /// Unsigned quants of chunk `k` (elements `32k..32k+32`).
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i;
}

/// Byte-shuffle masks selecting the chunk's scales from `KPrep::sc`.
#[inline(always)]
unsafe fn scale_shuffle(per16: bool, k: usize) -> __m256i {
    if per16 {
        // Chunk k covers sub-blocks 2t, 2t+1 of its half (t = k % 4): low lane gets i16 #2t,
        // high lane gets #2t+1.
        let t = (k % 4) as i8;
        let lo = _mm_set1_epi16(i16::from_le_bytes([(4 * t) as u8, (4 * t + 1) as u8]));
        let hi = _mm_set1_epi16(i16::from_le_bytes([(4 * t + 2) as u8, (4 * t + 3) as u8]));
        _mm256_set_m128i(hi, lo)
    } else {
        let k = k as u8;
        _mm256_set1_epi16(i16::from_le_bytes([2 * k, 2 * k + 1]))
    }
}

/// `(x >> s) & mask` on bytes, for a shift count known after unrolling.
#[inline(always)]
unsafe fn shr_bytes(x: __m256i, s: usize, mask: i8) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi16(x, _mm_cvtsi32_si128(s as i32)),
        _mm256_set1_epi8(mask),
    )
}

pub(super) struct Q2K;
pub(super) struct Q3K;
pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

impl BlkK for Q2K {
    const SIZE: usize = 84;
    const PER16: bool = true;
    const INT_CORR: bool = false;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let raw = loadu128(p);
        let sc = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0x0F));
        let sc16 = _mm256_cvtepu8_epi16(sc);
        let (d, dmin) = lanes01(f16x2_at(p.add(80)));
        KPrep {
            d,
            dm: -dmin,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            corr: _mm256_cvtepu8_epi16(mins),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        shr_bytes(loadu(p.add(16 + 32 * (k / 4))), 2 * (k % 4), 3)
    }
}

impl BlkK for Q3K {
    const SIZE: usize = 110;
    const PER16: bool = true;
    const INT_CORR: bool = true;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        // Unpack the 12 bytes of 6-bit scales (ggml's kmask trick) to 16 bytes of `scale + 32`.
        let mut aux = [0u32; 3];
        core::ptr::copy_nonoverlapping(p.add(96), aux.as_mut_ptr().cast::<u8>(), 12);
        const KM1: u32 = 0x0303_0303;
        const KM2: u32 = 0x0f0f_0f0f;
        let tmp = aux[2];
        let s = [
            (aux[0] & KM2) | ((tmp & KM1) << 4),
            (aux[1] & KM2) | (((tmp >> 2) & KM1) << 4),
            ((aux[0] >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
            ((aux[1] >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
        ];
        let raw = _mm_loadu_si128(s.as_ptr().cast());
        let sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(raw, _mm_set1_epi8(32)));
        let d = f16_before(p.add(110));
        KPrep {
            d,
            dm: d,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            corr: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<2>(sc16)),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let low = shr_bytes(loadu(p.add(32 + 32 * (k / 4))), 2 * (k % 4), 3);
        let high = shr_bytes(loadu(p), k, 1);
        _mm256_or_si256(low, _mm256_slli_epi16::<2>(high))
    }
}

/// Q4_K / Q5_K scales and mins: 12 bytes -> 8 scales and 8 mins (ggml's utmp shuffle).
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> (__m256i, __m256i) {
    let mut u = [0u32; 4];
    core::ptr::copy_nonoverlapping(p, u.as_mut_ptr().cast::<u8>(), 12);
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    u[3] = ((u[2] >> 4) & KM2) | (((u[1] >> 6) & KM3) << 4);
    let uaux = u[1] & KM1;
    u[1] = (u[2] & KM2) | (((u[0] >> 6) & KM3) << 4);
    u[2] = uaux;
    u[0] &= KM1;
    // i16 lanes 0..8 = scales, 8..16 = mins.
    let sm = _mm256_cvtepu8_epi16(_mm_loadu_si128(u.as_ptr().cast()));
    let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    let mins = _mm256_extracti128_si256::<1>(sm);
    // Each min twice: bsums come per 16 elements, mins per 32.
    let corr = _mm256_set_m128i(
        _mm_unpackhi_epi16(mins, mins),
        _mm_unpacklo_epi16(mins, mins),
    );
    (sc, corr)
}

impl BlkK for Q4K {
    const SIZE: usize = 144;
    const PER16: bool = false;
    const INT_CORR: bool = false;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let (sc, corr) = k4_scales_mins(p.add(4));
        let (d, dmin) = lanes01(f16x2_at(p));
        KPrep {
            d,
            dm: -dmin,
            sc: [sc, sc],
            corr,
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        shr_bytes(loadu(p.add(16 + 32 * (k / 2))), 4 * (k % 2), 0x0F)
    }
}

impl BlkK for Q5K {
    const SIZE: usize = 176;
    const PER16: bool = false;
    const INT_CORR: bool = false;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let (sc, corr) = k4_scales_mins(p.add(4));
        let (d, dmin) = lanes01(f16x2_at(p));
        KPrep {
            d,
            dm: -dmin,
            sc: [sc, sc],
            corr,
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let low = shr_bytes(loadu(p.add(48 + 32 * (k / 2))), 4 * (k % 2), 0x0F);
        let high = shr_bytes(loadu(p.add(16)), k, 1);
        _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
    }
}

impl BlkK for Q6K {
    const SIZE: usize = 210;
    const PER16: bool = true;
    const INT_CORR: bool = true;
    const TILED_FROM: usize = crate::quant::kquant_order::Q6K_TILED_MIN_ROWS;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let sc16 = _mm256_cvtepi8_epi16(loadu128(p.add(192)));
        let d = f16_before(p.add(210));
        KPrep {
            d,
            dm: d,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            corr: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16)),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let (h, c) = (k / 4, k % 4);
        let low = shr_bytes(loadu(p.add(64 * h + 32 * (c % 2))), 4 * (c / 2), 0x0F);
        let high = shr_bytes(loadu(p.add(128 + 32 * h)), 2 * c, 3);
        _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
    }
}

/// Q8_K activation block: f32 d at 0, 256 quants at 4, 16 i16 bsums at 260.
pub(super) const Q8K_BYTES: usize = 292;

/// The 8 chunks of k-quant super-block `$b` of format `$F` (weights at `$wp`, decoded scales
/// `$pr`) against `$NX` activation rows: runs `$body` with row `$j`, chunk `$k`, the 16-bit
/// products `$p` of the chunk's quants and the row's activations, and the chunk's scale `$sc`
/// in every 16-bit lane. Unrolled, so every chunk index is a constant.
macro_rules! k_chunks {
    ($F:ty, $wp:expr, $pr:expr, $x:expr, $b:expr, $NX:expr, |$j:ident, $k:ident, $p:ident, $sc:ident| $body:block) => {{
        macro_rules! step {
            ($kk:expr) => {{
                let q = <$F>::chunk($wp, $kk);
                let $sc = _mm256_shuffle_epi8(
                    $pr.sc[if <$F>::PER16 { $kk / 4 } else { 0 }],
                    scale_shuffle(<$F>::PER16, $kk),
                );
                for $j in 0..$NX {
                    let y = loadu($x[$j].add($b * Q8K_BYTES + 4 + 32 * $kk));
                    let $p = _mm256_maddubs_epi16(q, y);
                    let $k: usize = $kk;
                    $body
                }
            }};
        }
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        step!(4);
        step!(5);
        step!(6);
        step!(7);
    }};
}

/// Tile adapter for the k-quants.
pub(super) struct TK<F>(core::marker::PhantomData<F>);

impl<F: BlkK> TK<F> {
    /// The tile body. `total` (offset formats only): each super-block's exact integer sum is
    /// reduced first, scaled by the weight's `d` and fused-multiply-added with the activation's
    /// `d` (the reference's tiled Q6_K kernel, see `kquant_order::q6k_dot_tiled`); otherwise 8
    /// lanes are advanced per super-block and reduced at the end (its `vec_dot`).
    #[inline(always)]
    unsafe fn tile_impl<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
        total: bool,
    ) -> [f32; NX] {
        let nb = n / 256;
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut tot = [0f32; NX];
        for b in 0..nb {
            let wp = w.add(b * F::SIZE);
            let pr = F::prep(wp);
            // Two integer accumulators per row (even/odd chunks): shorter dependency chains.
            let mut isum = [[_mm256_setzero_si256(); 2]; NX];
            if D::AVX512 && NX.is_multiple_of(2) {
                // Two activation rows per 512-bit register (each half the 256-bit lanes of the
                // other branch: the same exact integers), half the instructions.
                let mut i2 = [[_mm512_setzero_si512(); 2]; NX];
                for k in 0..8 {
                    let q = _mm512_broadcast_i64x4(F::chunk(wp, k));
                    let sc = _mm512_broadcast_i64x4(_mm256_shuffle_epi8(
                        pr.sc[if F::PER16 { k / 4 } else { 0 }],
                        scale_shuffle(F::PER16, k),
                    ));
                    for t in 0..NX / 2 {
                        let y = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(loadu(x[2 * t].add(b * Q8K_BYTES + 4 + 32 * k))),
                            loadu(x[2 * t + 1].add(b * Q8K_BYTES + 4 + 32 * k)),
                        );
                        i2[t][k % 2] = D::dpwssd512(i2[t][k % 2], _mm512_maddubs_epi16(q, y), sc);
                    }
                }
                for t in 0..NX / 2 {
                    for h in 0..2 {
                        isum[2 * t][h] = _mm512_castsi512_si256(i2[t][h]);
                        isum[2 * t + 1][h] = _mm512_extracti64x4_epi64::<1>(i2[t][h]);
                    }
                }
            } else {
                k_chunks!(F, wp, pr, x, b, NX, |j, k, p16, sc| {
                    isum[j][k % 2] = D::dpwssd(isum[j][k % 2], p16, sc);
                });
            }
            for j in 0..NX {
                let xp = x[j].add(b * Q8K_BYTES);
                let yd = f32_at(xp);
                let m = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                let s = _mm256_add_epi32(isum[j][0], isum[j][1]);
                if F::INT_CORR {
                    let s = _mm256_add_epi32(s, m);
                    if total {
                        let r = hsum_epi32(s) as f32 * pr.d;
                        tot[j] = r.mul_add(yd, tot[j]);
                    } else {
                        acc[j] = _mm256_fmadd_ps(
                            _mm256_set1_ps(yd * pr.d),
                            _mm256_cvtepi32_ps(s),
                            acc[j],
                        );
                    }
                } else {
                    acc[j] =
                        _mm256_fmadd_ps(_mm256_set1_ps(pr.d * yd), _mm256_cvtepi32_ps(s), acc[j]);
                    acc[j] =
                        _mm256_fmadd_ps(_mm256_set1_ps(pr.dm * yd), _mm256_cvtepi32_ps(m), acc[j]);
                }
            }
        }
        if total {
            return tot;
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = hsum_ps(acc[j]);
        }
        out
    }
}

impl<F: BlkK> Tile for TK<F> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        Self::tile_impl::<D, NX>(n, w, x, false)
    }

    /// Batches of at least `F::TILED_FROM` rows take the reference's tiled arithmetic.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(
        n: usize,
        w: *const u8,
        w_stride: usize,
        nw: usize,
        x: *const u8,
        x_stride: usize,
        nx: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        if nx >= F::TILED_FROM {
            gemm_tiles::<TKTiled<F>, D>(n, w, w_stride, nw, x, x_stride, nx, out, out_stride)
        } else {
            gemm_tiles::<Self, D>(n, w, w_stride, nw, x, x_stride, nx, out, out_stride)
        }
    }
}

/// [`TK`] in its per-super-block ("tiled") arithmetic, for large batches.
pub(super) struct TKTiled<F>(core::marker::PhantomData<F>);

impl<F: BlkK> Tile for TKTiled<F> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        TK::<F>::tile_impl::<D, NX>(n, w, x, true)
    }
}

/// Q4_K in the reference engine's repacked order (`kquant_order::q4k_dot`): per super-block the
/// exact integer scale sums and minimum sums of each pair of sub-blocks, accumulated in two
/// fused-multiply-add chains, per pair (rows in the batch's groups of four) or per super-block
/// (the batch's last `nx % 4` rows, and single rows), subtracted at the end.
pub(super) struct TQ4K;

impl TQ4K {
    /// `G` batch groups of four rows (`G > 1` on AVX-512 tiers only), each in the reference's
    /// 4-row gemm order: per pair of sub-blocks. Lanes are rows, each lane its own pair of
    /// fused-multiply-add chains; the weight chunks are decoded once for all the groups.
    #[inline(always)]
    unsafe fn tile4x<D: IDot, const G: usize>(
        n: usize,
        w: *const u8,
        x: [[*const u8; 4]; G],
    ) -> [[f32; 4]; G] {
        let nb = n / 256;
        let mut acc = [_mm_setzero_ps(); G];
        let mut acc_min = [_mm_setzero_ps(); G];
        for b in 0..nb {
            let wp = w.add(b * Q4K::SIZE);
            let pr = Q4K::prep(wp);
            // Scale-weighted 4-element sums, one 8-lane accumulator per pair of sub-blocks.
            let mut pairs = [[[_mm256_setzero_si256(); 4]; 4]; G];
            if D::AVX512 {
                // Two activation rows per 512-bit register (each half the 256-bit lanes below,
                // the same exact integers), half the instructions.
                let mut p2 = [[[_mm512_setzero_si512(); 4]; 2]; G];
                for k in 0..8 {
                    let q = _mm512_broadcast_i64x4(Q4K::chunk(wp, k));
                    let sc = _mm512_broadcast_i64x4(_mm256_shuffle_epi8(
                        pr.sc[0],
                        scale_shuffle(false, k),
                    ));
                    for (xg, pg) in x.iter().zip(p2.iter_mut()) {
                        for (t, acc) in pg.iter_mut().enumerate() {
                            let y = _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(loadu(
                                    xg[2 * t].add(b * Q8K_BYTES + 4 + 32 * k),
                                )),
                                loadu(xg[2 * t + 1].add(b * Q8K_BYTES + 4 + 32 * k)),
                            );
                            acc[k / 2] = D::dpwssd512(acc[k / 2], _mm512_maddubs_epi16(q, y), sc);
                        }
                    }
                }
                for (pg, p2g) in pairs.iter_mut().zip(p2.iter()) {
                    for (t, acc) in p2g.iter().enumerate() {
                        for (s, a) in acc.iter().enumerate() {
                            pg[2 * t][s] = _mm512_castsi512_si256(*a);
                            pg[2 * t + 1][s] = _mm512_extracti64x4_epi64::<1>(*a);
                        }
                    }
                }
            } else {
                for (xg, pg) in x.iter().zip(pairs.iter_mut()) {
                    k_chunks!(Q4K, wp, pr, xg, b, 4, |j, k, p16, sc| {
                        pg[j][k / 2] = D::dpwssd(pg[j][k / 2], p16, sc);
                    });
                }
            }
            for g in 0..G {
                let (x, pairs) = (&x[g], &pairs[g]);
                // Per pair p: [S_0p, S_1p, S_2p, S_3p], the four rows' exact scale sums, and the
                // same for the minimum sums (lane l of a row's `m8` = min[l] · the 32 activation
                // quants of sub-block l), built directly in row-per-lane order.
                let mut yd = [0f32; 4];
                let mut m8 = [_mm256_setzero_si256(); 4];
                for j in 0..4 {
                    let xp = x[j].add(b * Q8K_BYTES);
                    yd[j] = f32_at(xp);
                    m8[j] = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                }
                let mut st = [_mm_setzero_si128(); 4];
                for (t, s) in st.iter_mut().enumerate() {
                    let h = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(pairs[0][t], pairs[1][t]),
                        _mm256_hadd_epi32(pairs[2][t], pairs[3][t]),
                    );
                    *s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                }
                // hadd(m8_0, m8_1) = [M00 M01 M10 M11 | M02 M03 M12 M13] (M_jp: row j, pair p).
                let h01 = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(m8[0], m8[1]));
                let h23 = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(m8[2], m8[3]));
                let m02 = _mm256_unpacklo_epi64(h01, h23);
                let m13 = _mm256_unpackhi_epi64(h01, h23);
                let mt = [
                    _mm256_castsi256_si128(m02),
                    _mm256_castsi256_si128(m13),
                    _mm256_extracti128_si256::<1>(m02),
                    _mm256_extracti128_si256::<1>(m13),
                ];
                let ydv = _mm_loadu_ps(yd.as_ptr());
                let dd = _mm_mul_ps(_mm_set1_ps(pr.d), ydv);
                let dm = _mm_mul_ps(_mm_set1_ps(-pr.dm), ydv);
                for t in 0..4 {
                    acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(st[t]), dd, acc[g]);
                    acc_min[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(mt[t]), dm, acc_min[g]);
                }
            }
        }
        let mut r = [[0f32; 4]; G];
        for (g, rg) in r.iter_mut().enumerate() {
            _mm_storeu_ps(rg.as_mut_ptr(), _mm_sub_ps(acc[g], acc_min[g]));
        }
        r
    }

    /// Rows in the reference's gemv order: one conversion and fused multiply-add per
    /// super-block. The horizontal sums are taken four super-blocks at a time.
    #[inline(always)]
    unsafe fn gemv<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        let nb = n / 256;
        let mut acc = [0f32; NX];
        let mut acc_min = [0f32; NX];
        let mut b0 = 0;
        while b0 < nb {
            let g = (nb - b0).min(4);
            let mut v = [[_mm256_setzero_si256(); 4]; NX];
            let mut m = [[_mm256_setzero_si256(); 4]; NX];
            let mut dd = [[0f32; 4]; NX];
            let mut dm = [[0f32; 4]; NX];
            for t in 0..g {
                let b = b0 + t;
                let wp = w.add(b * Q4K::SIZE);
                let pr = Q4K::prep(wp);
                let mut isum = [[_mm256_setzero_si256(); 2]; NX];
                k_chunks!(Q4K, wp, pr, x, b, NX, |j, k, p16, sc| {
                    isum[j][k % 2] = D::dpwssd(isum[j][k % 2], p16, sc);
                });
                for j in 0..NX {
                    let xp = x[j].add(b * Q8K_BYTES);
                    let yd = f32_at(xp);
                    v[j][t] = _mm256_add_epi32(isum[j][0], isum[j][1]);
                    m[j][t] = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                    dd[j][t] = pr.d * yd;
                    dm[j][t] = -pr.dm * yd;
                }
            }
            for j in 0..NX {
                let tv = reduce4(v[j]);
                let tm = reduce4(m[j]);
                for t in 0..g {
                    acc[j] = (tv[t] as f32).mul_add(dd[j][t], acc[j]);
                    acc_min[j] = (tm[t] as f32).mul_add(dm[j][t], acc_min[j]);
                }
            }
            b0 += g;
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = acc[j] - acc_min[j];
        }
        out
    }
}

/// The four horizontal sums of four 8-lane i32 vectors.
#[inline(always)]
unsafe fn reduce4(v: [__m256i; 4]) -> [i32; 4] {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let mut r = [0i32; 4];
    _mm_storeu_si128(r.as_mut_ptr().cast(), s);
    r
}

impl Tile for TQ4K {
    const BLOCK: usize = 256;
    const W_BYTES: usize = Q4K::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    /// Rows alone (and the batch's tail) are the reference's gemv.
    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        Self::gemv::<D, NX>(n, w, x)
    }

    /// Rows `0 .. nx - nx % 4` in the reference's 4-row gemm order, the rest in its gemv order.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(
        n: usize,
        w: *const u8,
        w_stride: usize,
        nw: usize,
        x: *const u8,
        x_stride: usize,
        nx: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let xr = |j: usize| x.add(j * x_stride);
        let g = |j: usize| [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)];
        let full = nx - nx % 4;
        for i in 0..nw {
            let wr = w.add(i * w_stride);
            let mut j = 0;
            if D::AVX512 {
                // Two groups per pass: each weight chunk decoded once for eight rows.
                while j + 8 <= full {
                    let r = Self::tile4x::<D, 2>(n, wr, [g(j), g(j + 4)]);
                    for (t, v) in r.into_iter().flatten().enumerate() {
                        *out.add((j + t) * out_stride + i) = v;
                    }
                    j += 8;
                }
            }
            while j < full {
                let [r] = Self::tile4x::<D, 1>(n, wr, [g(j)]);
                for (t, v) in r.into_iter().enumerate() {
                    *out.add((j + t) * out_stride + i) = v;
                }
                j += 4;
            }
        }
        // The `nx % 4` rows left: the gemv order (`Tile::tile`), as `gemm_tiles` runs them.
        if full < nx {
            let (x, out) = (xr(full), out.add(full * out_stride));
            gemm_tiles::<Self, D>(n, w, w_stride, nw, x, x_stride, nx - full, out, out_stride);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float formats: weight and activation in the same format (f32, f16, bf16).

pub(super) trait FloatFmt {
    const BYTES: usize;
    /// 8 elements starting at element `i`.
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
    unsafe fn one(p: *const u8, i: usize) -> f32;
}

pub(super) struct F32;
pub(super) struct F16;
pub(super) struct BF16;

impl FloatFmt for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        _mm256_loadu_ps(p.add(4 * i).cast())
    }
    #[inline(always)]
    unsafe fn one(p: *const u8, i: usize) -> f32 {
        f32_at(p.add(4 * i))
    }
}

impl FloatFmt for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        _mm256_cvtph_ps(loadu128(p.add(2 * i)))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8, i: usize) -> f32 {
        half::f16::from_bits(core::ptr::read_unaligned(p.add(2 * i).cast::<u16>())).to_f32()
    }
}

impl FloatFmt for BF16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        let h = _mm256_cvtepu16_epi32(loadu128(p.add(2 * i)));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8, i: usize) -> f32 {
        let h = core::ptr::read_unaligned(p.add(2 * i).cast::<u16>());
        f32::from_bits((h as u32) << 16)
    }
}

pub(super) struct TF<F>(core::marker::PhantomData<F>);

impl<F: FloatFmt> Tile for TF<F> {
    const BLOCK: usize = 1;
    const W_BYTES: usize = F::BYTES;
    const X_BYTES: usize = F::BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
    ) -> [f32; NX] {
        // The same accumulation order for every NX, so a row's result does not depend on how
        // many rows share its tile (batch invariance). Two accumulators per row already run
        // far above memory bandwidth.
        let mut i = 0;
        let mut out = [0f32; NX];
        let mut a = [[_mm256_setzero_ps(); 2]; NX];
        while i + 16 <= n {
            let w0 = F::load8(w, i);
            let w1 = F::load8(w, i + 8);
            for j in 0..NX {
                a[j][0] = _mm256_fmadd_ps(w0, F::load8(x[j], i), a[j][0]);
                a[j][1] = _mm256_fmadd_ps(w1, F::load8(x[j], i + 8), a[j][1]);
            }
            i += 16;
        }
        while i + 8 <= n {
            let w0 = F::load8(w, i);
            for j in 0..NX {
                a[j][0] = _mm256_fmadd_ps(w0, F::load8(x[j], i), a[j][0]);
            }
            i += 8;
        }
        for j in 0..NX {
            out[j] = hsum_ps(_mm256_add_ps(a[j][0], a[j][1]));
        }
        for k in i..n {
            let wk = F::one(w, k);
            for j in 0..NX {
                out[j] += wk * F::one(x[j], k);
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers, bit-identical to the scalar ones in `reference`.

/// `v * mul` rounded half to even, as i32 (the closures this replaces were not always inlined
/// into the `#[target_feature]` caller).
#[inline(always)]
unsafe fn round_i32(v: __m256, mul: __m256) -> __m256i {
    _mm256_cvtps_epi32(_mm256_round_ps::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(_mm256_mul_ps(mul, v)))
}

/// 32 f32 at `x` -> (i8 quants in element order, as 32 bytes) with multiplier `id`,
/// rounding half to even; also the i32 lane sums of the quants (for Q8_1's `s`).
#[inline(always)]
unsafe fn round_pack32(v: [__m256; 4], id: f32) -> (__m256i, __m256i) {
    let mul = _mm256_set1_ps(id);
    let (i0, i1, i2, i3) = (
        round_i32(v[0], mul),
        round_i32(v[1], mul),
        round_i32(v[2], mul),
        round_i32(v[3], mul),
    );
    let sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    let a = _mm256_packs_epi32(i0, i1);
    let b = _mm256_packs_epi32(i2, i3);
    let q = _mm256_packs_epi16(a, b);
    let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    (q, sum)
}

#[inline(always)]
unsafe fn load32(x: *const f32) -> [__m256; 4] {
    [
        _mm256_loadu_ps(x),
        _mm256_loadu_ps(x.add(8)),
        _mm256_loadu_ps(x.add(16)),
        _mm256_loadu_ps(x.add(24)),
    ]
}

#[inline(always)]
unsafe fn has_nan(v: &[__m256; 4]) -> bool {
    let mut m = _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]);
    for &vi in &v[1..] {
        m = _mm256_or_ps(m, _mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi));
    }
    _mm256_movemask_ps(m) != 0
}

#[inline(always)]
unsafe fn absmax32(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for &vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, vi));
    }
    hmax_ps(m)
}

/// Q8_0 (`with_sum = false`) or Q8_1 (`true`) activations; `nb` blocks of 32 from `x` to `y`.
#[inline(always)]
pub(super) unsafe fn quantize_q8_01(x: *const f32, y: *mut u8, nb: usize, with_sum: bool) {
    let bytes = if with_sum { 36 } else { 34 };
    for b in 0..nb {
        let v = load32(x.add(32 * b));
        let amax = absmax32(&v);
        if !amax.is_finite() || has_nan(&v) {
            // Non-finite input: the scalar quantizer defines the result (vector min/max and
            // float->int conversion treat NaN and infinity differently).
            let xs = core::slice::from_raw_parts(x.add(32 * b), 32);
            let ys = core::slice::from_raw_parts_mut(y.add(b * bytes), bytes);
            if with_sum {
                reference::quantize_q8_1_act(xs, cast_mut(ys).expect("one whole block"));
            } else {
                reference::quantize_q8_0_act(xs, cast_mut(ys).expect("one whole block"));
            }
            continue;
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let (q, sum) = round_pack32(v, id);
        let yp = y.add(b * bytes);
        core::ptr::write_unaligned(
            yp.cast::<[u8; 2]>(),
            half::f16::from_f32(d).to_bits().to_le_bytes(),
        );
        if with_sum {
            let s = d * hsum_epi32(sum) as f32;
            core::ptr::write_unaligned(
                yp.add(2).cast::<[u8; 2]>(),
                half::f16::from_f32(s).to_bits().to_le_bytes(),
            );
        }
        _mm256_storeu_si256(yp.add(bytes - 32).cast(), q);
    }
}

/// Q8_K activations (ggml's reference arithmetic: scale from the signed absmax, -127/max,
/// rounding half to even, clamp at 127), `nb` super-blocks.
#[inline(always)]
pub(super) unsafe fn quantize_q8k(x: *const f32, y: *mut u8, nb: usize) {
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..nb {
        let xb = x.add(256 * b);
        let yp = y.add(b * Q8K_BYTES);
        let mut m = _mm256_setzero_ps();
        let mut nan = _mm256_setzero_ps();
        for i in 0..32 {
            let v = _mm256_loadu_ps(xb.add(8 * i));
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        let amax = hmax_ps(m);
        if amax == 0.0 || !amax.is_finite() || _mm256_movemask_ps(nan) != 0 {
            // Zero or non-finite input: the scalar quantizer defines the result.
            let xs = core::slice::from_raw_parts(xb, 256);
            let ys = core::slice::from_raw_parts_mut(yp, Q8K_BYTES);
            BlockQ8K::quantize(xs, cast_mut(ys).expect("one whole block"));
            continue;
        }
        // The first element whose magnitude is the maximum, with its sign.
        let target = _mm256_set1_ps(amax);
        let mut max = amax;
        for i in 0..32 {
            let v = _mm256_loadu_ps(xb.add(8 * i));
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                _mm256_andnot_ps(sign, v),
                target,
            ));
            if hit != 0 {
                max = *xb.add(8 * i + hit.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let mul = _mm256_set1_ps(iscale);
        let lim = _mm256_set1_epi32(127);
        let mut bsums = [0i16; 16];
        for c in 0..8 {
            let xc = xb.add(32 * c);
            macro_rules! r {
                ($i:expr) => {
                    _mm256_min_epi32(round_i32(_mm256_loadu_ps(xc.add(8 * $i)), mul), lim)
                };
            }
            let (i0, i1, i2, i3) = (r!(0), r!(1), r!(2), r!(3));
            let q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(yp.add(4 + 32 * c).cast(), q);
            bsums[2 * c] = hsum_epi32(_mm256_add_epi32(i0, i1)) as i16;
            bsums[2 * c + 1] = hsum_epi32(_mm256_add_epi32(i2, i3)) as i16;
        }
        core::ptr::write_unaligned(yp.cast::<[u8; 4]>(), (1.0 / iscale).to_le_bytes());
        for (g, s) in bsums.iter().enumerate() {
            core::ptr::write_unaligned(yp.add(260 + 2 * g).cast::<[u8; 2]>(), s.to_le_bytes());
        }
    }
}

/// f32 -> f16, round to nearest even.
#[inline(always)]
pub(super) unsafe fn quantize_f16(x: *const f32, y: *mut u8, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.add(i)));
        _mm_storeu_si128(y.add(2 * i).cast(), h);
        i += 8;
    }
    for k in i..n {
        let h = half::f16::from_f32(*x.add(k)).to_bits().to_le_bytes();
        core::ptr::write_unaligned(y.add(2 * k).cast::<[u8; 2]>(), h);
    }
}

/// f32 -> bf16, round to nearest even; NaN keeps its top bits with the quiet bit set.
#[inline(always)]
pub(super) unsafe fn quantize_bf16(x: *const f32, y: *mut u8, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(x.add(i));
        let u = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
        let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            u,
            _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb),
        ));
        let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(0x40));
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        let h = _mm256_blendv_epi8(r, nan, is_nan);
        // 8 u32 (each < 2^16) -> 8 u16.
        let packed = _mm256_packus_epi32(h, h);
        let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(packed);
        _mm_storeu_si128(y.add(2 * i).cast(), _mm256_castsi256_si128(packed));
        i += 8;
    }
    for k in i..n {
        let h = half::bf16::from_f32(*x.add(k)).to_bits().to_le_bytes();
        core::ptr::write_unaligned(y.add(2 * k).cast::<[u8; 2]>(), h);
    }
}
