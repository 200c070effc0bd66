//! The memory plan: every byte the engine will hold, computed from the file's header before any
//! weight is loaded, with the same functions its runner allocates with (one source of truth).

use super::session::{kv_layout, scratch_spec_for, SessionOptions};
use crate::cache::{KvBudgetError, KvLayout, KvType, KvTypeError, Scratch};
use crate::gguf::GgufFile;
use crate::kernels::ops::{Activation, GELU_TABLE_LEN};
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

/// What the engine with given options will use.
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

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    KvType(#[from] KvTypeError),
    #[error(transparent)]
    KvBudget(#[from] KvBudgetError),
    #[error("context size {ctx} exceeds what this model supports ({max} positions, its training context); lower --ctx")]
    ContextTooLarge { ctx: usize, max: usize },
}

/// Bytes glibc's `malloc` takes from the system for a request of `n` bytes: a chunk with an
/// 8-byte header rounded up to 16 (32 at least); requests at or above the mmap threshold
/// (128 KiB) get their own page-rounded mapping.
pub fn malloc_bytes(n: usize) -> usize {
    const MMAP_THRESHOLD: usize = 128 * 1024;
    if n == 0 {
        0
    } else if n >= MMAP_THRESHOLD {
        (n + 16).next_multiple_of(4096)
    } else {
        (n + 8).next_multiple_of(16).max(32)
    }
}

/// Terms the caller measures or builds before planning (all zero in tests that compare the
/// formulas with a session's allocations).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostTerms {
    /// Heap of the tokenizer built from the file's metadata ([`crate::tokenizer::Tokenizer::heap_bytes`]).
    pub tokenizer_bytes: u64,
    /// Resident memory of the process before it opens the model (binary, libraries, allocator).
    pub runtime_bytes: u64,
    /// The memory the model may take (`kiln plan --budget`; unset: the system's available
    /// memory), which decides whether a mixture's experts are rearranged or paged from disk
    /// ([`crate::model::moe::experts_in_place`], as the loader decides).
    pub memory_limit: Option<u64>,
    /// `--no-repack`: a mixture's experts stay row-major in the mapping whatever the memory
    /// ([`crate::model::LoadOptions::no_repack`]).
    pub no_repack: bool,
}

/// Code pages and thread stacks a running session touches beyond what a fresh process has
/// resident: the kernels, the tokenizer and generation loop, one stack per pool thread.
/// Measured, not derived: file-backed RSS of `kiln run` minus the model file and the
/// pre-load baseline was 1.3–1.6 MiB for both real models at 1–2 threads.
pub const CODE_TOUCHED_BYTES: u64 = 3 << 19;
/// Stack touched by each worker thread of the pool: the kernels keep their tiles in the
/// scratch, except the repacked-group kernels' decoded weights of a prompt batch
/// ([`crate::quant::GROUP_KERNEL_STACK_BYTES`]).
pub const THREAD_STACK_BYTES: u64 = (64 << 10) + crate::quant::GROUP_KERNEL_STACK_BYTES as u64;

/// Plan the engine over `file` sized by `opts`: its batch runner of `parallel` sequences (one:
/// the command line's engine; more: a server's), each with its own KV cache, token history,
/// sampler and logits row, sharing the scratch of one forward pass with a row per sequence
/// beside the chunk. (Speculative decoding's rows come on top: `kiln plan` adds them.)
pub fn plan(
    file: &GgufFile,
    opts: &SessionOptions,
    parallel: usize,
    host: HostTerms,
) -> Result<MemoryPlan, PlanError> {
    plan_runner(file, opts, parallel, 0, host)
}

