//! Vector primitives of the attention kernel, each reproducing, bit for bit, the arithmetic of
//! the matching routine in the reference engine's CPU backend as built for AVX-512 (ggml's
//! `ggml_vec_dot_f16`, `ggml_vec_mad_f16`, `ggml_vec_scale_f16`, `ggml_v_expf`/
//! `ggml_vec_soft_max_f32` and the `simd_gemm` micro-kernel of its tiled flash attention).
//!
//! Why bit-exact rather than "as accurate as possible": the golden outputs we are tested
//! against come from that engine, and small models are hypersensitive to the rounding inside
//! attention (an f16 accumulator, an f16 query) — logits move by tenths when it changes. So
//! the *summation order* is part of each primitive's contract here: every path (AVX-512,
//! AVX2+FMA+F16C, scalar) computes exactly the same bits, and the tests check that.
//!
//! The fixed layouts follow the AVX-512 build of the reference: a dot product of f16 rows runs
//! 4 accumulators of 16 lanes over blocks of 64 elements, reduces them in a fixed tree, and
//! adds the leftover elements one by one in f64; the f16 accumulate `y = f16(y + x·v)` is one
//! fused multiply-add rounded to f32 and then to f16 (round to nearest even).

use half::f16;

/// Keys per tile of the batched (tiled) attention path; the softmax sums one tile at a time in
/// blocks of 16.
pub const KV_TILE: usize = 64;

/// `Σ q[i]·k[i]` in the reference's order; `q` holds f16 values (a query rounded to f16).
pub type DotF16Fn = fn(q: &[f32], k: &[f16]) -> f32;
/// `y[i] = f16(fma(x[i], v, y[i]))`: an f16 accumulator (values held in f32) takes `x·v`.
pub type MadF16Fn = fn(y: &mut [f32], x: &[f16], v: f32);
/// `y[i] = f16(y[i] · v)` on an f16 accumulator held in f32.
pub type ScaleF16Fn = fn(y: &mut [f32], v: f32);
/// The vector path's online softmax over a run of keys, for the `group` query heads sharing
/// them: queries `q16` (`[group][hdk]`, f16 values), keys `[n][hdk]`, values `[n][hdv]`; the
/// running state `m_s` (`[group][2]`: max, sum) and f16 accumulators `acc` (`[group][hdv]`,
/// held in f32) are continued. Per key and head, in the reference's order:
/// `s = dot(q16, k)·scale`; on a new maximum `acc = f16(acc·expf(M−s))`, `M = s`, weight 1,
/// else weight `expf(s−M)`; `acc = f16(acc + v·weight)`; `S = fma(S, rescale, weight)`.
///
/// Several kv heads ("streams") may run together, keys interleaved (key 0 of every stream, then
/// key 1, ...): each head's arithmetic is unchanged, but the independent chains overlap. Then
/// `q16`, `m_s` and `acc` hold `streams × group` heads, stream-major.
pub type VecKeysFn = fn(q16: &[f32], kv: KeyRun<'_>, scale: f32, m_s: &mut [f32], acc: &mut [f32]);

/// The keys and values a [`VecKeysFn`] visits: `streams` runs of `n` rows; run `s` starts at
/// row `s · k_stride` of `keys` (`[row][hdk]`) and `s · v_stride` of `values` (`[row][hdv]`).
#[derive(Clone, Copy)]
pub struct KeyRun<'a> {
    pub keys: &'a [f16],
    pub values: &'a [f16],
    pub n: usize,
    pub streams: usize,
    pub k_stride: usize,
    pub v_stride: usize,
}

impl<'a> KeyRun<'a> {
    /// One stream of `n` keys.
    pub fn single(keys: &'a [f16], values: &'a [f16], n: usize) -> Self {
        KeyRun {
            keys,
            values,
            n,
            streams: 1,
            k_stride: 0,
            v_stride: 0,
        }
    }

    /// Key and value rows `i` of stream `s`.
    #[inline(always)]
    fn rows(&self, s: usize, i: usize, hdk: usize, hdv: usize) -> (&'a [f16], &'a [f16]) {
        let (k, v) = ((s * self.k_stride + i) * hdk, (s * self.v_stride + i) * hdv);
        (&self.keys[k..k + hdk], &self.values[v..v + hdv])
    }
}
/// Scores of query rows against a tile of keys: `q` holds `rows = out.len() / KV_TILE` rows of
/// `hd` (`kt` is the tile transposed, `[hd][KV_TILE]`), and `out[r·KV_TILE + j]` = the
/// fma-chain over d of `q_r[d]·kt[d][j]` (`d` ascending, starting from 0).
pub type KqTileFn = fn(q: &[f32], kt: &[f32], out: &mut [f32]);

/// `(rows, hd)` of a [`KqTileFn`] call, checked.
fn tile_shape(q: &[f32], kt: &[f32], out: &[f32]) -> (usize, usize) {
    let rows = out.len() / KV_TILE;
    assert!(rows > 0 && out.len() == rows * KV_TILE && q.len().is_multiple_of(rows));
    let hd = q.len() / rows;
    assert_eq!(kt.len(), hd * KV_TILE);
    (rows, hd)
}
/// Scores of `heads` query rows (`q`: `[heads][hd]` f32) against `n <= KV_TILE` key rows
/// (`k`: `[n][hd]`): `out[g·KV_TILE + j] = dot(q_g, k_j)`, each exactly what [`DotF16Fn`]
/// returns for that pair (16 lanes of fused multiply-adds, the reference's lane tree). The
/// long-decode scores: key rows are read in place, with no transposed tile.
pub type KqRowsFn = fn(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]);
/// `vkq_acc` for `heads` rows at once: for each `g`, `acc[g·acc_stride..][..hdv]` takes
/// `p[g·p_stride..][..n]` against the same `n` value rows `v` (`[n][hdv]`), the bits of
/// [`VkqAccFn`] on that row; each value row is converted once for every head.
pub type VkqMultiFn = fn(
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    v: &[f16],
    hdv: usize,
);

/// `(hd, n)` of a [`KqRowsFn`] call, checked.
fn rows_shape(q: &[f32], heads: usize, k: &[f16], out: &[f32]) -> (usize, usize) {
    assert!(heads > 0 && q.len().is_multiple_of(heads) && out.len() >= heads * KV_TILE);
    let hd = q.len() / heads;
    assert!(hd > 0 && k.len().is_multiple_of(hd) && k.len() / hd <= KV_TILE);
    (hd, k.len() / hd)
}

pub fn kq_rows_scalar(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    kq_rows_with(dot_scalar, q, heads, k, out)
}

