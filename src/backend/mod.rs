//! The backend seam: the op set the forward pass uses, and nothing else.
//!
//! [`crate::model::forward`] writes the layer logic once as a sequence of calls on a
//! [`Backend`]; a backend owns the activation buffers (named by [`Buf`]), resolves weights
//! named by [`Mat`] and [`NormW`] against its own copy of them, and keeps each sequence's KV
//! storage (its [`Backend::Kv`]). The CPU backend ([`cpu`]) runs today's SIMD kernels over the
//! thread pool and the [`crate::cache::Scratch`] buffers.
//!
//! Rules a backend may rely on, so that a step can be recorded once and replayed (a CUDA
//! graph):
//! - control flow inside a step depends only on the model and the batch's row count; the
//!   positions and lengths of the sequences are data, read by [`Backend::begin`],
//!   [`Backend::embed`], [`Backend::rope`] and [`Backend::attend`] from the sequences' caches;
//! - every op works on rows `0..rows` of its buffers unless it takes a range;
//! - a buffer's row width is fixed by the model (see [`Buf`]), except [`Buf::Q`] right after a
//!   fused QKV product, whose rows are `q + k + v` wide until [`Backend::split_qkv`].
//!
//! What each op computes is written once, in scalar form, beside the CPU's version; a second
//! backend is tested op by op against the CPU's.

pub mod cpu;
pub mod cuda;
pub mod exec;
pub mod open;
pub mod vulkan;

use std::ops::Range;

use crate::cache::offload::OffloadFault;
pub use crate::cache::SeqCache;
use crate::cache::{KvCache, KvOverflow, KvWindowError};
use crate::kernels::ops::{Activation, AttnTemp};

/// Which logits a forward pass computes.
pub enum Logits<'a> {
    /// None (filling the cache only).
    None,
    /// The last token's, left in `scratch.logits[..vocab]`.
    Last,
    /// Rows `range` of the batch, each handed to the sink as `(row, logits)`.
    Rows(Range<usize>, &'a mut dyn FnMut(usize, &[f32])),
    /// Rows `range` of the batch, each handed to `f(row, logits)` in any order, on any of the
    /// backend's host threads ([`Backend::read_each`]).
    EachRow(Range<usize>, &'a (dyn Fn(usize, &[f32]) + Sync)),
    /// The listed rows of the batch (increasing), each handed to the sink as
    /// `(index in the list, logits)`.
    Picked(&'a [usize], &'a mut dyn FnMut(usize, &[f32])),
    /// The listed rows of the batch (increasing, at most [`Backend::logit_rows`]), left where
    /// they were computed (the logits buffer's first rows, in the list's order) for an
    /// argmax there: nothing is copied out.
    Kept(&'a [usize]),
    /// Embeddings: the final-normed hidden state (what the output matrix multiplies, the
    /// reference's `t_embd`, which its pooling reads) of every row in the `hidden` ranges of
    /// the batch, handed to `hidden_sink` as `(row, state)`; and the logits of the `picked`
    /// rows, as [`Logits::Picked`] hands them.
    Hidden {
        hidden: &'a [Range<usize>],
        hidden_sink: &'a mut dyn FnMut(usize, &[f32]),
        picked: &'a [usize],
        sink: &'a mut dyn FnMut(usize, &[f32]),
    },
}

/// Why a forward pass was refused. Nothing is modified when it is (but see
/// [`ForwardError::Offload`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error(transparent)]
    Overflow(#[from] KvOverflow),
    #[error(transparent)]
    Window(#[from] KvWindowError),
    /// An offloaded cache's file I/O failed (unlike the other errors, the pass had begun: the
    /// cache is lost).
    #[error(transparent)]
    Offload(#[from] OffloadFault),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("batch of {n} tokens exceeds the scratch size of {max}")]
    BatchTooLarge { n: usize, max: usize },
    #[error("position {pos} is past the {max} learned positions of this model")]
    PositionOutOfRange { pos: usize, max: usize },
    #[error("empty batch")]
    Empty,
    /// Logits asked of an encoder, which has no output head.
    #[error("{arch} is an encoder: it gives embeddings, not logits")]
    EncoderLogits { arch: String },
    #[error("the batch has {tokens} tokens but its sequences claim {claimed}")]
    BatchMismatch { tokens: usize, claimed: usize },
    /// The device failed during the pass (its caches are then lost).
    #[error("GPU: {0}")]
    Device(String),
}

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
    Vulkan,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" | "none" => Ok(Device::Cpu),
            "cuda" | "gpu" | "cuda0" => Ok(Device::Cuda),
            "vulkan" => Ok(Device::Vulkan),
            other => Err(format!("unknown device {other:?} (cpu, cuda or vulkan)")),
        }
    }
}

/// A device's failure (the GPU driver layer's error).
pub type DeviceError = cuda::CudaError;

impl Device {
    /// The most rows a pass computes each as a decode step of it alone
    /// ([`SeqBatch::alone`]), where that pass holds decode rows only (the GPU's: its graph of
    /// decode rows, [`cuda::MAX_GRAPH_ROWS`]); `None` where any pass may, beside any other
    /// rows (the CPU's).
    pub fn alone_rows(self) -> Option<usize> {
        match self {
            Device::Cpu => None,
            Device::Cuda => Some(cuda::MAX_GRAPH_ROWS),
            Device::Vulkan => Some(vulkan::exec::DECODE_ROWS),
        }
    }

    /// Check that this device can run a model here.
    pub fn open(self) -> Result<(), exec::ExecError> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda => Ok(cuda::open().map(|_| ())?),
            Device::Vulkan => Ok(vulkan::open().map(|_| ())?),
        }
    }
}