/// Plan the runner `kiln perplexity` scores with ([`crate::engine::perplexity::scoring_options`]):
/// one slot sized by `opts`, its output head computing
/// [`SCORE_ROWS`](crate::engine::perplexity::SCORE_ROWS) logits rows at a time, and a line
/// ([`SCORES`]) for the log-probabilities of a prefill chunk (the runner's, and the engine's
/// two outboxes') and the chunk of tokens and log-probabilities the perplexity loop keeps.
pub fn scoring_plan(
    file: &GgufFile,
    opts: &SessionOptions,
    host: HostTerms,
) -> Result<MemoryPlan, PlanError> {
    let rows = crate::engine::perplexity::SCORE_ROWS;
    let mut p = plan_runner(file, opts, 1, rows, host)?;
    let n_ctx = opts.n_ctx.max(1);
    let chunk = opts.prefill_chunk.clamp(1, n_ctx);
    // Per scored row of a step: the next token (u32) and its log-probability (f64 bits) in
    // the runner, and the log-probability in each of the engine's two outboxes.
    let bytes = (malloc_bytes(chunk * 4)
        + malloc_bytes(chunk * 8) * 3
        + malloc_bytes(n_ctx * 4)
        + malloc_bytes(n_ctx * 8)) as u64;
    p.components.push(Component {
        name: SCORES,
        bytes,
        mapped: false,
        formula: format!(
            "{chunk} scored rows × (4 next token + 8 log-probability + 2 × 8 in the engine's \
             outboxes) + a chunk of {n_ctx} positions × (4 token id + 8 log-probability)"
        ),
    });
    p.total_bytes += bytes;
    Ok(p)
}

/// The scoring runner's line ([`scoring_plan`]).
pub const SCORES: &str = "scores";

