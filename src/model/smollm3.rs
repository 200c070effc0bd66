//! SmolLM3 (`smollm3`): LLaMA's block (adjacent-pair RoPE, SwiGLU, optional output head) where
//! every fourth layer attends without positions (NoPE): layers `i` with `(i + 1) % 4 == 0`
//! skip the rotation, as the reference's fixed `n_no_rope_layer_step = 4` does.

use super::config::ModelConfig;
pub use super::llama::TRAITS;

/// The reference's step between layers without RoPE (not read from the file).
const NO_ROPE_LAYER_STEP: usize = 4;

pub fn configure(cfg: &mut ModelConfig) {
    cfg.no_rope_layers = (0..cfg.n_layers)
        .map(|i| (i + 1) % NO_ROPE_LAYER_STEP == 0)
        .collect();
}
