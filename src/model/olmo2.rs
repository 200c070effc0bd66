//! OLMo-2 (`olmo2`): blocks without input norms — attention reads the residual stream itself,
//! its q and k projections are RMS-normalized as whole vectors (`attn_q_norm` `[heads ×
//! head_dim]`, `attn_k_norm` `[kv heads × head_dim]`) before NeoX RoPE, and its output is
//! RMS-normalized (`post_attention_norm`) before the residual add; the FFN (SwiGLU) likewise
//! reads the stream and is normalized after (`post_ffw_norm`). The output head is required
//! (never tied), as the reference requires it.
//!
//! The reference also runs OLMo 3 under this name: with `attention.sliding_window` > 0 every
//! fourth layer is global and the local ones drop YaRN; kiln refuses that key by name.

use super::config::{ArchTraits, ModelConfig};
use super::weights::names;
use super::ModelError;
use crate::gguf::GgufFile;

pub const TRAITS: ArchTraits = ArchTraits {
    input_norms: false,
    post_norms: true,
    ..super::qwen3::TRAITS
};

pub fn configure(f: &GgufFile, cfg: &ModelConfig) -> Result<(), ModelError> {
    let key = f.arch_key("attention.sliding_window");
    if let Some(w) = f.opt_u32(&key)?.filter(|&w| w > 0) {
        return Err(ModelError::UnsupportedValue {
            key,
            value: w.to_string(),
            supported: "olmo2 without sliding-window layers (not OLMo 3's)",
        });
    }
    if f.tensor_info(names::OUTPUT).is_none() {
        return Err(ModelError::MissingTensor {
            name: names::OUTPUT.to_string(),
        });
    }
    refuse_biases(f, cfg, &["attn_output", "ffn_gate", "ffn_up", "ffn_down"])
}

/// Refuse a bias of any layer's `parts` (`blk.N.{part}.bias`), which the reference's graph of
/// this architecture does not add and kiln's projections would.
pub(super) fn refuse_biases(
    f: &GgufFile,
    cfg: &ModelConfig,
    parts: &[&str],
) -> Result<(), ModelError> {
    for i in 0..cfg.n_layers {
        for part in parts {
            let name = names::blk(i, &format!("{part}.bias"));
            if f.tensor_info(&name).is_some() {
                return Err(ModelError::BadConfig(format!(
                    "tensor '{name}': {}'s blocks have no such bias",
                    cfg.arch_name
                )));
            }
        }
    }
    Ok(())
}
