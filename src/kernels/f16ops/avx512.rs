//! The AVX-512 paths of [`super::F16Ops`]: the reference's own layouts (16 lanes), each bit for
//! bit the scalar definition in `super`.

use super::avx2::reduce8_avx;
use super::{ScoreScale, BLOCK, KV_TILE};
use half::f16;
use std::arch::x86_64::*;

lane_kernels! {
    table: AVX512, name: "avx512",
    feat: "avx512f", v: __m512, w: 16, vkq_vectors: 4,
    ld: _mm512_loadu_ps, st: _mm512_storeu_ps, ldh: load_ph16, set1: _mm512_set1_ps,
    zero: _mm512_setzero_ps, fma: _mm512_fmadd_ps, fnmadd: _mm512_fnmadd_ps, mul: _mm512_mul_ps,
    add: _mm512_add_ps, sub: _mm512_sub_ps, div: _mm512_div_ps, round: round16,
    reduce: reduce_dot16, exp: expf_avx512, gelu: gelu16, transpose: transpose16,
}

/// 16 f16 at `p`, widened to f32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_ph16(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// A dot's four accumulators reduced: `(a0 + a2) + (a1 + a3)`, then [`super::reduce16`].
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce_dot16(a: [__m512; 4]) -> f32 {
    let a02 = _mm512_add_ps(a[0], a[2]);
    let a13 = _mm512_add_ps(a[1], a[3]);
    reduce16_avx512(_mm512_add_ps(a02, a13))
}

/// [`super::reduce16`] on a vector.
#[target_feature(enable = "avx512f")]
fn reduce16_avx512(a: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    let lo = _mm512_castps512_ps256(a);
    reduce8_avx(_mm256_add_ps(hi, lo))
}

/// Round 16 lanes to f16 and back (ties to even).
#[target_feature(enable = "avx512f")]
#[inline]
fn round16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

pub fn vec_keys(
    q16: &[f32],
    kv: super::KeyRun<'_>,
    sc: ScoreScale,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    // SAFETY: selected only when avx512f was detected at run time.
    unsafe { vec_keys_impl(q16, kv, sc, m_s, acc) }
}

/// [`super::VecKeysFn`] with the primitives inlined into one loop.
#[target_feature(enable = "avx512f,fma")]
unsafe fn vec_keys_impl(
    q16: &[f32],
    kv: super::KeyRun<'_>,
    sc: ScoreScale,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    // SAFETY: (all three) avx512f detected (the caller's contract); `vec_keys_with` hands
    // them rows of the lengths they expect.
    let dot = |q: &[f32], k: &[f16]| unsafe { dot_impl(q, k) };
    let mad = |y: &mut [f32], x: &[f16], v: f32| unsafe { mad_impl(y, x, v) };
    let scale = |y: &mut [f32], v: f32| unsafe { scale_impl(y, v) };
    super::vec_keys_with(dot, mad, scale, q16, kv, sc, m_s, acc)
}

pub fn kq_tile(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let (rows, hd) = super::tile_shape(q, kt, out);
    let mut r = 0;
    while r + 4 <= rows {
        // SAFETY: avx512f detected; rows `r .. r + 4` of `q` and `out` exist (checked).
        unsafe { kq_tile_impl::<4>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 0) };
        r += 4;
    }
    if r + 3 == rows {
        // SAFETY: as above, three rows.
        unsafe { kq_tile_impl::<3>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 0) };
        r += 3;
    }
    // Two rows at a time: eight independent chains keep both FMA pipes busy (four would
    // wait on the latency of the previous FMA).
    while r + 2 <= rows {
        // SAFETY: avx512f detected; rows `r`, `r + 1` of `q` and `out` exist (checked).
        unsafe { kq_tile_impl::<2>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 0) };
        r += 2;
    }
    if r < rows {
        // SAFETY: as above, one row.
        unsafe { kq_tile_impl::<1>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 0) };
    }
}

pub fn kq_rows(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    let (hd, n) = super::rows_shape(q, heads, k, out);
    if hd % BLOCK != 0 {
        // Leftover elements go through the dot's scalar tail: one pair at a time.
        for g in 0..heads {
            for j in 0..n {
                out[g * KV_TILE + j] = dot(&q[g * hd..][..hd], &k[j * hd..][..hd]);
            }
        }
        return;
    }
    let mut g0 = 0;
    while g0 < heads {
        let gn = (heads - g0).min(4);
        let (qg, og) = (&q[g0 * hd..(g0 + gn) * hd], &mut out[g0 * KV_TILE..]);
        // SAFETY: avx512f detected; `qg` holds `gn` rows of `hd`, `k` holds `n` rows,
        // `og` holds `gn` rows of KV_TILE >= n (checked by `rows_shape`).
        unsafe {
            match gn {
                4 => kq_rows_impl::<4>(qg, k, hd, n, og),
                3 => kq_rows_impl::<3>(qg, k, hd, n, og),
                2 => kq_rows_impl::<2>(qg, k, hd, n, og),
                _ => kq_rows_impl::<1>(qg, k, hd, n, og),
            }
        }
        g0 += gn;
    }
}

