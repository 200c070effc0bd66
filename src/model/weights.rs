//! Weights of a transformer: zero-copy matrices into the mapped file, small vectors copied out.
//!
//! Tensor names follow llama.cpp's GGUF convention (`blk.{i}.attn_q.weight`, ...); the table is
//! [`names`]. Shapes are checked against the hyper-parameters when a tensor is loaded, so a
//! malformed file fails at load with the tensor's name, expected and found shape.

use super::config::{ArchTraits, ModelConfig, NormKind};
use super::ModelError;
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::matmul::Linear;
use crate::kernels::ops::Rope;
use crate::quant;

/// Tensor names (llama.cpp's `LLM_TENSOR_NAMES` for the architectures we run).
pub mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const POS_EMBD: &str = "position_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm";
    pub const OUTPUT: &str = "output.weight";
    pub const ROPE_FREQS: &str = "rope_freqs.weight";
    pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
    pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

    /// `blk.{layer}.{suffix}`.
    pub fn blk(layer: usize, suffix: &str) -> String {
        format!("blk.{layer}.{suffix}")
    }

    pub const ATTN_NORM: &str = "attn_norm";
    pub const ATTN_Q: &str = "attn_q.weight";
    pub const ATTN_K: &str = "attn_k.weight";
    pub const ATTN_V: &str = "attn_v.weight";
    pub const ATTN_QKV: &str = "attn_qkv.weight";
    pub const ATTN_Q_NORM: &str = "attn_q_norm";
    pub const ATTN_K_NORM: &str = "attn_k_norm";
    pub const ATTN_OUT: &str = "attn_output.weight";
    pub const ATTN_POST_NORM: &str = "post_attention_norm";
    pub const FFN_NORM: &str = "ffn_norm";
    pub const FFN_GATE: &str = "ffn_gate.weight";
    pub const FFN_UP: &str = "ffn_up.weight";
    pub const FFN_DOWN: &str = "ffn_down.weight";
    pub const FFN_POST_NORM: &str = "post_ffw_norm";

    // Encoders (BERT).
    pub const TOKEN_TYPES: &str = "token_types.weight";
    pub const TOKEN_EMBD_NORM: &str = "token_embd_norm";
    /// An encoder's norm after the attention's residual add (post-norm).
    pub const ATTN_OUT_NORM: &str = "attn_output_norm";
    /// An encoder's norm after the FFN's residual add.
    pub const LAYER_OUT_NORM: &str = "layer_output_norm";
    /// The router of a mixture of experts, `[n_expert, dim]`.
    pub const FFN_GATE_INP: &str = "ffn_gate_inp.weight";
    /// The experts, 3-D: `[dim, ffn, n_expert]` (down: `[ffn, dim, n_expert]`).
    pub const FFN_GATE_EXPS: &str = "ffn_gate_exps.weight";
    pub const FFN_UP_EXPS: &str = "ffn_up_exps.weight";
    pub const FFN_DOWN_EXPS: &str = "ffn_down_exps.weight";
    /// The shared expert (Qwen2-MoE) and its gate `[dim]`.
    pub const FFN_GATE_SHEXP: &str = "ffn_gate_shexp.weight";
    pub const FFN_UP_SHEXP: &str = "ffn_up_shexp.weight";
    pub const FFN_DOWN_SHEXP: &str = "ffn_down_shexp.weight";
    pub const FFN_GATE_INP_SHEXP: &str = "ffn_gate_inp_shexp.weight";
    /// gpt-oss: a learned logit per query head in the attention's softmax, `[n_heads]`.
    pub const ATTN_SINKS: &str = "attn_sinks.weight";
}

/// A norm's parameters (`{name}.weight`, and `{name}.bias` for LayerNorm).
#[derive(Clone, Debug)]
pub struct Norm {
    pub kind: NormKind,
    pub eps: f32,
    /// `[len]`
    pub weight: Vec<f32>,
    /// `[len]`, LayerNorm only.
    pub bias: Option<Vec<f32>>,
}