/// A [`KqRowsFn`] as one `dot` per (query row, key row) pair.
fn kq_rows_with(dot: DotF16Fn, q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    let (hd, _) = rows_shape(q, heads, k, out);
    for (g, qg) in q.chunks_exact(hd).enumerate() {
        for (j, kj) in k.chunks_exact(hd).enumerate() {
            out[g * KV_TILE + j] = dot(qg, kj);
        }
    }
}

/// `n` of a [`VkqMultiFn`] call, every row checked to lie inside its buffer.
fn multi_shape(
    acc: &[f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    v: &[f16],
    hdv: usize,
) -> usize {
    assert!(
        heads > 0 && hdv > 0 && v.len().is_multiple_of(hdv),
        "value rows of {hdv}"
    );
    let n = v.len() / hdv;
    assert!(
        acc.len() >= (heads - 1) * acc_stride + hdv,
        "accumulator rows"
    );
    assert!(p.len() >= (heads - 1) * p_stride + n, "weight rows");
    n
}

pub fn vkq_multi_scalar(
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    v: &[f16],
    hdv: usize,
) {
    vkq_multi_with(vkq_acc_scalar, acc, acc_stride, p, p_stride, heads, v, hdv)
}

/// A [`VkqMultiFn`] as one `vkq_acc` per head.
#[allow(clippy::too_many_arguments)]
fn vkq_multi_with(
    vkq_acc: VkqAccFn,
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    v: &[f16],
    hdv: usize,
) {
    let n = multi_shape(acc, acc_stride, p, p_stride, heads, v, hdv);
    for g in 0..heads {
        vkq_acc(
            &mut acc[g * acc_stride..][..hdv],
            &p[g * p_stride..][..n],
            v,
        );
    }
}

/// A tile of key rows (`k`: `n <= KV_TILE` rows of `hd` f16) transposed to f32 in `kt`
/// (`[hd][KV_TILE]`, column `j` = key `j`); columns `n..` hold zeros or stale values.
pub type KeyTileFn = fn(k: &[f16], kt: &mut [f32]);

/// The scalar [`KeyTileFn`] (the conversion is exact, so every path gives these bits).
pub fn key_tile_scalar(k: &[f16], kt: &mut [f32]) {
    let hd = kt.len() / KV_TILE;
    assert!(hd > 0 && k.len().is_multiple_of(hd) && k.len() / hd <= KV_TILE);
    for (j, row) in k.chunks_exact(hd).enumerate() {
        for (d, &x) in row.iter().enumerate() {
            kt[d * KV_TILE + j] = x.to_f32();
        }
    }
}

/// `s[j] = expf_approx(s[j] − m)` (−∞ gives 0) and the sum of the results, added up per block
/// of 16 in a fixed tree and across blocks in f64.
pub type SoftmaxTileFn = fn(s: &mut [f32; KV_TILE], m: f32) -> f64;
/// `acc[d] = fma-chain over j of v[j][d]·p[j]` (`j` ascending, continuing from `acc[d]`);
/// `v` holds `p.len()` rows of `acc.len()` values.
pub type VkqAccFn = fn(acc: &mut [f32], p: &[f32], v: &[f16]);
/// `gate[i] = silu(gate[i]) · up[i]`, SiLU as [`crate::kernels::ops::silu`] computes it.
pub type SwigluFn = fn(gate: &mut [f32], up: &[f32]);

/// `x[i] = gelu(x[i])`, GELU as [`crate::kernels::ops::gelu_tanh`] computes it (the table).
pub type GeluFn = fn(x: &mut [f32]);

/// The scalar GeGLU: `gate[i] = gelu(gate[i]) · up[i]` (what every SIMD path must match).
pub fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    let t = crate::kernels::ops::gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = crate::kernels::ops::gelu_tanh_with(t, *g) * u;
    }
}

/// The scalar GELU in place (GPT-2's ungated FFN).
pub fn gelu_scalar(x: &mut [f32]) {
    let t = crate::kernels::ops::gelu_table();
    for v in x.iter_mut() {
        *v = crate::kernels::ops::gelu_tanh_with(t, *v);
    }
}

/// The scalar SwiGLU (the reference every SIMD path must match bit for bit).
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = crate::kernels::ops::silu(*g) * u;
    }
}

/// The attention primitives for this CPU.
#[derive(Clone, Copy)]
pub struct F16Ops {
    pub dot: DotF16Fn,
    pub mad: MadF16Fn,
    pub scale: ScaleF16Fn,
    pub vec_keys: VecKeysFn,
    pub kq_tile: KqTileFn,
    pub key_tile: KeyTileFn,
    pub kq_rows: KqRowsFn,
    pub vkq_multi: VkqMultiFn,
    pub softmax_tile: SoftmaxTileFn,
    pub vkq_acc: VkqAccFn,
    pub swiglu: SwigluFn,
    /// GeGLU, same contract as `swiglu` with GELU (tanh) for SiLU.
    pub geglu: SwigluFn,
    pub gelu: GeluFn,
    pub name: &'static str,
}

impl F16Ops {
    /// The fastest path this CPU supports.
    pub fn detect() -> F16Ops {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return x86::AVX512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return x86::AVX2;
            }
        }
        Self::scalar()
    }

    /// The reference path (portable; slow where the CPU has no fused multiply-add).
    pub fn scalar() -> F16Ops {
        F16Ops {
            dot: dot_scalar,
            mad: mad_scalar,
            scale: scale_scalar,
            vec_keys: vec_keys_scalar,
            kq_tile: kq_tile_scalar,
            key_tile: key_tile_scalar,
            kq_rows: kq_rows_scalar,
            vkq_multi: vkq_multi_scalar,
            softmax_tile: softmax_tile_scalar,
            vkq_acc: vkq_acc_scalar,
            swiglu: swiglu_scalar,
            geglu: geglu_scalar,
            gelu: gelu_scalar,
            name: "scalar",
        }
    }
}

/// Elements per block of the f16 dot product and the f16 accumulate (4 vectors of 16).
const BLOCK: usize = 64;

/// The reference's horizontal sum of 16 lanes: halves, then quarters, then pairs.
#[inline]
fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t = [0.0f32; 8];
    for i in 0..8 {
        t[i] = a[i + 8] + a[i];
    }
    let u = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    (u[0] + u[2]) + (u[1] + u[3])
}

