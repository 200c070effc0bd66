//! LLaMA (and the models converted as `llama`: Mistral, TinyLlama, SmolLM, Llama 3).
//! RMSNorm, adjacent-pair RoPE, SwiGLU, optional separate output head.

use super::config::{Activation, RopeKind};
use super::config::{ArchTraits, ModelConfig, NormKind};

pub const TRAITS: ArchTraits = ArchTraits {
    norm: NormKind::Rms,
    act: Activation::Silu,
    gated_ffn: true,
    rope: Some(RopeKind::Normal),
    fused_qkv: false,
    fused_gate_up: false,
    longrope: false,
    qk_norm: false,
    input_norms: true,
    post_norms: false,
    scale_embeddings: false,
};

/// Nothing beyond the common hyper-parameters (Llama 3's `rope_freqs` factors are picked up
/// by the loader when the file has them).
pub fn configure(_cfg: &mut ModelConfig) {}
