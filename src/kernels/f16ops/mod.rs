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

use crate::quant::Isa;
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
/// `s = sc.apply(dot(q16, k))` ([`ScoreScale`]); on a new maximum `acc = f16(acc·expf(M−s))`, `M = s`, weight 1,
/// else weight `expf(s−M)`; `acc = f16(acc + v·weight)`; `S = fma(S, rescale, weight)`.
///
/// Several kv heads ("streams") may run together, keys interleaved (key 0 of every stream, then
/// key 1, ...): each head's arithmetic is unchanged, but the independent chains overlap. Then
/// `q16`, `m_s` and `acc` hold `streams × group` heads, stream-major.
pub type VecKeysFn =
    fn(q16: &[f32], kv: KeyRun<'_>, sc: ScoreScale, m_s: &mut [f32], acc: &mut [f32]);

/// How a raw score `q·k` becomes an attention logit: `s·scale`, then, with a soft cap `c`
/// (Gemma-2's `attn_logit_softcapping`), `c·tanh(s·scale)`, where `scale` is the attention's
/// scale divided by `c`. That is the reference's flash attention (`scale /= logit_softcap`,
/// then `logit_softcap*tanhf(s*scale)`, its tiled path through `ggml_vec_tanh_f32`), with the
/// C library's `tanhf`, as the reference's own: every path gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreScale {
    pub scale: f32,
    /// The soft cap `c` (`None`: scores are only scaled).
    pub cap: Option<f32>,
}

impl ScoreScale {
    /// Scores scaled by `scale`, then capped at `softcap` when one is given.
    pub fn new(scale: f32, softcap: Option<f32>) -> ScoreScale {
        match softcap {
            Some(c) => ScoreScale {
                scale: scale / c,
                cap: Some(c),
            },
            None => ScoreScale { scale, cap: None },
        }
    }

    /// Scores only scaled.
    pub fn plain(scale: f32) -> ScoreScale {
        ScoreScale { scale, cap: None }
    }

    /// The logit of a raw score.
    #[inline(always)]
    pub fn apply(self, raw: f32) -> f32 {
        cap_score(self.cap, raw * self.scale)
    }
}

/// `c·tanh(x)` with a cap `c`, else `x`: the second step of [`ScoreScale::apply`], on an
/// already scaled score.
#[inline(always)]
pub fn cap_score(cap: Option<f32>, x: f32) -> f32 {
    match cap {
        Some(c) => c * x.tanh(),
        None => x,
    }
}

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
/// `vkq_acc` for `heads` rows at once ([`Vkq`]), the bits of [`VkqAccFn`] on each row; each
/// value row is converted once for every head.
pub type VkqMultiFn = fn(Vkq<'_>);

/// The operands of a [`VkqMultiFn`] call: for each head `g < heads`, the accumulator row
/// `acc[g·acc_stride..][..hdv]` takes the weights `p[g·p_stride..][..n]` against the same `n`
/// value rows `v` (`[n][hdv]`).
pub struct Vkq<'a> {
    pub acc: &'a mut [f32],
    pub acc_stride: usize,
    pub p: &'a [f32],
    pub p_stride: usize,
    pub heads: usize,
    pub v: &'a [f16],
    pub hdv: usize,
}