/// [`plan`] for a runner whose output head computes `score_rows` logits rows at a time where
/// that is more than its slots' (a scoring runner: [`crate::engine::batch::CacheOptions::score_rows`]).
fn plan_runner(
    file: &GgufFile,
    opts: &SessionOptions,
    parallel: usize,
    score_rows: usize,
    host: HostTerms,
) -> Result<MemoryPlan, PlanError> {
    let (c, traits) = read_config(file)?;
    check_ctx(&c, opts)?;
    opts.kv_type.check_head_dim(c.head_dim_k)?;
    opts.kv_type.check_head_dim(c.head_dim_v)?;
    let parallel = parallel.max(1) as u64;
    let tensors = file.tensors();
    // Matrices (and stacks of experts) are multiplied; every vector is copied out as f32,
    // gpt-oss's 2-D expert biases `[width, n_expert]` as one vector per expert.
    let is_matrix = |t: &&crate::gguf::TensorInfo| t.shape.len() >= 2 && !t.name.ends_with(".bias");
    use crate::model::moe::{experts_in_place, InPlace};
    let in_place_why = experts_in_place(file, host.memory_limit, host.no_repack);
    let experts_paged = in_place_why.is_some();
    let (repacked, in_place): (Vec<_>, Vec<_>) = tensors
        .iter()
        .filter(is_matrix)
        .partition(|t| crate::model::weights::repacked_at_load(file, t, experts_paged));
    // Experts left in the mapping because the file exceeds the memory limit: a line of their
    // own, so the plan says they are paged from disk.
    let (paged, in_place): (Vec<_>, Vec<_>) = in_place
        .into_iter()
        .partition(|t| experts_paged && t.shape.len() == 3);
    // An untied token-embedding table read in place: a lookup reads one row a token, so a run
    // keeps resident the rows of the tokens it has seen, not the table (a line of its own).
    let (table, in_place): (Vec<_>, Vec<_>) = in_place
        .into_iter()
        .partition(|t| is_token_table(file, &c, t));
    let bytes_of = |ts: &[&crate::gguf::TensorInfo]| ts.iter().map(|t| t.n_bytes as u64).sum();
    // A rearranged tensor is one allocation of its size; a 3-D stack of experts, one per
    // expert.
    let owned_2d: u64 = repacked
        .iter()
        .map(|t| match t.shape.get(2) {
            Some(&n) if n > 0 => (n * malloc_bytes(t.n_bytes / n)) as u64,
            _ => malloc_bytes(t.n_bytes) as u64,
        })
        .sum();
    let n_experts = |ts: &[&crate::gguf::TensorInfo]| -> usize {
        ts.iter().filter_map(|t| t.shape.get(2)).sum()
    };
    let mapped: u64 = bytes_of(&in_place);
    let paged_bytes: u64 = bytes_of(&paged);
    let table_bytes: u64 = bytes_of(&table);
    let seen = (opts.n_ctx.max(1) as u64 * parallel).min(c.vocab_size as u64);
    // A rearranged tensor's file pages are released once copied, all but the partial pages at
    // its two ends (`TensorBytes::release`), which stay resident with the rest of the file.
    let released: u64 = repacked
        .iter()
        .map(|t| {
            let start = file.tensor_file_offset(t);
            crate::gguf::whole_pages(start..start + t.n_bytes).len() as u64
        })
        .sum();
    let file_pages: u64 = file
        .part_sizes()
        .iter()
        .map(|&s| s.next_multiple_of(crate::gguf::PAGE) as u64)
        .sum();
    let file_rest = file_pages.saturating_sub(mapped + paged_bytes + table_bytes + released);
    let small: Vec<_> = tensors.iter().filter(|t| !is_matrix(t)).collect();
    let owned: u64 = small
        .iter()
        .map(|t| match t.shape[..] {
            [width, n, ..] => (n * malloc_bytes(width * 4)) as u64,
            _ => malloc_bytes(t.n_elements * 4) as u64,
        })
        .sum();
    let header_heap = file.heap_bytes(&malloc_bytes) as u64;
    let kv = kv_layout(&c, opts);
    let ring = kv.offload_ring(opts.kv_type, opts.kv_budget)?;
    // The batch runner: its pass carries a row per sequence beside the chunk, and it keeps
    // each sequence's logits row beside the scratch's.
    let runner_rows = parallel as usize;
    let o = crate::engine::batch::runner_session_options(opts, runner_rows, 0, score_rows);
    let spec = scratch_spec_for(file, &o);
    let scratch = Scratch::bytes_for(&c, spec) as u64;
    let logit_rows = spec.logit_rows.max(1) + runner_rows;
    let logits = (logit_rows * c.vocab_size * 4) as u64;
    let scratch_logits = (spec.logit_rows.max(1) * c.vocab_size * 4) as u64;
    let per_seq = (malloc_bytes(c.vocab_size * 8)
        + malloc_bytes(c.vocab_size * 4) * 2
        + malloc_bytes(opts.n_ctx.max(1) * 4)) as u64;
    let mut components = vec![
        Component {
            name: "weights (mapped)",
            bytes: mapped,
            mapped: true,
            formula: format!(
                "Σ bytes of the {} 2-D tensors read in place from the file mapping; \
                 all resident once a token has passed (each is read per token){}",
                in_place.len(),
                match n_experts(&in_place) {
                    0 => String::new(),
                    n => format!(
                        "; {n} experts among them (3-D tensors), each resident once a token \
                         has chosen it, paged from disk when the file exceeds free memory"
                    ),
                }
            ),
        },
        Component {
            name: "weights (repacked)",
            bytes: owned_2d,
            mapped: false,
            formula: format!(
                "Σ bytes of the {} 2-D tensors rearranged at load for this CPU's kernels \
                 (same size, one allocation each; the file's pages are released){}",
                repacked.len(),
                match n_experts(&repacked) {
                    0 => String::new(),
                    n => format!("; {n} experts among them, one allocation per expert"),
                }
            ),
        },
        Component {
            name: "header (mapped)",
            bytes: file_rest,
            mapped: true,
            formula: format!(
                "file pages − 2-D tensors read in place − the whole pages inside the rearranged \
                 ones: header, metadata, {} vectors and the rearranged tensors' end pages, \
                 paged in at load",
                small.len()
            ),
        },
        Component {
            name: "weights (f32 copies)",
            bytes: owned,
            mapped: false,
            formula: format!(
                "{} 1-D tensors (norms, biases) × elements × 4, each one allocation (a 2-D \
                 expert bias, one per expert)",
                small.len()
            ),
        },
        Component {
            name: "GGUF metadata (parsed)",
            bytes: header_heap,
            mapped: false,
            formula: format!(
                "{} key/value pairs and {} tensor infos held by the parsed file (strings, arrays, indexes), malloc chunks",
                file.metadata().len(),
                tensors.len()
            ),
        },
        Component {
            name: "KV cache",
            bytes: match ring {
                None => kv.bytes_as(opts.kv_type),
                Some(r) => r * kv.layer_kv_bytes(opts.kv_type) + kv.ring_kv_bytes(opts.kv_type),
            } as u64
                * parallel,
            mapped: false,
            formula: kv_formula(&kv, opts.kv_type, ring, parallel),
        },
        Component {
            name: "scratch (activations)",
            bytes: scratch - scratch_logits,
            mapped: false,
            formula: format!(
                "{} rows × (named buffers of widths dim/q/kv/ffn) × 4 + attention and matmul tiles for {} threads{}",
                spec.max_tokens,
                spec.n_threads,
                match &c.moe {
                    None => String::new(),
                    Some(m) => format!(
                        " + routing ({} rows × {} experts) and {} rows × {} chosen experts × \
                         (dim + 2 × {} expert ffn) × 4 + their quantized inputs",
                        spec.max_tokens, m.n_expert, spec.max_tokens, m.n_used, m.ffn_dim
                    ),
                }
            ),
        },
        Component {
            name: "logits",
            bytes: logits,
            mapped: false,
            formula: format!(
                "({} output head rows + {runner_rows} seq × 1 row) × {} vocab × 4",
                spec.logit_rows.max(1),
                c.vocab_size
            ),
        },
        Component {
            name: "sampler and history",
            bytes: per_seq * parallel,
            mapped: false,
            formula: format!(
                "{parallel} seq × ({} vocab × (8 + 4 + 4) candidate/probability/count + {} positions × 4 token ids)",
                c.vocab_size,
                opts.n_ctx.max(1)
            ),
        },
        Component {
            name: "activation table",
            bytes: match traits.act {
                Activation::GeluTanh => malloc_bytes(GELU_TABLE_LEN * 2) as u64,
                Activation::Silu => 0,
            },
            mapped: false,
            formula: "GELU models: one f16 GELU value per f16 input (the reference's table)".into(),
        },
        Component {
            name: "tokenizer tables",
            bytes: host.tokenizer_bytes,
            mapped: false,
            formula: "vocabulary, merges and lookup tables built from the metadata".into(),
        },
        Component {
            name: "runtime",
            bytes: host.runtime_bytes
                + CODE_TOUCHED_BYTES
                + THREAD_STACK_BYTES * (spec.n_threads.saturating_sub(1) + ring.is_some() as usize) as u64,
            mapped: false,
            formula: format!(
                "resident before loading ({:.2} MiB: binary, libraries) + {:.2} MiB code touched by inference + {} worker stacks × {} KiB",
                host.runtime_bytes as f64 / (1u64 << 20) as f64,
                CODE_TOUCHED_BYTES as f64 / (1u64 << 20) as f64,
                spec.n_threads.saturating_sub(1) + ring.is_some() as usize,
                THREAD_STACK_BYTES >> 10
            ),
        },
    ];
    if let Some(t) = table.first() {
        let row = (t.n_bytes / c.vocab_size.max(1)) as u64;
        components.insert(
            1,
            Component {
                name: TOKEN_TABLE,
                bytes: token_table_resident(table_bytes, row, seen),
                mapped: true,
                formula: format!(
                    "the untied token-embedding table ({:.2} MiB, {} rows of {row} bytes) read in \
                     place a row per token: the rows of at most {seen} distinct tokens ({} seq × \
                     {} positions, at most the vocabulary), each its pages ({} of {} bytes at most), \
                     at most the table",
                    table_bytes as f64 / (1u64 << 20) as f64,
                    c.vocab_size,
                    parallel,
                    opts.n_ctx.max(1),
                    row_pages(row),
                    crate::gguf::PAGE
                ),
            },
        );
    }
    if experts_paged {
        let file_bytes: u64 = file.part_sizes().iter().map(|&s| s as u64).sum();
        components.insert(
            1,
            Component {
                name: EXPERTS_PAGED,
                bytes: paged_bytes,
                mapped: true,
                formula: format!(
                    "Σ bytes of the {} expert tensors ({} experts), row-major in the file mapping: \
                     {}, so the experts are paged from disk as tokens choose them (resident at \
                     most this much)",
                    paged.len(),
                    n_experts(&paged),
                    if in_place_why == Some(InPlace::OverLimit) {
                        format!(
                            "the file ({:.2} MiB) exceeds the memory limit{}",
                            file_bytes as f64 / (1u64 << 20) as f64,
                            host.memory_limit.map_or(
                                " (available memory)".to_string(),
                                |m| format!(" of {:.2} MiB", m as f64 / (1u64 << 20) as f64)
                            )
                        )
                    } else {
                        "--no-repack".to_string()
                    }
                ),
            },
        );
    }
    let total_bytes = components.iter().map(|c| c.bytes).sum();
    Ok(MemoryPlan {
        components,
        total_bytes,
    })
}

