//! Mixture-of-experts feed-forward: the hyper-parameters read from the `{arch}.expert_*` keys,
//! and the architectures built on it (`qwen3moe`, `qwen2moe`, `olmoe`; `gpt-oss` in
//! [`super::gpt_oss`]).
//!
//! A MoE layer replaces the dense feed-forward by `expert_count` small gated FFNs ("experts")
//! and a router `ffn_gate_inp` (`[expert_count, dim]`): each token's router logits are gated
//! (softmax or sigmoid), the `expert_used_count` largest picked, their weights optionally
//! renormalized to sum 1 and scaled, and the token's output is the weighted sum of the picked
//! experts' outputs, added in the order they were picked (largest first), as llama.cpp's
//! `build_moe_ffn` adds them. Qwen2-MoE adds a shared expert, a dense gated FFN whose output is
//! multiplied by `sigmoid(ffn_gate_inp_shexp · x)`.

use super::config::{Activation, Arch, ArchTraits, ModelConfig, NormKind, RopeKind};
use super::ModelError;
use crate::gguf::GgufFile;

/// The hyper-parameters, part of the model's configuration.
pub use super::config::{ClampedSwiglu, Gating, MoeConfig};

/// Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm), a routed MoE with renormalized
/// weights.
pub const QWEN3MOE: ArchTraits = ArchTraits {
    norm: NormKind::Rms,
    act: Activation::Silu,
    gated_ffn: true,
    rope: Some(RopeKind::Neox),
    fused_qkv: false,
    qk_norm: true,
    input_norms: true,
    post_norms: false,
    scale_embeddings: false,
    fused_gate_up: false,
    longrope: false,
};

/// Qwen2-MoE: Qwen2's attention (q/k/v biases), routed experts plus a gated shared expert.
pub const QWEN2MOE: ArchTraits = ArchTraits {
    qk_norm: false,
    ..QWEN3MOE
};

/// OLMoE: RMSNorm of the whole q and k vectors rather than per head ([`whole_qk_norm`]),
/// routed experts without renormalization.
pub const OLMOE: ArchTraits = QWEN3MOE;

/// The largest expert count kiln accepts (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;
/// The most experts a token may use (real models use 2 to 8).
pub const MAX_USED: usize = 64;

/// Read the `{arch}.expert_*` keys of a MoE architecture into `cfg.moe`.
pub fn configure(f: &GgufFile, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let arch = cfg.arch;
    let k = |s: &str| f.arch_key(s);
    let count_key = k("expert_count");
    let used_key = k("expert_used_count");
    let n_expert = f.get_u32(&count_key)? as usize;
    let n_used = f.get_u32(&used_key)? as usize;
    if n_expert == 0 || n_expert > MAX_EXPERTS {
        return Err(ModelError::BadConfig(format!(
            "'{count_key}' = {n_expert}: a mixture of experts needs 1 to {MAX_EXPERTS} experts"
        )));
    }
    if n_used == 0 || n_used > n_expert || n_used > MAX_USED {
        return Err(ModelError::BadConfig(format!(
            "'{used_key}' = {n_used}: each token must use 1 to '{count_key}' = {n_expert} \
             experts (at most {MAX_USED})"
        )));
    }
    // OLMoE's experts are `feed_forward_length` wide; the Qwen MoEs say so in their own key
    // (llama.cpp: else `feed_forward_length / expert_used_count`).
    let ffn_dim = match arch {
        Arch::Olmoe => cfg.ffn_dim,
        // gpt-oss: the reference requires the key.
        Arch::GptOss => f.get_u32(&k("expert_feed_forward_length"))? as usize,
        _ => match f.opt_u32(&k("expert_feed_forward_length"))? {
            Some(v) if v > 0 => v as usize,
            _ => cfg.ffn_dim / n_used,
        },
    };
    let shared_ffn_dim = match arch {
        Arch::Qwen2Moe => Some(match f.opt_u32(&k("expert_shared_feed_forward_length"))? {
            Some(v) if v > 0 => v as usize,
            _ => cfg.ffn_dim,
        }),
        _ => None,
    };
    let gating_key = k("expert_gating_func");
    let gating = match f.opt_u32(&gating_key)? {
        None | Some(0) | Some(1) => Gating::Softmax,
        Some(2) => Gating::Sigmoid,
        Some(3) if arch == Arch::GptOss => Gating::SoftmaxWeight,
        Some(v) => {
            return Err(ModelError::UnsupportedValue {
                key: gating_key,
                value: v.to_string(),
                supported: "1 (softmax), 2 (sigmoid)",
            })
        }
    };
    let groups_key = k("expert_group_count");
    if let Some(g) = f.opt_u32(&groups_key)?.filter(|&g| g > 1) {
        return Err(ModelError::UnsupportedValue {
            key: groups_key,
            value: g.to_string(),
            supported: "1 (no expert groups)",
        });
    }
    // gpt-oss: the reference's graph fixes the gating and leaves the weights unnormalized.
    let gating = if arch == Arch::GptOss {
        Gating::SoftmaxWeight
    } else {
        gating
    };
    let norm_weights = arch != Arch::GptOss
        && f.opt_bool(&k("expert_weights_norm"))?
            .unwrap_or(arch == Arch::Qwen3Moe);
    let weights_scale = f.opt_f32(&k("expert_weights_scale"))?.unwrap_or(0.0);
    if ffn_dim == 0 || ffn_dim > 1 << 22 {
        return Err(ModelError::BadConfig(format!(
            "expert feed-forward width {ffn_dim} (from '{}')",
            k("expert_feed_forward_length")
        )));
    }
    cfg.moe = Some(MoeConfig {
        n_expert,
        n_used,
        ffn_dim,
        shared_ffn_dim,
        norm_weights,
        weights_scale,
        gating,
        clamped_swiglu: (arch == Arch::GptOss).then_some(ClampedSwiglu::GPT_OSS),
    });
    Ok(())
}