impl<'a> Vkq<'a> {
    /// The accumulators `(acc, acc_stride)` and weights `(p, p_stride)` of `heads` heads, the
    /// value rows `(v, hdv)`.
    pub fn new(
        acc: (&'a mut [f32], usize),
        p: (&'a [f32], usize),
        heads: usize,
        v: (&'a [f16], usize),
    ) -> Self {
        Vkq {
            acc: acc.0,
            acc_stride: acc.1,
            p: p.0,
            p_stride: p.1,
            heads,
            v: v.0,
            hdv: v.1,
        }
    }

    /// `n`, every row checked to lie inside its buffer.
    fn shape(&self) -> usize {
        let (heads, hdv) = (self.heads, self.hdv);
        assert!(
            heads > 0 && hdv > 0 && self.v.len().is_multiple_of(hdv),
            "value rows of {hdv}"
        );
        let n = self.v.len() / hdv;
        assert!(
            self.acc.len() >= (heads - 1) * self.acc_stride + hdv,
            "accumulator rows"
        );
        assert!(
            self.p.len() >= (heads - 1) * self.p_stride + n,
            "weight rows"
        );
        n
    }
}

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

pub fn vkq_multi_scalar(a: Vkq) {
    vkq_multi_with(vkq_acc_scalar, a)
}

/// A SIMD path's register-blocked [`VkqMultiFn`] kernel for `G` heads at once:
/// `(acc, acc_stride, p, p_stride, v, n, hdv)`.
#[cfg(target_arch = "x86_64")]
type VkqBlockFn = unsafe fn(&mut [f32], usize, &[f32], usize, &[f16], usize, usize);

/// [`VkqMultiFn`] through a SIMD path's kernels: when `hdv` is whole blocks of `cols` columns,
/// the heads in groups of up to 4, group of `G` through `blocks[G − 1]`; otherwise one
/// `vkq_acc` per head.
///
/// # Safety
/// The kernels run on this CPU (their tier was detected) and read `hdv` columns of the rows
/// [`Vkq::shape`] checks.
#[cfg(target_arch = "x86_64")]
unsafe fn vkq_multi_blocked(vkq_acc: VkqAccFn, cols: usize, blocks: [VkqBlockFn; 4], a: Vkq) {
    if !a.hdv.is_multiple_of(cols) {
        return vkq_multi_with(vkq_acc, a);
    }
    let n = a.shape();
    let Vkq {
        acc,
        acc_stride,
        p,
        p_stride,
        heads,
        v,
        hdv,
    } = a;
    let mut g0 = 0;
    while g0 < heads {
        let gn = (heads - g0).min(4);
        let (a, pg) = (&mut acc[g0 * acc_stride..], &p[g0 * p_stride..]);
        // SAFETY: the caller's contract; the rows are checked by `Vkq::shape`.
        unsafe { blocks[gn - 1](a, acc_stride, pg, p_stride, v, n, hdv) };
        g0 += gn;
    }
}

/// A [`VkqMultiFn`] as one `vkq_acc` per head.
fn vkq_multi_with(vkq_acc: VkqAccFn, a: Vkq) {
    let n = a.shape();
    for g in 0..a.heads {
        let acc = &mut a.acc[g * a.acc_stride..][..a.hdv];
        vkq_acc(acc, &a.p[g * a.p_stride..][..n], a.v);
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
/// A tile's raw scores made logits in place, `s[j] = sc.apply(s[j])` ([`ScoreScale`]) for the
/// visible columns `lo..hi` and `−∞` elsewhere, and their maximum: per lane of 16 (column `j` in lane
/// `j mod 16`) `max = if s > max { s } else { max }` from `−∞`, then the 16 lanes folded in
/// order the same way (so a NaN score never becomes the maximum).
pub type ScaleMaxFn = fn(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32;
/// `acc[d] = fma-chain over j of v[j][d]·p[j]` (`j` ascending, continuing from `acc[d]`);
/// `v` holds `p.len()` rows of `acc.len()` values.
pub type VkqAccFn = fn(acc: &mut [f32], p: &[f32], v: &[f16]);
/// `gate[i] = silu(gate[i]) · up[i]`, SiLU as [`silu`] computes it.
pub type SwigluFn = fn(gate: &mut [f32], up: &[f32]);

/// `x[i] = gelu(x[i])`, GELU as [`gelu_tanh`] computes it (the table).
pub type GeluFn = fn(x: &mut [f32]);

/// SiLU(x) = x · σ(x), with the reference engine's vectorised `expf` (a polynomial within
/// about an ulp of the true one) so activations agree with it to the bit.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf_approx(0.0 - x))
}

/// GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`), evaluated as the reference engine
/// does: through a table indexed by the f16 value of `x` ([`gelu_table`]), so input and output
/// are rounded to f16, with `x <= -10 → 0` and `x >= 10 → x`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    gelu_tanh_with(gelu_table(), x)
}

/// [`gelu_tanh`] with the table already in hand (loops fetch it once).
#[inline]
pub fn gelu_tanh_with(table: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let i = half::f16::from_f32(x).to_bits() as usize;
        half::f16::from_bits(table[i]).to_f32()
    }
}

/// Entries of [`gelu_table`]: one per f16 bit pattern, plus one zero entry so a 32-bit gather
/// at the last index stays inside the table.
pub const GELU_TABLE_LEN: usize = 65537;

/// The reference engine's GELU table (`ggml_table_gelu_f16`): for every f16 bit pattern `i`,
/// the f16 bits of [`gelu_tanh_exact`] of that value. 128 KiB, built once on first use.
pub fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Box<[u16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..GELU_TABLE_LEN)
            .map(|i| match u16::try_from(i) {
                Ok(bits) => {
                    let x = half::f16::from_bits(bits).to_f32();
                    half::f16::from_f32(gelu_tanh_exact(x)).to_bits()
                }
                Err(_) => 0,
            })
            .collect()
    })
}