/// The plan's line for an untied token-embedding table read in place ([`token_table_resident`]).
pub const TOKEN_TABLE: &str = "token embeddings (mapped)";

/// Whether `t` is a token-embedding table that a run reads a row per token from the file
/// mapping: an untied one (the output head is a matrix of its own), or an encoder's, that the
/// loader leaves in place ([`crate::model::weights::repacked_at_load`]). A tied table is the
/// output head, read whole for every token's logits.
fn is_token_table(
    file: &GgufFile,
    c: &crate::model::ModelConfig,
    t: &crate::gguf::TensorInfo,
) -> bool {
    use crate::model::weights::names;
    t.name == names::TOKEN_EMBD
        && (file.tensor_info(names::OUTPUT).is_some() || c.arch.is_encoder())
}

/// Pages a row of `row` bytes at any offset of the file lies on, at most.
fn row_pages(row: u64) -> u64 {
    row.div_ceil(crate::gguf::PAGE as u64) + 1
}

/// What a run keeps resident of a token-embedding table of `table` bytes read in place, with
/// rows of `row` bytes, after looking up `tokens` distinct tokens: each token's row, on at
/// most [`row_pages`] pages, and never more than the table. (Neighbouring pages the kernel
/// maps with a faulting one where they are in the page cache are not counted.)
pub fn token_table_resident(table: u64, row: u64, tokens: u64) -> u64 {
    (tokens * row_pages(row) * crate::gguf::PAGE as u64).min(table)
}

