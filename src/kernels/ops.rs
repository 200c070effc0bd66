//! Element-wise and row-wise operations of the forward pass: norms, RoPE, activations.
//!
//! These are cheap next to the matrix products (they touch activations, not weights), so they
//! are plain loops the compiler vectorizes. Reductions accumulate in f64, as ggml does, so our
//! hidden states track the reference engine's closely.

/// The scalar activations and the NaN-proof maximum, defined beside their SIMD forms.
pub use super::f16ops::{
    gelu_table, gelu_tanh, gelu_tanh_exact, gelu_tanh_with, max_not_nan, silu, GELU_TABLE_LEN,
};
use super::f16ops::{F16Ops, KV_TILE};

/// RMSNorm of one row: `out = x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), w.len());
    let scale = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// `1/sqrt(mean(x²) + eps)` as the reference engine computes it: f32 squares summed in f64.
#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// LayerNorm of one row with weight and bias: `out = (x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len() && b.len() == w.len());
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
    let var = (x.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / n) as f32;
    let scale = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &bb) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * scale * g + bb;
    }
}

/// LayerNorm in place.
pub fn layer_norm_inplace(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
    let var = (x.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / n) as f32;
    let scale = 1.0 / (var + eps).sqrt();
    for ((v, &g), &bb) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * scale * g + bb;
    }
}

/// `y += x`.
pub fn add_inplace(y: &mut [f32], x: &[f32]) {
    for (a, &b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

/// `y *= s`.
pub fn scale_inplace(y: &mut [f32], s: f32) {
    for a in y.iter_mut() {
        *a *= s;
    }
}

/// `y = c·tanh(y/c)`: a soft cap (Gemma-2's final logits), as the reference's graph computes
/// it: `ggml_scale(y, 1/c)`, `ggml_tanh` (the C library's `tanhf`), `ggml_scale(y, c)`.
pub fn softcap_inplace(y: &mut [f32], c: f32) {
    let inv = 1.0 / c;
    for a in y.iter_mut() {
        *a = (*a * inv).tanh() * c;
    }
}

// The architecture's choices these kernels implement (read from the file by model::config).

/// The FFN's activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

/// How rotary dimensions are paired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs `(2i, 2i+1)` (LLaMA as converted to GGUF).
    Normal,
    /// Halves `(i, i + n/2)` (GPT-NeoX, Qwen2/3, Gemma).
    Neox,
}

/// Llama-4-style attention temperature (`{arch}.attention.temperature_scale`, Mistral-3): the
/// queries at position `p` are multiplied by `ln(⌊p / floor⌋ + 1)·scale + 1` after RoPE, so
/// positions below `floor` (the context before YaRN's extension) are unchanged.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct AttnTemp {
    pub scale: f32,
    /// Positions per step of the factor (the reference's `n_attn_temp_floor_scale`).
    pub floor: usize,
}

impl AttnTemp {
    /// The factor at position `pos`, in the reference's steps (`llm_graph_input_attn_temp`:
    /// the quotient in f32, the logarithm and the sum in f64, stored as f32).
    pub fn factor(&self, pos: usize) -> f32 {
        let steps = (pos as f32 / self.floor as f32).floor() as f64;
        ((steps + 1.0).ln() * self.scale as f64 + 1.0) as f32
    }
}

/// RoPE's position-scaling parameters as the reference engine's context holds them
/// (`cparams.yarn_*`, `n_ctx_orig_yarn`), applied to every layer's rotation
/// ([`Rope::with_yarn`]). Without YaRN, `ext_factor` is 0 and only
/// `attn_factor` (the file's `rope.scaling.attn_factor`, 1 by default) matters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct YarnParams {
    /// Mix of extrapolation (0: none, plain interpolation; 1 for YaRN).
    pub ext_factor: f32,
    /// Magnitude factor of cos and sin (for YaRN already divided by its own
    /// `1 + 0.1·ln(factor)`, which the rotation multiplies back in, as the reference does).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The context length the model was trained with before the extension.
    pub n_ctx_orig: usize,
}

impl YarnParams {
    /// No YaRN, magnitude 1: plain RoPE.
    pub const NONE: YarnParams = YarnParams {
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 0,
    };
}

