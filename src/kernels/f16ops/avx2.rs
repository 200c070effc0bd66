//! The AVX2 + FMA + F16C paths of [`super::F16Ops`]: each 16-lane accumulator of the reference's
//! AVX-512 layout is two 256-bit registers, so every path gives the scalar definition's bits.

use super::{ScoreScale, BLOCK, KV_TILE};
use half::f16;
use std::arch::x86_64::*;

lane_kernels! {
    table: AVX2, name: "avx2",
    feat: "avx2,fma,f16c", v: __m256, w: 8, vkq_vectors: 2,
    ld: _mm256_loadu_ps, st: _mm256_storeu_ps, ldh: load_ph8, set1: _mm256_set1_ps,
    zero: _mm256_setzero_ps, fma: _mm256_fmadd_ps, fnmadd: _mm256_fnmadd_ps, mul: _mm256_mul_ps,
    add: _mm256_add_ps, sub: _mm256_sub_ps, div: _mm256_div_ps, round: round8,
    reduce: reduce_dot8, exp: expf8, gelu: gelu8, transpose: transpose8,
}

/// 8 f16 at `p`, widened to f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_ph8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The last three steps of [`super::reduce16`], on the 8 half sums.
#[target_feature(enable = "avx2")]
pub(super) fn reduce8_avx(t: __m256) -> f32 {
    let u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    let w = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0b01_00_11_10));
    _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)))
}

/// A dot's 8 accumulators reduced: `acc[2j]` / `acc[2j + 1]` are lanes 0..8 / 8..16 of the
/// reference's accumulator `j`, summed `(a0 + a2) + (a1 + a3)` then as [`super::reduce16`].
#[target_feature(enable = "avx2")]
#[inline]
fn reduce_dot8(acc: [__m256; 8]) -> f32 {
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    reduce8_avx(_mm256_add_ps(hi, lo))
}

/// Round 8 lanes to f16 and back (ties to even).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn round8(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

pub fn vec_keys(
    q16: &[f32],
    kv: super::KeyRun<'_>,
    sc: ScoreScale,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    super::vec_keys_with(dot, mad, scale, q16, kv, sc, m_s, acc)
}

pub fn kq_rows(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    super::kq_rows_with(dot, q, heads, k, out)
}

pub fn kq_tile(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let (rows, hd) = super::tile_shape(q, kt, out);
    // Half a tile (32 keys, 4 vectors) for two rows at a time: eight independent chains, and
    // each transposed key read once for both rows.
    for half in 0..2 {
        let mut r = 0;
        while r + 2 <= rows {
            // SAFETY: avx2, fma and f16c detected; rows `r`, `r + 1` of `q` and `out` exist,
            // `kt` holds `hd` rows of KV_TILE (checked).
            unsafe { kq_tile_impl::<2>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 32 * half) };
            r += 2;
        }
        if r < rows {
            // SAFETY: as above, one row.
            unsafe { kq_tile_impl::<1>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], 32 * half) };
        }
    }
}

/// Transpose of an 8×8 f32 matrix held as 8 row vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved by 32 bits within each 128-bit lane: t[2i] holds elements 0, 1
    // (and 4, 5) of rows 2i, 2i + 1; t[2i + 1] elements 2, 3 (and 6, 7).
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4h + c]: element c (and c + 4) of rows 4h .. 4h + 4.
    let u: [__m256; 8] = std::array::from_fn(|k| {
        let (h, c) = (k / 4, k % 4);
        let (a, b) = (t[4 * h + c / 2], t[4 * h + 2 + c / 2]);
        if c % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    // Column c: the low 128-bit lanes of u[c], u[4 + c]; column c + 4: the high ones.
    std::array::from_fn(|c| {
        if c < 4 {
            _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[c - 4], u[c])
        }
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_tile_impl(s: &mut [f32; KV_TILE], m: f32) -> f64 {
    let mv = _mm256_set1_ps(m);
    let mut sum = 0.0f64;
    for b in 0..KV_TILE / 16 {
        // SAFETY: 16 floats at 16b of a 64-float array.
        unsafe {
            let p = s.as_mut_ptr().add(16 * b);
            let lo = expf8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            let hi = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), mv));
            _mm256_storeu_ps(p, lo);
            _mm256_storeu_ps(p.add(8), hi);
            sum += reduce8_avx(_mm256_add_ps(hi, lo)) as f64;
        }
    }
    sum
}

