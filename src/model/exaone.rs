//! EXAONE 3.x (`exaone`): LLaMA's block with NeoX-ordered RoPE (Qwen2's, q/k/v biases where
//! the file has them), SwiGLU, optional output head and Llama-3 `rope_freqs`.
//!
//! EXAONE 4 (`exaone4`): OLMo-2's block shape (no input norms; attention and FFN outputs
//! RMS-normalized before their residual adds) with per-head q/k RMSNorm and an optional
//! output head. The reference gives its 64-layer model (EXAONE 4.0 32B) sliding-window layers
//! with global layers that skip RoPE, and keeps multi-token-prediction layers out of the
//! decoder (`nextn_predict_layers`); kiln refuses both by name.

use super::config::{ArchTraits, ModelConfig};
use super::ModelError;
use crate::gguf::GgufFile;

pub const TRAITS: ArchTraits = super::qwen2::TRAITS;

pub const TRAITS4: ArchTraits = ArchTraits {
    input_norms: false,
    post_norms: true,
    ..super::qwen3::TRAITS
};

/// The layer count the reference gives sliding-window layers (`llama_model_exaone4`).
const SWA_LAYERS_4: usize = 64;

pub fn configure(f: &GgufFile, cfg: &ModelConfig) -> Result<(), ModelError> {
    super::olmo2::refuse_biases(f, cfg, &["attn_output", "ffn_gate", "ffn_up", "ffn_down"])
}

pub fn configure4(f: &GgufFile, cfg: &ModelConfig) -> Result<(), ModelError> {
    if cfg.n_layers == SWA_LAYERS_4 {
        return Err(ModelError::UnsupportedValue {
            key: f.arch_key("block_count"),
            value: SWA_LAYERS_4.to_string(),
            supported: "exaone4 without sliding-window layers (the reference gives them to \
                        64-layer models only)",
        });
    }
    let key = f.arch_key("nextn_predict_layers");
    if let Some(n) = f.opt_u32(&key)?.filter(|&n| n > 0) {
        return Err(ModelError::UnsupportedValue {
            key,
            value: n.to_string(),
            supported: "exaone4 without multi-token-prediction layers",
        });
    }
    configure(f, cfg)
}
