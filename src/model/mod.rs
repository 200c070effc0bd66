//! Models: hyper-parameters, weights, and the forward pass.
//!
//! Each architecture is a short file saying how it differs ([`ArchTraits`] plus any metadata
//! of its own); they share one loader ([`weights`]) and one block implementation
//! ([`forward`]).

pub mod config;
pub mod forward;
pub mod moe;
pub mod weights;

mod bert;
pub mod classifier;
mod exaone;
mod gemma2;
mod gemma3;
mod gpt2;
mod gpt_oss;
mod granite;
mod llama;
mod mistral3;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen3;
pub mod rope_scaling;
mod smollm3;
#[cfg(test)]
mod test_header;

use std::path::Path;

pub use config::{Arch, ArchTraits, ModelConfig, NormKind};
pub use weights::{Layer, Norm, Qkv, Weights};

use crate::gguf::{GgufError, GgufFile};
use crate::kernels::ops::{Rope, YarnParams};
use crate::quant::GgmlType;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unknown architecture '{name}' (supported: {supported})")]
    UnknownArch { name: String, supported: String },
    #[error("tensor '{name}' is missing from the model file")]
    MissingTensor { name: String },
    #[error("tensor '{name}' ({ty}) has shape {found:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        ty: GgmlType,
    },
    #[error("tensor '{name}' has type {ty}, which kiln cannot compute with: {reason}")]
    UnsupportedType {
        name: String,
        ty: GgmlType,
        reason: String,
    },
    #[error("invalid model configuration: {0}")]
    BadConfig(String),
    #[error(
        "metadata key '{key}' = '{value}': kiln does not implement this RoPE scaling \
         (it implements: none, linear, yarn; longrope for phi3)"
    )]
    UnsupportedRopeScaling { key: String, value: String },
    #[error(
        "metadata key '{key}' = {value}: kiln does not implement this (it implements: {supported})"
    )]
    UnsupportedValue {
        key: String,
        value: String,
        supported: &'static str,
    },
}

/// A loaded model: configuration and weights (views into the mapped file).
pub struct Model {
    pub config: ModelConfig,
    pub traits: ArchTraits,
    pub weights: Weights,
    /// Multiplier applied to token embeddings (sqrt(dim) for Gemma, the file's for Granite,
    /// else 1).
    pub embed_scale: f32,
    /// The file; weights point into its mapping.
    pub file: GgufFile,
    /// A mixture's experts were left row-major in the file mapping (paged from disk as tokens
    /// choose them) rather than rearranged into owned memory: [`moe::experts_in_place`].
    pub experts_in_place: bool,
}

/// What loading may take.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Bytes of memory the model may hold (unset: the system's available memory when loading).
    /// A mixture of experts larger than this keeps its experts in the file mapping.
    pub memory_limit: Option<u64>,
    /// Leave a mixture's experts row-major in the file mapping whatever the memory (llama.cpp's
    /// `--no-repack`): the row-major kernels multiply the same bits.
    pub no_repack: bool,
}

impl Model {
    /// Map and load a GGUF model (every part of a split model, named by its first).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Model::load_with(path, LoadOptions::default())
    }

    /// [`Model::load`] within `opts`.
    pub fn load_with(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Model, ModelError> {
        Model::from_gguf_with(GgufFile::open_model(path, false)?, opts)
    }

    /// Build a model from a parsed file.
    pub fn from_gguf(file: GgufFile) -> Result<Model, ModelError> {
        Model::from_gguf_with(file, LoadOptions::default())
    }

    /// [`Model::from_gguf`] within `opts`.
    pub fn from_gguf_with(file: GgufFile, opts: LoadOptions) -> Result<Model, ModelError> {
        // One part of a split model parsed alone (not through `GgufFile::open_model`).
        let count = file.opt_u32(crate::gguf::split::SPLIT_COUNT)?.unwrap_or(1) as usize;
        if count > file.n_parts() {
            return Err(ModelError::UnsupportedValue {
                key: crate::gguf::split::SPLIT_COUNT.to_string(),
                value: count.to_string(),
                supported: "a model in one file, or a split model opened by its first part's path (every part is then mapped)",
            });
        }
        let (config, traits) = read_config(&file)?;
        let ropes = layer_ropes(&file, &config, &traits)?;
        let experts_in_place =
            moe::experts_in_place(&file, opts.memory_limit, opts.no_repack).is_some();
        let weights = weights::load(&file, &config, &traits, ropes, experts_in_place)?;
        if traits.act == config::Activation::GeluTanh {
            // Built now, not inside the first forward pass (decoding allocates nothing).
            crate::kernels::ops::gelu_table();
        }
        let embed_scale = if traits.scale_embeddings {
            (config.dim as f32).sqrt()
        } else {
            config.embed_scale.unwrap_or(1.0)
        };
        Ok(Model {
            config,
            traits,
            weights,
            embed_scale,
            file,
            experts_in_place,
        })
    }
}

