//! Gemma-3: embeddings scaled by sqrt(dim); RMSNorm before and after attention and the FFN;
//! per-head q/k RMSNorm; GELU-gated FFN; tied output head. Layers alternate between a sliding
//! window (local, with their own RoPE base) and global attention: every `pattern`-th layer is
//! global. llama.cpp's converter stores Gemma's norm weights with the `+1` already added, so
//! they are ordinary RMSNorm weights here.

use super::config::{Activation, ArchTraits, ModelConfig};
use crate::gguf::{GgufError, GgufFile};

pub const TRAITS: ArchTraits = ArchTraits {
    act: Activation::GeluTanh,
    post_norms: true,
    scale_embeddings: true,
    ..super::qwen3::TRAITS
};

/// Gemma-3's local layers: five sliding-window layers, then one global.
const SWA_PATTERN: usize = 6;
/// RoPE base of the local layers when the file does not say.
const DEFAULT_SWA_ROPE_BASE: f32 = 10_000.0;

pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), GgufError> {
    cfg.sliding_window = f
        .opt_u32(&f.arch_key("attention.sliding_window"))?
        .map(|w| w as usize);
    cfg.rope_base_swa = Some(
        f.opt_f32(&f.arch_key("rope.freq_base_swa"))?
            .unwrap_or(DEFAULT_SWA_ROPE_BASE),
    );
    if cfg.sliding_window.is_some() {
        cfg.swa_layers = (0..cfg.n_layers)
            .map(|i| (i + 1) % SWA_PATTERN != 0)
            .collect();
    }
    // Gemma-3 scales queries by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim) before
    // attention, as the reference's graph does (`ggml_scale(Qcur, ...)`, then attention with
    // scale 1).
    cfg.q_scale = Some(1.0 / (cfg.head_dim_k as f32).sqrt());
    cfg.attn_scale = 1.0;
    Ok(())
}