/// How a block stores its q, k, v projections. (One per layer, built once: the size
/// difference between the variants does not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Qkv {
    /// `wq [q_dim, dim]`, `wk [kv_dim, dim]`, `wv [kv_dim, dim]`.
    Separate { wq: Linear, wk: Linear, wv: Linear },
    /// One `[q_dim + 2·kv_dim, dim]` matrix (GPT-2).
    Fused(Linear),
}

impl Qkv {
    /// The matrices, for walks over every weight.
    pub fn matrices(&self) -> Vec<&Linear> {
        match self {
            Qkv::Separate { wq, wk, wv } => vec![wq, wk, wv],
            Qkv::Fused(w) => vec![w],
        }
    }
}

/// One transformer block.
pub struct Layer {
    /// `[dim]` (an encoder's `attn_output_norm`, applied after the residual add; `None`
    /// where the architecture has no input norms, OLMo-2)
    pub attn_norm: Option<Norm>,
    /// The query, key and value projections.
    pub qkv: Qkv,
    /// `[head_dim]`, applied to every head of q / k.
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    /// `[dim, n_heads·head_dim_v]`
    pub wo: Linear,
    /// `[dim]` (Gemma-3)
    pub attn_post_norm: Option<Norm>,
    /// `[dim]` (an encoder's `layer_output_norm`, applied after the residual add; `None` as
    /// `attn_norm`)
    pub ffn_norm: Option<Norm>,
    /// `[ffn_dim, dim]` (gated FFNs; a MoE layer's shared expert)
    pub ffn_gate: Option<Linear>,
    /// `[ffn_dim, dim]` (`None`: a MoE layer without a shared expert)
    pub ffn_up: Option<Linear>,
    /// `[dim, ffn_dim]`
    pub ffn_down: Option<Linear>,
    /// A mixture-of-experts feed-forward (the dense matrices above are then its shared
    /// expert, if it has one).
    pub moe: Option<Moe>,
    /// `[dim]` (Gemma-3)
    pub ffn_post_norm: Option<Norm>,
    /// This layer's rotary embedding (`None` for learned positions).
    pub rope: Option<Rope>,
    /// Sliding-window size if this layer attends locally.
    pub window: Option<usize>,
    /// `[n_heads]` attention sinks (gpt-oss), each head's logit in its softmax's denominator.
    pub attn_sinks: Option<Vec<f32>>,
}

/// A mixture-of-experts feed-forward's weights: the router and each expert's matrices, views
/// into the file's 3-D tensors (rearranged for this CPU like any matrix).
pub struct Moe {
    /// `[n_expert, dim]`
    pub router: Linear,
    /// Per expert: `[ffn, dim]`, `[ffn, dim]`, `[dim, ffn]`.
    pub gate: Vec<Linear>,
    pub up: Vec<Linear>,
    pub down: Vec<Linear>,
    /// The shared expert's gate `[1, dim]` (its output is scaled by the sigmoid of this
    /// product), Qwen2-MoE.
    pub shared_gate: Option<Linear>,
}

/// All weights of a model.
pub struct Weights {
    /// `[vocab, dim]`
    pub token_embd: Linear,
    /// `[ctx_train, dim]` (GPT-2)
    pub pos_embd: Option<Linear>,
    pub layers: Vec<Layer>,
    /// `[dim]` (an encoder has none: this is then its `token_embd_norm` again, unused)
    pub output_norm: Norm,
    /// `[vocab, dim]`; the embedding matrix again when tied (and for an encoder, which has
    /// no output head and computes no logits).
    pub output: Linear,
    pub output_tied: bool,
    /// An encoder's LayerNorm of the summed embeddings (`token_embd_norm`).
    pub embd_norm: Option<Norm>,
    /// An encoder's token-type embedding of type 0 (`token_types` row 0), added to every
    /// token's embedding.
    pub type_embd: Option<Vec<f32>>,
    /// A reranker's classification head (an encoder's `cls.*`; rank pooling applies it).
    pub classifier: Option<super::classifier::Classifier>,
    /// ALiBi's slope per query head (Jina-BERT-v2), from the configuration's maximum bias.
    pub alibi_slopes: Option<Vec<f32>>,
}