/// The named activation buffers of a step. Widths per row: `X`, `Xb`, `Proj`: dim; `Q`: heads ×
/// head_dim_k; `K`: kv heads × head_dim_k; `V`: kv heads × head_dim_v; `Attn`: heads ×
/// head_dim_v; `Gate`, `Up`: ffn_dim; `Logits`: vocab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The residual stream.
    X,
    /// A normalized input of a projection.
    Xb,
    Q,
    K,
    V,
    /// Attention output, the input of `wo`.
    Attn,
    /// Output of `wo` or `ffn_down` before the residual add.
    Proj,
    /// The gate projection, then the activated product.
    Gate,
    Up,
    Logits,
}

/// A weight matrix, by role (and layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mat {
    /// `[q + k + v, dim]` (GPT-2's fused projection).
    Qkv(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// `[vocab, dim]`.
    Output,
}

/// A norm's weights, by role (and layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormW {
    Attn(usize),
    /// Per head of q (`[head_dim_k]`).
    QHead(usize),
    /// Per head of k.
    KHead(usize),
    AttnPost(usize),
    Ffn(usize),
    FfnPost(usize),
    Output,
    /// An encoder's LayerNorm of the summed embeddings.
    Embd,
}

/// Which rows of a buffer: a range, or a list.
#[derive(Clone, Copy, Debug)]
pub enum RowSel<'a> {
    Range(usize, usize),
    List(&'a [usize]),
}

impl RowSel<'_> {
    pub fn len(&self) -> usize {
        match *self {
            RowSel::Range(a, b) => b - a,
            RowSel::List(l) => l.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Selected rows `i0..i1` (positions in this selection).
    pub fn part(&self, i0: usize, i1: usize) -> RowSel<'_> {
        match *self {
            RowSel::Range(a, _) => RowSel::Range(a + i0, a + i1),
            RowSel::List(l) => RowSel::List(&l[i0..i1]),
        }
    }

    /// The `i`-th row selected.
    pub fn get(&self, i: usize) -> usize {
        match *self {
            RowSel::Range(a, _) => a + i,
            RowSel::List(l) => l[i],
        }
    }
}

/// One sequence's share of a batch: its KV cache and how many of the batch's tokens are its
/// (consecutive, after the previous sequences' tokens). Its tokens go to positions
/// `kv.len()..kv.len() + n_tokens`.
pub struct SeqBatch<'a, K = KvCache> {
    pub kv: &'a mut K,
    pub n_tokens: usize,
    /// Each of its rows computed as a decode step of it alone would be (its products as a batch
    /// of one, its attention on the decode path of its position): a speculative verification
    /// pass among other sequences' rows. The CPU computes such rows alone inside any pass; the
    /// GPU, in a pass of decode rows only, of at most [`cuda::MAX_GRAPH_ROWS`] (the batch
    /// runner splits a step into such passes).
    pub alone: bool,
}

