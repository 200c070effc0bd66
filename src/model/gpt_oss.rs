//! gpt-oss (llama.cpp's `LLM_ARCH_OPENAI_MOE`): a mixture of experts with biases on q, k, v, o,
//! the router and every expert; attention sinks (a learned logit per head in the softmax's
//! denominator, `attn_sinks`); sliding-window (`attention.sliding_window`, 128 in the released
//! models) and full layers alternating, the first local, kept as a ring as Gemma-3's are;
//! YaRN RoPE on every layer; the experts' clamped SwiGLU ([`super::moe::ClampedSwiglu`]) and
//! their softmax over the chosen router logits ([`super::moe::Gating::SoftmaxWeight`]). Its
//! FFN's input norm is stored as `post_attention_norm`.

use super::config::{ArchTraits, ModelConfig};
use super::ModelError;
use crate::gguf::{GgufFile, Value};

pub const TRAITS: ArchTraits = super::qwen2::TRAITS;

/// Local layers: every `pattern`-th layer is full, the others slide (llama.cpp's
/// `set_swa_pattern(2)`: layer `i` is local when `i % pattern < pattern - 1`).
const SWA_PATTERN: usize = 2;

pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let window_key = f.arch_key("attention.sliding_window");
    let window = f.get_u32(&window_key)? as usize;
    if window == 0 {
        return Err(ModelError::BadConfig(format!(
            "'{window_key}' = 0: gpt-oss's local layers need a window"
        )));
    }
    cfg.sliding_window = Some(window);
    // `attention.sliding_window_pattern`: a per-layer array of flags, or the pattern's period.
    let pattern_key = f.arch_key("attention.sliding_window_pattern");
    cfg.swa_layers = match f.get(&pattern_key) {
        None => pattern_layers(cfg.n_layers, SWA_PATTERN),
        Some(Value::Array(crate::gguf::Array::Bool(flags))) if flags.len() >= cfg.n_layers => {
            flags[..cfg.n_layers].to_vec()
        }
        Some(v) => match v.as_u64() {
            Some(p) => pattern_layers(cfg.n_layers, p as usize),
            None => {
                return Err(ModelError::UnsupportedValue {
                    key: pattern_key,
                    value: format!("{v:?}"),
                    supported: "a period (u32) or one flag per layer",
                })
            }
        },
    };
    // The local layers' RoPE base, if the file gives one; their position scaling is the full
    // layers' (the reference's `rope_freq_scale_train_swa`).
    cfg.rope_base_swa = f.opt_f32(&f.arch_key("rope.freq_base_swa"))?;
    // `1/sqrt(n_rot)`, as the reference's graph passes it.
    cfg.attn_scale = 1.0 / (cfg.rope_dims.max(1) as f32).sqrt();
    Ok(())
}

/// Layer `i` is local when `i % pattern < pattern - 1` (every layer local for pattern 0).
fn pattern_layers(n_layers: usize, pattern: usize) -> Vec<bool> {
    (0..n_layers)
        .map(|i| pattern == 0 || i % pattern < pattern - 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_layer_slides_then_every_other() {
        assert_eq!(pattern_layers(4, 2), [true, false, true, false]);
        assert_eq!(pattern_layers(3, 0), [true, true, true]);
        assert_eq!(pattern_layers(6, 3), [true, true, false, true, true, false]);
    }
}
