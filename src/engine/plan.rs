//! The memory plan: every byte a session will hold, computed from the file's header before any
//! weight is loaded, with the same functions the session allocates with (one source of truth).

use super::session::{kv_layout, scratch_spec_for, SessionOptions};
use crate::cache::Scratch;
use crate::gguf::GgufFile;
use crate::model::{read_config, ModelError};

/// One line of the plan.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Component {
    pub name: &'static str,
    pub bytes: u64,
    /// Of `bytes`, how much is a read-only mapping of the model file (page cache, shared and
    /// evictable) rather than memory the process owns.
    pub mapped: bool,
    pub formula: String,
}

/// What a session with given options will use.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryPlan {
    pub components: Vec<Component>,
    pub total_bytes: u64,
}

impl MemoryPlan {
    pub fn get(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }
}

/// Plan a session over `file` sized by `opts`. `tokenizer_bytes` and `runtime_bytes` are
/// supplied by the caller (the tokenizer's tables and the process's own baseline).
pub fn plan(
    file: &GgufFile,
    opts: &SessionOptions,
    tokenizer_bytes: u64,
    runtime_bytes: u64,
) -> Result<MemoryPlan, ModelError> {
    let (c, _) = read_config(file)?;
    let mapped: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2)
        .map(|t| t.n_bytes as u64)
        .sum();
    let owned: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.shape.len() < 2)
        .map(|t| t.n_elements as u64 * 4)
        .sum();
    let kv = kv_layout(&c, opts.n_ctx.max(1));
    let spec = scratch_spec_for(file, opts);
    let scratch = Scratch::bytes_for(&c, spec) as u64;
    let logits = (spec.logit_rows.max(1) * c.vocab_size * 4) as u64;
    let components = vec![
        Component {
            name: "weights (mapped)",
            bytes: mapped,
            mapped: true,
            formula: "Σ bytes of the 2-D tensors, read in place from the file mapping".into(),
        },
        Component {
            name: "weights (f32 copies)",
            bytes: owned,
            mapped: false,
            formula: "Σ elements of the 1-D tensors (norms, biases) × 4".into(),
        },
        Component {
            name: "KV cache",
            bytes: kv.bytes() as u64,
            mapped: false,
            formula: format!(
                "{} layers × {} kv heads × {} positions × ({} + {}) dims × 2 bytes (f16)",
                kv.n_layers, kv.n_kv_heads, kv.max_len, kv.head_dim_k, kv.head_dim_v
            ),
        },
        Component {
            name: "scratch (activations)",
            bytes: scratch - logits,
            mapped: false,
            formula: format!(
                "chunk {} × (named buffers of widths dim/q/kv/ffn) × 4 + attention and matmul tiles for {} threads",
                spec.max_tokens, spec.n_threads
            ),
        },
        Component {
            name: "logits",
            bytes: logits,
            mapped: false,
            formula: format!("{} rows × {} vocab × 4", spec.logit_rows.max(1), c.vocab_size),
        },
        Component {
            name: "tokenizer tables",
            bytes: tokenizer_bytes,
            mapped: false,
            formula: "vocabulary, merges and lookup tables built from the metadata".into(),
        },
        Component {
            name: "runtime",
            bytes: runtime_bytes,
            mapped: false,
            formula: "resident memory of the process before loading (binary, libraries, allocator)".into(),
        },
    ];
    let total_bytes = components.iter().map(|c| c.bytes).sum();
    Ok(MemoryPlan {
        components,
        total_bytes,
    })
}
