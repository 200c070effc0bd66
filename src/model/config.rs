//! Hyper-parameters read from GGUF metadata, and how each architecture differs.

use crate::gguf::{GgufError, GgufFile};

/// The op choices an architecture makes, defined beside the kernels that implement them.
pub use crate::kernels::ops::{Activation, AttnTemp, RopeKind, YarnParams};

/// How router logits become expert probabilities (`{arch}.expert_gating_func`, llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Gating {
    /// Softmax over all experts (value 1; also what 0, "none", means for these architectures).
    Softmax,
    /// Each logit's sigmoid (value 2).
    Sigmoid,
    /// The experts chosen on the raw logits, their weights the softmax of the chosen logits
    /// alone (llama.cpp's `SOFTMAX_WEIGHT`, value 3; gpt-oss's, whatever its file says).
    SoftmaxWeight,
}

/// gpt-oss's clamped SwiGLU of an expert (llama.cpp's `swiglu_oai`): the gate clamped above
/// at `limit`, the up product to `[-limit, limit]`, then `g·sigmoid(alpha·g)·(u + 1)`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClampedSwiglu {
    pub alpha: f32,
    pub limit: f32,
}

impl ClampedSwiglu {
    /// gpt-oss's constants (the reference's `build_moe_ffn` fixes them).
    pub const GPT_OSS: ClampedSwiglu = ClampedSwiglu {
        alpha: 1.702,
        limit: 7.0,
    };

    /// One element, in the reference's f32 steps (`ggml_compute_forward_swiglu_oai_f32`):
    /// `x = min(g, limit)`, `y = clamp(u, -limit, limit)`, `x / (1 + expf(alpha·(−x)))·(y + 1)`.
    #[inline]
    pub fn apply(&self, g: f32, u: f32) -> f32 {
        let x = g.min(self.limit);
        let y = u.clamp(-self.limit, self.limit);
        let glu = x / (1.0 + (self.alpha * -x).exp());
        glu * (y + 1.0)
    }
}

/// The mixture-of-experts hyper-parameters of a model (read by [`crate::model::moe`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MoeConfig {
    /// `{arch}.expert_count`.
    pub n_expert: usize,
    /// `{arch}.expert_used_count`: experts each token runs through.
    pub n_used: usize,
    /// Hidden width of one expert.
    pub ffn_dim: usize,
    /// Hidden width of the shared expert (Qwen2-MoE), if any.
    pub shared_ffn_dim: Option<usize>,
    /// Renormalize the picked experts' weights to sum 1 (`{arch}.expert_weights_norm`).
    pub norm_weights: bool,
    /// Multiply the picked experts' weights by this (`{arch}.expert_weights_scale`; 0 and 1
    /// leave them alone).
    pub weights_scale: f32,
    pub gating: Gating,
    /// The experts' activation when it is gpt-oss's clamped SwiGLU (`None`: the
    /// architecture's own, gated).
    pub clamped_swiglu: Option<ClampedSwiglu>,
}

/// The architectures kiln runs, from `general.architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Granite,
    Gpt2,
    Qwen3Moe,
    Qwen2Moe,
    Olmoe,
    /// gpt-oss (llama.cpp's `LLM_ARCH_OPENAI_MOE`).
    GptOss,
    /// Encoders (embeddings, no generation): BERT, Nomic-BERT and Jina-BERT-v2.
    Bert,
    NomicBert,
    JinaBertV2,
    Phi3,
    Smollm3,
    /// Mistral Small 3.x / Ministral 3 as llama.cpp converts them (`mistral3`).
    Mistral3,
    /// OLMo-2 (`olmo2`).
    Olmo2,
    /// EXAONE 3.x (`exaone`) and EXAONE 4 (`exaone4`).
    Exaone,
    Exaone4,
}