/// Rotary position embedding parameters of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub kind: RopeKind,
    /// Rotated dimensions per head (≤ head_dim; the rest pass through).
    pub n_dims: usize,
    pub freq_base: f32,
    /// Linear position scaling: positions are multiplied by this (1/factor).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (Llama-3 style `rope_freqs`, LongRoPE's factors),
    /// `n_dims / 2` long, if any.
    pub freq_factors: Option<Vec<f32>>,
    /// YaRN's per-pair extrapolation mix (ggml's `rope_yarn_ramp(..) · ext_factor`), `n_dims / 2`
    /// long, precomputed at load by [`Rope::with_yarn`]; `None` without YaRN (ext_factor 0).
    pub yarn_mix: Option<Vec<f32>>,
    /// Magnitude multiplier of cos and sin (ggml's `mscale`: the attention factor, times YaRN's
    /// `1 + 0.1·ln(1/freq_scale)` when YaRN is on); 1 for plain RoPE.
    pub mscale: f32,
}

/// ggml's `ggml_rope_yarn_corr_dim`: the dimension at which a rotation completes `n_rot`
/// turns over `n_ctx_orig` positions.
fn yarn_corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

impl Rope {
    /// Plain RoPE (no YaRN, magnitude 1).
    pub fn new(
        kind: RopeKind,
        n_dims: usize,
        freq_base: f32,
        freq_scale: f32,
        freq_factors: Option<Vec<f32>>,
    ) -> Rope {
        Rope {
            kind,
            n_dims,
            freq_base,
            freq_scale,
            freq_factors,
            yarn_mix: None,
            mscale: 1.0,
        }
    }

    /// This RoPE with YaRN's ramp and magnitude, computed as ggml's `rope_yarn` and
    /// `ggml_rope_yarn_corr_dims` do (in f32, in the same order), once, at load.
    pub fn with_yarn(mut self, y: &YarnParams) -> Rope {
        let mut mscale = y.attn_factor;
        if y.ext_factor != 0.0 {
            let n = self.n_dims;
            let (low, high) = self.yarn_ramp(y);
            let mix = (0..n / 2)
                .map(|i| {
                    // (`i0 / 2` of ggml's `rope_yarn_ramp`, i0 = 2i)
                    let t = (i as f32 - low) / (high - low).max(0.001);
                    (1.0 - t.clamp(0.0, 1.0)) * y.ext_factor
                })
                .collect();
            self.yarn_mix = Some(mix);
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        self.mscale = mscale;
        self
    }

    /// YaRN's ramp bounds `(low, high)` for this rotation (ggml's `ggml_rope_yarn_corr_dims`):
    /// pair `i`'s mix is `(1 − clamp((i − low) / max(high − low, 0.001), 0, 1)) · ext_factor`
    /// ([`Rope::with_yarn`]; a device computes it from these).
    pub fn yarn_ramp(&self, y: &YarnParams) -> (f32, f32) {
        let n = self.n_dims;
        let start = yarn_corr_dim(n, y.n_ctx_orig, y.beta_fast, self.freq_base).floor();
        let end = yarn_corr_dim(n, y.n_ctx_orig, y.beta_slow, self.freq_base).ceil();
        (start.max(0.0), end.min(n as f32 - 1.0))
    }

    /// Fill `cs` (`n_dims` floats: cos, sin interleaved per pair) for position `pos`.
    ///
    /// Follows ggml's recurrence `theta_i = pos · base^(-2i/n)` computed as a running product
    /// in f32, then its `rope_yarn` (frequency factor, position scale, YaRN's mix and
    /// magnitude), so the angles agree with the reference engine to the last bit.
    pub fn cos_sin(&self, pos: usize, cs: &mut [f32]) {
        let half = self.n_dims / 2;
        debug_assert!(cs.len() >= self.n_dims);
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        for i in 0..half {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let t = match &self.yarn_mix {
                Some(mix) => interp * (1.0 - mix[i]) + extrap * mix[i],
                None => interp,
            };
            cs[2 * i] = t.cos() * self.mscale;
            cs[2 * i + 1] = t.sin() * self.mscale;
            theta *= theta_scale;
        }
    }

    /// Rotate every head of a row `x` (`n_heads * head_dim`) with the angles in `cs`.
    ///
    /// The products are fused as the reference engine's compiled code fuses them:
    /// `x0' = fma(x0, cos, -(x1·sin))`, `x1' = fma(x0, sin, x1·cos)`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above).
            return unsafe { self.apply_fma(x, head_dim, cs) };
        }
        self.apply_with(x, head_dim, cs)
    }

    /// [`Rope::apply`] compiled with hardware FMA: `mul_add` becomes one instruction instead
    /// of a call into the math library (the same bits: a fused multiply-add is exact).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn apply_fma(&self, x: &mut [f32], head_dim: usize, cs: &[f32]) {
        self.apply_with(x, head_dim, cs)
    }

    #[inline(always)]
    fn apply_with(&self, x: &mut [f32], head_dim: usize, cs: &[f32]) {
        let half = self.n_dims / 2;
        for head in x.chunks_exact_mut(head_dim) {
            match self.kind {
                RopeKind::Normal => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a.mul_add(c, -(b * s));
                        head[2 * i + 1] = a.mul_add(s, b * c);
                    }
                }
                RopeKind::Neox => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a.mul_add(c, -(b * s));
                        head[i + half] = a.mul_add(s, b * c);
                    }
                }
            }
        }
    }
}

