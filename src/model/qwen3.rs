//! Qwen3: Qwen2 without biases, plus a per-head RMSNorm of q and k before RoPE; its head
//! dimension (`attention.key_length`) need not be `dim / heads`.

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
    qk_norm: true,
    post_norms: false,
    scale_embeddings: false,
};

pub fn configure(_cfg: &mut ModelConfig) {}
