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
    const TILE4: bool = true;
    #[inline(always)]
    unsafe fn t32_tile4<F: Blk32>(
        n: usize,
        w: *const u8,
        x: [*const u8; 4],
        sc4: *const [f32; 8],
    ) -> [f32; 4] {
        t32_tile4::<F, Self>(n, w, x, sc4)
    }
}

use super::avx2::{f16x2_at, hsum_ps, loadu, Blk32};

/// Four activation rows against one weight row of a 32-element format, two rows per 512-bit
/// register: each half of a register is lane for lane the 256-bit tile of
/// `T32::tile_impl::<D, 4>` (the same integer dot per lane, the same products `d_w·d_x` and
/// fused multiply-adds in the same block order, the same final horizontal sum), so every
/// output is bit-identical to that kernel's, at about half the instructions.
///
/// `sc4[b]` holds `[d_0..d_3, s_0..s_3]` of block `b` of the four rows, converted to f32.
#[inline(always)]
pub(super) unsafe fn t32_tile4<F: Blk32, D: IDot>(
    n: usize,
    w: *const u8,
    x: [*const u8; 4],
    sc4: *const [f32; 8],
) -> [f32; 4] {
    let xb = if F::SIGNED { 34 } else { 36 };
    let xq = if F::SIGNED { 2 } else { 4 };
    let nb = n / 32;
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut ms = _mm_setzero_ps();
    let idx = [
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
    ];
    for b in 0..nb {
        let wp = w.add(b * F::SIZE);
        let q = _mm512_broadcast_i64x4(F::quants::<D>(wp));
        // [d, m] of the weight block.
        let wdm = f16x2_at(wp);
        let s = sc4.add(b).cast::<f32>();
        // d_w · d_x of the four rows (the scalar kernel's product, lane by lane).
        let prod = _mm_mul_ps(_mm_broadcastss_ps(wdm), _mm_loadu_ps(s));
        let prod = _mm512_castps128_ps512(prod);
        if !F::SIGNED {
            // m_w · s_x summed per row, as the scalar kernel's lane 1.
            let m = _mm_movehdup_ps(wdm);
            ms = _mm_fmadd_ps(_mm_broadcastss_ps(m), _mm_loadu_ps(s.add(4)), ms);
        }
        let (aq, neg) = if F::SIGNED {
            (_mm512_abs_epi8(q), _mm512_movepi8_mask(q))
        } else {
            (q, 0)
        };
        for p in 0..2 {
            let y0 = loadu(x[2 * p].add(b * xb + xq));
            let y1 = loadu(x[2 * p + 1].add(b * xb + xq));
            let mut y = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(y0), y1);
            if F::SIGNED {
                // y · sign(q) (where q is 0, |q| is 0 too, so the product is 0 either way).
                y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
            }
            let i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aq, y);
            let pf = _mm512_cvtepi32_ps(i);
            let pp = _mm512_permutexvar_ps(idx[p], prod);
            acc[p] = _mm512_fmadd_ps(pp, pf, acc[p]);
        }
    }
    let msv: [f32; 4] = core::mem::transmute(ms);
    let mut out = [0f32; 4];
    for p in 0..2 {
        out[2 * p] = hsum_ps(_mm512_castps512_ps256(acc[p]));
        out[2 * p + 1] = hsum_ps(_mm512_extractf32x8_ps::<1>(acc[p]));
    }
    if !F::SIGNED {
        for (o, m) in out.iter_mut().zip(msv) {
            *o += m;
        }
    }
    out
}
