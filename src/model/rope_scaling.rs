//! RoPE position scaling from `{arch}.rope.scaling.*`, read as the reference engine reads it
//! (llama.cpp's `llama_model::load_hparams` and the context's `cparams`): linear scaling and
//! YaRN are computed; any other type is refused by name, never run as plain RoPE.
//!
//! - `rope.scaling.type`: `none`, `linear` (the default when absent) or `yarn`;
//! - `rope.scaling.factor` (or the older `rope.scale_linear`): positions are divided by it
//!   (`none` ignores it);
//! - `rope.scaling.attn_factor`: a magnitude multiplier of cos and sin (1 by default);
//! - `longrope` (for the architectures that read LongRoPE's factor tensors, Phi-3): the
//!   factors and the attention factor do the work; `rope.scaling.original_context_length`
//!   decides which factors (see [`super::phi3`]);
//! - YaRN: `rope.scaling.original_context_length` (the context before the extension), an
//!   extrapolation mix of 1, the corrections `beta_fast` 32 and `beta_slow` 1, and the
//!   magnitude `get_mscale(factor) / (1 + 0.1·ln factor)` times the attention factor; for
//!   `mistral3` the file's `rope.scaling.yarn_beta_fast`, `yarn_beta_slow` and
//!   `yarn_log_multiplier` (the magnitude then `get_mscale(factor, 1) / get_mscale(factor,
//!   log_mul)`), which the reference reads for it (the other architectures kiln runs read none
//!   of them, nor `yarn_ext_factor`).

use super::config::{Arch, ModelConfig, YarnParams};
use super::ModelError;
use crate::gguf::GgufFile;

/// Set `cfg.rope_freq_scale` and `cfg.rope_yarn` from the file's scaling keys, or refuse a
/// scaling kiln does not compute (by its name) or a YaRN declaration missing its keys.
///
/// `longrope`: the architecture reads LongRoPE's factor tensors (the type then only names them:
/// no position scale, no YaRN).
pub fn read(f: &GgufFile, cfg: &mut ModelConfig, longrope: bool) -> Result<(), ModelError> {
    let k = |s: &str| f.arch_key(s);
    let type_key = k("rope.scaling.type");
    let kind = f.opt_str(&type_key)?.unwrap_or("linear");
    let factor_key = k("rope.scaling.factor");
    let factor = match f.opt_f32(&factor_key)? {
        Some(v) => Some(v),
        None => f.opt_f32(&k("rope.scale_linear"))?,
    };
    let attn_key = k("rope.scaling.attn_factor");
    let rope_attn_factor = f.opt_f32(&attn_key)?.unwrap_or(1.0);
    if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
        return Err(bad_key(&attn_key, rope_attn_factor, "a positive number"));
    }
    let scale_of = |factor: Option<f32>| -> Result<f32, ModelError> {
        match factor {
            None => Ok(1.0),
            Some(0.0) => Ok(1.0), // (the reference's "not set")
            Some(v) if v.is_finite() && v > 0.0 => Ok(1.0 / v),
            Some(v) => Err(bad_key(&factor_key, v, "a positive number")),
        }
    };
    let orig_key = k("rope.scaling.original_context_length");
    let n_ctx_orig = f.opt_u32(&orig_key)?;
    cfg.rope_yarn = YarnParams {
        attn_factor: rope_attn_factor,
        // (The reference's `n_ctx_orig_yarn`: the trained context when the file has none.)
        n_ctx_orig: n_ctx_orig.map_or(cfg.ctx_train, |v| v as usize),
        ..YarnParams::NONE
    };
    match kind {
        "none" => cfg.rope_freq_scale = 1.0,
        "linear" => cfg.rope_freq_scale = scale_of(factor)?,
        "longrope" if longrope => cfg.rope_freq_scale = scale_of(factor)?,
        "yarn" => {
            let Some(factor) = f.opt_f32(&factor_key)? else {
                return Err(missing(&factor_key, "yarn"));
            };
            if !(factor.is_finite() && factor > 0.0) {
                return Err(bad_key(&factor_key, factor, "a positive number"));
            }
            let n_ctx_orig = n_ctx_orig.ok_or_else(|| missing(&orig_key, "yarn"))?;
            if n_ctx_orig == 0 {
                return Err(bad_key(&orig_key, 0.0, "a positive context length"));
            }
            cfg.rope_freq_scale = 1.0 / factor;
            let own = own_yarn_keys(f, cfg.arch)?;
            cfg.rope_yarn = YarnParams {
                ext_factor: 1.0,
                attn_factor: yarn_attn_factor(cfg.rope_freq_scale, own.log_mul) * rope_attn_factor,
                n_ctx_orig: n_ctx_orig as usize,
                beta_fast: own.beta_fast,
                beta_slow: own.beta_slow,
            };
        }
        other => {
            return Err(ModelError::UnsupportedRopeScaling {
                key: type_key,
                value: other.to_string(),
            })
        }
    }
    Ok(())
}

