//! Phi-3 and Phi-4-mini (`phi3`): LLaMA's block with q, k and v in one `attn_qkv` matrix and
//! the FFN's gate and up in one `ffn_up` matrix (the gate's rows first, as the reference's
//! SwiGLU splits it), NeoX RoPE over `rope.dimension_count` dimensions (Phi-4-mini rotates
//! three quarters of each head), queries scaled by `1/sqrt(head_dim)` before attention.
//!
//! The long-context variants carry LongRoPE: per-pair frequency divisors
//! `rope_factors_long.weight` and `rope_factors_short.weight` and the attention factor
//! `rope.scaling.attn_factor` (a magnitude of cos and sin). The reference picks the long
//! factors when its context exceeds `rope.scaling.original_context_length`, at its default
//! context (the trained one); kiln picks them the same way, once, at load. As in the
//! reference, `attention.sliding_window` is not used (llama.cpp disables Phi's SWA).

use super::config::{ArchTraits, ModelConfig};

pub const TRAITS: ArchTraits = ArchTraits {
    fused_qkv: true,
    fused_gate_up: true,
    longrope: true,
    ..super::qwen2::TRAITS
};

/// The reference scales the queries (`ggml_scale(Qcur, 1/sqrt(head_dim))`), then attends with
/// scale 1.
pub fn configure(cfg: &mut ModelConfig) {
    cfg.q_scale = Some(1.0 / (cfg.head_dim_k as f32).sqrt());
    cfg.attn_scale = 1.0;
}
