//! The AVX2 + FMA + F16C paths of [`super::F16Ops`]: each 16-lane accumulator of the reference's
//! AVX-512 layout is two 256-bit registers, so every path gives the scalar definition's bits.

use super::{F16Ops, ScoreScale, BLOCK, KV_TILE};
use half::f16;
use std::arch::x86_64::*;

pub const AVX2: F16Ops = F16Ops {
    dot: dot_avx2,
    mad: mad_avx2,
    scale: scale_avx2,
    vec_keys: vec_keys_avx2,
    kq_tile: kq_tile_avx2,
    key_tile: key_tile_avx2,
    kq_rows: kq_rows_avx2,
    vkq_multi: vkq_multi_avx2,
    softmax_tile: softmax_tile_avx2,
    scale_max: scale_max_avx2,
    vkq_acc: vkq_acc_avx2,
    swiglu: swiglu_avx2,
    geglu: geglu_avx2,
    gelu: gelu_avx2,
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
    sc: ScoreScale,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    super::vec_keys_with(dot_avx2, mad_avx2, scale_avx2, q16, kv, sc, m_s, acc)
}

pub fn kq_rows_avx2(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    super::kq_rows_with(dot_avx2, q, heads, k, out)
}

pub fn vkq_multi_avx2(a: super::Vkq) {
    let blocks = [
        vkq_multi_impl::<1>,
        vkq_multi_impl::<2>,
        vkq_multi_impl::<3>,
        vkq_multi_impl::<4>,
    ];
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { super::vkq_multi_blocked(vkq_acc_avx2, 16, blocks, a) }
}

/// `G` accumulator rows (`hdv` a multiple of 16), 16 columns at a time: 2 vectors per row stay
/// in registers across the `n` keys, each value block converted once for the `G` rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn vkq_multi_impl<const G: usize>(
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    v: &[f16],
    n: usize,
    hdv: usize,
) {
    let (ap, pp, vp) = (acc.as_mut_ptr(), p.as_ptr(), v.as_ptr() as *const u16);
    for d0 in (0..hdv).step_by(16) {
        // SAFETY: rows `g < G` of `acc` hold `hdv >= d0 + 16` elements at `g·acc_stride`;
        // value row `j < n` holds `hdv`; weight row `g` holds `n` at `g·p_stride`.
        unsafe {
            let mut a: [[__m256; 2]; G] = std::array::from_fn(|g| {
                std::array::from_fn(|c| _mm256_loadu_ps(ap.add(g * acc_stride + d0 + 8 * c)))
            });
            for j in 0..n {
                let x: [__m256; 2] = std::array::from_fn(|c| {
                    _mm256_cvtph_ps(_mm_loadu_si128(
                        vp.add(j * hdv + d0 + 8 * c) as *const __m128i
                    ))
                });
                for (g, ag) in a.iter_mut().enumerate() {
                    let pv = _mm256_set1_ps(*pp.add(g * p_stride + j));
                    for (c, ac) in ag.iter_mut().enumerate() {
                        *ac = _mm256_fmadd_ps(x[c], pv, *ac);
                    }
                }
            }
            for (g, ag) in a.iter().enumerate() {
                for (c, ac) in ag.iter().enumerate() {
                    _mm256_storeu_ps(ap.add(g * acc_stride + d0 + 8 * c), *ac);
                }
            }
        }
    }
}

pub fn kq_tile_avx2(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let (rows, hd) = super::tile_shape(q, kt, out);
    // Half a tile (32 keys, 4 vectors) for two rows at a time: eight independent chains, and
    // each transposed key read once for both rows.
    for half in 0..2 {
        let mut r = 0;
        while r + 2 <= rows {
            // SAFETY: avx2, fma and f16c detected; rows `r`, `r + 1` of `q` and `out` exist,
            // `kt` holds `hd` rows of KV_TILE (checked).
            unsafe { kq_tile_impl::<2>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], half) };
            r += 2;
        }
        if r < rows {
            // SAFETY: as above, one row.
            unsafe { kq_tile_impl::<1>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..], half) };
        }
    }
}

/// `R` query rows (`hd` apart in `q`) against keys `32·half .. 32·half + 32` of the transposed
/// tile, into those columns of `R` rows of `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kq_tile_impl<const R: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    out: &mut [f32],
    half: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let (kp, qp) = (kt.as_ptr().add(32 * half), q.as_ptr());
    for d in 0..hd {
        // SAFETY: `d * KV_TILE + 32·half + 32 <= kt.len()`, row `i < R` of `q` has `hd`
        // elements.
        unsafe {
            let kv: [__m256; 4] =
                std::array::from_fn(|c| _mm256_loadu_ps(kp.add(d * KV_TILE + 8 * c)));
            for (i, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_set1_ps(*qp.add(i * hd + d));
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm256_fmadd_ps(kv[c], qv, *ac);
                }
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        for (c, ac) in a.iter().enumerate() {
            // SAFETY: row `i < R` of `out` holds KV_TILE floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i * KV_TILE + 32 * half + 8 * c), *ac) };
        }
    }
}

