//! GPT-2 (the model of the ember design): LayerNorm with bias, learned absolute positions, one fused
//! QKV matrix, biases everywhere, a non-gated GELU FFN.

use super::config::Activation;
use super::config::{ArchTraits, ModelConfig, NormKind};

/// Llama's, but for the norm, the activation, the FFN, the positions and the QKV matrix.
pub const TRAITS: ArchTraits = ArchTraits {
    norm: NormKind::Layer,
    act: Activation::GeluTanh,
    gated_ffn: false,
    rope: None,
    fused_qkv: true,
    ..super::llama::TRAITS
};

pub fn configure(_cfg: &mut ModelConfig) {}
