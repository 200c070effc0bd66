//! IBM Granite 3.x (`granite`): LLaMA's block (adjacent-pair RoPE, SwiGLU, optional output head)
//! with four multipliers from the file, as the reference's graph applies them: the token
//! embeddings times `embedding_scale`, q·k times `attention.scale` (instead of
//! `1/sqrt(head_dim)`), each block's attention and FFN outputs times `residual_scale` before
//! their residual adds, and the logits divided by `logit_scale` (required). Without
//! `rope.scaling.finetuned` (true by default) no layer is rotated.

use super::config::ModelConfig;
pub use super::llama::TRAITS;
use super::weights::names;
use super::ModelError;
use crate::gguf::GgufFile;

pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    // The reference reads each as "not set" when 0.
    let factor = |name: &str| -> Result<Option<f32>, ModelError> {
        let key = f.arch_key(name);
        match f.opt_f32(&key)? {
            None => Ok(None),
            Some(0.0) => Ok(None),
            Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
            Some(v) => Err(ModelError::BadConfig(format!(
                "metadata key '{key}' = {v}: a scale must be a positive number"
            ))),
        }
    };
    let logit_key = f.arch_key("logit_scale");
    let logit = factor("logit_scale")?.ok_or_else(|| {
        ModelError::BadConfig(format!(
            "metadata key '{logit_key}' is missing or 0: granite divides its logits by it"
        ))
    })?;
    cfg.logit_scale = Some(1.0 / logit);
    cfg.residual_scale = factor("residual_scale")?;
    cfg.embed_scale = factor("embedding_scale")?;
    if let Some(s) = factor("attention.scale")? {
        cfg.attn_scale = s;
    }
    let rope = f
        .opt_bool(&f.arch_key("rope.scaling.finetuned"))?
        .unwrap_or(true);
    cfg.no_rope_layers = vec![!rope; cfg.n_layers];
    // Optional biases the reference adds and kiln's llama block does not: refused by name.
    for i in 0..cfg.n_layers {
        for t in [
            "attn_output.bias",
            "ffn_gate.bias",
            "ffn_up.bias",
            "ffn_down.bias",
        ] {
            let name = names::blk(i, t);
            if f.tensor_info(&name).is_some() {
                return Err(ModelError::BadConfig(format!(
                    "tensor '{name}': kiln does not implement granite's optional biases"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::gguf::Value;
    use crate::model::test_header::Header;

    const HEADER: Header = Header::new("granite", 2);

    #[test]
    fn scales_and_rope_switch_from_the_file() {
        let c = HEADER
            .config(&[("logit_scale", Value::F32(16.0))])
            .expect("config");
        assert_eq!(c.logit_scale, Some(1.0 / 16.0));
        assert_eq!((c.residual_scale, c.embed_scale), (None, None));
        assert_eq!(c.attn_scale, 0.25);
        assert_eq!(c.no_rope_layers, [false, false]);
        let c = HEADER
            .config(&[
                ("logit_scale", Value::F32(8.0)),
                ("residual_scale", Value::F32(0.22)),
                ("embedding_scale", Value::F32(12.0)),
                ("attention.scale", Value::F32(0.0078125)),
                ("rope.scaling.finetuned", Value::Bool(false)),
            ])
            .expect("config");
        assert_eq!((c.residual_scale, c.embed_scale), (Some(0.22), Some(12.0)));
        assert_eq!(c.attn_scale, 0.0078125);
        assert_eq!(c.no_rope_layers, [true, true]);
        // 0 is the reference's "not set".
        let c = HEADER
            .config(&[
                ("logit_scale", Value::F32(8.0)),
                ("residual_scale", Value::F32(0.0)),
            ])
            .expect("config");
        assert_eq!(c.residual_scale, None);
    }

    #[test]
    fn a_missing_or_bad_scale_is_named() {
        for (extra, key) in [
            (vec![], "granite.logit_scale"),
            (
                vec![("logit_scale", Value::F32(0.0))],
                "granite.logit_scale",
            ),
            (
                vec![
                    ("logit_scale", Value::F32(8.0)),
                    ("embedding_scale", Value::F32(f32::NAN)),
                ],
                "granite.embedding_scale",
            ),
        ] {
            let e = HEADER.config(&extra).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{e}");
        }
    }
}
