//! Mistral Small 3.x and Ministral 3 as llama.cpp converts them (`mistral3`): LLaMA's block
//! (adjacent-pair RoPE, SwiGLU, optional output head, Llama-3 `rope_freqs` where the file has
//! them) with what the reference's `llama_model_mistral3` reads besides:
//!
//! - YaRN's `rope.scaling.yarn_beta_fast`, `yarn_beta_slow` and `yarn_log_multiplier`
//!   ([`super::rope_scaling`] reads them for this architecture);
//! - `attention.temperature_scale`: the queries at position `p` multiplied by
//!   `ln(⌊p / n⌋ + 1)·scale + 1` after RoPE, `n` the context before YaRN's extension
//!   (`rope.scaling.original_context_length`, else the trained one) ([`AttnTemp`]).
//!
//! The reference's graph also builds a mixture of experts (`expert_count` > 0) and adds
//! optional biases of the output projection and the FFN; kiln refuses the first by name and
//! adds the biases as it does for any projection that has one.

use super::config::{AttnTemp, ModelConfig};
pub use super::llama::TRAITS;
use super::ModelError;
use crate::gguf::GgufFile;

/// Reads the temperature scale; call after [`super::rope_scaling::read`] (its floor is YaRN's
/// original context).
pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let experts_key = f.arch_key("expert_count");
    if let Some(n) = f.opt_u32(&experts_key)?.filter(|&n| n > 0) {
        return Err(ModelError::UnsupportedValue {
            key: experts_key,
            value: n.to_string(),
            supported: "mistral3 with a dense feed-forward (no experts)",
        });
    }
    let key = f.arch_key("attention.temperature_scale");
    cfg.attn_temp = match f.opt_f32(&key)? {
        // (0 is the reference's "not set".)
        None | Some(0.0) => None,
        Some(scale) if scale.is_finite() => {
            let floor = cfg.rope_yarn.n_ctx_orig;
            if floor == 0 {
                return Err(ModelError::BadConfig(format!(
                    "metadata key '{key}' needs the original context length \
                     ('{}'), which is 0",
                    f.arch_key("rope.scaling.original_context_length")
                )));
            }
            Some(AttnTemp { scale, floor })
        }
        Some(v) => {
            return Err(ModelError::BadConfig(format!(
                "metadata key '{key}' = {v}: expected a finite number"
            )))
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;
    use crate::model::test_header::Header;

    /// The configuration of a minimal mistral3 header with `extra` keys.
    fn config(extra: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
        let keys = [("context_length", Value::U32(256))];
        Header::new("mistral3", 2).config(&[&keys[..], extra].concat())
    }

    #[test]
    fn temperature_and_yarn_keys_from_the_file() {
        let c = config(&[]).expect("config");
        assert_eq!(c.attn_temp, None);
        let c = config(&[
            ("attention.temperature_scale", Value::F32(0.1)),
            ("rope.scaling.type", Value::from("yarn")),
            ("rope.scaling.factor", Value::F32(16.0)),
            ("rope.scaling.original_context_length", Value::U32(64)),
            ("rope.scaling.yarn_beta_fast", Value::F32(4.0)),
            ("rope.scaling.yarn_beta_slow", Value::F32(2.0)),
            ("rope.scaling.yarn_log_multiplier", Value::F32(1.0)),
        ])
        .expect("config");
        let t = c.attn_temp.expect("temperature");
        assert_eq!((t.scale, t.floor), (0.1, 64));
        assert_eq!((c.rope_yarn.beta_fast, c.rope_yarn.beta_slow), (4.0, 2.0));
        // A log multiplier of 1 leaves only the division by YaRN's own magnitude.
        let want = 1.0 / (1.0 + 0.1 * 16f32.ln());
        assert!((c.rope_yarn.attn_factor - want).abs() < 1e-7);
        // Without YaRN the floor is the trained context.
        let c = config(&[("attention.temperature_scale", Value::F32(0.5))]).expect("config");
        assert_eq!(c.attn_temp.map(|t| t.floor), Some(256));
    }

    /// The factor is 1 below the floor and grows by the logarithm of the step count after.
    #[test]
    fn temperature_factor_is_the_reference_s() {
        let t = AttnTemp {
            scale: 0.1,
            floor: 32,
        };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(31), 1.0);
        assert_eq!(t.factor(32), (2f64.ln() * 0.1f32 as f64 + 1.0) as f32);
        assert_eq!(t.factor(100), (4f64.ln() * 0.1f32 as f64 + 1.0) as f32);
    }

    #[test]
    fn experts_and_bad_values_are_named() {
        for (extra, key) in [
            (
                vec![("expert_count", Value::U32(8))],
                "mistral3.expert_count",
            ),
            (
                vec![("attention.temperature_scale", Value::F32(f32::NAN))],
                "mistral3.attention.temperature_scale",
            ),
            (
                vec![
                    ("rope.scaling.type", Value::from("yarn")),
                    ("rope.scaling.factor", Value::F32(4.0)),
                    ("rope.scaling.original_context_length", Value::U32(64)),
                    ("rope.scaling.yarn_beta_fast", Value::F32(-1.0)),
                ],
                "mistral3.rope.scaling.yarn_beta_fast",
            ),
        ] {
            let e = config(&extra).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{e}");
        }
    }
}