/// GELU, tanh approximation, in plain f32, as the reference engine's table is filled:
/// `(0.5·x)·(1 + tanh((√(2/π)·x)·fma(0.044715·x, x, 1)))` (its compiler fuses the inner
/// `1 + a·x·x`; the fused and unfused forms differ in the last bit often enough to flip
/// an f16 table entry).
#[inline]
pub fn gelu_tanh_exact(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// The largest entry of `xs` that is not NaN (−∞ when there is none), 16 lanes at a time.
#[must_use]
pub fn max_not_nan(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            // (NaN never wins a `>`)
            *m = if x > *m { x } else { *m };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// The scalar GeGLU: `gate[i] = gelu(gate[i]) · up[i]` (what every SIMD path must match).
pub fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    let t = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh_with(t, *g) * u;
    }
}

/// The scalar GELU in place (GPT-2's ungated FFN).
pub fn gelu_scalar(x: &mut [f32]) {
    let t = gelu_table();
    for v in x.iter_mut() {
        *v = gelu_tanh_with(t, *v);
    }
}

/// GELU of `x` (times `up` when given: GeGLU) through a SIMD path's kernel for the whole
/// blocks of `lanes` (`blocks(x, up, table)`, the tail left alone), the tail through the scalar
/// definition.
///
/// # Safety
/// `blocks` runs on this CPU (its tier was detected), and reads `up` only as far as `x`.
#[cfg(target_arch = "x86_64")]
unsafe fn gelu_with(
    x: &mut [f32],
    up: Option<&[f32]>,
    lanes: usize,
    blocks: unsafe fn(&mut [f32], Option<&[f32]>, *const u16),
) {
    if let Some(u) = up {
        assert!(u.len() >= x.len());
    }
    let t = gelu_table();
    // SAFETY: the caller's contract; `up` is no shorter than `x` (checked); the table has
    // `GELU_TABLE_LEN` entries, as the kernels' gathers need.
    unsafe { blocks(x, up, t.as_ptr()) };
    let n = x.len() / lanes * lanes;
    match up {
        Some(u) => geglu_scalar(&mut x[n..], &u[n..]),
        None => gelu_scalar(&mut x[n..]),
    }
}

/// The scalar SwiGLU (the reference every SIMD path must match bit for bit).
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
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
    pub scale_max: ScaleMaxFn,
    pub vkq_acc: VkqAccFn,
    pub swiglu: SwigluFn,
    /// GeGLU, same contract as `swiglu` with GELU (tanh) for SiLU.
    pub geglu: SwigluFn,
    pub gelu: GeluFn,
    pub name: &'static str,
}

impl F16Ops {
    /// The fastest path of the kernel tier chosen at load ([`Isa::detect`]: `KILN_ISA` caps
    /// it, so a run held to `avx2` runs these at AVX2 too, as an AVX2-only CPU would).
    pub fn detect() -> F16Ops {
        Self::for_isa(Isa::detect())
    }

    /// The fastest path tier `isa` allows (the paths give the same bits on every tier).
    pub fn for_isa(isa: Isa) -> F16Ops {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => avx512::AVX512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::AVX2,
            _ => Self::scalar(),
        }
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
            scale_max: scale_max_scalar,
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

/// [`VecKeysFn`] from a path's dot / scale / mad primitives (inlined into one loop where they
/// are the path's own `#[target_feature]` functions).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn vec_keys_with(
    dot: impl Fn(&[f32], &[f16]) -> f32,
    mad: impl Fn(&mut [f32], &[f16], f32),
    scale_acc: impl Fn(&mut [f32], f32),
    q16: &[f32],
    kv: KeyRun<'_>,
    sc: ScoreScale,
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
            let s = sc.apply(dot(q, krow));
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

pub fn vec_keys_scalar(
    q16: &[f32],
    kv: KeyRun<'_>,
    sc: ScoreScale,
    m_s: &mut [f32],
    acc: &mut [f32],
) {
    vec_keys_with(dot_scalar, mad_scalar, scale_scalar, q16, kv, sc, m_s, acc)
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

pub fn scale_max_scalar(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32 {
    for (j, x) in s.iter_mut().enumerate() {
        *x = if j >= lo && j < hi {
            sc.apply(*x)
        } else {
            f32::NEG_INFINITY
        };
    }
    // 16 lanes folded in lane order, as the SIMD tiers fold theirs (`fold_max`).
    max_not_nan(s)
}

/// `scale_max`'s last step: the 16 lanes' maxima folded in lane order (the x86 tiers; the
/// scalar path folds in [`max_not_nan`] the same way).
#[cfg(target_arch = "x86_64")]
#[inline]
fn fold_max(m: [f32; 16]) -> f32 {
    m.into_iter()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
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
#[macro_use]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;
