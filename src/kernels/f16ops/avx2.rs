//! The AVX2 + FMA + F16C paths of [`super::F16Ops`]: each 16-lane accumulator of the reference's
//! AVX-512 layout is two 256-bit registers, so every path gives the scalar definition's bits.

use super::{F16Ops, BLOCK, KV_TILE};
use half::f16;
use std::arch::x86_64::*;

pub const AVX2: F16Ops = F16Ops {
    dot: dot_avx2,
    mad: mad_avx2,
    scale: scale_avx2,
    vec_keys: vec_keys_avx2,
    kq_tile: kq_tile_avx2,
    key_tile: super::key_tile_scalar,
    kq_rows: kq_rows_avx2,
    vkq_multi: vkq_multi_avx2,
    softmax_tile: super::softmax_tile_scalar,
    vkq_acc: vkq_acc_avx2,
    swiglu: super::swiglu_scalar,
    geglu: super::geglu_scalar,
    gelu: super::gelu_scalar,
    name: "avx2",
};

/// The last three steps of [`super::reduce16`], on the 8 half sums.
#[target_feature(enable = "avx2")]
pub(super) fn reduce8_avx(t: __m256) -> f32 {
    let u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    let w = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0b01_00_11_10));
    _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)))
}

pub fn dot_avx2(q: &[f32], k: &[f16]) -> f32 {
    assert_eq!(q.len(), k.len());
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { dot_avx2_impl(q, k) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2_impl(q: &[f32], k: &[f16]) -> f32 {
    let n = q.len();
    let np = n & !(BLOCK - 1);
    let mut sumf = 0.0f64;
    if np > 0 {
        // acc[2j] / acc[2j+1]: lanes 0..8 / 8..16 of the reference's accumulator j.
        let mut acc = [_mm256_setzero_ps(); 8];
        let (qp, kp) = (q.as_ptr(), k.as_ptr() as *const u16);
        // SAFETY: every load reads 8 elements at `i + 8h < np <= n`.
        unsafe {
            for i in (0..np).step_by(BLOCK) {
                for (h, a) in acc.iter_mut().enumerate() {
                    let o = i + 8 * h;
                    let kv = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(o) as *const __m128i));
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(o)), kv, *a);
                }
            }
        }
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        sumf = reduce8_avx(_mm256_add_ps(hi, lo)) as f64;
    }
    for i in np..n {
        sumf += (q[i] * k[i].to_f32()) as f64;
    }
    sumf as f32
}

pub fn mad_avx2(y: &mut [f32], x: &[f16], v: f32) {
    assert_eq!(y.len(), x.len());
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { mad_avx2_impl(y, x, v) }
}

/// Round 8 lanes to f16 and back (ties to even).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn round8(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_avx2_impl(y: &mut [f32], x: &[f16], v: f32) {
    let n = y.len();
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr() as *const u16);
    // SAFETY: loads and stores of 8 elements at `i` with `i + 8 <= n`.
    unsafe {
        while i + 8 <= n {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i) as *const __m128i));
            let r = _mm256_fmadd_ps(xv, vv, _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), round8(r));
            i += 8;
        }
    }
    super::mad_scalar(&mut y[i..], &x[i..], v);
}

pub fn scale_avx2(y: &mut [f32], v: f32) {
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { scale_avx2_impl(y, v) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_avx2_impl(y: &mut [f32], v: f32) {
    let n = y.len();
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    let yp = y.as_mut_ptr();
    // SAFETY: loads and stores of 8 elements at `i` with `i + 8 <= n`.
    unsafe {
        while i + 8 <= n {
            _mm256_storeu_ps(
                yp.add(i),
                round8(_mm256_mul_ps(_mm256_loadu_ps(yp.add(i)), vv)),
            );
            i += 8;
        }
    }
    super::scale_scalar(&mut y[i..], v);
}

pub fn vec_keys_avx2(
    q16: &[f32],
    kv: super::KeyRun<'_>,
    scale: f32,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    super::vec_keys_with(dot_avx2, mad_avx2, scale_avx2, q16, kv, scale, m_s, acc)
}

pub fn kq_rows_avx2(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    super::kq_rows_with(dot_avx2, q, heads, k, out)
}

pub fn vkq_multi_avx2(
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    v: &[f16],
    hdv: usize,
) {
    super::vkq_multi_with(vkq_acc_avx2, acc, acc_stride, p, p_stride, heads, v, hdv)
}

pub fn kq_tile_avx2(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let (_, hd) = super::tile_shape(q, kt, out);
    for (qr, o) in q.chunks_exact(hd).zip(out.chunks_exact_mut(KV_TILE)) {
        // SAFETY: selected only when avx2, fma and f16c were detected at run time; each
        // row has `hd` elements and `kt` `hd` rows of KV_TILE (checked).
        unsafe { kq_tile_avx2_impl(qr, kt, o.try_into().expect("tile row")) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kq_tile_avx2_impl(q: &[f32], kt: &[f32], out: &mut [f32; KV_TILE]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    let kp = kt.as_ptr();
    for (d, &qd) in q.iter().enumerate() {
        let qv = _mm256_set1_ps(qd);
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: `d * KV_TILE + 8r + 8 <= kt.len()` (asserted by the caller).
            let kv = unsafe { _mm256_loadu_ps(kp.add(d * KV_TILE + 8 * r)) };
            *a = _mm256_fmadd_ps(kv, qv, *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: 8 floats at 8r of a 64-float array.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * r), *a) };
    }
}

pub fn vkq_acc_avx2(acc: &mut [f32], p: &[f32], v: &[f16]) {
    assert_eq!(v.len(), p.len() * acc.len());
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { vkq_acc_avx2_impl(acc, p, v) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vkq_acc_avx2_impl(acc: &mut [f32], p: &[f32], v: &[f16]) {
    let dv = acc.len();
    let vp = v.as_ptr() as *const u16;
    let mut d0 = 0;
    while d0 + 32 <= dv {
        // SAFETY: loads/stores of 8 elements at `d0 + 8r < dv`; V row `j` has `dv` elements.
        unsafe {
            let ap = acc.as_mut_ptr().add(d0);
            let mut a = [
                _mm256_loadu_ps(ap),
                _mm256_loadu_ps(ap.add(8)),
                _mm256_loadu_ps(ap.add(16)),
                _mm256_loadu_ps(ap.add(24)),
            ];
            for (j, &pj) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(pj);
                for (r, ar) in a.iter_mut().enumerate() {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(
                        vp.add(j * dv + d0 + 8 * r) as *const __m128i
                    ));
                    *ar = _mm256_fmadd_ps(x, pv, *ar);
                }
            }
            for (r, ar) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(8 * r), *ar);
            }
        }
        d0 += 32;
    }
    for d in d0..dv {
        for (j, &pj) in p.iter().enumerate() {
            acc[d] = v[j * dv + d].to_f32().mul_add(pj, acc[d]);
        }
    }
}
