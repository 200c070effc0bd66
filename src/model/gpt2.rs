//! GPT-2 (the ember seed's model): LayerNorm with bias, learned absolute positions, one fused
//! QKV matrix, biases everywhere, a non-gated GELU FFN.

use super::config::Activation;
use super::config::{ArchTraits, ModelConfig, NormKind};

pub const TRAITS: ArchTraits = ArchTraits {
    norm: NormKind::Layer,
    act: Activation::GeluTanh,
    gated_ffn: false,
    rope: None,
    fused_qkv: true,
    fused_gate_up: false,
    longrope: false,
    qk_norm: false,
    input_norms: true,
    post_norms: false,
    scale_embeddings: false,
};

pub fn configure(_cfg: &mut ModelConfig) {}