/// The 16 lanes as two registers; a lane's maximum is `vmaxps(s, max)`: `s` where
/// `s > max`, else `max` (NaN included), as the scalar definition's comparison. A soft cap
/// takes the scaled lanes through the scalar `c·tanh` (the reference's `tanhf` per element).
#[target_feature(enable = "avx2")]
unsafe fn scale_max_impl(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32 {
    let (sv, ninf) = (_mm256_set1_ps(sc.scale), _mm256_set1_ps(f32::NEG_INFINITY));
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // `lo`, `hi` ≤ KV_TILE (clamped by the caller): visible is `lo - 1 < j < hi`.
    let (lov, hiv) = (
        _mm256_set1_epi32(lo as i32 - 1),
        _mm256_set1_epi32(hi as i32),
    );
    let mut m = [ninf; 2];
    for b in 0..KV_TILE / 8 {
        let j = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * b as i32));
        let keep = _mm256_and_si256(_mm256_cmpgt_epi32(j, lov), _mm256_cmpgt_epi32(hiv, j));
        // SAFETY: 8 floats at 8b of a 64-float array.
        unsafe {
            let p = s.as_mut_ptr().add(8 * b);
            let mut x = _mm256_mul_ps(_mm256_loadu_ps(p), sv);
            if sc.cap.is_some() {
                x = cap_lanes(x, sc.cap);
            }
            let x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(keep));
            _mm256_storeu_ps(p, x);
            m[b % 2] = _mm256_max_ps(x, m[b % 2]);
        }
    }
    let mut out = [0.0f32; 16];
    // SAFETY: 16 floats.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), m[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), m[1]);
    }
    super::fold_max(out)
}

/// [`super::expf_approx`] on 8 lanes. Without `vscalefps`, `j·2ⁿ` is `(j·2^⌊n/2⌋)·2^(n−⌊n/2⌋)`:
/// both powers are normal floats for `|n| ≤ 192`, the first product is exact (`j` is near 1),
/// so the result is rounded once, as the scalar definition's f64 product.
#[target_feature(enable = "avx2,fma,f16c")]
fn expf8(x: __m256) -> __m256 {
    let (n, j) = exp_poly(x);
    // `n` is a whole number: the conversion is exact where it is used (|n| ≤ 192).
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let pow2 = |k: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )))
    };
    let res = _mm256_mul_ps(_mm256_mul_ps(j, pow2(n1)), pow2(n2));
    let abs_n = _mm256_and_ps(n, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    if _mm256_movemask_ps(d) == 0 {
        return res;
    }
    // Past ±192: 0 below, +∞ above.
    let le0 = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let alt = _mm256_andnot_ps(le0, _mm256_set1_ps(f32::INFINITY));
    _mm256_blendv_ps(res, alt, d)
}

/// `ggml_vec_gelu_f32` on 8 lanes: the table entry at the f16 bits of `x` (round to nearest
/// even, as the scalar conversion), `0` for `x <= -10`, `x` for `x >= 10`. Each lane gathers
/// 32 bits at `table + 2·bits` and keeps the low half: the table has one entry past the last
/// index, so the read stays inside.
///
/// # Safety
/// `table` holds `GELU_TABLE_LEN` (65537) u16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn gelu8(x: __m256, table: *const u16) -> __m256 {
    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
    let idx = _mm256_cvtepu16_epi32(h);
    // SAFETY: every index is < 65536 and the table holds 65537 u16 (caller's contract).
    let g = unsafe { _mm256_i32gather_epi32::<2>(table.cast(), idx) };
    // The low halves, packed: lanes 0..4 and 4..8 of `g` sit in the two 128-bit lanes.
    let g = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(g, g));
    let y = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
    let hi = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(10.0));
    let lo = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(-10.0));
    _mm256_andnot_ps(lo, _mm256_blendv_ps(y, x, hi))
}