pub fn dot_scalar(q: &[f32], k: &[f16]) -> f32 {
    assert_eq!(q.len(), k.len());
    let n = q.len();
    let np = n & !(BLOCK - 1);
    let mut sumf = 0.0f64;
    if np > 0 {
        // acc[j][l]: accumulator j (of 4), lane l (of 16), advanced by fused multiply-adds as
        // the SIMD paths do. (For a query rounded to f16, as the reference's, products of f16
        // values are exact in f32 and `acc + q·k` would give the same bits; a long decode row
        // passes its query in f32.)
        let mut acc = [[0.0f32; 16]; 4];
        for b in (0..np).step_by(BLOCK) {
            for (j, a) in acc.iter_mut().enumerate() {
                for (l, x) in a.iter_mut().enumerate() {
                    let i = b + 16 * j + l;
                    *x = q[i].mul_add(k[i].to_f32(), *x);
                }
            }
        }
        let [mut a0, mut a1, a2, a3] = acc;
        for ((x0, x1), (x2, x3)) in a0.iter_mut().zip(a1.iter_mut()).zip(a2.iter().zip(&a3)) {
            *x0 += x2;
            *x1 += x3;
        }
        for (x0, x1) in a0.iter_mut().zip(&a1) {
            *x0 += x1;
        }
        sumf = reduce16(&a0) as f64;
    }
    for i in np..n {
        sumf += (q[i] * k[i].to_f32()) as f64;
    }
    sumf as f32
}

/// Round to the nearest f16 (ties to even), kept in f32.
#[inline]
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

pub fn mad_scalar(y: &mut [f32], x: &[f16], v: f32) {
    assert_eq!(y.len(), x.len());
    for (a, &b) in y.iter_mut().zip(x) {
        *a = round_f16(b.to_f32().mul_add(v, *a));
    }
}

pub fn scale_scalar(y: &mut [f32], v: f32) {
    for a in y.iter_mut() {
        *a = round_f16(*a * v);
    }
}

/// [`VecKeysFn`] from a path's dot / scale / mad primitives.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn vec_keys_with(
    dot: DotF16Fn,
    mad: MadF16Fn,
    scale_acc: ScaleF16Fn,
    q16: &[f32],
    kv: KeyRun<'_>,
    scale: f32,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    let heads = m_s.len() / 2;
    let group = heads / kv.streams;
    let (hdk, hdv) = (q16.len() / heads, acc.len() / heads);
    for i in 0..kv.n {
        for (h, ((q, a), st)) in q16
            .chunks_exact(hdk)
            .zip(acc.chunks_exact_mut(hdv))
            .zip(m_s.chunks_exact_mut(2))
            .enumerate()
        {
            let (krow, vrow) = kv.rows(h / group, i, hdk, hdv);
            let s = dot(q, krow) * scale;
            let (mut rescale, mut weight) = (1.0f32, 1.0f32);
            if s > st[0] {
                rescale = (st[0] - s).exp();
                st[0] = s;
                scale_acc(a, rescale);
            } else {
                weight = (s - st[0]).exp();
            }
            mad(a, vrow, weight);
            st[1] = st[1].mul_add(rescale, weight);
        }
    }
}

pub fn vec_keys_scalar(q16: &[f32], kv: KeyRun<'_>, scale: f32, m_s: &mut [f32], acc: &mut [f32]) {
    vec_keys_with(
        dot_scalar,
        mad_scalar,
        scale_scalar,
        q16,
        kv,
        scale,
        m_s,
        acc,
    )
}

pub fn kq_tile_scalar(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let (_, hd) = tile_shape(q, kt, out);
    out.fill(0.0);
    for (qr, o) in q.chunks_exact(hd).zip(out.chunks_exact_mut(KV_TILE)) {
        for (&qd, krow) in qr.iter().zip(kt.chunks_exact(KV_TILE)) {
            for (o, &k) in o.iter_mut().zip(krow) {
                *o = k.mul_add(qd, *o);
            }
        }
    }
}

/// The reference's vectorised `expf` (`ggml_v_expf`, AVX-512 form): a degree-5 polynomial on
/// the reduced argument, scaled by `2^n` exactly (`vscalefps`).
#[inline]
pub fn expf_approx(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let u = b * b;
    let p_hi = f32::from_bits(0x3c07_2010).mul_add(b, f32::from_bits(0x3d2b_9f17));
    let p_lo = f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb));
    let p1 = f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0);
    let j = p_hi.mul_add(u, p_lo).mul_add(u, p1);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef: j·2^n rounded once (exact in f64, then one rounding to f32); |n| <= 192 here.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    ((j as f64) * two_n) as f32
}

pub fn softmax_tile_scalar(s: &mut [f32; KV_TILE], m: f32) -> f64 {
    let mut sum = 0.0f64;
    for blk in s.chunks_exact_mut(16) {
        let mut v = [0.0f32; 16];
        for (o, x) in v.iter_mut().zip(blk.iter_mut()) {
            *x = expf_approx(*x - m);
            *o = *x;
        }
        sum += reduce16(&v) as f64;
    }
    sum
}