impl Model {
    /// Bytes of weights one decoded token reads: every projection of every layer and the
    /// output head (the embedding lookup reads one row, negligible); of a mixture of experts,
    /// the router and `expert_used_count` experts (the average expert's size).
    pub fn weights_bytes_per_token(&self) -> usize {
        let w = &self.weights;
        let mut total = w.output.data.len();
        for l in &w.layers {
            let dense = [&l.ffn_gate, &l.ffn_up, &l.ffn_down];
            for lin in l
                .qkv
                .matrices()
                .into_iter()
                .chain(dense.into_iter().flatten())
            {
                total += lin.data.len();
            }
            total += l.wo.data.len();
            if let (Some(moe), Some(mc)) = (&l.moe, &self.config.moe) {
                let experts: usize = [&moe.gate, &moe.up, &moe.down]
                    .iter()
                    .flat_map(|v| v.iter())
                    .map(|e| e.data.len())
                    .sum();
                total += moe.router.data.len() + experts / mc.n_expert * mc.n_used;
                total += moe.shared_gate.as_ref().map_or(0, |g| g.data.len());
            }
        }
        total
    }
}

/// Hyper-parameters and block traits for the file's architecture.
pub fn read_config(f: &GgufFile) -> Result<(ModelConfig, ArchTraits), ModelError> {
    let name = f.architecture()?;
    let arch = Arch::from_name(name).ok_or_else(|| ModelError::UnknownArch {
        name: name.to_string(),
        supported: Arch::supported_list(),
    })?;
    let mut cfg = config::read_common(f, arch)?;
    let traits = match arch {
        Arch::Llama => {
            llama::configure(&mut cfg);
            llama::TRAITS
        }
        Arch::Qwen2 => {
            qwen2::configure(&mut cfg);
            qwen2::TRAITS
        }
        Arch::Qwen3 => {
            qwen3::configure(&mut cfg);
            qwen3::TRAITS
        }
        Arch::Gemma2 => {
            gemma2::configure(f, &mut cfg)?;
            gemma2::TRAITS
        }
        Arch::Gemma3 => {
            gemma3::configure(f, &mut cfg)?;
            gemma3::TRAITS
        }
        Arch::Granite => {
            granite::configure(f, &mut cfg)?;
            granite::TRAITS
        }
        Arch::Gpt2 => {
            gpt2::configure(&mut cfg);
            gpt2::TRAITS
        }
        Arch::Bert | Arch::NomicBert | Arch::JinaBertV2 => bert::configure(f, arch, &mut cfg)?,
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Olmoe => {
            moe::configure(f, &mut cfg)?;
            match arch {
                Arch::Qwen3Moe => moe::QWEN3MOE,
                Arch::Qwen2Moe => moe::QWEN2MOE,
                _ => moe::OLMOE,
            }
        }
        Arch::GptOss => {
            moe::configure(f, &mut cfg)?;
            gpt_oss::configure(f, &mut cfg)?;
            gpt_oss::TRAITS
        }
        Arch::Phi3 => {
            phi3::configure(&mut cfg);
            phi3::TRAITS
        }
        Arch::Smollm3 => {
            smollm3::configure(&mut cfg);
            smollm3::TRAITS
        }
        // (Its temperature reads YaRN's context: configured below.)
        Arch::Mistral3 => mistral3::TRAITS,
        Arch::Olmo2 => {
            olmo2::configure(f, &mut cfg)?;
            olmo2::TRAITS
        }
        Arch::Exaone => {
            exaone::configure(f, &cfg)?;
            exaone::TRAITS
        }
        Arch::Exaone4 => {
            exaone::configure4(f, &cfg)?;
            exaone::TRAITS4
        }
    };
    rope_scaling::read(f, &mut cfg, traits.longrope)?;
    if arch == Arch::Mistral3 {
        mistral3::configure(f, &mut cfg)?;
    }
    validate(&cfg)?;
    Ok((cfg, traits))
}

