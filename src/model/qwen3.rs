//! Qwen3: Qwen2 without biases, plus a per-head RMSNorm of q and k before RoPE; its head
//! dimension (`attention.key_length`) need not be `dim / heads`.

use super::config::{ArchTraits, ModelConfig};

pub const TRAITS: ArchTraits = ArchTraits {
    qk_norm: true,
    ..super::qwen2::TRAITS
};

pub fn configure(_cfg: &mut ModelConfig) {}