/// `G` query rows against `n` key rows, `hd` a multiple of 64: per key, each 64-block of
/// the key is converted once and multiplied into all `G` rows' four accumulators; then
/// each row's accumulators are reduced exactly as `dot_impl` reduces them.
#[target_feature(enable = "avx512f")]
unsafe fn kq_rows_impl<const G: usize>(q: &[f32], k: &[f16], hd: usize, n: usize, out: &mut [f32]) {
    let (qp, kp) = (q.as_ptr(), k.as_ptr() as *const u16);
    for j in 0..n {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for b in (0..hd).step_by(BLOCK) {
            // SAFETY: key row `j < n` has `hd >= b + 64` elements, as has each query row.
            unsafe {
                let kv: [__m512; 4] = std::array::from_fn(|c| {
                    _mm512_cvtph_ps(_mm256_loadu_si256(
                        kp.add(j * hd + b + 16 * c) as *const __m256i
                    ))
                });
                for (g, a) in acc.iter_mut().enumerate() {
                    for (c, ac) in a.iter_mut().enumerate() {
                        let qv = _mm512_loadu_ps(qp.add(g * hd + b + 16 * c));
                        *ac = _mm512_fmadd_ps(qv, kv[c], *ac);
                    }
                }
            }
        }
        for (g, a) in acc.iter().enumerate() {
            out[g * KV_TILE + j] = reduce_dot16(*a);
        }
    }
}

/// Transpose of a 16×16 f32 matrix held as 16 row vectors.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    // Pairs of rows interleaved by 32 bits within each 128-bit lane.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // Quads of rows by 64 bits: u[4i + c] holds column c of each 128-bit lane for rows
    // 4i..4i+4.
    let u: [__m512; 16] = std::array::from_fn(|k| {
        let (i, c) = (k / 4, k % 4);
        let (a, b) = (pd(t[4 * i + c / 2]), pd(t[4 * i + 2 + c / 2]));
        ps(if c % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // Across 128-bit lanes: column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let v1 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let v2 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
        let w1 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let w2 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v2, w2);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v2, w2);
    }
    out
}

#[target_feature(enable = "avx512f")]
unsafe fn softmax_tile_impl(s: &mut [f32; KV_TILE], m: f32) -> f64 {
    let mv = _mm512_set1_ps(m);
    let mut sum = 0.0f64;
    for b in 0..KV_TILE / 16 {
        // SAFETY: 16 floats at 16b of a 64-float array.
        unsafe {
            let p = s.as_mut_ptr().add(16 * b);
            let e = expf_avx512(_mm512_sub_ps(_mm512_loadu_ps(p), mv));
            _mm512_storeu_ps(p, e);
            sum += reduce16_avx512(e) as f64;
        }
    }
    sum
}

/// A lane's maximum is `vmaxps(s, max)`: `s` where `s > max`, else `max` (NaN included), as
/// the scalar definition's comparison. A soft cap takes the scaled lanes through the scalar
/// `c·tanh` (the reference's `tanhf` per element).
#[target_feature(enable = "avx512f")]
unsafe fn scale_max_impl(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32 {
    let (sv, ninf) = (_mm512_set1_ps(sc.scale), _mm512_set1_ps(f32::NEG_INFINITY));
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // `lo`, `hi` ≤ KV_TILE (clamped by the caller).
    let (lov, hiv) = (_mm512_set1_epi32(lo as i32), _mm512_set1_epi32(hi as i32));
    let mut m = ninf;
    for b in 0..KV_TILE / 16 {
        let j = _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * b as i32));
        let keep = _mm512_cmpge_epi32_mask(j, lov) & _mm512_cmplt_epi32_mask(j, hiv);
        // SAFETY: 16 floats at 16b of a 64-float array.
        unsafe {
            let p = s.as_mut_ptr().add(16 * b);
            let mut x = _mm512_mul_ps(_mm512_loadu_ps(p), sv);
            if sc.cap.is_some() {
                x = cap_lanes(x, sc.cap);
            }
            let x = _mm512_mask_blend_ps(keep, ninf, x);
            _mm512_storeu_ps(p, x);
            m = _mm512_max_ps(x, m);
        }
    }
    let mut out = [0.0f32; 16];
    // SAFETY: 16 floats.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), m) };
    super::fold_max(out)
}

/// `ggml_vec_gelu_f32` on 16 lanes: the table entry at the f16 bits of `x` (round to
/// nearest even, as the scalar conversion), `0` for `x <= -10`, `x` for `x >= 10`.
/// Each lane gathers 32 bits at `table + 2·bits` and keeps the low half: the table has
/// one entry past the last index, so the read stays inside.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn gelu16(x: __m512, table: *const u16) -> __m512 {
    let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let idx = _mm512_cvtepu16_epi32(h);
    // SAFETY: every index is < 65536 and the table holds 65537 u16 (caller's contract).
    let g = unsafe { _mm512_i32gather_epi32::<2>(idx, table.cast()) };
    let y = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    let hi = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(10.0));
    let lo = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, _mm512_set1_ps(-10.0));
    _mm512_maskz_mov_ps(!lo, _mm512_mask_blend_ps(hi, y, x))
}

/// `ggml_v_expf` (AVX-512 form), lane for lane what [`super::expf_approx`] computes.
#[target_feature(enable = "avx512f")]
fn expf_avx512(x: __m512) -> __m512 {
    let (n, j) = exp_poly(x);
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
    _mm512_mask_blend_ps(d, res, alt)
}