/// Loads tensors by name with shape and type checks.
pub struct Loader<'a> {
    pub file: &'a GgufFile,
    pub norm_kind: NormKind,
    pub eps: f32,
}

impl<'a> Loader<'a> {
    fn info(&self, name: &str) -> Result<&'a TensorInfo, ModelError> {
        self.file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    /// The product kernels of tensor `name`'s format, or its refusal naming the tensor.
    fn kernels(name: &str, info: &TensorInfo) -> Result<quant::Kernels, ModelError> {
        quant::kernels(info.ty).map_err(|e| ModelError::UnsupportedType {
            name: name.to_string(),
            ty: info.ty,
            reason: e.to_string(),
        })
    }

    /// Bytes of one row of `in_dim` values of tensor `name` (its shape already checked).
    fn row_bytes(name: &str, info: &TensorInfo, in_dim: usize) -> Result<usize, ModelError> {
        info.ty
            .row_bytes(in_dim)
            .ok_or_else(|| ModelError::BadShape {
                name: name.to_string(),
                expected: info.shape.clone(),
                found: info.shape.clone(),
                ty: info.ty,
            })
    }

    fn check_shape(info: &TensorInfo, expected: &[usize]) -> Result<(), ModelError> {
        if info.shape != expected {
            return Err(ModelError::BadShape {
                name: info.name.clone(),
                expected: expected.to_vec(),
                found: info.shape.clone(),
                ty: info.ty,
            });
        }
        Ok(())
    }

    /// A matrix with `out_dim` rows of `in_dim` (GGUF shape `[in_dim, out_dim]`), plus its
    /// `.bias` if the file has one.
    pub fn linear(&self, name: &str, in_dim: usize, out_dim: usize) -> Result<Linear, ModelError> {
        let info = self.info(name)?;
        Self::check_shape(info, &[in_dim, out_dim])?;
        let kernels = Self::kernels(name, info)?;
        let row_bytes = Self::row_bytes(name, info, in_dim)?;
        let bias_name = name.strip_suffix(".weight").map(|b| format!("{b}.bias"));
        let bias = match bias_name {
            Some(b) if self.file.tensor_info(&b).is_some() => Some(self.vector(&b, out_dim)?),
            _ => None,
        };
        Ok(Linear {
            name: name.to_string(),
            in_dim,
            out_dim,
            row_bytes,
            data: self.file.tensor_bytes(info),
            kernels,
            bias,
        })
    }

    /// A matrix used only in products (never read by row): [`Self::linear`] in the layout
    /// this CPU multiplies it fastest in ([`Linear::repacked`]).
    pub fn matrix(&self, name: &str, in_dim: usize, out_dim: usize) -> Result<Linear, ModelError> {
        Ok(self.linear(name, in_dim, out_dim)?.repacked())
    }

    /// Expert `e`'s matrix of a 3-D tensor `[in_dim, out_dim, n_expert]`, for every expert:
    /// views into the file, rearranged as [`Self::matrix`] does unless `in_place` (then they
    /// stay row-major in the mapping, paged from disk as tokens choose them). With `biased`, each
    /// expert takes its row of the 2-D `{base}.bias` `[out_dim, n_expert]` (gpt-oss), which
    /// must be there.
    pub fn experts(
        &self,
        name: &str,
        in_dim: usize,
        out_dim: usize,
        n_expert: usize,
        biased: bool,
        in_place: bool,
    ) -> Result<Vec<Linear>, ModelError> {
        let info = self.info(name)?;
        Self::check_shape(info, &[in_dim, out_dim, n_expert])?;
        let kernels = Self::kernels(name, info)?;
        let row_bytes = Self::row_bytes(name, info, in_dim)?;
        let all = self.file.tensor_bytes(info);
        let per = row_bytes * out_dim;
        let biases = match name.strip_suffix(".weight") {
            Some(base) if biased => {
                let b = format!("{base}.bias");
                let bi = self.info(&b)?;
                Self::check_shape(bi, &[out_dim, n_expert])?;
                let mut v = vec![0f32; out_dim * n_expert];
                quant::dequantize_row(bi.ty, &self.file.tensor_bytes(bi), &mut v).map_err(|e| {
                    ModelError::UnsupportedType {
                        name: b.clone(),
                        ty: bi.ty,
                        reason: e.to_string(),
                    }
                })?;
                Some(v)
            }
            _ => None,
        };
        Ok((0..n_expert)
            .map(|e| {
                let expert = Linear {
                    name: format!("{name}[{e}]"),
                    in_dim,
                    out_dim,
                    row_bytes,
                    data: all.slice(e * per..(e + 1) * per),
                    kernels,
                    bias: biases
                        .as_ref()
                        .map(|v| v[e * out_dim..(e + 1) * out_dim].to_vec()),
                };
                match in_place {
                    true => expert,
                    false => expert.repacked(),
                }
            })
            .collect())
    }