fn validate(c: &ModelConfig) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::BadConfig(m));
    if c.n_layers == 0 || c.dim == 0 || c.n_heads == 0 || c.n_kv_heads == 0 || c.head_dim_k == 0 {
        return bad(format!(
            "zero-sized model: {} layers, dim {}, {} heads, {} kv heads, head dim {}",
            c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim_k
        ));
    }
    if !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return bad(format!(
            "{} heads is not a multiple of {} kv heads",
            c.n_heads, c.n_kv_heads
        ));
    }
    if c.rope_dims > c.head_dim_k || !c.rope_dims.is_multiple_of(2) {
        return bad(format!(
            "rope dimension {} does not fit head dimension {}",
            c.rope_dims, c.head_dim_k
        ));
    }
    if c.vocab_size == 0 {
        return bad("empty vocabulary".into());
    }
    if c.n_layers > 4096 || c.dim > 1 << 20 || c.ffn_dim > 1 << 22 || c.n_heads > 4096 {
        return bad(format!(
            "implausible sizes: {} layers, dim {}, ffn {}",
            c.n_layers, c.dim, c.ffn_dim
        ));
    }
    Ok(())
}

/// Each layer's rotary parameters (local layers may use another base).
fn layer_ropes(
    f: &GgufFile,
    c: &ModelConfig,
    t: &ArchTraits,
) -> Result<Vec<Option<Rope>>, ModelError> {
    let Some(kind) = t.rope else {
        return Ok(vec![None; c.n_layers]);
    };
    let loader = weights::Loader {
        file: f,
        norm_kind: t.norm,
        eps: c.norm_eps,
    };
    // Llama-3's `rope_freqs`; else LongRoPE's long factors where the context passes the
    // original one (the reference's `get_rope_factors` at its default context, the trained
    // one), its short ones otherwise.
    let long = c.ctx_train > c.rope_yarn.n_ctx_orig;
    let name = match f.tensor_info(weights::names::ROPE_FREQS) {
        Some(_) => Some(weights::names::ROPE_FREQS),
        None if t.longrope && long => Some(weights::names::ROPE_FACTORS_LONG),
        None if t.longrope => Some(weights::names::ROPE_FACTORS_SHORT),
        None => None,
    };
    let freq_factors = match name {
        Some(n) if f.tensor_info(n).is_some() => {
            let v = loader.vector(n, c.rope_dims / 2)?;
            if let Some(bad) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                return Err(ModelError::BadConfig(format!(
                    "tensor '{n}' holds {bad}: RoPE frequency factors must be positive"
                )));
            }
            Some(v)
        }
        _ => None,
    };
    Ok((0..c.n_layers)
        .map(|i| {
            if c.no_rope_layers[i] {
                return None;
            }
            // Local layers have their own base and no position scaling (gpt-oss's keep the
            // full layers' scaling; OLMo 3's share the base and drop YaRN as well).
            if c.arch == Arch::Olmo2 && c.swa_layers[i] {
                return Some(
                    Rope::new(kind, c.rope_dims, c.rope_base, 1.0, None)
                        .with_yarn(&YarnParams::NONE),
                );
            }
            let (base, scale) = match (c.swa_layers[i], c.rope_base_swa) {
                (true, Some(b)) if c.arch == Arch::GptOss => (b, c.rope_freq_scale),
                (true, Some(b)) => (b, 1.0),
                _ => (c.rope_base, c.rope_freq_scale),
            };
            Some(
                Rope::new(kind, c.rope_dims, base, scale, freq_factors.clone())
                    .with_yarn(&c.rope_yarn),
            )
        })
        .collect())
}