pub fn key_tile_avx2(k: &[f16], kt: &mut [f32]) {
    let hd = kt.len() / KV_TILE;
    assert!(hd > 0 && k.len().is_multiple_of(hd) && k.len() / hd <= KV_TILE);
    // SAFETY: selected only when avx2, fma and f16c were detected at run time; shapes checked.
    unsafe { key_tile_impl(k, kt, hd) }
}

/// 8×8 blocks: 8 key rows converted to f32, transposed in registers, stored as 8 dimension rows
/// of `kt`; leftover dimensions (`hd % 8`) element by element.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn key_tile_impl(k: &[f16], kt: &mut [f32], hd: usize) {
    let n = k.len() / hd;
    let d8 = hd / 8 * 8;
    let (kp, ktp) = (k.as_ptr() as *const u16, kt.as_mut_ptr());
    for j0 in (0..n).step_by(8) {
        let nj = (n - j0).min(8);
        for d0 in (0..d8).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, ri) in r.iter_mut().enumerate().take(nj) {
                // SAFETY: row `j0 + i < n` has `hd >= d0 + 8` elements.
                *ri = unsafe {
                    _mm256_cvtph_ps(_mm_loadu_si128(kp.add((j0 + i) * hd + d0) as *const __m128i))
                };
            }
            for (d, v) in transpose8(r).into_iter().enumerate() {
                // SAFETY: row `d0 + d < hd` of `kt`, columns `j0..j0 + 8 <= KV_TILE`.
                unsafe { _mm256_storeu_ps(ktp.add((d0 + d) * KV_TILE + j0), v) };
            }
        }
        for j in j0..j0 + nj {
            for d in d8..hd {
                kt[d * KV_TILE + j] = k[j * hd + d].to_f32();
            }
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

pub fn softmax_tile_avx2(s: &mut [f32; KV_TILE], m: f32) -> f64 {
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { softmax_tile_impl(s, m) }
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

pub fn scale_max_avx2(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32 {
    // SAFETY: selected only when avx2 was detected at run time.
    unsafe { scale_max_impl(s, sc, lo.min(KV_TILE), hi.min(KV_TILE)) }
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
                let mut l = [0.0f32; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), x);
                l.iter_mut().for_each(|v| *v = super::cap_score(sc.cap, *v));
                x = _mm256_loadu_ps(l.as_ptr());
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
#[target_feature(enable = "avx2,fma")]
fn expf8(x: __m256) -> __m256 {
    let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
    );
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

pub fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len());
    // SAFETY: selected only when avx2, fma and f16c were detected at run time; lengths checked.
    unsafe { swiglu_impl(gate, up) }
}

/// `x / (1 + expf(0 − x)) · g`, 8 lanes at a time, the tail through the scalar definition (the
/// same arithmetic per element).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn swiglu_impl(gate: &mut [f32], up: &[f32]) {
    let n8 = gate.len() / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i < n8 {
        // SAFETY: 8 elements at `i + 8 <= n8` of `gate` (and of `up`, no shorter).
        unsafe {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let g = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(silu, g));
        }
        i += 8;
    }
    super::swiglu_scalar(&mut gate[n8..], &up[n8..]);
}

pub fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: selected only when avx2, fma and f16c were detected at run time.
    unsafe { super::gelu_with(gate, Some(up), 8, gelu_impl) }
}

pub fn gelu_avx2(x: &mut [f32]) {
    // SAFETY: as `geglu_avx2`.
    unsafe { super::gelu_with(x, None, 8, gelu_impl) }
}

/// GELU of the whole 8-lane blocks of `x` (times `up` when given), the tail left alone.
/// Caller: `up` is at least as long as `x`; `table` points at the GELU table.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_impl(x: &mut [f32], up: Option<&[f32]>, table: *const u16) {
    let n8 = x.len() / 8 * 8;
    let mut i = 0;
    while i < n8 {
        // SAFETY: 8 elements at `i + 8 <= n8` of `x` (and of `up`, no shorter); the table
        // as the caller promises.
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let mut y = gelu8(_mm256_loadu_ps(p), table);
            if let Some(u) = up {
                y = _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i)));
            }
            _mm256_storeu_ps(p, y);
        }
        i += 8;
    }
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
