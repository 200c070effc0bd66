//! Qwen2: the llama block with biases on q, k, v (loaded whenever the file has them) and
//! NeoX-ordered RoPE; the output head is usually tied to the embeddings.

use super::config::{Activation, RopeKind};
use super::config::{ArchTraits, ModelConfig, NormKind};

pub const TRAITS: ArchTraits = ArchTraits {
    norm: NormKind::Rms,
    act: Activation::Silu,
    gated_ffn: true,
    rope: Some(RopeKind::Neox),
    fused_qkv: false,
    fused_gate_up: false,
    longrope: false,
    qk_norm: false,
    post_norms: false,
    scale_embeddings: false,
};

pub fn configure(_cfg: &mut ModelConfig) {}