    /// A 1-D tensor `[in_dim]` as a matrix of one row (Qwen2-MoE's shared-expert gate), copied
    /// out of the file as every 1-D tensor is.
    pub fn row_matrix(&self, name: &str, in_dim: usize) -> Result<Linear, ModelError> {
        let info = self.info(name)?;
        Self::check_shape(info, &[in_dim])?;
        let kernels = Self::kernels(name, info)?;
        Ok(Linear {
            name: name.to_string(),
            in_dim,
            out_dim: 1,
            row_bytes: info.n_bytes,
            data: crate::gguf::TensorBytes::owned(self.file.tensor_bytes(info).to_vec()),
            kernels,
            bias: None,
        })
    }

    /// Two matrices stored as one `[in_dim, 2·out_dim]` tensor (the first `out_dim` rows,
    /// then the rest), each in the layout this CPU multiplies fastest.
    pub fn matrix_halves(
        &self,
        name: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(Linear, Linear), ModelError> {
        let both = self.linear(name, in_dim, 2 * out_dim)?;
        if both.bias.is_some() {
            return Err(ModelError::BadConfig(format!(
                "tensor '{name}' is a fused pair of matrices with a bias, which kiln does not split"
            )));
        }
        let half = out_dim * both.row_bytes;
        let part = |range: std::ops::Range<usize>| Linear {
            out_dim,
            data: both.data.slice(range),
            ..both.clone()
        };
        Ok((part(0..half).repacked(), part(half..2 * half).repacked()))
    }

    pub fn opt_linear(
        &self,
        name: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Option<Linear>, ModelError> {
        if self.file.tensor_info(name).is_none() {
            return Ok(None);
        }
        self.linear(name, in_dim, out_dim).map(Some)
    }

    /// A 1-D tensor of `len` values, dequantized to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        Self::check_shape(info, &[len])?;
        let mut out = vec![0.0f32; len];
        let bytes = self.file.tensor_bytes(info);
        quant::dequantize_row(info.ty, &bytes, &mut out).map_err(|e| {
            ModelError::UnsupportedType {
                name: name.to_string(),
                ty: info.ty,
                reason: e.to_string(),
            }
        })?;
        Ok(out)
    }

    /// `{base}.weight` (and `{base}.bias` for LayerNorm).
    pub fn norm(&self, base: &str, len: usize) -> Result<Norm, ModelError> {
        let weight = self.vector(&format!("{base}.weight"), len)?;
        let bias = match self.norm_kind {
            NormKind::Layer => Some(self.vector(&format!("{base}.bias"), len)?),
            NormKind::Rms => None,
        };
        Ok(Norm {
            kind: self.norm_kind,
            eps: self.eps,
            weight,
            bias,
        })
    }

    pub fn opt_norm(&self, base: &str, len: usize) -> Result<Option<Norm>, ModelError> {
        if self.file.tensor_info(&format!("{base}.weight")).is_none() {
            return Ok(None);
        }
        self.norm(base, len).map(Some)
    }
}

/// Load every weight for `cfg` laid out as `traits` describe; a mixture's experts stay
/// row-major in the file mapping with `experts_in_place` ([`super::moe::experts_in_place`]).
pub fn load(
    f: &GgufFile,
    cfg: &ModelConfig,
    traits: &ArchTraits,
    ropes: Vec<Option<Rope>>,
    experts_in_place: bool,
) -> Result<Weights, ModelError> {
    use names::*;
    let ld = Loader {
        file: f,
        norm_kind: traits.norm,
        eps: cfg.norm_eps,
    };
    let (dim, q_dim, kv_k, kv_v) = (cfg.dim, cfg.q_dim(), cfg.kv_dim_k(), cfg.kv_dim_v());
    let mut token_embd = ld.linear(TOKEN_EMBD, dim, cfg.vocab_size)?;
    // (ALiBi's positions are in the attention scores.)
    let pos_embd = if traits.rope.is_none() && cfg.alibi.is_none() {
        Some(ld.linear(POS_EMBD, dim, cfg.ctx_train)?)
    } else {
        None
    };
    // Reading a tensor faults its file pages in together with their neighbours where those are
    // in the page cache, which maps back pages of tensors rearranged (and released) just
    // before it: each layer's reads are followed by releasing the rearranged tensors of the
    // last few layers again, so the pages never pile up during the load, and a last pass at
    // the end leaves resident exactly what the plan counts, whatever the page cache held.
    let release = |t: &crate::gguf::TensorInfo| {
        if repacked_at_load(f, t, experts_in_place) {
            f.tensor_bytes(t).release();
        }
    };
    let release_layers = |layers: std::ops::Range<usize>| {
        for t in f.tensors() {
            let layer = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next());
            if layer
                .and_then(|l| l.parse::<usize>().ok())
                .is_some_and(|l| layers.contains(&l))
            {
                release(t);
            }
        }
    };
    let encoder = cfg.arch.is_encoder();
    let (type_embd, embd_norm) = if encoder {
        let types = ld.linear(TOKEN_TYPES, dim, cfg.token_types)?;
        let mut row0 = vec![0.0f32; dim];
        types.row_f32(0, &mut row0);
        (Some(row0), Some(ld.norm(TOKEN_EMBD_NORM, dim)?))
    } else {
        (None, None)
    };
    let gpt_oss = cfg.arch == super::Arch::GptOss;
    let (attn_norm_name, ffn_norm_name) = if encoder {
        (ATTN_OUT_NORM, LAYER_OUT_NORM)
    } else if gpt_oss {
        // gpt-oss's FFN input norm is stored under the post-attention name.
        (ATTN_NORM, ATTN_POST_NORM)
    } else {
        (ATTN_NORM, FFN_NORM)
    };
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for (i, rope) in ropes.into_iter().enumerate() {
        let b = |s: &str| blk(i, s);
        let qkv = if traits.fused_qkv {
            Qkv::Fused(ld.matrix(&b(ATTN_QKV), dim, q_dim + kv_k + kv_v)?)
        } else {
            Qkv::Separate {
                wq: ld.matrix(&b(ATTN_Q), dim, q_dim)?,
                wk: ld.matrix(&b(ATTN_K), dim, kv_k)?,
                wv: ld.matrix(&b(ATTN_V), dim, kv_v)?,
            }
        };
        let (q_norm, k_norm) = if traits.qk_norm {
            // OLMoE normalizes the whole q and k vectors, the others each head.
            let (qn, kn) = match super::moe::whole_qk_norm(cfg) {
                true => (q_dim, kv_k),
                false => (cfg.head_dim_k, cfg.head_dim_k),
            };
            (
                Some(ld.norm(&b(ATTN_Q_NORM), qn)?),
                Some(ld.norm(&b(ATTN_K_NORM), kn)?),
            )
        } else {
            (None, None)
        };
        let (ffn_gate, ffn_up, ffn_down, moe) = match &cfg.moe {
            None => {
                let (gate, up) = if traits.fused_gate_up {
                    let (gate, up) = ld.matrix_halves(&b(FFN_UP), dim, cfg.ffn_dim)?;
                    (Some(gate), up)
                } else if traits.gated_ffn {
                    (
                        Some(ld.matrix(&b(FFN_GATE), dim, cfg.ffn_dim)?),
                        ld.matrix(&b(FFN_UP), dim, cfg.ffn_dim)?,
                    )
                } else {
                    (None, ld.matrix(&b(FFN_UP), dim, cfg.ffn_dim)?)
                };
                let down = ld.matrix(&b(FFN_DOWN), cfg.ffn_dim, dim)?;
                (gate, Some(up), Some(down), None)
            }
            Some(mc) => {
                let (ne, f) = (mc.n_expert, mc.ffn_dim);
                let router = ld.linear(&b(FFN_GATE_INP), dim, ne)?;
                if gpt_oss {
                    require_bias(&router)?;
                }
                let moe = Moe {
                    router,
                    gate: ld.experts(&b(FFN_GATE_EXPS), dim, f, ne, gpt_oss, experts_in_place)?,
                    up: ld.experts(&b(FFN_UP_EXPS), dim, f, ne, gpt_oss, experts_in_place)?,
                    down: ld.experts(&b(FFN_DOWN_EXPS), f, dim, ne, gpt_oss, experts_in_place)?,
                    shared_gate: match mc.shared_ffn_dim {
                        Some(_) => Some(ld.row_matrix(&b(FFN_GATE_INP_SHEXP), dim)?),
                        None => None,
                    },
                };
                match mc.shared_ffn_dim {
                    Some(sf) => (
                        Some(ld.matrix(&b(FFN_GATE_SHEXP), dim, sf)?),
                        Some(ld.matrix(&b(FFN_UP_SHEXP), dim, sf)?),
                        Some(ld.matrix(&b(FFN_DOWN_SHEXP), sf, dim)?),
                        Some(moe),
                    ),
                    None => (None, None, None, Some(moe)),
                }
            }
        };
        let (attn_post_norm, ffn_post_norm) = if traits.post_norms {
            (
                Some(ld.norm(&b(ATTN_POST_NORM), dim)?),
                Some(ld.norm(&b(FFN_POST_NORM), dim)?),
            )
        } else {
            (None, None)
        };
        let wo = ld.matrix(&b(ATTN_OUT), cfg.attn_out_dim(), dim)?;
        let attn_sinks = if gpt_oss {
            require_bias(&wo)?;
            Some(ld.vector(&b(ATTN_SINKS), cfg.n_heads)?)
        } else {
            None
        };
        let input_norm = |name: &str| match traits.input_norms {
            true => ld.norm(&b(name), dim).map(Some),
            false => Ok(None),
        };
        layers.push(Layer {
            attn_norm: input_norm(attn_norm_name)?,
            qkv,
            q_norm,
            k_norm,
            wo,
            attn_post_norm,
            ffn_norm: input_norm(ffn_norm_name)?,
            ffn_gate,
            ffn_up,
            ffn_down,
            moe,
            ffn_post_norm,
            window: if cfg.swa_layers[i] {
                cfg.sliding_window
            } else {
                None
            },
            rope,
            attn_sinks,
        });
        release_layers(i.saturating_sub(2)..i + 1);
    }
    let alibi_slopes = cfg
        .alibi
        .map(|b| crate::kernels::attention::alibi_slopes(b, cfg.n_heads));
    if let Some(norm) = embd_norm.as_ref().filter(|_| encoder) {
        // No output head (a reranker's classification head instead, copied out as f32):
        // nothing reads these but the accounting of weights.
        let classifier = super::classifier::Classifier::load(f, dim)?;
        f.tensors().iter().for_each(release);
        return Ok(Weights {
            output: token_embd.clone(),
            token_embd,
            pos_embd,
            layers,
            output_norm: norm.clone(),
            output_tied: true,
            embd_norm,
            type_embd,
            classifier,
            alibi_slopes,
        });
    }
    let output_norm = ld.norm(OUTPUT_NORM, dim)?;
    let (output, output_tied) = match ld.opt_linear(OUTPUT, dim, cfg.vocab_size)? {
        Some(o) => (o.repacked_for_logits(), false),
        None => {
            // Tied: the embedding matrix, rearranged for the product; the lookups then read
            // their rows from the same bytes (so the file's pages are not brought back in).
            let output = token_embd.repacked_for_logits();
            token_embd = output.clone();
            (output, true)
        }
    };
    f.tensors().iter().for_each(release);
    Ok(Weights {
        token_embd,
        pos_embd,
        layers,
        output_norm,
        output,
        output_tied,
        embd_norm,
        type_embd,
        classifier: None,
        alibi_slopes,
    })
}