/// The plan's line for a mixture's experts left in the file mapping when the file exceeds the
/// memory limit ([`crate::model::moe::experts_in_place`]).
pub const EXPERTS_PAGED: &str = "experts (paged from disk)";

/// The device plan's component for an offloaded KV cache's host memory.
pub const HOST_KV: &str = "kv cache (pinned host)";

/// How the KV cache line is computed: full layers × context, sliding-window layers × their
/// ring, and the offload ring where the cache streams from a file.
fn kv_formula(kv: &KvLayout, ty: KvType, offload: Option<usize>, parallel: u64) -> String {
    let dims = match ty {
        KvType::F16 => format!(
            "({} + {}) dims × 2 bytes (f16)",
            kv.head_dim_k, kv.head_dim_v
        ),
        KvType::Q8_0 => format!(
            "({} + {}) dims / 32 × 34 bytes (q8_0)",
            kv.head_dim_k, kv.head_dim_v
        ),
    };
    let heads = kv.n_kv_heads;
    let full = kv.n_full_layers();
    let rings = match &kv.window {
        None => String::new(),
        Some(w) => format!(
            " + {} sliding-window layers × ring of {} positions (window {} + {} tokens per pass − 1, \
             rounded up to 64; {:.1} MiB)",
            kv.n_ring_layers(),
            w.rows,
            w.window,
            w.max_tokens,
            kv.ring_kv_bytes(ty) as f64 / (1u64 << 20) as f64
        ),
    };
    match offload {
        None => format!(
            "{parallel} seq × ({full} layers × {} positions{rings}) × {heads} kv heads × {dims}",
            kv.max_len
        ),
        Some(r) => format!(
            "{parallel} seq × (ring of {r} layer buffers × {} positions{rings}) × {heads} kv heads \
             × {dims} ({} bytes each); all {full} full layers ({:.1} MiB) in a file streamed by a \
             background thread",
            kv.max_len,
            kv.layer_kv_bytes(ty),
            (full * kv.layer_kv_bytes(ty)) as f64 / (1u64 << 20) as f64
        ),
    }
}

/// Refuse a context past the model's training context (as a session does).
fn check_ctx(c: &crate::model::ModelConfig, opts: &SessionOptions) -> Result<(), PlanError> {
    if c.ctx_train > 0 && opts.n_ctx > c.ctx_train {
        return Err(PlanError::ContextTooLarge {
            ctx: opts.n_ctx,
            max: c.ctx_train,
        });
    }
    Ok(())
}

