//! f32 × f16 vector primitives used by attention over the f16 KV cache, with AVX-512 and
//! AVX2+F16C paths picked once at run time and a scalar reference.

use half::f16;

/// `Σ q[i] · k[i]`.
pub type DotF16Fn = fn(q: &[f32], k: &[f16]) -> f32;
/// `out[i] = out[i] · scale + w · v[i]`.
pub type AxpbyF16Fn = fn(out: &mut [f32], scale: f32, w: f32, v: &[f16]);

/// The f16 primitives for this CPU.
#[derive(Clone, Copy)]
pub struct F16Ops {
    pub dot: DotF16Fn,
    pub axpby: AxpbyF16Fn,
    pub name: &'static str,
}

impl F16Ops {
    /// The fastest path this CPU supports.
    pub fn detect() -> F16Ops {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return F16Ops { dot: x86::dot_avx512, axpby: x86::axpby_avx512, name: "avx512" };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return F16Ops { dot: x86::dot_avx2, axpby: x86::axpby_avx2, name: "avx2" };
            }
        }
        Self::scalar()
    }

    /// The reference path.
    pub fn scalar() -> F16Ops {
        F16Ops { dot: dot_scalar, axpby: axpby_scalar, name: "scalar" }
    }
}

pub fn dot_scalar(q: &[f32], k: &[f16]) -> f32 {
    q.iter().zip(k).map(|(&a, &b)| a * b.to_f32()).sum()
}

pub fn axpby_scalar(out: &mut [f32], scale: f32, w: f32, v: &[f16]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o = *o * scale + w * x.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    pub fn dot_avx512(q: &[f32], k: &[f16]) -> f32 {
        assert_eq!(q.len(), k.len());
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { dot_avx512_impl(q, k) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn dot_avx512_impl(q: &[f32], k: &[f16]) -> f32 {
        let n = q.len();
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads 16 or 32 elements at `i` with `i + 16/32 <= n`; f16 is a u16.
        unsafe {
            while i + 32 <= n {
                let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(i) as *const __m256i));
                let k1 = _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(i + 16) as *const __m256i));
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(i)), k0, acc0);
                acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(i + 16)), k1, acc1);
                i += 32;
            }
            while i + 16 <= n {
                let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(i) as *const __m256i));
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(i)), k0, acc0);
                i += 16;
            }
        }
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        for j in i..n {
            s += q[j] * k[j].to_f32();
        }
        s
    }

    pub fn axpby_avx512(out: &mut [f32], scale: f32, w: f32, v: &[f16]) {
        assert_eq!(out.len(), v.len());
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { axpby_avx512_impl(out, scale, w, v) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn axpby_avx512_impl(out: &mut [f32], scale: f32, w: f32, v: &[f16]) {
        let n = out.len();
        let vs = _mm512_set1_ps(scale);
        let vw = _mm512_set1_ps(w);
        let mut i = 0;
        // SAFETY: loads and stores of 16 elements at `i` with `i + 16 <= n`.
        unsafe {
            while i + 16 <= n {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(i) as *const __m256i));
                let o = _mm512_loadu_ps(out.as_ptr().add(i));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_fmadd_ps(vw, x, _mm512_mul_ps(o, vs)));
                i += 16;
            }
        }
        for j in i..n {
            out[j] = out[j] * scale + w * v[j].to_f32();
        }
    }

    pub fn dot_avx2(q: &[f32], k: &[f16]) -> f32 {
        assert_eq!(q.len(), k.len());
        // SAFETY: selected only when avx2, fma and f16c were detected at run time.
        unsafe { dot_avx2_impl(q, k) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2_impl(q: &[f32], k: &[f16]) -> f32 {
        let n = q.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: loads of 8 or 16 elements at `i` with `i + 8/16 <= n`.
        unsafe {
            while i + 16 <= n {
                let k0 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i) as *const __m128i));
                let k1 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i + 8) as *const __m128i));
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), k0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), k1, acc1);
                i += 16;
            }
            while i + 8 <= n {
                let k0 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i) as *const __m128i));
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), k0, acc0);
                i += 8;
            }
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let hi = _mm256_extractf128_ps(acc, 1);
        let lo = _mm256_castps256_ps128(acc);
        let s4 = _mm_add_ps(hi, lo);
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        let mut s = _mm_cvtss_f32(s1);
        for j in i..n {
            s += q[j] * k[j].to_f32();
        }
        s
    }

    pub fn axpby_avx2(out: &mut [f32], scale: f32, w: f32, v: &[f16]) {
        assert_eq!(out.len(), v.len());
        // SAFETY: selected only when avx2, fma and f16c were detected at run time.
        unsafe { axpby_avx2_impl(out, scale, w, v) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpby_avx2_impl(out: &mut [f32], scale: f32, w: f32, v: &[f16]) {
        let n = out.len();
        let vs = _mm256_set1_ps(scale);
        let vw = _mm256_set1_ps(w);
        let mut i = 0;
        // SAFETY: loads and stores of 8 elements at `i` with `i + 8 <= n`.
        unsafe {
            while i + 8 <= n {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                let o = _mm256_loadu_ps(out.as_ptr().add(i));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_fmadd_ps(vw, x, _mm256_mul_ps(o, vs)));
                i += 8;
            }
        }
        for j in i..n {
            out[j] = out[j] * scale + w * v[j].to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_paths() -> Vec<F16Ops> {
        let mut v = vec![F16Ops::scalar()];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(F16Ops { dot: x86::dot_avx512, axpby: x86::axpby_avx512, name: "avx512" });
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                v.push(F16Ops { dot: x86::dot_avx2, axpby: x86::axpby_avx2, name: "avx2" });
            }
        }
        v
    }

    #[test]
    fn simd_matches_scalar() {
        let mut seed = 1u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for n in [0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 256] {
            let q: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let k: Vec<f16> = (0..n).map(|_| f16::from_f32(rnd())).collect();
            let base: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let want = dot_scalar(&q, &k);
            let mut want_axpy = base.clone();
            axpby_scalar(&mut want_axpy, 0.5, 1.5, &k);
            let mag: f32 = q.iter().zip(&k).map(|(a, b)| (a * b.to_f32()).abs()).sum::<f32>() + 1e-6;
            for ops in all_paths() {
                let got = (ops.dot)(&q, &k);
                assert!((got - want).abs() <= 1e-5 * mag, "{} dot n={n}: {got} vs {want}", ops.name);
                let mut out = base.clone();
                (ops.axpby)(&mut out, 0.5, 1.5, &k);
                for (a, b) in out.iter().zip(&want_axpy) {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{} axpby n={n}", ops.name);
                }
            }
        }
    }

    #[test]
    fn extreme_values_stay_finite() {
        let k = vec![f16::MAX; 40];
        let q = vec![1e-3f32; 40];
        for ops in all_paths() {
            assert!((ops.dot)(&q, &k).is_finite(), "{}", ops.name);
            let zeros = vec![f16::ZERO; 40];
            assert_eq!((ops.dot)(&q, &zeros), 0.0);
        }
    }
}