/// A matrix the architecture requires a `.bias` of (gpt-oss's attention output and router):
/// its absence refused with the tensor's name.
fn require_bias(lin: &Linear) -> Result<(), ModelError> {
    match (&lin.bias, lin.name.strip_suffix(".weight")) {
        (None, Some(base)) => Err(ModelError::MissingTensor {
            name: format!("{base}.bias"),
        }),
        _ => Ok(()),
    }
}

/// The largest quantized-activation row any matrix of the file needs, in bytes: for every
/// 2-D tensor, a row of its input width in the partner format of its type. Computed from the
/// tensor table alone, so the memory plan knows it before any weight is loaded.
pub fn max_act_row_bytes(f: &GgufFile) -> usize {
    f.tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2)
        .filter_map(|t| quant::dot_type(t.ty).row_bytes(t.shape[0]))
        .max()
        .unwrap_or(0)
}

/// Whether every layer's gated feed-forward runs fused for prompt batches (`forward`: a gate
/// and an up matrix sharing one activation format), so the `up` scratch buffer only ever holds
/// the rows of a batch smaller than `GATED_MIN_ROWS`. From the tensor table alone.
pub fn gated_ffn_fuses(f: &GgufFile) -> bool {
    use names::{blk, FFN_GATE, FFN_GATE_INP, FFN_UP};
    if f.tensor_info(&blk(0, FFN_GATE_INP)).is_some() {
        // A mixture of experts: its products run through the expert scratch, whatever other
        // (unread) dense tensors the file carries.
        return false;
    }
    let ty = |name: &str| f.tensor_info(name).map(|t| quant::dot_type(t.ty));
    let mut layers = 0;
    while let Some(up) = ty(&blk(layers, FFN_UP)) {
        if ty(&blk(layers, FFN_GATE)) != Some(up) {
            return false;
        }
        layers += 1;
    }
    layers > 0
}

