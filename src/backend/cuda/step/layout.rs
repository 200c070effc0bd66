//! What a GPU session allocates, laid out once: the activation buffers and step parameters,
//! the products' and the split attention's scratch, and the KV cache (every slot, every
//! layer: the context, or a sliding-window layer's ring); and a sequence's cursor into it.
//! The memory plan lays a session out with the same function.

use super::{GEMM_MIN_ROWS, MAX_GRAPH_ROWS};
use crate::backend::cuda::gpu::Layout;
use crate::backend::Buf;
use crate::cache::{KvLayout, KvType};

/// One sequence's cursor into a session's device KV cache ([`crate::cache::SlotKv`]).
pub use crate::cache::SlotKv as CudaKv;

/// How a session is sized on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct CudaSizes {
    /// Rows per forward pass.
    pub max_rows: usize,
    /// Logit rows computed at once.
    pub logit_rows: usize,
    /// KV positions per sequence.
    pub n_ctx: usize,
    /// Sequences (KV slots).
    pub slots: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// Keep the KV cache in page-locked host memory and this many layers of it on the device
    /// (`--kv-budget`; one sequence only): see `step/offload.rs`.
    pub kv_ring: Option<usize>,
}

/// Where a session's buffers go: the activations and step parameters in one allocation, the
/// KV cache in another. [`CudaSession::new`] allocates exactly this; the memory plan reports it.
#[derive(Clone, Debug)]
pub struct SessionLayout {
    /// Offsets of the activation buffers, in [`Buf`]'s order, and their row widths.
    pub(super) buf: [usize; 10],
    pub(super) width: [usize; 10],
    pub(super) qkv: Option<usize>,
    /// `[rows]` i32 each: token ids, positions, slots, attention arithmetic (see `attend`);
    /// gathered rows and argmax results.
    pub(super) ids: usize,
    pub(super) pos: usize,
    pub(super) seq: usize,
    pub(super) mode: usize,
    pub(super) sel: usize,
    pub(super) argmax: usize,
    /// One i32: the blocks of a product with a post-norm epilogue that have finished (zero
    /// between launches; `last_block_norm_add` in matvec.cu).
    pub(super) post_count: usize,
    /// Rows of the i32 buffers.
    pub(super) rows_i32: usize,
    /// A product's input quantized to 8 bits: `[rows, widest input / 32]` groups of 40 bytes.
    pub(super) xq: usize,
    /// Prompt-sized products (when `max_rows >= GEMM_MIN_ROWS`).
    pub(super) gemm: Option<GemmLayout>,
    /// A mixture-of-experts model's routing and expert buffers.
    pub(super) moe: Option<MoeLayout>,
    /// Decode attention split over the keys: the splits' partial results
    /// `[decode rows, n_heads, n_split, head_dim_v + 2]` f32 and their counters (when the
    /// context has 2+ splits).
    pub(super) split: Option<SplitLayout>,
    /// Bytes of the activation allocation.
    pub act_bytes: usize,
    /// Per layer, where its keys and values are.
    pub(super) kv: Vec<KvLayerAt>,
    pub(super) kv_heads: usize,
    /// Bytes of one position of a head's keys and values.
    pub(super) row_bytes: (usize, usize),
    pub(super) kv_type: KvType,
    /// Bytes of the KV allocation on the device: the whole cache, or an offloaded one's
    /// sliding-window rings and its ring of layers.
    pub kv_bytes: usize,
    /// An offloaded cache: the layers of the whole context are in host memory (at the offsets
    /// `kv` gives them), and visit a ring of slots on the device.
    pub ring: Option<RingLayout>,
}

/// The device's ring of an offloaded KV cache: `layers` slots of `slot_bytes` from device
/// offset `at`, each holding one offloaded layer's keys (at the slot's start) and values (at
/// `v_at(layer)` past it), laid out as in host memory (`KvLayerAt`, one sequence).
#[derive(Clone, Copy, Debug)]
pub struct RingLayout {
    pub layers: usize,
    pub slot_bytes: usize,
    pub at: usize,
    /// Bytes of the offloaded layers, in host memory.
    pub host_bytes: usize,
}