/// The position of batch row `j` (rows are the sequences' tokens, in order).
pub fn row_pos<K: SeqCache>(seqs: &[SeqBatch<'_, K>], j: usize) -> usize {
    let mut r = j;
    for sq in seqs {
        if r < sq.n_tokens {
            return sq.kv.len() + r;
        }
        r -= sq.n_tokens;
    }
    panic!("row {j} past the batch")
}

/// The op set of a forward pass. See the module documentation for the rules.
pub trait Backend {
    /// One sequence's KV cache.
    type Kv: SeqCache;

    /// Rows a step may hold.
    fn max_rows(&self) -> usize;

    /// Rows of logits computed at once (the [`Buf::Logits`] buffer's rows).
    fn logit_rows(&self) -> usize;

    /// Start a step of `tokens` over `seqs` (their lengths are the positions of their first new
    /// rows): what varies from step to step goes to the device here.
    fn begin(&mut self, tokens: &[u32], seqs: &[SeqBatch<'_, Self::Kv>]);

    /// `X[j] = embed(tokens[j]) · scale (+ an encoder's token-type embedding) (+ learned
    /// position embedding of row j's position)`.
    fn embed(&mut self, tokens: &[u32], seqs: &[SeqBatch<'_, Self::Kv>], scale: f32);

    /// Normalize the rows `rows` of `src` into the same rows of `dst` (in place when they are
    /// the same buffer), in groups as wide as the norm's weights (heads for q/k norms).
    fn norm(&mut self, w: NormW, src: Buf, dst: Buf, rows: Range<usize>);

    /// Row `i` of `dst` = the normalized row `sel.get(i)` of `src` (the output head's rows).
    fn norm_gather(&mut self, w: NormW, src: Buf, sel: RowSel<'_>, dst: Buf);

    /// `dst[i][r] = Σ_c W_i[r][c] · src[r'][c] (+ bias)` for each matrix: several products of
    /// one input, which a backend may run together.
    fn matmul(&mut self, ws: &[Mat], src: Buf, dsts: &[Buf], rows: usize);

    /// `dst += post(src · Wᵀ (+ bias))`: a block's output projection added to the residual
    /// stream, through its post-norm when the architecture has one (Gemma-3). By default the
    /// product goes to [`Buf::Proj`], is normalized there in place, then added (a backend may
    /// do the norm and the add in the product's epilogue, the same arithmetic; [`Buf::Proj`]
    /// is then not what the default leaves there).
    fn matmul_add(&mut self, w: Mat, src: Buf, post: Option<NormW>, dst: Buf, rows: usize) {
        self.matmul(&[w], src, &[Buf::Proj], rows);
        if let Some(norm) = post {
            self.norm(norm, Buf::Proj, Buf::Proj, 0..rows);
        }
        self.add(dst, Buf::Proj, rows);
    }

    /// The output head: `Logits[..rows] = Xb[..rows] · Woutᵀ`, times `scale` where the model
    /// scales its logits (Granite), then `softcap`ped where it caps them (Gemma-2). By default
    /// the product, then [`Backend::scale`], then [`Backend::softcap`]; a backend may apply
    /// both in the product's epilogue (the same arithmetic, element by element).
    fn output_head(&mut self, rows: usize, scale: Option<f32>, softcap: Option<f32>) {
        self.matmul(&[Mat::Output], Buf::Xb, &[Buf::Logits], rows);
        if let Some(s) = scale {
            self.scale(Buf::Logits, s, rows);
        }
        if let Some(c) = softcap {
            self.softcap(Buf::Logits, c, rows);
        }
    }

    /// The gated feed-forward's first half: `Gate = act(Xb·Wgateᵀ) ⊙ (Xb·Wupᵀ)`.
    fn gated_ffn(&mut self, gate: Mat, up: Mat, act: Activation, rows: usize);

    /// A mixture-of-experts feed-forward of layer `layer` over `Xb`, into `Proj`: each row's
    /// router logits (`ffn_gate_inp`) gated and its `expert_used_count` experts chosen
    /// ([`crate::kernels::moe::route`]), then `Proj[j] = Σ_s w[j][s] · down_e(act(gate_e(x)) ⊙
    /// up_e(x))` over its chosen experts `e = e[j][s]`, each term a product rounded to f32 and
    /// added in slot order (largest weight first). Where the layer has a shared expert (the
    /// dense `Gate`, `Up`, `Down` matrices), its output times `sigmoid(shared_gate · x)` is
    /// added to that sum. `Gate` and `Up` may be used as scratch.
    fn moe_ffn(&mut self, layer: usize, act: Activation, rows: usize);

    /// `buf = act(buf)` (an ungated feed-forward).
    fn activate(&mut self, buf: Buf, act: Activation, rows: usize);

    /// Move the fused QKV product's rows (in `Q`) into `Q`, `K` and `V`.
    fn split_qkv(&mut self, rows: usize);

    /// Rotate the heads of `Q` and `K` by layer `layer`'s RoPE at each row's position.
    fn rope(&mut self, layer: usize, seqs: &[SeqBatch<'_, Self::Kv>], rows: usize);

    /// `buf *= s`.
    fn scale(&mut self, buf: Buf, s: f32, rows: usize);

    /// `Q[j] *= t.factor(position of row j)`: the queries' attention temperature (Mistral-3).
    fn attn_temperature(&mut self, t: AttnTemp, seqs: &[SeqBatch<'_, Self::Kv>], rows: usize);

    /// `dst = src` (the FFN's input where the block has no input norm: the stream itself).
    fn copy(&mut self, dst: Buf, src: Buf, rows: usize);

    /// `buf = c·tanh(buf/c)` ([`crate::kernels::ops::softcap_inplace`]): the output logits'
    /// soft cap (Gemma-2's `final_logit_softcapping`).
    fn softcap(&mut self, buf: Buf, cap: f32, rows: usize);

    /// `dst += src`.
    fn add(&mut self, dst: Buf, src: Buf, rows: usize);

    /// Store `K` and `V` of every row into its sequence's cache at its position, then `Attn` =
    /// attention of each row's queries over its sequence's keys up to and including its own
    /// position (layer `layer`'s window, if any).
    fn attend(
        &mut self,
        layer: usize,
        seqs: &mut [SeqBatch<'_, Self::Kv>],
        rows: usize,
    ) -> Result<(), ForwardError>;

    /// Hand rows `rows` of `buf` to `sink(row, values)`, in order.
    fn read(&mut self, buf: Buf, rows: Range<usize>, sink: &mut dyn FnMut(usize, &[f32]));

    /// Hand rows `rows` of `buf` to `f(row, values)`, in any order and on any of the backend's
    /// host threads (per-row work on the host, such as scoring each row's logits). By default
    /// one at a time, through [`Backend::read`].
    fn read_each(&mut self, buf: Buf, rows: Range<usize>, f: &(dyn Fn(usize, &[f32]) + Sync)) {
        self.read(buf, rows, &mut |j, row| f(j, row));
    }

    /// End the step: wait for the device, and report an error any op met (ops on a device
    /// run asynchronously, so their errors surface here).
    fn finish(&mut self) -> Result<(), ForwardError> {
        Ok(())
    }
}

/// The routing a mixture-of-experts model's config asks for, as every backend's
/// [`Backend::moe_ffn`] computes it on the host ([`crate::kernels::moe::route`]).
pub(crate) fn moe_routing(mc: &crate::model::config::MoeConfig) -> crate::kernels::moe::Routing {
    use crate::kernels::moe::{GateFn, Routing};
    use crate::model::config::Gating;
    Routing {
        n_expert: mc.n_expert,
        n_used: mc.n_used,
        gate: match mc.gating {
            Gating::Softmax => GateFn::Softmax,
            Gating::Sigmoid => GateFn::Sigmoid,
            Gating::SoftmaxWeight => GateFn::SoftmaxWeight,
        },
        norm: mc.norm_weights,
        scale: mc.weights_scale,
    }
}