pub fn vkq_acc_scalar(acc: &mut [f32], p: &[f32], v: &[f16]) {
    let dv = acc.len();
    assert_eq!(v.len(), p.len() * dv);
    if dv == 0 {
        return;
    }
    for (&pj, vrow) in p.iter().zip(v.chunks_exact(dv)) {
        for (a, &x) in acc.iter_mut().zip(vrow) {
            *a = x.to_f32().mul_add(pj, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{F16Ops, BLOCK, KV_TILE};
    use half::f16;
    use std::arch::x86_64::*;

    pub const AVX512: F16Ops = F16Ops {
        dot: dot_avx512,
        mad: mad_avx512,
        scale: scale_avx512,
        vec_keys: vec_keys_avx512,
        kq_tile: kq_tile_avx512,
        key_tile: key_tile_avx512,
        kq_rows: kq_rows_avx512,
        vkq_multi: vkq_multi_avx512,
        softmax_tile: softmax_tile_avx512,
        vkq_acc: vkq_acc_avx512,
        swiglu: swiglu_avx512,
        geglu: geglu_avx512,
        gelu: gelu_avx512,
        name: "avx512",
    };

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

    // ---------------------------------------------------------------- AVX-512

    pub fn dot_avx512(q: &[f32], k: &[f16]) -> f32 {
        assert_eq!(q.len(), k.len());
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { dot_avx512_impl(q, k) }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn dot_avx512_impl(q: &[f32], k: &[f16]) -> f32 {
        let n = q.len();
        let np = n & !(BLOCK - 1);
        let mut sumf = 0.0f64;
        if np > 0 {
            let mut acc = [_mm512_setzero_ps(); 4];
            let (qp, kp) = (q.as_ptr(), k.as_ptr() as *const u16);
            // SAFETY: every load reads 16 elements at `i + 16j < np <= n`.
            unsafe {
                for i in (0..np).step_by(BLOCK) {
                    for (j, a) in acc.iter_mut().enumerate() {
                        let o = i + 16 * j;
                        let kv = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(o) as *const __m256i));
                        *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(o)), kv, *a);
                    }
                }
            }
            let a02 = _mm512_add_ps(acc[0], acc[2]);
            let a13 = _mm512_add_ps(acc[1], acc[3]);
            sumf = reduce16_avx512(_mm512_add_ps(a02, a13)) as f64;
        }
        for i in np..n {
            sumf += (q[i] * k[i].to_f32()) as f64;
        }
        sumf as f32
    }

    /// [`super::reduce16`] on a vector.
    #[target_feature(enable = "avx512f")]
    fn reduce16_avx512(a: __m512) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
        let lo = _mm512_castps512_ps256(a);
        reduce8_avx(_mm256_add_ps(hi, lo))
    }

    /// The last three steps of [`super::reduce16`], on the 8 half sums.
    #[target_feature(enable = "avx2")]
    fn reduce8_avx(t: __m256) -> f32 {
        let u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
        let w = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0b01_00_11_10));
        _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)))
    }

    pub fn mad_avx512(y: &mut [f32], x: &[f16], v: f32) {
        assert_eq!(y.len(), x.len());
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { mad_avx512_impl(y, x, v) }
    }

    /// Round 16 lanes to f16 and back (ties to even).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn round16(x: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn mad_avx512_impl(y: &mut [f32], x: &[f16], v: f32) {
        let n = y.len();
        let vv = _mm512_set1_ps(v);
        let mut i = 0;
        let (yp, xp) = (y.as_mut_ptr(), x.as_ptr() as *const u16);
        // SAFETY: loads and stores of 16 elements at `i` with `i + 16 <= n`.
        unsafe {
            while i + 16 <= n {
                let xv = _mm512_cvtph_ps(_mm256_loadu_si256(xp.add(i) as *const __m256i));
                let r = _mm512_fmadd_ps(xv, vv, _mm512_loadu_ps(yp.add(i)));
                _mm512_storeu_ps(yp.add(i), round16(r));
                i += 16;
            }
        }
        super::mad_scalar(&mut y[i..], &x[i..], v);
    }

    pub fn scale_avx512(y: &mut [f32], v: f32) {
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { scale_avx512_impl(y, v) }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn scale_avx512_impl(y: &mut [f32], v: f32) {
        let n = y.len();
        let vv = _mm512_set1_ps(v);
        let mut i = 0;
        let yp = y.as_mut_ptr();
        // SAFETY: loads and stores of 16 elements at `i` with `i + 16 <= n`.
        unsafe {
            while i + 16 <= n {
                _mm512_storeu_ps(
                    yp.add(i),
                    round16(_mm512_mul_ps(_mm512_loadu_ps(yp.add(i)), vv)),
                );
                i += 16;
            }
        }
        super::scale_scalar(&mut y[i..], v);
    }

    pub fn vec_keys_avx512(
        q16: &[f32],
        kv: super::KeyRun<'_>,
        scale: f32,
        m_s: &mut [f32],
        acc: &mut [f32],
    ) {
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { vec_keys_avx512_impl(q16, kv, scale, m_s, acc) }
    }

    /// [`super::VecKeysFn`] with the primitives inlined into one loop.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn vec_keys_avx512_impl(
        q16: &[f32],
        kv: super::KeyRun<'_>,
        scale: f32,
        m_s: &mut [f32],
        acc: &mut [f32],
    ) {
        let heads = m_s.len() / 2;
        let group = heads / kv.streams;
        let (hdk, hdv) = (q16.len() / heads, acc.len() / heads);
        for i in 0..kv.n {
            for (h, ((q, a), st)) in q16
                .chunks_exact(hdk)
                .zip(acc.chunks_exact_mut(hdv))
                .zip(m_s.chunks_exact_mut(2))
                .enumerate()
            {
                let (krow, vrow) = kv.rows(h / group, i, hdk, hdv);
                // SAFETY: (all three) the rows have the lengths the kernels expect.
                let s = unsafe { dot_avx512_impl(q, krow) } * scale;
                let (mut rescale, mut weight) = (1.0f32, 1.0f32);
                if s > st[0] {
                    rescale = (st[0] - s).exp();
                    st[0] = s;
                    unsafe { scale_avx512_impl(a, rescale) };
                } else {
                    weight = (s - st[0]).exp();
                }
                unsafe { mad_avx512_impl(a, vrow, weight) };
                st[1] = st[1].mul_add(rescale, weight);
            }
        }
    }

    pub fn kq_tile_avx512(q: &[f32], kt: &[f32], out: &mut [f32]) {
        let (rows, hd) = super::tile_shape(q, kt, out);
        let mut r = 0;
        // Two rows at a time: eight independent chains keep both FMA pipes busy (four would
        // wait on the latency of the previous FMA).
        while r + 2 <= rows {
            // SAFETY: avx512f detected; rows `r`, `r + 1` of `q` and `out` exist (checked).
            unsafe { kq_tile_avx512_impl::<2>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..]) };
            r += 2;
        }
        if r < rows {
            // SAFETY: as above, one row.
            unsafe { kq_tile_avx512_impl::<1>(&q[r * hd..], hd, kt, &mut out[r * KV_TILE..]) };
        }
    }

    /// `R` query rows (`hd` apart in `q`) against the transposed tile, into `R` rows of `out`.
    #[target_feature(enable = "avx512f")]
    unsafe fn kq_tile_avx512_impl<const R: usize>(
        q: &[f32],
        hd: usize,
        kt: &[f32],
        out: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let (kp, qp) = (kt.as_ptr(), q.as_ptr());
        for d in 0..hd {
            // SAFETY: `d * KV_TILE + 64 <= kt.len()`, row `i < R` of `q` has `hd` elements.
            unsafe {
                let kv: [__m512; 4] =
                    std::array::from_fn(|c| _mm512_loadu_ps(kp.add(d * KV_TILE + 16 * c)));
                for (i, a) in acc.iter_mut().enumerate() {
                    let qv = _mm512_set1_ps(*qp.add(i * hd + d));
                    for (c, ac) in a.iter_mut().enumerate() {
                        *ac = _mm512_fmadd_ps(kv[c], qv, *ac);
                    }
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (c, ac) in a.iter().enumerate() {
                // SAFETY: row `i < R` of `out` holds KV_TILE floats.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(i * KV_TILE + 16 * c), *ac) };
            }
        }
    }

    pub fn kq_rows_avx512(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
        let (hd, n) = super::rows_shape(q, heads, k, out);
        if hd % BLOCK != 0 {
            // Leftover elements go through the dot's scalar tail: one pair at a time.
            for g in 0..heads {
                for j in 0..n {
                    out[g * KV_TILE + j] = dot_avx512(&q[g * hd..][..hd], &k[j * hd..][..hd]);
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
    /// each row's accumulators are reduced exactly as `dot_avx512_impl` reduces them.
    #[target_feature(enable = "avx512f")]
    unsafe fn kq_rows_impl<const G: usize>(
        q: &[f32],
        k: &[f16],
        hd: usize,
        n: usize,
        out: &mut [f32],
    ) {
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
                let a02 = _mm512_add_ps(a[0], a[2]);
                let a13 = _mm512_add_ps(a[1], a[3]);
                out[g * KV_TILE + j] = reduce16_avx512(_mm512_add_ps(a02, a13));
            }
        }
    }

    pub fn vkq_multi_avx512(
        acc: &mut [f32],
        acc_stride: usize,
        p: &[f32],
        p_stride: usize,
        heads: usize,
        v: &[f16],
        hdv: usize,
    ) {
        if !hdv.is_multiple_of(BLOCK) {
            let one: super::VkqAccFn = vkq_acc_avx512;
            return super::vkq_multi_with(one, acc, acc_stride, p, p_stride, heads, v, hdv);
        }
        let n = super::multi_shape(acc, acc_stride, p, p_stride, heads, v, hdv);
        let mut g0 = 0;
        while g0 < heads {
            let gn = (heads - g0).min(4);
            let (a, pg) = (&mut acc[g0 * acc_stride..], &p[g0 * p_stride..]);
            // SAFETY: avx512f detected; rows checked by `multi_shape`; `hdv` is whole blocks.
            unsafe {
                match gn {
                    4 => vkq_multi_impl::<4>(a, acc_stride, pg, p_stride, v, n, hdv),
                    3 => vkq_multi_impl::<3>(a, acc_stride, pg, p_stride, v, n, hdv),
                    2 => vkq_multi_impl::<2>(a, acc_stride, pg, p_stride, v, n, hdv),
                    _ => vkq_multi_impl::<1>(a, acc_stride, pg, p_stride, v, n, hdv),
                }
            }
            g0 += gn;
        }
    }

    /// `G` accumulator rows (`hdv` a multiple of 64), 64 columns at a time: 4 vectors per row
    /// stay in registers across the `n` keys, each value block converted once for the `G` rows.
    #[target_feature(enable = "avx512f")]
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
        for d0 in (0..hdv).step_by(BLOCK) {
            // SAFETY: rows `g < G` of `acc` hold `hdv >= d0 + 64` elements at `g·acc_stride`;
            // value row `j < n` holds `hdv`; weight row `g` holds `n` at `g·p_stride`.
            unsafe {
                let mut a: [[__m512; 4]; G] = std::array::from_fn(|g| {
                    std::array::from_fn(|c| _mm512_loadu_ps(ap.add(g * acc_stride + d0 + 16 * c)))
                });
                for j in 0..n {
                    let x: [__m512; 4] = std::array::from_fn(|c| {
                        _mm512_cvtph_ps(_mm256_loadu_si256(
                            vp.add(j * hdv + d0 + 16 * c) as *const __m256i
                        ))
                    });
                    for (g, ag) in a.iter_mut().enumerate() {
                        let pv = _mm512_set1_ps(*pp.add(g * p_stride + j));
                        for (c, ac) in ag.iter_mut().enumerate() {
                            *ac = _mm512_fmadd_ps(x[c], pv, *ac);
                        }
                    }
                }
                for (g, ag) in a.iter().enumerate() {
                    for (c, ac) in ag.iter().enumerate() {
                        _mm512_storeu_ps(ap.add(g * acc_stride + d0 + 16 * c), *ac);
                    }
                }
            }
        }
    }

    pub fn key_tile_avx512(k: &[f16], kt: &mut [f32]) {
        let hd = kt.len() / KV_TILE;
        assert!(hd > 0 && k.len().is_multiple_of(hd) && k.len() / hd <= KV_TILE);
        // SAFETY: selected only when avx512f was detected at run time; shapes checked.
        unsafe { key_tile_avx512_impl(k, kt, hd) }
    }

    /// 16×16 blocks: 16 key rows converted to f32, transposed in registers, stored as 16
    /// dimension rows of `kt`; leftover dimensions (`hd % 16`) element by element.
    #[target_feature(enable = "avx512f")]
    unsafe fn key_tile_avx512_impl(k: &[f16], kt: &mut [f32], hd: usize) {
        let n = k.len() / hd;
        let d16 = hd / 16 * 16;
        let (kp, ktp) = (k.as_ptr() as *const u16, kt.as_mut_ptr());
        for j0 in (0..n).step_by(16) {
            let nj = (n - j0).min(16);
            for d0 in (0..d16).step_by(16) {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, ri) in r.iter_mut().enumerate().take(nj) {
                    // SAFETY: row `j0 + i < n` has `hd >= d0 + 16` elements.
                    *ri = unsafe {
                        _mm512_cvtph_ps(_mm256_loadu_si256(
                            kp.add((j0 + i) * hd + d0) as *const __m256i
                        ))
                    };
                }
                let t = transpose16(r);
                for (d, v) in t.into_iter().enumerate() {
                    // SAFETY: row `d0 + d < hd` of `kt`, columns `j0..j0 + 16 <= KV_TILE`.
                    unsafe { _mm512_storeu_ps(ktp.add((d0 + d) * KV_TILE + j0), v) };
                }
            }
            for j in j0..j0 + nj {
                for d in d16..hd {
                    kt[d * KV_TILE + j] = k[j * hd + d].to_f32();
                }
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

    pub fn softmax_tile_avx512(s: &mut [f32; KV_TILE], m: f32) -> f64 {
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { softmax_tile_avx512_impl(s, m) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn softmax_tile_avx512_impl(s: &mut [f32; KV_TILE], m: f32) -> f64 {
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

    pub fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
        assert!(up.len() >= gate.len());
        // SAFETY: this table is used only when AVX-512F was detected; lengths checked.
        unsafe { swiglu_avx512_impl(gate, up) }
    }

    /// `ggml_vec_swiglu_f32` (AVX-512): `x / (1 + expf(0 − x)) · g`, 16 lanes at a time, the
    /// tail through the scalar definition (the same arithmetic per element).
    #[target_feature(enable = "avx512f")]
    unsafe fn swiglu_avx512_impl(gate: &mut [f32], up: &[f32]) {
        let n16 = gate.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        let mut i = 0;
        while i < n16 {
            let x = _mm512_loadu_ps(gate.as_ptr().add(i));
            let g = _mm512_loadu_ps(up.as_ptr().add(i));
            let e = expf_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let silu = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(silu, g));
            i += 16;
        }
        super::swiglu_scalar(&mut gate[n16..], &up[n16..]);
    }

    pub fn geglu_avx512(gate: &mut [f32], up: &[f32]) {
        assert!(up.len() >= gate.len());
        let t = crate::kernels::ops::gelu_table();
        // SAFETY: used only when AVX-512F was detected; lengths checked; the table has
        // `GELU_TABLE_LEN` entries (see `gelu16`).
        unsafe { gelu_avx512_impl(gate, Some(up), t.as_ptr()) }
        let n16 = gate.len() / 16 * 16;
        super::geglu_scalar(&mut gate[n16..], &up[n16..]);
    }

    pub fn gelu_avx512(x: &mut [f32]) {
        let t = crate::kernels::ops::gelu_table();
        // SAFETY: as `geglu_avx512`.
        unsafe { gelu_avx512_impl(x, None, t.as_ptr()) }
        let n16 = x.len() / 16 * 16;
        super::gelu_scalar(&mut x[n16..]);
    }

    /// GELU of the whole 16-lane blocks of `x` (times `up` when given), the tail left alone.
    /// Caller: `up` is at least as long as `x`; `table` points at the GELU table.
    #[target_feature(enable = "avx512f")]
    unsafe fn gelu_avx512_impl(x: &mut [f32], up: Option<&[f32]>, table: *const u16) {
        let n16 = x.len() / 16 * 16;
        let mut i = 0;
        while i < n16 {
            // SAFETY: 16 elements at `i + 16 <= n16` of `x` (and of `up`, no shorter).
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let mut y = gelu16(_mm512_loadu_ps(p), table);
                if let Some(u) = up {
                    y = _mm512_mul_ps(y, _mm512_loadu_ps(u.as_ptr().add(i)));
                }
                _mm512_storeu_ps(p, y);
            }
            i += 16;
        }
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
        let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(d, res, alt)
    }

    pub fn vkq_acc_avx512(acc: &mut [f32], p: &[f32], v: &[f16]) {
        assert_eq!(v.len(), p.len() * acc.len());
        // SAFETY: selected only when avx512f was detected at run time.
        unsafe { vkq_acc_avx512_impl(acc, p, v) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn vkq_acc_avx512_impl(acc: &mut [f32], p: &[f32], v: &[f16]) {
        let dv = acc.len();
        let vp = v.as_ptr() as *const u16;
        let mut d0 = 0;
        // Four vectors of the accumulator stay in registers across all the keys.
        while d0 + 64 <= dv {
            // SAFETY: loads/stores of 16 elements at `d0 + 16r < dv`; V row `j` has `dv` elements.
            unsafe {
                let ap = acc.as_mut_ptr().add(d0);
                let mut a = [
                    _mm512_loadu_ps(ap),
                    _mm512_loadu_ps(ap.add(16)),
                    _mm512_loadu_ps(ap.add(32)),
                    _mm512_loadu_ps(ap.add(48)),
                ];
                for (j, &pj) in p.iter().enumerate() {
                    let pv = _mm512_set1_ps(pj);
                    for (r, ar) in a.iter_mut().enumerate() {
                        let x = _mm512_cvtph_ps(_mm256_loadu_si256(
                            vp.add(j * dv + d0 + 16 * r) as *const __m256i
                        ));
                        *ar = _mm512_fmadd_ps(x, pv, *ar);
                    }
                }
                for (r, ar) in a.iter().enumerate() {
                    _mm512_storeu_ps(ap.add(16 * r), *ar);
                }
            }
            d0 += 64;
        }
        while d0 + 16 <= dv {
            // SAFETY: as above, one vector.
            unsafe {
                let ap = acc.as_mut_ptr().add(d0);
                let mut a = _mm512_loadu_ps(ap);
                for (j, &pj) in p.iter().enumerate() {
                    let x =
                        _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j * dv + d0) as *const __m256i));
                    a = _mm512_fmadd_ps(x, _mm512_set1_ps(pj), a);
                }
                _mm512_storeu_ps(ap, a);
            }
            d0 += 16;
        }
        for d in d0..dv {
            for (j, &pj) in p.iter().enumerate() {
                acc[d] = v[j * dv + d].to_f32().mul_add(pj, acc[d]);
            }
        }
    }

    // ---------------------------------------------------------------- AVX2 (same bits)

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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_paths() -> Vec<F16Ops> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut v = vec![F16Ops::scalar()];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(x86::AVX512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                v.push(x86::AVX2);
            }
        }
        v
    }

    struct Rng(u32);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
            (self.0 >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        }
        fn f16s(&mut self, n: usize) -> Vec<f16> {
            (0..n).map(|_| f16::from_f32(self.next())).collect()
        }
    }

    /// Every SIMD path gives the scalar path's bits, at every length (blocks and leftovers).
    #[test]
    fn simd_paths_are_bit_identical_to_scalar() {
        let mut rng = Rng(1);
        let scalar = F16Ops::scalar();
        for n in [
            0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 256, 300,
        ] {
            let q: Vec<f32> = rng.f16s(n).iter().map(|x| x.to_f32()).collect();
            let k = rng.f16s(n);
            let y0: Vec<f32> = rng.f16s(n).iter().map(|x| x.to_f32()).collect();
            let w = rng.next();
            let want_dot = (scalar.dot)(&q, &k);
            let mut want_mad = y0.clone();
            (scalar.mad)(&mut want_mad, &k, w);
            let mut want_scale = y0.clone();
            (scalar.scale)(&mut want_scale, w);
            let p: Vec<f32> = (0..5).map(|_| rng.next().abs()).collect();
            let vrows = rng.f16s(5 * n);
            let acc0: Vec<f32> = (0..n).map(|_| rng.next()).collect();
            let mut want_vkq = acc0.clone();
            (scalar.vkq_acc)(&mut want_vkq, &p, &vrows);
            for ops in all_paths() {
                assert_eq!(
                    (ops.dot)(&q, &k).to_bits(),
                    want_dot.to_bits(),
                    "{} dot n={n}",
                    ops.name
                );
                let mut y = y0.clone();
                (ops.mad)(&mut y, &k, w);
                assert_eq!(y, want_mad, "{} mad n={n}", ops.name);
                let mut y = y0.clone();
                (ops.scale)(&mut y, w);
                assert_eq!(y, want_scale, "{} scale n={n}", ops.name);
                let mut a = acc0.clone();
                (ops.vkq_acc)(&mut a, &p, &vrows);
                assert_eq!(a, want_vkq, "{} vkq n={n}", ops.name);
            }
        }
        for dk in [1, 32, 64, 256] {
            for rows in [1, 2, 3, 4] {
                let q: Vec<f32> = (0..rows * dk).map(|_| rng.next()).collect();
                let kt: Vec<f32> = (0..dk * KV_TILE).map(|_| rng.next()).collect();
                let mut want = vec![0.0f32; rows * KV_TILE];
                (scalar.kq_tile)(&q, &kt, &mut want);
                for ops in all_paths() {
                    let mut got = vec![1.0f32; rows * KV_TILE];
                    (ops.kq_tile)(&q, &kt, &mut got);
                    assert_eq!(got, want, "{} kq_tile dk={dk} rows={rows}", ops.name);
                    // Each row as its own call.
                    for r in 0..rows {
                        let mut one = vec![1.0f32; KV_TILE];
                        (ops.kq_tile)(&q[r * dk..(r + 1) * dk], &kt, &mut one);
                        assert_eq!(
                            one[..],
                            want[r * KV_TILE..(r + 1) * KV_TILE],
                            "{}",
                            ops.name
                        );
                    }
                }
            }
        }
        // Softmax over scores spanning the whole range, with masked (−∞) keys.
        for round in 0..50 {
            let mut s = [0.0f32; KV_TILE];
            for (j, x) in s.iter_mut().enumerate() {
                *x = if (j + round) % 7 == 0 {
                    f32::NEG_INFINITY
                } else {
                    rng.next() * (round as f32 + 1.0) * 4.0
                };
            }
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut want = s;
            let want_sum = (scalar.softmax_tile)(&mut want, m);
            for ops in all_paths() {
                let mut got = s;
                let sum = (ops.softmax_tile)(&mut got, m);
                assert_eq!(got, want, "{} softmax round {round}", ops.name);
                assert_eq!(
                    sum.to_bits(),
                    want_sum.to_bits(),
                    "{} softmax sum",
                    ops.name
                );
            }
        }
    }

    /// The fused vector-path loop gives the scalar loop's bits on every path (head dims with
    /// and without leftovers, new maxima early and late).
    #[test]
    fn vec_keys_paths_agree() {
        let mut rng = Rng(5);
        for (group, hdk, hdv) in [
            (1, 64, 64),
            (3, 64, 64),
            (4, 256, 256),
            (2, 80, 48),
            (2, 32, 8),
        ] {
            let n = 37;
            let q16: Vec<f32> = rng.f16s(group * hdk).iter().map(|x| x.to_f32()).collect();
            let keys: Vec<f16> = (0..n * hdk)
                .map(|_| f16::from_f32(rng.next() * 2.0))
                .collect();
            let values = rng.f16s(n * hdv);
            let mut m_s0 = vec![0.0f32; 2 * group];
            for st in m_s0.chunks_exact_mut(2) {
                st[0] = f32::NEG_INFINITY;
            }
            let mut want_ms = m_s0.clone();
            let mut want_acc = vec![0.0f32; group * hdv];
            // Two runs continue the state as two chunks of keys would.
            for (a, b) in [(0, 20), (20, n)] {
                vec_keys_scalar(
                    &q16,
                    KeyRun::single(&keys[a * hdk..b * hdk], &values[a * hdv..b * hdv], b - a),
                    0.3,
                    &mut want_ms,
                    &mut want_acc,
                );
            }
            for ops in all_paths() {
                let mut m_s = m_s0.clone();
                let mut acc = vec![0.0f32; group * hdv];
                for (a, b) in [(0, 20), (20, n)] {
                    (ops.vec_keys)(
                        &q16,
                        KeyRun::single(&keys[a * hdk..b * hdk], &values[a * hdv..b * hdv], b - a),
                        0.3,
                        &mut m_s,
                        &mut acc,
                    );
                }
                assert_eq!(m_s, want_ms, "{} group {group} hdk {hdk}", ops.name);
                assert_eq!(acc, want_acc, "{} group {group} hdk {hdk}", ops.name);
                assert!(
                    acc.iter().all(|&v| f16::from_f32(v).to_f32() == v),
                    "accumulator holds f16 values"
                );
            }
        }
    }

    /// Several kv heads run together (interleaved) give each head the bits of its own run.
    #[test]
    fn vec_keys_streams_match_separate_runs() {
        let mut rng = Rng(9);
        let (streams, group, hdk, hdv, n, stride) = (3, 2, 64, 64, 29, 40);
        let heads = streams * group;
        let q16: Vec<f32> = rng.f16s(heads * hdk).iter().map(|x| x.to_f32()).collect();
        let keys: Vec<f16> = (0..streams * stride * hdk)
            .map(|_| f16::from_f32(rng.next() * 2.0))
            .collect();
        let values = rng.f16s(streams * stride * hdv);
        let fresh = |h: usize| {
            let mut m = vec![0.0f32; 2 * h];
            m.chunks_exact_mut(2)
                .for_each(|st| st[0] = f32::NEG_INFINITY);
            (m, vec![0.0f32; h * hdv])
        };
        for ops in all_paths() {
            let (mut m_s, mut acc) = fresh(heads);
            let run = KeyRun {
                keys: &keys,
                values: &values,
                n,
                streams,
                k_stride: stride,
                v_stride: stride,
            };
            (ops.vec_keys)(&q16, run, 0.3, &mut m_s, &mut acc);
            for s in 0..streams {
                let (mut m1, mut a1) = fresh(group);
                let one = KeyRun::single(
                    &keys[s * stride * hdk..(s * stride + n) * hdk],
                    &values[s * stride * hdv..(s * stride + n) * hdv],
                    n,
                );
                vec_keys_scalar(
                    &q16[s * group * hdk..(s + 1) * group * hdk],
                    one,
                    0.3,
                    &mut m1,
                    &mut a1,
                );
                assert_eq!(
                    m_s[s * group * 2..(s + 1) * group * 2],
                    m1[..],
                    "{}",
                    ops.name
                );
                assert_eq!(
                    acc[s * group * hdv..(s + 1) * group * hdv],
                    a1[..],
                    "{}",
                    ops.name
                );
            }
        }
    }

    #[test]
    fn swiglu_paths_are_bit_identical_to_scalar() {
        let mut rng = Rng(7);
        for n in [0, 1, 15, 16, 17, 100, 1536] {
            // Wide range: large |x| hits the overflow/underflow branches of expf.
            let gate: Vec<f32> = (0..n).map(|_| rng.next() * 60.0).collect();
            let up: Vec<f32> = (0..n).map(|_| rng.next()).collect();
            let mut want = gate.clone();
            swiglu_scalar(&mut want, &up);
            for p in all_paths() {
                let mut got = gate.clone();
                (p.swiglu)(&mut got, &up);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{} n={n} i={i}", p.name);
                }
            }
        }
    }

    /// `kq_rows` is `dot` pair by pair, and `vkq_multi` is `vkq_acc` row by row, bit for bit,
    /// on every path (head counts past the 4-row register block, head sizes with leftovers).
    #[test]
    fn multi_head_kernels_equal_their_single_forms() {
        let mut rng = Rng(21);
        for hd in [64, 256, 80, 32] {
            for heads in [1, 3, 4, 5, 9] {
                for n in [1, 7, 16, 64] {
                    let q: Vec<f32> = (0..heads * hd).map(|_| rng.next() * 3.0).collect();
                    let k: Vec<f16> = (0..n * hd)
                        .map(|_| f16::from_f32(rng.next() * 2.0))
                        .collect();
                    let p: Vec<f32> = (0..heads * KV_TILE).map(|_| rng.next().abs()).collect();
                    let stride = hd + 2;
                    let acc0: Vec<f32> = (0..heads * stride).map(|_| rng.next()).collect();
                    for ops in all_paths() {
                        let mut out = vec![f32::NAN; heads * KV_TILE];
                        (ops.kq_rows)(&q, heads, &k, &mut out);
                        let mut acc = acc0.clone();
                        (ops.vkq_multi)(&mut acc, stride, &p, KV_TILE, heads, &k, hd);
                        for g in 0..heads {
                            let qg = &q[g * hd..][..hd];
                            for j in 0..n {
                                let want = dot_scalar(qg, &k[j * hd..][..hd]);
                                assert_eq!(
                                    out[g * KV_TILE + j].to_bits(),
                                    want.to_bits(),
                                    "{} kq_rows hd {hd} heads {heads} n {n} g {g} j {j}",
                                    ops.name
                                );
                            }
                            let mut want = acc0[g * stride..][..hd].to_vec();
                            (ops.vkq_acc)(&mut want, &p[g * KV_TILE..][..n], &k);
                            assert_eq!(
                                &acc[g * stride..][..hd],
                                &want[..],
                                "{} vkq_multi hd {hd} heads {heads} n {n} g {g}",
                                ops.name
                            );
                            // The two columns between rows are left alone.
                            assert_eq!(
                                &acc[g * stride + hd..(g * stride + stride).min(acc.len())],
                                &acc0[g * stride + hd..(g * stride + stride).min(acc.len())]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn key_tile_paths_transpose_exactly() {
        let mut rng = Rng(5);
        for hd in [64, 256, 80, 16, 8] {
            for n in [1, 5, 15, 16, 17, 33, 63, 64] {
                let k: Vec<f16> = (0..n * hd)
                    .map(|_| f16::from_f32(rng.next() * 8.0))
                    .collect();
                for p in all_paths() {
                    let mut kt = vec![f32::NAN; hd * KV_TILE];
                    (p.key_tile)(&k, &mut kt);
                    for j in 0..n {
                        for d in 0..hd {
                            assert_eq!(
                                kt[d * KV_TILE + j].to_bits(),
                                k[j * hd + d].to_f32().to_bits(),
                                "{} hd={hd} n={n} j={j} d={d}",
                                p.name
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gelu_paths_are_bit_identical_to_scalar() {
        let mut rng = Rng(11);
        for n in [0, 1, 15, 16, 17, 100, 2048] {
            // Past ±10 (the cut-offs), around 0, and every f16 neighbourhood in between.
            let mut x: Vec<f32> = (0..n).map(|_| rng.next() * 30.0).collect();
            for (i, v) in [10.0, -10.0, 9.999, -9.999, 0.0, -0.0, 65504.0, 1e-8]
                .iter()
                .enumerate()
            {
                if i < n {
                    x[i] = *v;
                }
            }
            let up: Vec<f32> = (0..n).map(|_| rng.next()).collect();
            let mut want_g = x.clone();
            geglu_scalar(&mut want_g, &up);
            let mut want = x.clone();
            gelu_scalar(&mut want);
            for (i, (&w, &v)) in want.iter().zip(&x).enumerate() {
                let e = crate::kernels::ops::gelu_tanh_exact(f16::from_f32(v).to_f32());
                let expect = if v <= -10.0 {
                    0.0
                } else if v >= 10.0 {
                    v
                } else {
                    f16::from_f32(e).to_f32()
                };
                assert_eq!(w.to_bits(), expect.to_bits(), "scalar i={i} x={v}");
            }
            for p in all_paths() {
                let mut got = x.clone();
                (p.geglu)(&mut got, &up);
                for (i, (a, b)) in got.iter().zip(&want_g).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{} geglu n={n} i={i}", p.name);
                }
                let mut got = x.clone();
                (p.gelu)(&mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{} gelu n={n} i={i}", p.name);
                }
            }
        }
    }

    /// The approximate exp is close to the true one, exact at 0, and 0 far below.
    #[test]
    fn expf_approx_is_accurate() {
        assert_eq!(expf_approx(0.0), 1.0);
        assert_eq!(expf_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_approx(-200.0), 0.0);
        let mut x = -100.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = expf_approx(x) as f64;
            assert!(
                (got - want).abs() <= 4e-7 * want + 1e-44,
                "x={x}: {got} vs {want}"
            );
            x += 0.0137;
        }
    }

    /// Hand-checkable cases: the f16 accumulate rounds once to f32 and once to f16.
    #[test]
    fn f16_accumulate_rounds_to_f16() {
        for ops in all_paths() {
            let mut y = vec![1.0f32; 20];
            let x = vec![f16::from_f32(1.0); 20];
            // 1 + 2^-12 is not an f16: rounds back to 1 (ties to even).
            (ops.mad)(&mut y, &x, 1.0 / 4096.0);
            assert!(y.iter().all(|&v| v == 1.0), "{}", ops.name);
            (ops.mad)(&mut y, &x, 3.0 / 2048.0);
            assert!(y.iter().all(|&v| v == 1.0 + 2.0 / 1024.0), "{}", ops.name);
            (ops.scale)(&mut y, 1.0 / 3.0);
            assert!(
                y.iter()
                    .all(|&v| v == f16::from_f32((1.0 + 2.0 / 1024.0) / 3.0).to_f32()),
                "{}",
                ops.name
            );
            let q = vec![0.5f32; 70];
            let k = vec![f16::from_f32(2.0); 70];
            assert_eq!((ops.dot)(&q, &k), 70.0, "{}", ops.name);
        }
    }
}