impl RingLayout {
    /// Offset of a layer's values in its slot.
    pub(super) fn v_at(at: &KvLayerAt) -> usize {
        at.slot_stride
            .0
            .next_multiple_of(crate::backend::cuda::gpu::ALIGN)
    }
}

/// One layer's keys `[slots, n_kv_heads, rows]` rows of `head_dim_k` values (f16, or Q8_0
/// blocks) and values: `rows` is the context, or a sliding-window layer's ring (position `p` at
/// row `p mod rows`, as in RAM: `KvLayout`).
#[derive(Clone, Copy, Debug)]
pub(super) struct KvLayerAt {
    pub(super) k: usize,
    pub(super) v: usize,
    pub(super) rows: usize,
    /// Bytes of one slot's keys and values.
    pub(super) slot_stride: (usize, usize),
    /// `k` and `v` are offsets in host memory: the layer is offloaded, and visits the
    /// device's ring (`RingLayout`).
    pub(super) offloaded: bool,
}

/// The scratch of prompt-sized products: the input as bf16, two chunks of weight rows as bf16
/// (one is filled while the other is multiplied: `step/ahead.rs`; the same one twice with
/// `KILN_CUDA_DEQUANT_AHEAD=0`), cuBLAS's workspace.
#[derive(Clone, Copy, Debug)]
pub(super) struct GemmLayout {
    pub(super) xbf: usize,
    pub(super) wbf: [usize; 2],
    /// Elements of a weight chunk (the largest layer matrix; the output head goes by parts).
    pub(super) wbf_elems: usize,
    pub(super) workspace: usize,
}

/// A mixture-of-experts layer's buffers for `rows` token rows choosing `n_used` experts each
/// (`p = rows · n_used` pairs, grouped by expert): the router's logits `[rows, n_expert]` and
/// the shared expert's gate logits `[rows]` (f32, read by the host, which routes), the
/// host's routing (`row_of`, `pos_of`: `[p]` i32; `weights`: `[p]` f32; `shared`: `[rows]`
/// f32), the gathered inputs, then the experts' outputs `xg` `[p, dim]`, and their gate
/// and up products `[p, expert ffn]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct MoeLayout {
    pub(super) logits: usize,
    pub(super) shared_logit: usize,
    pub(super) row_of: usize,
    pub(super) pos_of: usize,
    pub(super) weights: usize,
    pub(super) shared: usize,
    pub(super) xg: usize,
    pub(super) gate: usize,
    pub(super) up: usize,
}

/// How decode attention splits a long context: `n_split` runs of `chunk` positions, for up to
/// `rows` rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct SplitLayout {
    pub(super) part: usize,
    /// One i32 per row and head: the splits that have finished (zero between launches).
    pub(super) counts: usize,
    pub(super) rows: usize,
    pub(super) n_split: usize,
    pub(super) chunk: usize,
}

/// The most splits of decode attention (`MAX_SPLITS` in attention.cu: `merge_splits` reads
/// one per thread).
const MAX_SPLITS: usize = 64;

/// Positions per split of decode attention (at least): 64, or `KILN_CUDA_SPLIT_KEYS` (16 to
/// 4096, for measuring). Fewer keys a block means more blocks reading the cache at once.
fn split_keys() -> usize {
    crate::tuning::get().cuda_split_keys
}

/// Bytes of one 8-bit activation group (`Q8v` in matvec.cu: 32 values, then apart d and s).
const Q8X_BYTES: usize = 40;

