//! The float formats (f32, f16, bf16) on 256-bit registers, and the activation quantizers
//! (`super`'s module text says how every kernel here is called).

use super::*;

// ---------------------------------------------------------------------------------------------
// Float formats: weight and activation in the same format (f32, f16, bf16).

pub(in crate::quant::x86) trait FloatFmt {
    const BYTES: usize;
    /// 8 elements starting at element `i`.
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
    /// 16 elements starting at element `i`, as [`FloatFmt::load8`] of `i` and of `i + 8` side
    /// by side (AVX-512 tiers only).
    unsafe fn load16(p: *const u8, i: usize) -> __m512;
    unsafe fn one(p: *const u8, i: usize) -> f32;
}

pub(in crate::quant::x86) struct F32;
pub(in crate::quant::x86) struct F16;
pub(in crate::quant::x86) struct BF16;

impl FloatFmt for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        _mm256_loadu_ps(p.add(4 * i).cast())
    }
    #[inline(always)]
    unsafe fn load16(p: *const u8, i: usize) -> __m512 {
        _mm512_loadu_ps(p.add(4 * i).cast())
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
    unsafe fn load16(p: *const u8, i: usize) -> __m512 {
        _mm512_cvtph_ps(loadu(p.add(2 * i)))
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
    unsafe fn load16(p: *const u8, i: usize) -> __m512 {
        let h = _mm512_cvtepu16_epi32(loadu(p.add(2 * i)));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8, i: usize) -> f32 {
        let h = core::ptr::read_unaligned(p.add(2 * i).cast::<u16>());
        f32::from_bits((h as u32) << 16)
    }
}

pub(in crate::quant::x86) struct TF<F>(core::marker::PhantomData<F>);

impl<F: FloatFmt> Tile for TF<F> {
    const BLOCK: usize = 1;
    const W_BYTES: usize = F::BYTES;
    const X_BYTES: usize = F::BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
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

    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        if D::AVX512 && g.nx >= 4 {
            return gemm_blocked::<F>(g);
        }
        gemm_tiles::<Self, D>(g)
    }
}

/// Weight rows and activation rows of a [`gemm_blocked`] tile.
const TILE_W: usize = 4;
const TILE_X: usize = 6;

/// [`TF::tile`]'s dots for `WR` weight rows against `XR` activation rows at once, on 512-bit
/// registers: each accumulator holds the two 8-lane accumulators of one (weight row,
/// activation row) pair side by side (lanes 0-7 the elements at 16k, lanes 8-15 those at
/// 16k + 8), so every pair sees exactly [`TF::tile`]'s operations in its order; each loaded
/// (and converted) weight chunk serves `XR` rows and each activation chunk `WR` rows.
#[inline(always)]
unsafe fn tile_zmm<F: FloatFmt, const WR: usize, const XR: usize>(
    n: usize,
    w: [*const u8; WR],
    x: [*const u8; XR],
) -> [[f32; XR]; WR] {
    let mut acc = [[_mm512_setzero_ps(); XR]; WR];
    let mut i = 0;
    while i + 16 <= n {
        let wv = w.map(|p| F::load16(p, i));
        for j in 0..XR {
            let xv = F::load16(x[j], i);
            for r in 0..WR {
                acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
            }
        }
        i += 16;
    }
    let mut out = [[0f32; XR]; WR];
    for r in 0..WR {
        for j in 0..XR {
            let mut lo = _mm512_castps512_ps256(acc[r][j]);
            let hi = _mm512_extractf32x8_ps::<1>(acc[r][j]);
            if i + 8 <= n {
                lo = _mm256_fmadd_ps(F::load8(w[r], i), F::load8(x[j], i), lo);
            }
            out[r][j] = hsum_ps(_mm256_add_ps(lo, hi));
        }
    }
    if i + 8 <= n {
        i += 8;
    }
    for k in i..n {
        for r in 0..WR {
            let wk = F::one(w[r], k);
            for j in 0..XR {
                out[r][j] += wk * F::one(x[j], k);
            }
        }
    }
    out
}

/// `nw x nx` dots in tiles of [`TILE_W`] weight rows by [`TILE_X`] activation rows
/// ([`tile_zmm`]; smaller ones at the edges): every dot as [`TF::tile`] computes it, with far
/// fewer loads and conversions per multiply-add than [`gemm_tiles`]' one weight row at a time
/// (AVX-512 tiers, several activation rows: prompts and encoders).
#[inline(always)]
unsafe fn gemm_blocked<F: FloatFmt>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    let mut i = 0;
    while i < nw {
        let wr = (nw - i).min(TILE_W);
        let mut j = 0;
        while j < nx {
            let xr = (nx - j).min(TILE_X);
            macro_rules! run {
                ($wr:literal, $xr:literal) => {{
                    let ws: [*const u8; $wr] = core::array::from_fn(|r| w.add((i + r) * w_stride));
                    let xs: [*const u8; $xr] = core::array::from_fn(|c| x.add((j + c) * x_stride));
                    let r = tile_zmm::<F, $wr, $xr>(n, ws, xs);
                    for (a, row) in r.iter().enumerate() {
                        for (b, v) in row.iter().enumerate() {
                            *out.add((j + b) * out_stride + i + a) = *v;
                        }
                    }
                }};
            }
            macro_rules! by_x {
                ($wr:literal) => {
                    match xr {
                        6 => run!($wr, 6),
                        5 => run!($wr, 5),
                        4 => run!($wr, 4),
                        3 => run!($wr, 3),
                        2 => run!($wr, 2),
                        _ => run!($wr, 1),
                    }
                };
            }
            match wr {
                4 => by_x!(4),
                3 => by_x!(3),
                2 => by_x!(2),
                _ => by_x!(1),
            }
            j += xr;
        }
        i += wr;
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
pub(in crate::quant::x86) unsafe fn quantize_q8_01(
    x: *const f32,
    y: *mut u8,
    nb: usize,
    with_sum: bool,
) {
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
pub(in crate::quant::x86) unsafe fn quantize_q8k(x: *const f32, y: *mut u8, nb: usize) {
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
pub(in crate::quant::x86) unsafe fn quantize_f16(x: *const f32, y: *mut u8, n: usize) {
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
pub(in crate::quant::x86) unsafe fn quantize_bf16(x: *const f32, y: *mut u8, n: usize) {
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
