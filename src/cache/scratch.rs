//! Scratch buffers: every intermediate of a forward pass has a named buffer,
//! allocated once from the model's shape and the largest batch, and reused by every layer and
//! every step. After construction nothing on the decode path allocates.
//!
//! On a CPU one set serves both phases: decode uses row 0 of the batch buffers, prefill uses
//! up to `max_tokens` rows (the prefill chunk), so activation memory is fixed by the chunk size
//! and independent of the prompt's length.

use super::kv::KvType;
use crate::kernels::attention::AttnScratch;
use crate::kernels::matmul::MatmulScratch;
use crate::kernels::moe::{MoeScratch, MoeShape};
use crate::model::ModelConfig;

/// Sizes that determine the scratch buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchSpec {
    /// Rows per forward pass (the prefill chunk; 1 would be decode-only).
    pub max_tokens: usize,
    /// Rows of logits computed at once.
    pub logit_rows: usize,
    pub n_threads: usize,
    /// Bytes of the largest quantized activation row any matrix needs.
    pub act_row_bytes: usize,
    /// Element type of the KV cache the attention reads (a quantized one needs tile buffers).
    pub kv_type: KvType,
    /// Rows of the `up` buffer: `max_tokens`, or fewer when prompt batches run the gated
    /// feed-forward fused and never write it (`weights::gated_ffn_fuses`).
    pub up_rows: usize,
}

/// The named buffers. Shapes are `[rows, width]`, row-major, f32.
pub struct Scratch {
    pub spec: ScratchSpec,
    /// `[T, dim]` the residual stream.
    pub x: Vec<f32>,
    /// `[T, dim]` normalized input of a projection.
    pub xb: Vec<f32>,
    /// `[T, n_heads·head_dim_k]` queries (or fused QKV rows for GPT-2, `[T, q+2kv]`).
    pub q: Vec<f32>,
    /// `[T, n_kv_heads·head_dim_k]`
    pub k: Vec<f32>,
    /// `[T, n_kv_heads·head_dim_v]`
    pub v: Vec<f32>,
    /// `[T, n_heads·head_dim_v]` attention output, input of `wo`.
    pub attn: Vec<f32>,
    /// `[T, dim]` output of `wo` / `ffn_down` before the residual add (what the design calls `post_norm`).
    pub proj: Vec<f32>,
    /// `[T, ffn_dim]` gate projection, then the activated product.
    pub gate: Vec<f32>,
    /// `[spec.up_rows, ffn_dim]`
    pub up: Vec<f32>,
    /// `[T, act_row_bytes]` quantized activations.
    pub xq: Vec<u8>,
    /// `[logit_rows, vocab]`
    pub logits: Vec<f32>,
    /// `[T, rope_dims]` cos/sin per position.
    pub rope_cs: Vec<f32>,
    pub attn_scratch: AttnScratch,
    pub matmul: MatmulScratch,
    /// The mixture-of-experts routing and expert buffers (empty for a dense model).
    pub moe: MoeScratch,
}

/// Rows of each buffer of [`widths`]: all `t`, except `up` (`spec.up_rows`).
fn rows(spec: &ScratchSpec, t: usize) -> [usize; 9] {
    let mut r = [t; 9];
    r[8] = spec.up_rows.min(t);
    r
}

/// Width of the dense feed-forward's buffers: a MoE model's shared expert, if any.
fn ffn_width(c: &ModelConfig) -> usize {
    match &c.moe {
        Some(m) => m.shared_ffn_dim.unwrap_or(0),
        None => c.ffn_dim,
    }
}

/// The expert buffers' shape for this model and spec, if it is a mixture of experts.
fn moe_shape(c: &ModelConfig, spec: &ScratchSpec) -> MoeShape {
    let m = c.moe.as_ref();
    MoeShape {
        max_tokens: spec.max_tokens.max(1),
        n_expert: m.map_or(0, |m| m.n_expert),
        n_used: m.map_or(0, |m| m.n_used),
        dim: c.dim,
        ffn: m.map_or(0, |m| m.ffn_dim),
        act_row_bytes: spec.act_row_bytes,
    }
}

fn widths(c: &ModelConfig) -> [usize; 9] {
    let qkv = c.q_dim() + c.kv_dim_k() + c.kv_dim_v();
    [
        c.dim,              // x
        c.dim,              // xb
        qkv.max(c.q_dim()), // q (room for fused qkv rows)
        c.kv_dim_k(),       // k
        c.kv_dim_v(),       // v
        c.attn_out_dim(),   // attn
        c.dim,              // proj
        ffn_width(c),       // gate
        ffn_width(c),       // up
    ]
}

/// `f` on the attention buffers' shape for this model and spec (heads, kv heads, key and value
/// widths, threads, cache type): [`AttnScratch::with_kv`], or its size.
fn attn<T>(
    c: &ModelConfig,
    spec: &ScratchSpec,
    f: fn(usize, usize, usize, usize, usize, KvType) -> T,
) -> T {
    f(
        c.n_heads,
        c.n_kv_heads,
        c.head_dim_k,
        c.head_dim_v,
        spec.n_threads,
        spec.kv_type,
    )
}

impl Scratch {
    pub fn new(c: &ModelConfig, spec: ScratchSpec) -> Scratch {
        let t = spec.max_tokens.max(1);
        let (w, r) = (widths(c), rows(&spec, t));
        let buf = |i: usize| vec![0.0f32; r[i] * w[i]];
        Scratch {
            spec,
            x: buf(0),
            xb: buf(1),
            q: buf(2),
            k: buf(3),
            v: buf(4),
            attn: buf(5),
            proj: buf(6),
            gate: buf(7),
            up: buf(8),
            xq: vec![0u8; t * spec.act_row_bytes],
            logits: vec![0.0; spec.logit_rows.max(1) * c.vocab_size],
            rope_cs: vec![0.0; t * c.rope_dims.max(2)],
            attn_scratch: attn(c, &spec, AttnScratch::with_kv),
            matmul: MatmulScratch::new(t, spec.n_threads),
            moe: MoeScratch::new(moe_shape(c, &spec)),
        }
    }

    /// Bytes `new` allocates for this model and spec (the memory plan's formula).
    pub fn bytes_for(c: &ModelConfig, spec: ScratchSpec) -> usize {
        let t = spec.max_tokens.max(1);
        let r = rows(&spec, t);
        let floats: usize = widths(c).iter().zip(r).map(|(w, r)| r * w).sum::<usize>()
            + spec.logit_rows.max(1) * c.vocab_size
            + t * c.rope_dims.max(2);
        floats * 4
            + t * spec.act_row_bytes
            + attn(c, &spec, AttnScratch::bytes_for_kv)
            + MatmulScratch::bytes_for(t, spec.n_threads)
            + moe_shape(c, &spec).bytes()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let floats = self.x.len()
            + self.xb.len()
            + self.q.len()
            + self.k.len()
            + self.v.len()
            + self.attn.len()
            + self.proj.len()
            + self.gate.len()
            + self.up.len()
            + self.logits.len()
            + self.rope_cs.len();
        floats * 4
            + self.xq.len()
            + self.attn_scratch.bytes()
            + self.matmul.bytes()
            + self.moe.bytes()
    }
}