impl Arch {
    /// Every supported `general.architecture` value, with the variant it maps to.
    /// Mistral and other llama-shaped models are converted to GGUF as `llama`.
    pub const NAMES: &'static [(&'static str, Arch)] = &[
        ("llama", Arch::Llama),
        ("mistral", Arch::Llama),
        ("qwen2", Arch::Qwen2),
        ("qwen3", Arch::Qwen3),
        ("gemma2", Arch::Gemma2),
        ("gemma3", Arch::Gemma3),
        ("granite", Arch::Granite),
        ("gpt2", Arch::Gpt2),
        ("qwen3moe", Arch::Qwen3Moe),
        ("qwen2moe", Arch::Qwen2Moe),
        ("olmoe", Arch::Olmoe),
        ("gpt-oss", Arch::GptOss),
        ("bert", Arch::Bert),
        ("nomic-bert", Arch::NomicBert),
        ("jina-bert-v2", Arch::JinaBertV2),
        ("phi3", Arch::Phi3),
        ("smollm3", Arch::Smollm3),
        ("mistral3", Arch::Mistral3),
        ("olmo2", Arch::Olmo2),
        ("exaone", Arch::Exaone),
        ("exaone4", Arch::Exaone4),
    ];

    pub fn from_name(name: &str) -> Option<Arch> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
    }

    /// An encoder: post-norm blocks over embeddings with their own LayerNorm, no output
    /// head; it gives embeddings, never text.
    pub fn is_encoder(self) -> bool {
        matches!(self, Arch::Bert | Arch::NomicBert | Arch::JinaBertV2)
    }

    pub fn supported_list() -> String {
        Self::NAMES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Normalization flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum NormKind {
    Rms,
    /// LayerNorm with weight and bias (GPT-2).
    Layer,
}

/// How an architecture builds its blocks. Each architecture file returns one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchTraits {
    pub norm: NormKind,
    pub act: Activation,
    /// `down(act(gate(x)) * up(x))` rather than `down(act(up(x)))`.
    pub gated_ffn: bool,
    /// `None`: learned absolute positions (GPT-2) instead of rotary embeddings.
    pub rope: Option<RopeKind>,
    /// Q, K, V stored as one `attn_qkv` matrix.
    pub fused_qkv: bool,
    /// The FFN's gate and up stored as one `ffn_up` matrix `[2·ffn_dim, dim]`, the gate's
    /// rows first (Phi-3).
    pub fused_gate_up: bool,
    /// LongRoPE: `rope_factors_long` / `rope_factors_short` frequency divisors (Phi-3).
    pub longrope: bool,
    /// Per-head RMSNorm of q and k (Qwen3, Gemma-3).
    pub qk_norm: bool,
    /// Norms of the block's input before attention and before the FFN (`attn_norm`,
    /// `ffn_norm`): every architecture but OLMo-2 and EXAONE 4, whose blocks normalize only
    /// their outputs ([`Self::post_norms`]).
    pub input_norms: bool,
    /// Norms after attention and FFN, before the residual add (Gemma-2, Gemma-3, OLMo-2).
    pub post_norms: bool,
    /// Multiply embeddings by `sqrt(dim)` (Gemma).
    pub scale_embeddings: bool,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    /// `general.architecture` as written in the file (for metadata keys).
    pub arch_name: String,
    pub name: String,
    pub n_layers: usize,
    /// Embedding width.
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub ctx_train: usize,
    pub norm_eps: f32,
    /// Rotated dimensions per head.
    pub rope_dims: usize,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma-3 uses a different one), if any.
    pub rope_base_swa: Option<f32>,
    pub rope_freq_scale: f32,
    /// YaRN and the attention factor of the rotation ([`YarnParams::NONE`] for plain RoPE).
    pub rope_yarn: YarnParams,
    /// Sliding-window size of the local-attention layers.
    pub sliding_window: Option<usize>,
    /// Per layer: does it use the sliding window?
    pub swa_layers: Vec<bool>,
    /// Per layer: does it attend without positions (no RoPE; SmolLM3's NoPE layers)?
    pub no_rope_layers: Vec<bool>,
    /// Multiplier of q·k.
    pub attn_scale: f32,
    /// Queries are multiplied by this after RoPE, before attention (Gemma's
    /// `ggml_scale(Qcur, f_attention_scale)`; attention then runs with `attn_scale` = 1).
    /// Equal in real arithmetic to folding it into `attn_scale`, but the attention rounds
    /// queries to f16, so where the scale is applied shows in the last bits.
    pub q_scale: Option<f32>,
    /// Soft cap of the attention scores, `c·tanh(s/c)` before the mask and softmax (Gemma-2's
    /// `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Soft cap of the output logits, `c·tanh(l/c)` (Gemma-2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Multiplier of the token embeddings where the file gives one (Granite's
    /// `embedding_scale`; Gemma's sqrt(dim) comes from its traits).
    pub embed_scale: Option<f32>,
    /// Multiplier of each block's attention and FFN outputs before their residual adds
    /// (Granite's `residual_scale`).
    pub residual_scale: Option<f32>,
    /// Multiplier of the output logits (Granite's `1 / logit_scale`).
    pub logit_scale: Option<f32>,
    /// Queries multiplied by a factor growing with the position after RoPE (Mistral-3's
    /// attention temperature).
    pub attn_temp: Option<AttnTemp>,
    /// Off: every position of a pass attends to every other (an encoder's bidirectional
    /// attention, `{arch}.attention.causal = false`; decoders are always causal).
    pub causal: bool,
    /// Rows of the token-type embeddings (an encoder's; 0 for decoders).
    pub token_types: usize,
    /// ALiBi's maximum bias (Jina-BERT-v2's 8): attention scores get `-slope_h·|i − j|` for
    /// query position `i` and key position `j`, a slope per head, instead of positions in
    /// the embeddings or RoPE ([`crate::kernels::attention::AttnShape::alibi`]).
    pub alibi: Option<f32>,
    /// Mixture-of-experts feed-forward (`None`: a dense one).
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim_k
    }
    pub fn kv_dim_k(&self) -> usize {
        self.n_kv_heads * self.head_dim_k
    }
    pub fn kv_dim_v(&self) -> usize {
        self.n_kv_heads * self.head_dim_v
    }
    pub fn attn_out_dim(&self) -> usize {
        self.n_heads * self.head_dim_v
    }
}