/// Whether q and k are normalized as whole vectors (OLMoE's and OLMo-2's `attn_q_norm` is
/// `[q_dim]`) rather than head by head.
pub fn whole_qk_norm(cfg: &ModelConfig) -> bool {
    matches!(cfg.arch, Arch::Olmoe | Arch::Olmo2)
}

/// Whether a mixture's experts stay row-major in the file mapping rather than rearranged into
/// owned memory at load ([`super::weights::repacked_at_load`]): when the file is larger than
/// `memory_limit` bytes (unset: the system's available memory now). Rearranged experts are
/// faster to multiply but owned, so a file larger than memory would not fit; left in the
/// mapping, the row-major kernels multiply the same bits and the kernel pages each expert in
/// from disk when a token chooses it (and out again under pressure); or whatever the memory
/// with `no_repack` (llama.cpp's `--no-repack`). A file without 3-D expert tensors: never.
/// The loader and the memory plan both decide by this; the plan names the reason.
pub fn experts_in_place(
    f: &GgufFile,
    memory_limit: Option<u64>,
    no_repack: bool,
) -> Option<InPlace> {
    if !f.tensors().iter().any(|t| t.shape.len() == 3) {
        return None;
    }
    let file_bytes: u64 = f.part_sizes().iter().map(|&s| s as u64).sum();
    if exceeds(file_bytes, memory_limit.or_else(available_memory)) {
        Some(InPlace::OverLimit)
    } else {
        no_repack.then_some(InPlace::NoRepack)
    }
}

/// Why a mixture's experts stay in the file mapping ([`experts_in_place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// The file is larger than the memory limit.
    OverLimit,
    /// Asked for (`--no-repack`).
    NoRepack,
}

/// The rule of [`experts_in_place`]: a file of `file_bytes` against the memory it may take
/// (none known: it fits).
fn exceeds(file_bytes: u64, limit: Option<u64>) -> bool {
    limit.is_some_and(|m| file_bytes > m)
}

/// `MemAvailable` of `/proc/meminfo` in bytes: memory that can be taken without swapping,
/// the page cache's reclaimable part included (where the file's own pages may already be);
/// `None` where the system does not say (not Linux).
pub fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn experts_stay_in_place_only_past_the_limit() {
        assert!(!exceeds(100, Some(100)));
        assert!(exceeds(101, Some(100)));
        assert!(!exceeds(u64::MAX, None), "no known limit: rearrange");
        // The machine running the tests reports its available memory.
        if cfg!(target_os = "linux") {
            assert!(available_memory().is_some_and(|b| b > 0));
        }
    }
}
