//! AVX-512 specifics: the VNNI integer-dot primitive (`vpdpbusd` / `vpdpwssd` on 256-bit
//! registers, which need AVX-512VL), used by the `Avx512Vnni` tier's instantiation of the
//! generic kernels in `avx2.rs`.

use super::avx2::IDot;
use core::arch::x86_64::*;

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
}