/// Read the hyper-parameters common to every architecture (`{arch}.block_count`, ...).
/// Architecture files adjust what differs.
pub fn read_common(f: &GgufFile, arch: Arch) -> Result<ModelConfig, GgufError> {
    let arch_name = f.architecture()?.to_string();
    let k = |s: &str| f.arch_key(s);
    let n_layers = f.get_u32(&k("block_count"))? as usize;
    let dim = f.get_u32(&k("embedding_length"))? as usize;
    let n_heads = f.get_u32(&k("attention.head_count"))? as usize;
    let n_kv_heads = f
        .opt_u32(&k("attention.head_count_kv"))?
        .map_or(n_heads, |v| v as usize);
    let default_head = dim.checked_div(n_heads).unwrap_or(0);
    let head_dim_k = f
        .opt_u32(&k("attention.key_length"))?
        .map_or(default_head, |v| v as usize);
    let head_dim_v = f
        .opt_u32(&k("attention.value_length"))?
        .map_or(head_dim_k, |v| v as usize);
    let ffn_dim = f.get_u32(&k("feed_forward_length"))? as usize;
    let ctx_train = f.opt_u32(&k("context_length"))?.unwrap_or(2048) as usize;
    let norm_eps = match f.opt_f32(&k("attention.layer_norm_rms_epsilon"))? {
        Some(e) => e,
        None => f
            .opt_f32(&k("attention.layer_norm_epsilon"))?
            .unwrap_or(1e-5),
    };
    let rope_dims = f
        .opt_u32(&k("rope.dimension_count"))?
        .map_or(head_dim_k, |v| v as usize);
    let rope_base = f.opt_f32(&k("rope.freq_base"))?.unwrap_or(10_000.0);
    let vocab_size = match f.opt_u32(&k("vocab_size"))? {
        Some(v) => v as usize,
        None => f.opt_array("tokenizer.ggml.tokens")?.map_or(0, |a| a.len()),
    };
    let name = f.opt_str("general.name")?.unwrap_or("").to_string();
    Ok(ModelConfig {
        arch,
        arch_name,
        name,
        n_layers,
        dim,
        n_heads,
        n_kv_heads,
        head_dim_k,
        head_dim_v,
        ffn_dim,
        vocab_size,
        ctx_train,
        norm_eps,
        rope_dims,
        rope_base,
        rope_base_swa: None,
        // (`rope_scaling::read` sets these from the file's scaling keys.)
        rope_freq_scale: 1.0,
        rope_yarn: YarnParams::NONE,
        sliding_window: None,
        swa_layers: vec![false; n_layers],
        no_rope_layers: vec![false; n_layers],
        attn_scale: 1.0 / (head_dim_k.max(1) as f32).sqrt(),
        q_scale: None,
        attn_softcap: None,
        final_softcap: None,
        embed_scale: None,
        residual_scale: None,
        logit_scale: None,
        attn_temp: None,
        causal: true,
        token_types: 0,
        alibi: None,
        moe: None,
    })
}
