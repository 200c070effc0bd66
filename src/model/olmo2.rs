//! OLMo-2 (`olmo2`): blocks without input norms — attention reads the residual stream itself,
//! its q and k projections are RMS-normalized as whole vectors (`attn_q_norm` `[heads ×
//! head_dim]`, `attn_k_norm` `[kv heads × head_dim]`) before NeoX RoPE, and its output is
//! RMS-normalized (`post_attention_norm`) before the residual add; the FFN (SwiGLU) likewise
//! reads the stream and is normalized after (`post_ffw_norm`). The output head is required
//! (never tied), as the reference requires it.
//!
//! OLMo 3 is converted under this name: with `attention.sliding_window` > 0 the layers attend
//! through that window but every `attention.sliding_window_pattern`-th one (4 by default), and
//! the local layers rotate with plain RoPE (the file's YaRN or linear scaling for the global
//! layers only, one RoPE base for both), as the reference's graph does.

use super::config::{ArchTraits, ModelConfig};
use super::weights::names;
use super::ModelError;
use crate::gguf::GgufFile;

pub const TRAITS: ArchTraits = ArchTraits {
    input_norms: false,
    post_norms: true,
    ..super::qwen3::TRAITS
};

/// OLMo 3's default period of local layers.
const SWA_PATTERN: u32 = 4;

pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    // (0, or no key: no sliding window, as the reference reads it.)
    if let Some(w) = f.opt_u32(&f.arch_key("attention.sliding_window"))? {
        if w > 0 {
            cfg.sliding_window = Some(w as usize);
            cfg.swa_layers = super::gemma2::swa_layers(f, cfg.n_layers, SWA_PATTERN)?;
        }
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