/// `Σ exp(x − max)` over the entries of `xs` that are not NaN (`max` at least every one of them),
/// a softmax's normalizer: the attention's softmax tile ([`F16Ops::softmax_tile`] of the tier
/// chosen at load: the reference's vectorized `expf`, each tile's sum in f64) over tiles of
/// [`KV_TILE`] entries, NaN and the last tile's padding as −∞. Against the f64 `exp` of every
/// entry: a relative error under 1e-6.
#[must_use]
pub fn exp_sum(xs: &[f32], max: f32) -> f64 {
    let softmax_tile = F16Ops::detect().softmax_tile;
    let mut tile = [f32::NEG_INFINITY; KV_TILE];
    let mut sum = 0.0f64;
    for c in xs.chunks(KV_TILE) {
        for (t, &v) in tile.iter_mut().zip(c) {
            *t = if v.is_nan() { f32::NEG_INFINITY } else { v };
        }
        tile[c.len()..].fill(f32::NEG_INFINITY);
        sum += softmax_tile(&mut tile, max);
    }
    sum
}

#[cfg(test)]
mod tests {

    /// `exp_sum` against the f64 sum of f64 exponentials and `max_not_nan` against a plain
    /// fold, NaN entries skipped, rows of every length around their 16 lanes.
    #[test]
    fn exp_sum_matches_f64() {
        let mut x = 0x2545f4914f6cdd1du64;
        for n in (0..40).chain([1000, 262_144]) {
            let xs: Vec<f32> = (0..n)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if i % 17 == 5 {
                        f32::NAN
                    } else {
                        (x >> 40) as f32 / (1u64 << 24) as f32 * 60.0 - 40.0
                    }
                })
                .collect();
            let plain_max = xs
                .iter()
                .copied()
                .filter(|v| !v.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_not_nan(&xs), plain_max, "n {n}");
            let max = plain_max.max(-1e30);
            let want: f64 = xs
                .iter()
                .filter(|v| !v.is_nan())
                .map(|&v| (v as f64 - max as f64).exp())
                .sum();
            let got = exp_sum(&xs, max);
            assert!(
                (got - want).abs() <= 1e-6 * want.max(f64::MIN_POSITIVE),
                "n {n}: {got} against {want}"
            );
        }
    }

    use super::*;

    /// RMSNorm, RoPE and SiLU round as the reference engine does (pinned: the golden tests
    /// agree with it to the last bit only with exactly these roundings).
    #[test]
    fn reference_rounding_is_pinned() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        let mut out = vec![0.0; 64];
        rms_norm(&x, &[1.5; 64], 1e-5, &mut out);
        let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((sum / 64.0) as f32 + 1e-5).sqrt();
        assert!(out
            .iter()
            .zip(&x)
            .all(|(o, v)| o.to_bits() == (v * scale * 1.5).to_bits()));

        let rope = Rope::new(RopeKind::Normal, 64, 10000.0, 1.0, None);
        let mut cs = vec![0.0; 64];
        rope.cos_sin(7, &mut cs);
        let mut y = x.clone();
        rope.apply(&mut y, 64, &cs);
        for i in 0..32 {
            let (c, s, a, b) = (cs[2 * i], cs[2 * i + 1], x[2 * i], x[2 * i + 1]);
            assert_eq!(y[2 * i].to_bits(), a.mul_add(c, -(b * s)).to_bits());
            assert_eq!(y[2 * i + 1].to_bits(), a.mul_add(s, b * c).to_bits());
        }

        for &v in &x {
            let want = v / (1.0 + crate::kernels::f16ops::expf_approx(-v));
            assert_eq!(silu(v).to_bits(), want.to_bits());
            assert!(
                (silu(v) as f64 - v as f64 / (1.0 + (-v as f64).exp())).abs()
                    < 1e-6 * (1.0 + v.abs() as f64)
            );
        }
    }

    /// YaRN's angles and magnitude against an f64 evaluation of the formula as ggml computes
    /// it (`ggml_rope_yarn_corr_dims`, `rope_yarn`): pairs below the low correction dimension
    /// keep their frequency, those above the high one are divided by the factor, a linear ramp
    /// between; cos and sin carry the attention factor times `1 + 0.1·ln(factor)`.
    #[test]
    fn yarn_matches_an_f64_evaluation() {
        let (n, base, factor, orig) = (32usize, 10_000.0f64, 4.0f64, 64usize);
        let y = YarnParams {
            ext_factor: 1.0,
            attn_factor: 0.9,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: orig,
        };
        let rope =
            Rope::new(RopeKind::Neox, n, base as f32, (1.0 / factor) as f32, None).with_yarn(&y);
        let corr = |beta: f64| {
            n as f64 * (orig as f64 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (low, high) = (
            corr(32.0).floor().max(0.0),
            corr(1.0).ceil().min(n as f64 - 1.0),
        );
        // (This shape puts the ramp over pairs 0..5: some pairs of each kind.)
        assert_eq!((low, high), (0.0, 5.0));
        let m = 0.9 * (1.0 + 0.1 * factor.ln());
        assert!((rope.mscale as f64 - m).abs() < 1e-6, "{}", rope.mscale);
        let mut cs = vec![0.0f32; n];
        for pos in [0usize, 1, 7, 33, 100] {
            rope.cos_sin(pos, &mut cs);
            for i in 0..n / 2 {
                let extrap = pos as f64 * base.powf(-2.0 * i as f64 / n as f64);
                let mix = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let theta = extrap / factor * (1.0 - mix) + extrap * mix;
                let (c, s) = (cs[2 * i] as f64, cs[2 * i + 1] as f64);
                assert!(
                    (c - theta.cos() * m).abs() < 1e-4 && (s - theta.sin() * m).abs() < 1e-4,
                    "pos {pos} pair {i}: ({c}, {s}) against {}",
                    theta
                );
            }
        }
        // Without YaRN and with magnitude 1, the angles are plain RoPE's to the bit.
        let plain = Rope::new(RopeKind::Neox, n, base as f32, 0.25, None);
        let off = plain.clone().with_yarn(&YarnParams::NONE);
        let (mut a, mut b) = (vec![0.0f32; n], vec![0.0f32; n]);
        plain.cos_sin(77, &mut a);
        off.cos_sin(77, &mut b);
        assert_eq!(a, b);
        assert_ne!(a, cs);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn layer_norm_zero_mean_unit_var() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0.0; 4];
        layer_norm(&x, &[1.0; 4], &[0.0; 4], 0.0, &mut out);
        let mean: f32 = out.iter().sum::<f32>() / 4.0;
        let var: f32 = out.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_position_zero_is_identity() {
        for kind in [RopeKind::Normal, RopeKind::Neox] {
            let rope = Rope::new(kind, 8, 10000.0, 1.0, None);
            let mut cs = [0.0; 8];
            let orig: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut x = orig.clone();
            rope.cos_sin(0, &mut cs);
            rope.apply(&mut x, 8, &cs);
            assert_eq!(x, orig);
            rope.cos_sin(17, &mut cs);
            rope.apply(&mut x, 8, &cs);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn rope_relative_property() {
        // <R(p)q, R(p+k)v> depends only on k.
        let rope = Rope::new(RopeKind::Neox, 4, 100.0, 1.0, None);
        let q = [0.3f32, -0.2, 0.9, 0.1];
        let v = [0.5f32, 0.4, -0.1, 0.7];
        let dot_at = |p: usize, k: usize| {
            let mut cs = [0.0; 4];
            let (mut a, mut b) = (q, v);
            rope.cos_sin(p, &mut cs);
            rope.apply(&mut a, 4, &cs);
            rope.cos_sin(p + k, &mut cs);
            rope.apply(&mut b, 4, &cs);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot_at(0, 3) - dot_at(11, 3)).abs() < 1e-4);
    }

    #[test]
    fn activations() {
        assert!((silu(0.0)).abs() < 1e-7);
        assert!((gelu_tanh(0.0)).abs() < 1e-7);
        assert!((gelu_tanh(3.0) - 2.99636).abs() < 2e-3);
        assert!((gelu_tanh_exact(3.0) - 2.99636).abs() < 1e-4);
        assert_eq!(gelu_tanh(-11.0), 0.0);
        assert_eq!(gelu_tanh(12.5), 12.5);
        assert!((silu(2.0) - 1.761594).abs() < 1e-5);
    }
}
