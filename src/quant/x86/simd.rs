//! What the generic 256-bit kernels (`avx2`) and the 512-bit kernels (`avx512`) are both
//! written over: the integer-dot primitive of each tier ([`IDot`]), the decoding of a
//! 32-element weight block ([`Blk32`]) and the register helpers they share.
//!
//! Every function here is `#[inline(always)]` and `unsafe`, under the contract of `avx2`'s:
//! only ever inlined into a `#[target_feature]` entry point of a tier that runtime detection
//! confirmed, with pointers whose row lengths the safe wrapper checked.

use crate::quant::GemmArgs;
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

/// AVX-512 VNNI: one instruction per multiply-accumulate step, exact (no i16 saturation).
/// These intrinsics are stable since Rust 1.89 (the crate's declared MSRV is older; the
/// workspace toolchain is newer).
pub(super) struct Vnni;

#[allow(clippy::incompatible_msrv)]
impl IDot for Vnni {
    const AVX512: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dpwssd512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        _mm512_dpwssd_epi32(acc, a, b)
    }
    const VNNI: bool = true;
}

#[inline(always)]
pub(super) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
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

#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

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
            (Self::quants::<Vnni>(p0), Self::quants::<Vnni>(p1))
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1)
    }
}

/// The operands of one gemm call (`quant::GemmFn`) as raw pointers, once the safe entry point
/// has checked every row lies in its buffer: `nw` weight rows `w_stride` bytes apart (for a
/// repacked group kernel, the group's 16 rows) times `nx` activation rows `x_stride` bytes
/// apart, `n` elements each, into `out[j * out_stride + i]`.
#[derive(Clone, Copy)]
pub(super) struct Gemm {
    pub n: usize,
    pub w: *const u8,
    pub w_stride: usize,
    pub nw: usize,
    pub x: *const u8,
    pub x_stride: usize,
    pub nx: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

impl Gemm {
    /// The operands of a call, once checked ([`GemmArgs::check`]).
    pub(in crate::quant::x86) fn of(a: GemmArgs) -> Self {
        Gemm {
            n: a.n,
            w: a.w.as_ptr(),
            w_stride: a.w_stride,
            nw: a.nw,
            x: a.x.as_ptr(),
            x_stride: a.x_stride,
            nx: a.nx,
            out: a.out.as_mut_ptr(),
            out_stride: a.out_stride,
        }
    }

    /// The fields in their order, `(n, w, w_stride, nw, x, x_stride, nx, out, out_stride)`.
    #[allow(clippy::type_complexity)]
    #[inline(always)]
    pub(in crate::quant::x86) fn parts(
        self,
    ) -> (
        usize,
        *const u8,
        usize,
        usize,
        *const u8,
        usize,
        usize,
        *mut f32,
        usize,
    ) {
        let g = self;
        (
            g.n,
            g.w,
            g.w_stride,
            g.nw,
            g.x,
            g.x_stride,
            g.nx,
            g.out,
            g.out_stride,
        )
    }

    /// The same product for activation rows `j ..` only (their outputs at `out`'s row `j`).
    ///
    /// # Safety
    /// `j ≤ nx`.
    #[inline(always)]
    pub(in crate::quant::x86) unsafe fn skip_rows(self, j: usize) -> Self {
        Gemm {
            x: self.x.add(j * self.x_stride),
            out: self.out.add(j * self.out_stride),
            nx: self.nx - j,
            ..self
        }
    }
}