impl SessionLayout {
    /// `kv`: the cache's geometry (which layers keep rings), as a cache in RAM would have it.
    pub fn new(
        c: &crate::model::ModelConfig,
        fused_qkv: bool,
        sizes: CudaSizes,
        kv: &KvLayout,
    ) -> Self {
        let t = sizes.max_rows.max(1);
        // (A shared expert's hidden state goes through `Gate` and `Up`; an expert's through
        // the experts' own buffers.)
        let moe = c.moe.as_ref();
        let (expert_ffn, shared_ffn) =
            moe.map_or((0, 0), |m| (m.ffn_dim, m.shared_ffn_dim.unwrap_or(0)));
        let ffn = c.ffn_dim.max(shared_ffn);
        let width = [
            c.dim,
            c.dim,
            c.q_dim(),
            c.kv_dim_k(),
            c.kv_dim_v(),
            c.attn_out_dim(),
            c.dim,
            ffn,
            ffn,
            c.vocab_size,
        ];
        let mut l = Layout::default();
        let mut buf = [0; 10];
        for (i, &w) in width.iter().enumerate() {
            let rows = if i == Buf::Logits as usize {
                sizes.logit_rows.max(1)
            } else {
                t
            };
            buf[i] = l.take(rows * w * 4);
        }
        let qkv = fused_qkv.then(|| l.take(t * (c.q_dim() + c.kv_dim_k() + c.kv_dim_v()) * 4));
        let rows_i32 = t.max(sizes.logit_rows).max(sizes.slots);
        let (ids, pos, seq, mode) = (l.take(t * 4), l.take(t * 4), l.take(t * 4), l.take(t * 4));
        let (sel, argmax) = (l.take(rows_i32 * 4), l.take(rows_i32 * 4));
        let post_count = l.take(4);
        // The products' inputs: x, the attention output, the FFN's (or an expert's) hidden
        // state.
        let widest = c
            .dim
            .max(c.q_dim())
            .max(c.attn_out_dim())
            .max(ffn)
            .max(expert_ffn);
        let xq = l.take(t * widest.div_ceil(32) * Q8X_BYTES);
        let moe = moe.map(|m| {
            let p = t * m.n_used;
            MoeLayout {
                logits: l.take(t * m.n_expert * 4),
                shared_logit: l.take(t * 4),
                row_of: l.take(p * 4),
                pos_of: l.take(p * 4),
                weights: l.take(p * 4),
                shared: l.take(t * 4),
                xg: l.take(p * c.dim * 4),
                gate: l.take(p * m.ffn_dim * 4),
                up: l.take(p * m.ffn_dim * 4),
            }
        });
        let gemm = (t >= GEMM_MIN_ROWS).then(|| {
            let qkv = c.q_dim() + c.kv_dim_k() + c.kv_dim_v();
            let n_expert = c.moe.as_ref().map_or(0, |m| m.n_expert);
            let wbf_elems = [
                qkv * c.dim,
                c.dim * c.attn_out_dim(),
                ffn * c.dim,
                expert_ffn * c.dim,
                n_expert * c.dim,
            ]
            .into_iter()
            .max()
            .unwrap_or(0)
            .max(c.dim);
            let xbf = l.take(t * widest * 2);
            let first = l.take(wbf_elems * 2);
            // Prompt products dequantize their weights ahead, on a second stream, into two
            // buffers used in turn (step/ahead.rs), unless `KILN_CUDA_DEQUANT_AHEAD=0` (one
            // buffer, on the session's stream: for measuring).
            let second = match crate::tuning::get().cuda_dequant_ahead {
                true => l.take(wbf_elems * 2),
                false => first,
            };
            GemmLayout {
                xbf,
                wbf: [first, second],
                wbf_elems,
                workspace: l.take(crate::backend::cuda::blas::WORKSPACE_BYTES),
            }
        });
        let row_bytes = (
            sizes.kv_type.row_bytes(c.head_dim_k),
            sizes.kv_type.row_bytes(c.head_dim_v),
        );
        // The device's cache, and an offloaded cache's layers in host memory: with a ring,
        // the layers of the whole context go to host memory; sliding-window rings stay.
        let (mut kl, mut hl) = (Layout::default(), Layout::default());
        let mut at = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let rows = kv.rows(l);
            let per_k = c.n_kv_heads * rows * row_bytes.0;
            let per_v = c.n_kv_heads * rows * row_bytes.1;
            let offloaded = sizes.kv_ring.is_some() && kv.ring_rows(l).is_none();
            let m = if offloaded { &mut hl } else { &mut kl };
            at.push(KvLayerAt {
                k: m.take(sizes.slots * per_k),
                v: m.take(sizes.slots * per_v),
                rows,
                slot_stride: (per_k, per_v),
                offloaded,
            });
        }
        let kv = at;
        let ring = sizes.kv_ring.map(|layers| {
            let a = crate::backend::cuda::gpu::ALIGN;
            let slot_bytes = kv
                .iter()
                .filter(|at| at.offloaded)
                .map(|at| RingLayout::v_at(at) + at.slot_stride.1.next_multiple_of(a))
                .max()
                .unwrap_or(0);
            RingLayout {
                layers,
                slot_bytes,
                at: kl.take(layers * slot_bytes),
                host_bytes: hl.bytes,
            }
        });
        // (Contexts of up to 256 positions attend in one block per row and head: the CPU's
        // arithmetic covers them whole, no split ever runs.)
        let n_split = match sizes.n_ctx {
            0..=256 => 1,
            n => n.div_ceil(split_keys()).min(MAX_SPLITS),
        };
        let split = (n_split > 1).then(|| {
            let rows = t.min(MAX_GRAPH_ROWS);
            SplitLayout {
                part: l.take(rows * c.n_heads * n_split * (c.head_dim_v + 2) * 4),
                counts: l.take(rows * c.n_heads * 4),
                rows,
                n_split,
                chunk: sizes.n_ctx.div_ceil(n_split),
            }
        });
        SessionLayout {
            buf,
            width,
            qkv,
            ids,
            pos,
            seq,
            mode,
            sel,
            argmax,
            post_count,
            rows_i32,
            xq,
            gemm,
            moe,
            split,
            act_bytes: l.bytes,
            kv,
            kv_heads: c.n_kv_heads,
            row_bytes,
            kv_type: sizes.kv_type,
            kv_bytes: kl.bytes,
            ring,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mixture of experts' session counts its routing and expert buffers: the router's
    /// logits, the routing, `rows · used` gathered rows and their gate and up products (the
    /// memory plan lays a session out with this function).
    #[test]
    fn a_moe_session_counts_its_expert_buffers() {
        let (_, recipe) = crate::fixtures::RECIPES
            .iter()
            .find(|(n, _)| *n == "qwen2moe")
            .expect("recipe");
        let f = crate::gguf::GgufFile::from_bytes(crate::fixtures::random_f32(recipe).to_bytes())
            .expect("parse");
        let m = crate::model::Model::from_gguf(f).expect("load");
        let c = &m.config;
        let mc = c.moe.clone().expect("experts");
        let kv = KvLayout::full(c.n_layers, c.n_kv_heads, c.head_dim_k, c.head_dim_v, 256);
        let sizes = CudaSizes {
            max_rows: 32,
            logit_rows: 1,
            n_ctx: 256,
            slots: 1,
            kv_type: KvType::F16,
            kv_ring: None,
        };
        let with = SessionLayout::new(c, false, sizes, &kv);
        let moe = with.moe.expect("expert buffers");
        let p = 32 * mc.n_used;
        assert!(moe.xg - moe.logits >= (32 * mc.n_expert + 32 + 3 * p + 32) * 4);
        assert!(moe.gate - moe.xg >= p * c.dim * 4 && moe.up - moe.gate >= p * mc.ffn_dim * 4);
        // The shared expert's hidden state fits `Gate` and `Up`.
        let shared = mc.shared_ffn_dim.expect("a shared expert");
        assert!(with.width[Buf::Gate as usize] >= shared.max(c.ffn_dim));
        let mut dense = c.clone();
        dense.moe = None;
        let without = SessionLayout::new(&dense, false, sizes, &kv);
        assert!(without.moe.is_none());
        let experts = (32 * mc.n_expert + 32 + 3 * p + 32 + p * (c.dim + 2 * mc.ffn_dim)) * 4;
        assert!(
            with.act_bytes >= without.act_bytes + experts,
            "{} against {} + {experts}",
            with.act_bytes,
            without.act_bytes
        );
    }
}
