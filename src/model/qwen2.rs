//! Qwen2: the llama block with biases on q, k, v (loaded whenever the file has them) and
//! NeoX-ordered RoPE; the output head is usually tied to the embeddings.

use super::config::{ArchTraits, ModelConfig, RopeKind};

pub const TRAITS: ArchTraits = ArchTraits {
    rope: Some(RopeKind::Neox),
    ..super::llama::TRAITS
};

pub fn configure(_cfg: &mut ModelConfig) {}