/// Whether the loader keeps 2-D tensor `t` in owned memory, rearranged for this CPU
/// (`Linear::repacked`), rather than reading it in place from the file mapping: every layer
/// matrix and the output matrix (the embedding matrix when tied) whose format has a faster
/// layout here; a stack of experts too, unless `experts_in_place`
/// ([`super::moe::experts_in_place`]). From the tensor table alone, so the memory plan knows it.
pub fn repacked_at_load(f: &GgufFile, t: &crate::gguf::TensorInfo, experts_in_place: bool) -> bool {
    if t.shape.len() == 3 {
        // A stack of experts, each rearranged as a matrix of its own.
        return !experts_in_place
            && quant::kernels(t.ty)
                .is_ok_and(|k| quant::repacking(&k, t.shape[1], t.shape[0]).is_some());
    }
    let encoder = f
        .architecture()
        .ok()
        .and_then(super::Arch::from_name)
        .is_some_and(super::Arch::is_encoder);
    if t.shape.len() != 2
        || t.name == names::POS_EMBD
        || t.name == names::TOKEN_TYPES
        || (encoder && t.name == names::TOKEN_EMBD)
        || (t.name == names::TOKEN_EMBD && f.tensor_info(names::OUTPUT).is_some())
    {
        return false;
    }
    // (The output matrix, `OUTPUT` or the tied embedding, is repacked for logits.)
    let logits = t.name == names::OUTPUT || t.name == names::TOKEN_EMBD;
    let (rows, n) = (t.shape[1], t.shape[0]);
    quant::kernels(t.ty).is_ok_and(|k| match logits {
        true => quant::logits_layout(&k, rows, n).is_some(),
        false => quant::repacking(&k, rows, n).is_some(),
    })
}