/// YaRN's corrections and magnitude as the file may set them: `rope.scaling.yarn_beta_fast`,
/// `rope.scaling.yarn_beta_slow` and `rope.scaling.yarn_log_multiplier` (HF's
/// `mscale_all_dim`), which the reference reads for `mistral3` (of the architectures kiln
/// runs) and defaults to 32, 1 and 0 for the others.
struct OwnYarnKeys {
    beta_fast: f32,
    beta_slow: f32,
    log_mul: f32,
}

fn own_yarn_keys(f: &GgufFile, arch: Arch) -> Result<OwnYarnKeys, ModelError> {
    let mut own = OwnYarnKeys {
        beta_fast: YarnParams::NONE.beta_fast,
        beta_slow: YarnParams::NONE.beta_slow,
        log_mul: 0.0,
    };
    if arch != Arch::Mistral3 {
        return Ok(own);
    }
    for (name, slot) in [
        ("rope.scaling.yarn_beta_fast", &mut own.beta_fast),
        ("rope.scaling.yarn_beta_slow", &mut own.beta_slow),
        ("rope.scaling.yarn_log_multiplier", &mut own.log_mul),
    ] {
        let key = f.arch_key(name);
        if let Some(v) = f.opt_f32(&key)? {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad_key(&key, v, "a non-negative number"));
            }
            *slot = v;
        }
    }
    Ok(own)
}

/// The reference context's `yarn_attn_factor` for a position scale, before the file's
/// attention factor multiplies it: `get_mscale(factor, 1)` (over `get_mscale(factor,
/// log_mul)` where the file gives a log multiplier) divided by the `1 + 0.1·ln(factor)` the
/// rotation multiplies back in, in f32 and in its order.
fn yarn_attn_factor(freq_scale: f32, log_mul: f32) -> f32 {
    let factor = 1.0 / freq_scale;
    let get_mscale = |mscale: f32| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * factor.ln() + 1.0
        }
    };
    let m = match log_mul {
        0.0 => get_mscale(1.0),
        all => get_mscale(1.0) / get_mscale(all),
    };
    m * (1.0 / (1.0 + 0.1 * factor.ln()))
}

fn missing(key: &str, kind: &str) -> ModelError {
    ModelError::BadConfig(format!(
        "RoPE scaling '{kind}' needs metadata key '{key}', which the file lacks"
    ))
}

fn bad_key(key: &str, value: f32, want: &str) -> ModelError {
    ModelError::BadConfig(format!("metadata key '{key}' = {value}: expected {want}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A YaRN factor of 1 changes no magnitude; larger factors cancel YaRN's own
    /// `1 + 0.1·ln(factor)` (up to rounding), as the reference's context does.
    #[test]
    fn yarn_attn_factor_cancels_the_rotation_magnitude() {
        assert_eq!(yarn_attn_factor(1.0, 0.0), 1.0);
        for factor in [2.0f32, 4.0, 8.0, 32.0] {
            let a = yarn_attn_factor(1.0 / factor, 0.0);
            assert!((a - 1.0).abs() < 1e-6, "{factor}: {a}");
            // A log multiplier of 1 (Ministral 3's `mscale_all_dim`) cancels `get_mscale`:
            // the rotation's magnitude is then 1 overall.
            let a = yarn_attn_factor(1.0 / factor, 1.0);
            let want = 1.0 / (1.0 + 0.1 * factor.ln());
            assert!((a - want).abs() < 1e-7, "{factor}: {a} vs {want}");
        }
    }
}
