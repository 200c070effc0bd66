//! Gemma-2 (`gemma2`): embeddings scaled by sqrt(dim); RMSNorm before and after attention and
//! the FFN (llama.cpp's converter stores the norm weights with Gemma's `+1` already added, so
//! they are ordinary RMSNorm weights here); GELU-gated FFN; tied output head; NeoX RoPE.
//! Layers alternate between a sliding window and global attention (the even layers are
//! local); attention scores are soft-capped, `c·tanh(s/c)` before the mask and softmax
//! (`attn_logit_softcapping`, 50 by default), and so are the output logits
//! (`final_logit_softcapping`, 30 by default), as the reference's graph does.

use super::config::{ArchTraits, ModelConfig};
use super::ModelError;
use crate::gguf::{GgufFile, Value};

pub const TRAITS: ArchTraits = ArchTraits {
    qk_norm: false,
    ..super::gemma3::TRAITS
};

/// The reference's defaults when the file does not say.
const DEFAULT_SLIDING_WINDOW: u32 = 4096;
const DEFAULT_SWA_PATTERN: u32 = 2;
const DEFAULT_ATTN_SOFTCAP: f32 = 50.0;
const DEFAULT_FINAL_SOFTCAP: f32 = 30.0;
/// Gemma-2 27B's layer count: the reference scales its queries by `1/sqrt(dim / heads)`
/// (its `query_pre_attn_scalar`, 144) instead of `1/sqrt(head_dim)`.
const LAYERS_27B: usize = 46;

pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let window_key = f.arch_key("attention.sliding_window");
    let window = f.opt_u32(&window_key)?.unwrap_or(DEFAULT_SLIDING_WINDOW);
    if window == 0 {
        return Err(ModelError::BadConfig(format!(
            "metadata key '{window_key}' = 0: a sliding window must hold at least one position"
        )));
    }
    cfg.sliding_window = Some(window as usize);
    cfg.swa_layers = swa_layers(f, cfg.n_layers, DEFAULT_SWA_PATTERN)?;
    // Local and global layers share one RoPE base unless the file gives the local one.
    cfg.rope_base_swa = f.opt_f32(&f.arch_key("rope.freq_base_swa"))?;
    cfg.attn_softcap = Some(softcap(f, "attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP)?);
    cfg.final_softcap = Some(softcap(
        f,
        "final_logit_softcapping",
        DEFAULT_FINAL_SOFTCAP,
    )?);
    // Queries are scaled before attention (`ggml_scale(Qcur, f_attention_scale)`), which then
    // runs with scale 1.
    let per_head = if cfg.n_layers == LAYERS_27B {
        cfg.dim / cfg.n_heads
    } else {
        cfg.head_dim_k
    };
    cfg.q_scale = Some(1.0 / (per_head as f32).sqrt());
    cfg.attn_scale = 1.0;
    Ok(())
}

/// A soft cap from `{arch}.{name}`: positive and finite (a cap of 0 would divide by zero).
fn softcap(f: &GgufFile, name: &str, default: f32) -> Result<f32, ModelError> {
    let key = f.arch_key(name);
    let c = f.opt_f32(&key)?.unwrap_or(default);
    if !(c.is_finite() && c > 0.0) {
        return Err(ModelError::BadConfig(format!(
            "metadata key '{key}' = {c}: a soft cap must be a positive number"
        )));
    }
    Ok(c)
}

/// Which layers use the sliding window, as the reference's `load_swa_pattern(ml, period)`:
/// `attention.sliding_window_pattern` as one flag per layer, or as a period `n` (layer `i` is
/// local when `i mod n < n − 1`; 0: every layer), `period` by default (Gemma-2's 2, OLMo 3's
/// 4).
pub(super) fn swa_layers(
    f: &GgufFile,
    n_layers: usize,
    period: u32,
) -> Result<Vec<bool>, ModelError> {
    let key = f.arch_key("attention.sliding_window_pattern");
    let bad = |what: String| ModelError::BadConfig(format!("metadata key '{key}': {what}"));
    let period = match f.get(&key) {
        None => period,
        Some(Value::Array(a)) => {
            let flags = a
                .as_bools()
                .ok_or_else(|| bad(format!("an array of {}, not of booleans", a.type_name())))?;
            if flags.len() != n_layers {
                return Err(bad(format!("{} flags for {n_layers} layers", flags.len())));
            }
            return Ok(flags.to_vec());
        }
        Some(_) => f.get_u32(&key)?,
    };
    let n = period as usize;
    Ok((0..n_layers).map(|i| n == 0 || i % n < n - 1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_header::Header;

    const HEADER: Header = Header::new("gemma2", 4);

    #[test]
    fn defaults_are_the_reference_s() {
        let c = HEADER.config(&[]).expect("config");
        assert_eq!(c.sliding_window, Some(4096));
        assert_eq!(c.swa_layers, [true, false, true, false]);
        assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
        assert_eq!((c.q_scale, c.attn_scale), (Some(0.25), 1.0));
        assert_eq!(c.rope_base_swa, None);
    }

    #[test]
    fn window_pattern_from_the_file() {
        let c = HEADER
            .config(&[
                ("attention.sliding_window", Value::U32(16)),
                ("attention.sliding_window_pattern", Value::U32(3)),
            ])
            .expect("config");
        assert_eq!(c.sliding_window, Some(16));
        assert_eq!(c.swa_layers, [true, true, false, true]);
        let c = HEADER
            .config(&[("attention.sliding_window_pattern", Value::U32(0))])
            .expect("config");
        assert_eq!(c.swa_layers, [true; 4]);
        let flags = vec![false, true, true, false];
        let c = HEADER
            .config(&[(
                "attention.sliding_window_pattern",
                Value::from(flags.clone()),
            )])
            .expect("config");
        assert_eq!(c.swa_layers, flags);
    }

    /// A soft cap of 0 (or negative, or NaN), a window of 0 or a negative one, a pattern of
    /// the wrong length: one-line errors naming the key.
    #[test]
    fn bad_values_are_named() {
        for (key, v, names) in [
            (
                "attn_logit_softcapping",
                Value::F32(0.0),
                "attn_logit_softcapping",
            ),
            (
                "final_logit_softcapping",
                Value::F32(-1.0),
                "final_logit_softcapping",
            ),
            (
                "attn_logit_softcapping",
                Value::F32(f32::NAN),
                "attn_logit_softcapping",
            ),
            ("attention.sliding_window", Value::U32(0), "sliding_window"),
            ("attention.sliding_window", Value::I32(-4), "sliding_window"),
            (
                "attention.sliding_window_pattern",
                Value::from(vec![true, false]),
                "2 flags",
            ),
        ] {
            let e = HEADER.config(&[(key, v)]).unwrap_err().to_string();
            assert!(e.contains(&format!("gemma2.{key}")), "{e}");
            assert!(e.contains(names) && !e.contains('\n'), "{e}");
        }
    }
}