/// What the engine on the GPU will hold in device memory, from the file's header: the weights
/// as [`crate::backend::cuda::DeviceWeights::upload`] lays them out, and the activation and
/// KV-cache allocations as [`crate::backend::cuda::CudaSession::new`] makes them (the same
/// layout functions), for the engine's batch runner ([`crate::engine::batch::BatchRunner`]) of
/// `parallel` sequences (one: the command line's): that many KV slots, and rows for a prefill
/// chunk beside a decode token and `draft_max` verification rows per slot (the drafts the
/// runner keeps: [`crate::engine::batch::drafts_kept`]). The driver's own context memory is
/// not included.
pub fn device_plan(
    file: &GgufFile,
    opts: &SessionOptions,
    parallel: usize,
    draft_max: usize,
) -> Result<MemoryPlan, PlanError> {
    use crate::backend::cuda::step::SessionLayout;
    let (c, traits) = read_config(file)?;
    check_ctx(&c, opts)?;
    opts.kv_type.check_head_dim(c.head_dim_k)?;
    opts.kv_type.check_head_dim(c.head_dim_v)?;
    let slots = parallel.max(1);
    // (Rings are sized for one sequence's chunk, before a runner adds a row per slot.)
    let kv = crate::engine::session::kv_layout(&c, opts);
    let opts = crate::engine::batch::runner_session_options(opts, slots, draft_max, 0);
    let spec = scratch_spec_for(file, &opts);
    let ring = kv.offload_ring(opts.kv_type, opts.kv_budget)?;
    let exec = crate::engine::session::exec_spec_with(&opts, slots, kv.clone(), spec);
    let sizes = crate::backend::cuda::exec::cuda_sizes(&exec, ring);
    let l = SessionLayout::new(&c, traits.fused_qkv, sizes, &kv);
    let rings = match kv.window.as_ref() {
        Some(w) => format!(" + {} rings × {}", kv.n_ring_layers(), w.rows),
        None => String::new(),
    };
    let whole = format!(
        "{slots} seq × ({} layers × {} ctx{rings}) × {} kv heads × ({} + {}) B ({} rows of {} + {} dims)",
        kv.n_full_layers(),
        sizes.n_ctx,
        c.n_kv_heads,
        opts.kv_type.row_bytes(c.head_dim_k),
        opts.kv_type.row_bytes(c.head_dim_v),
        opts.kv_type.name(),
        c.head_dim_k,
        c.head_dim_v
    );
    let weights = crate::backend::cuda::weights::planned_bytes(file) as u64;
    let components = vec![
        Component {
            name: "weights (device)",
            bytes: weights,
            mapped: false,
            formula: "every matrix as stored, vectors as f32, 256-byte aligned".into(),
        },
        Component {
            name: "kv cache (device)",
            bytes: l.kv_bytes as u64,
            mapped: false,
            formula: match l.ring {
                None => whole,
                Some(r) => format!(
                    "a ring of {} layer slots × {} B (a layer's keys and values; --kv-budget){}",
                    r.layers,
                    r.slot_bytes,
                    match rings.is_empty() {
                        true => rings,
                        false => format!("{rings} (resident)"),
                    }
                ),
            },
        },
        Component {
            name: "activations (device)",
            bytes: l.act_bytes as u64,
            mapped: false,
            formula: format!(
                "{} rows of every buffer, {} logit rows of {}",
                sizes.max_rows, sizes.logit_rows, c.vocab_size
            ),
        },
    ];
    // The device's total; an offloaded cache's host memory is listed after it.
    let total_bytes = components.iter().map(|c| c.bytes).sum();
    let mut components = components;
    if let Some(r) = l.ring {
        components.push(Component {
            name: HOST_KV,
            bytes: r.host_bytes as u64,
            mapped: false,
            formula: format!(
                "{} layers × {} ctx × {} kv heads × ({} + {}) B, page-locked host memory (not in the device total)",
                kv.n_full_layers(),
                sizes.n_ctx,
                c.n_kv_heads,
                opts.kv_type.row_bytes(c.head_dim_k),
                opts.kv_type.row_bytes(c.head_dim_v),
            ),
        });
    }
    Ok(MemoryPlan {
        components,
        total_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_table_counts_the_rows_of_the_tokens_seen() {
        // gpt-oss's table: 201,088 rows of 2,880 Q8_0 values (3,060 bytes), on 2 pages each
        // at most.
        let (row, vocab) = (3060u64, 201_088u64);
        let table = row * vocab;
        assert_eq!(row_pages(row), 2);
        assert_eq!(token_table_resident(table, row, 512), 512 * 2 * 4096);
        assert_eq!(token_table_resident(table, row, 0), 0);
        // Bounded by the table: every token of the vocabulary seen.
        assert_eq!(token_table_resident(table, row, vocab), table);
        // A row of exactly a page may still straddle two; a row of 8 KiB three.
        assert_eq!(row_pages(4096), 2);
        assert_eq!(row_pages(8192), 3);
        assert_eq!(row_pages(100), 2);
    }
}
