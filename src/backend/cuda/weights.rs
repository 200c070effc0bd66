//! The model's weights on the GPU: every matrix uploaded once, as the file stores it or, for
//! the 32-element formats and q6_K (blocks whose fields the file leaves 2-byte aligned),
//! rearranged for aligned loads ([`repack`]; the CPU's repacked layouts are not used here),
//! norms, biases and RoPE factors as f32.

use super::gpu::{Arena, Gpu, Layout};
use super::CudaError;
use crate::backend::{Mat, NormW};
use crate::kernels::matmul::Linear;
use crate::model::{Model, Norm, NormKind, Qkv};
use crate::quant::GgmlType;

/// A matrix on the device: `[rows, cols]` in the file's block format.
#[derive(Clone, Copy, Debug)]
pub struct DevMat {
    pub ty: GgmlType,
    /// Its format's kernels (chosen at upload).
    pub kernels: FormatKernels,
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
    /// `[rows]` f32.
    pub bias: Option<u64>,
}

impl DevMat {
    /// Groups of 32 elements in the matrix (the layouts rearranged at upload place their
    /// arrays by it: [`repack`]).
    pub fn groups(&self) -> usize {
        self.rows * self.cols / 32
    }
}

/// A norm's weights on the device.
#[derive(Clone, Copy, Debug)]
pub struct DevNorm {
    pub kind: NormKind,
    pub eps: f32,
    /// `[len]` f32.
    pub w: u64,
    pub b: Option<u64>,
    pub len: usize,
}

/// A mixture-of-experts layer's matrices on the device: each expert's a [`DevMat`] of its
/// own, inside its stack's one placement.
#[derive(Clone, Debug)]
pub struct DevMoe {
    /// `[n_expert, dim]` (+ bias).
    pub router: DevMat,
    /// Per expert: `[ffn, dim]`, `[ffn, dim]`, `[dim, ffn]` (+ biases: gpt-oss).
    pub gate: Vec<DevMat>,
    pub up: Vec<DevMat>,
    pub down: Vec<DevMat>,
    /// Qwen2-MoE's shared expert's gate `[1, dim]`, as f32.
    pub shared_gate: Option<DevMat>,
}

struct DevLayer {
    qkv: Option<DevMat>,
    q: Option<DevMat>,
    k: Option<DevMat>,
    v: Option<DevMat>,
    o: DevMat,
    gate: Option<DevMat>,
    /// (A MoE layer without a shared expert has no dense FFN.)
    up: Option<DevMat>,
    down: Option<DevMat>,
    moe: Option<DevMoe>,
    /// Attention sinks `[n_heads]` f32 (gpt-oss).
    sinks: Option<u64>,
    attn_norm: Option<DevNorm>,
    q_norm: Option<DevNorm>,
    k_norm: Option<DevNorm>,
    attn_post: Option<DevNorm>,
    ffn_norm: Option<DevNorm>,
    ffn_post: Option<DevNorm>,
    /// RoPE frequency divisors `[rope_dims / 2]`, if the model has them.
    rope_factors: Option<u64>,
}

/// Every weight of a model on one GPU, in one allocation.
pub struct DeviceWeights {
    /// The allocation (none while only laying out).
    _arena: Option<Arena>,
    pub token_embd: DevMat,
    /// `[ctx_train, dim]` f32 (GPT-2's learned positions).
    pub pos_embd: Option<u64>,
    layers: Vec<DevLayer>,
    pub output_norm: DevNorm,
    pub output: DevMat,
    /// Bytes of the allocation.
    pub bytes: usize,
}

/// A format's kernels in `matvec.cu`, `embed.cu` and `gemm.cu`.
#[derive(Clone, Copy, Debug)]
pub struct FormatKernels {
    pub matvec: &'static str,
    /// The same product over f32 input that each block quantizes itself, as `quantize`
    /// would (rows of at most [`F32_INPUT_MAX_COLS`], a warp per row): one launch fewer
    /// where nothing quantized the input already.
    pub matvec_f32: Option<&'static str>,
    /// The kernel that quantizes the matvec kernel's activations to 8 bits (as the CPU does
    /// for this format); none: it takes f32.
    pub quantize: Option<&'static str>,
    /// The gated FFN's two products and activation in one launch (quantized formats).
    pub gated: Option<&'static str>,
    /// The same over f32 input, as `matvec_f32`.
    pub gated_f32: Option<&'static str>,
    /// `matvec` and `matvec_f32` with the attention's RoPE (and cache store) in their
    /// epilogue (`rope_epilogue` in matvec.cu).
    pub matvec_rope: Option<[&'static str; 2]>,
    /// `matvec_f32` with a post-norm and the residual add after it in its epilogue
    /// (`last_block_norm_add` in matvec.cu).
    pub matvec_post: Option<&'static str>,
    /// The product of a stack of matrices (a mixture's experts) with each row's matrix named
    /// by an id in device memory (`matvec_id.cu`): over the input `quantize` makes, or f32.
    pub matvec_id: &'static str,
    pub embed: &'static str,
    /// How prompt-sized products multiply this format.
    pub prompt: PromptProduct,
}

/// How a format's prompt-sized products multiply (`step/products.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptProduct {
    /// Chunks of rows dequantized to bf16 by this kernel, on the tensor cores.
    Bf16(&'static str),
    /// f32 operands, which bf16 would round: F32 rows as they are (`None`), F16 rows widened
    /// exactly a chunk at a time by this kernel.
    F32(Option<&'static str>),
}

impl PromptProduct {
    /// The kernel that makes a chunk of rows into the product's operand, if any.
    pub fn kernel(self) -> Option<&'static str> {
        match self {
            PromptProduct::Bf16(k) => Some(k),
            PromptProduct::F32(k) => k,
        }
    }
}

/// The widest rows the matvecs over f32 input take (`matvec_*_f`, `F32_INPUT_COLS` in
/// matvec.cu: their shared memory holds one token's input quantized, 128 groups of 32). The
/// session takes them for rows up to 2048 unless told otherwise (step/products.rs
/// `f32_input_cols`).
pub const F32_INPUT_MAX_COLS: usize = 4096;

/// The kernels of quantized format `$t` (the names `MATVEC_Q`, `MATVEC_GATED` and
/// `DEQUANT_BF16` stamp in the kernel files), its activations' quantizer and its embedding.
macro_rules! quant_kernels {
    ($t:literal, $quantize:literal, $embed:literal) => {
        FormatKernels {
            matvec: concat!("matvec_", $t),
            matvec_f32: Some(concat!("matvec_", $t, "_f")),
            quantize: Some($quantize),
            gated: Some(concat!("gated_", $t)),
            gated_f32: Some(concat!("gated_", $t, "_f")),
            matvec_rope: Some([
                concat!("matvec_", $t, "_rope"),
                concat!("matvec_", $t, "_f_rope"),
            ]),
            matvec_post: Some(concat!("matvec_", $t, "_f_post")),
            matvec_id: concat!("matvec_", $t, "_id"),
            embed: $embed,
            prompt: PromptProduct::Bf16(concat!("dequant_bf16_", $t)),
        }
    };
}

/// The kernels of a weight format, or why the GPU has none.
pub fn format_kernels(ty: GgmlType) -> Result<FormatKernels, CudaError> {
    let plain = |matvec, matvec_id, embed, prompt| {
        Ok(FormatKernels {
            matvec,
            matvec_id,
            matvec_f32: None,
            quantize: None,
            gated: None,
            gated_f32: None,
            matvec_rope: None,
            matvec_post: None,
            embed,
            prompt,
        })
    };
    match ty {
        GgmlType::F32 => plain(
            "matvec_f32",
            "matvec_f32_id",
            "embed_f32",
            PromptProduct::F32(None),
        ),
        GgmlType::F16 => plain(
            "matvec_f16",
            "matvec_f16_id",
            "embed_f16",
            PromptProduct::F32(Some("widen_f16")),
        ),
        GgmlType::BF16 => plain(
            "matvec_bf16",
            "matvec_bf16_id",
            "embed_bf16",
            PromptProduct::Bf16("dequant_bf16_bf16"),
        ),
        GgmlType::Q4_0 => Ok(quant_kernels!("q4_0", "quantize_q8_0", "embed_q4_0")),
        GgmlType::Q4_1 => Ok(quant_kernels!("q4_1", "quantize_q8_1", "embed_q4_1")),
        GgmlType::Q5_0 => Ok(quant_kernels!("q5_0", "quantize_q8_0", "embed_q5_0")),
        GgmlType::Q5_1 => Ok(quant_kernels!("q5_1", "quantize_q8_1", "embed_q5_1")),
        GgmlType::Q8_0 => Ok(quant_kernels!("q8_0", "quantize_q8_0", "embed_q8_0")),
        GgmlType::Q2K => Ok(quant_kernels!("q2_k", "quantize_q8_k", "embed_q2_k")),
        GgmlType::Q3K => Ok(quant_kernels!("q3_k", "quantize_q8_k", "embed_q3_k")),
        GgmlType::Q4K => Ok(quant_kernels!("q4_k", "quantize_q8_k", "embed_q4_k")),
        GgmlType::Q5K => Ok(quant_kernels!("q5_k", "quantize_q8_k", "embed_q5_k")),
        GgmlType::Q6K => Ok(quant_kernels!("q6_k", "quantize_q8_k", "embed_q6_k")),
        GgmlType::Q8_1 | GgmlType::Q8K => Err(CudaError::Unsupported(format!(
            "{ty} is an activation format, not a weight format"
        ))),
        // The non-linear formats (kernels/matvec_iq.cu), with the activations the CPU
        // multiplies them with (`quant::dot_type`).
        GgmlType::IQ4NL => Ok(quant_kernels!("iq4_nl", "quantize_q8_0", "embed_iq4_nl")),
        GgmlType::MXFP4 => Ok(quant_kernels!("mxfp4", "quantize_q8_0", "embed_mxfp4")),
        GgmlType::IQ4XS => Ok(quant_kernels!("iq4_xs", "quantize_q8_k", "embed_iq4_xs")),
        GgmlType::IQ2XXS => Ok(quant_kernels!("iq2_xxs", "quantize_q8_k", "embed_iq2_xxs")),
        GgmlType::IQ2XS => Ok(quant_kernels!("iq2_xs", "quantize_q8_k", "embed_iq2_xs")),
        GgmlType::IQ2S => Ok(quant_kernels!("iq2_s", "quantize_q8_k", "embed_iq2_s")),
        GgmlType::IQ3XXS => Ok(quant_kernels!("iq3_xxs", "quantize_q8_k", "embed_iq3_xxs")),
        GgmlType::IQ3S => Ok(quant_kernels!("iq3_s", "quantize_q8_k", "embed_iq3_s")),
        GgmlType::IQ1S => Ok(quant_kernels!("iq1_s", "quantize_q8_k", "embed_iq1_s")),
        GgmlType::IQ1M => Ok(quant_kernels!("iq1_m", "quantize_q8_k", "embed_iq1_m")),
    }
}

/// The kernels of a matrix rearranged at upload ([`repack`]).
pub fn repacked_kernels(ty: GgmlType) -> Option<FormatKernels> {
    Some(match ty {
        GgmlType::Q4_0 => quant_kernels!("q4_0r", "quantize_q8_0", "embed_q4_0r"),
        GgmlType::Q4_1 => quant_kernels!("q4_1r", "quantize_q8_1", "embed_q4_1r"),
        GgmlType::Q5_0 => quant_kernels!("q5_0r", "quantize_q8_0", "embed_q5_0r"),
        GgmlType::Q5_1 => quant_kernels!("q5_1r", "quantize_q8_1", "embed_q5_1r"),
        GgmlType::Q8_0 => quant_kernels!("q8_0r", "quantize_q8_0", "embed_q8_0r"),
        GgmlType::Q6K => quant_kernels!("q6_kr", "quantize_q8_k", "embed_q6_kr"),
        _ => return None,
    })
}

/// How [`repack`] lays out a block of `ty`: its fields as (offset in the file's block, bytes),
/// in the order of their arrays (kernels/blocks.cuh): quants first.
fn repack_fields(ty: GgmlType) -> Option<&'static [(usize, usize)]> {
    Some(match ty {
        GgmlType::Q4_0 => &[(2, 16), (0, 2)],
        GgmlType::Q4_1 => &[(4, 16), (0, 4)],
        GgmlType::Q5_0 => &[(6, 16), (2, 4), (0, 2)],
        GgmlType::Q5_1 => &[(8, 16), (4, 4), (0, 4)],
        GgmlType::Q8_0 => &[(2, 32), (0, 2)],
        // Low nibbles, high pairs, scales, d: the file's order.
        GgmlType::Q6K => &[(0, 128), (128, 64), (192, 16), (208, 2)],
        _ => return None,
    })
}

/// Whether a matrix of `ty` is rearranged at upload ([`repack`]): the 32-element formats and
/// q6_K, unless `KILN_CUDA_REPACK=0` (for measuring). The same bytes, another order: the plan
/// is unchanged.
fn repacks(ty: GgmlType) -> bool {
    crate::tuning::get().cuda_repack && repacked_kernels(ty).is_some()
}

/// A matrix (`rows × cols`, the file's blocks) rearranged for the `*r` kernels
/// (kernels/blocks.cuh): one array per field of a block, the blocks' fields one after
/// another in each ([`repack_fields`]: the quants' array first), so that a group's quants are
/// aligned 16-byte loads and each other field one load, whatever the row length. For the
/// 32-element formats: the quants (16 bytes of nibbles, or Q8_0's 32 bytes), the fifth bits
/// (Q5_0, Q5_1: 4 bytes a group), the scales (d, or d and m); for Q6_K its four fields. The
/// same size as the file's. `None` for other formats.
pub fn repack(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let fields = repack_fields(ty)?;
    let block = ty.type_size();
    let n = rows * cols / ty.block_size();
    let mut out = vec![0u8; n * block];
    let mut at = 0;
    for &(off, len) in fields {
        let array = &mut out[at..at + n * len];
        for (dst, blk) in array.chunks_exact_mut(len).zip(data.chunks_exact(block)) {
            dst.copy_from_slice(&blk[off..off + len]);
        }
        at += n * len;
    }
    Some(out)
}

/// Bytes the weights of a model file take on the device, from its header: every matrix as
/// stored, every vector as f32 (norms, biases, RoPE factors), learned positions as f32, each
/// in an [`ALIGN`]ed slot, as [`DeviceWeights::upload`] lays them out.
pub fn planned_bytes(file: &crate::gguf::GgufFile) -> usize {
    use crate::model::weights::names::{ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT};
    let mut l = Layout::default();
    // LongRoPE's two sets of factors: the model uses one (the upload places that one).
    let both = file.tensor_info(ROPE_FACTORS_LONG).is_some();
    for t in file.tensors() {
        if both && t.name == ROPE_FACTORS_SHORT {
            continue;
        }
        let f32s = t.shape.len() == 1 || t.name == crate::model::weights::names::POS_EMBD;
        l.take(if f32s { t.n_elements * 4 } else { t.n_bytes });
    }
    l.bytes
}

/// Walks the model's tensors twice in the same order: first only laying them out, then
/// copying each to its place in the one allocation.
struct Uploader<'a> {
    /// None: only lay out (no GPU needed).
    gpu: Option<&'a Gpu>,
    m: &'a Model,
    layout: Layout,
    arena: Option<Arena>,
    progress: &'a mut dyn FnMut(usize, usize),
    total: usize,
}

impl Uploader<'_> {
    fn place(&mut self, data: &[u8]) -> Result<u64, CudaError> {
        let off = self.layout.take(data.len());
        match (&mut self.arena, self.gpu) {
            (Some(a), Some(gpu)) => {
                a.write(gpu.default_stream(), off, data)?;
                (self.progress)(self.layout.bytes, self.total);
                Ok(a.ptr(off))
            }
            _ => Ok(0),
        }
    }

    fn floats(&mut self, v: &[f32]) -> Result<u64, CudaError> {
        self.place(zerocopy::IntoBytes::as_bytes(v))
    }

    /// A matrix's bytes as the file stores them (looked up by name: a CPU-repacked `Linear`
    /// holds another layout), or rearranged for the GPU's kernels where it gains from it
    /// ([`repacks`]: every kernel that reads the matrix, the embedding's too, has a twin for
    /// that layout).
    fn matrix(&mut self, l: &Linear) -> Result<DevMat, CudaError> {
        let f = &self.m.file;
        let info = f
            .tensor_info(&l.name)
            .ok_or_else(|| CudaError::Unsupported(format!("tensor {} not in the file", l.name)))?;
        let data = f.tensor_bytes(info);
        let repacked = repacks(info.ty);
        let kernels = match repacked_kernels(info.ty) {
            Some(k) if repacked => k,
            _ => format_kernels(info.ty).map_err(|e| match e {
                CudaError::Unsupported(why) => {
                    CudaError::Unsupported(format!("tensor {}: {why}", l.name))
                }
                e => e,
            })?,
        };
        // (Only laying out, without a GPU: the same size either way.)
        let ptr = match repacked && self.gpu.is_some() {
            true => match repack(info.ty, &data, l.out_dim, l.in_dim) {
                Some(r) => self.place(&r)?,
                None => self.place(&data)?,
            },
            false => self.place(&data)?,
        };
        let bias = match &l.bias {
            Some(b) => Some(self.floats(b)?),
            None => None,
        };
        Ok(DevMat {
            ty: info.ty,
            kernels,
            ptr,
            rows: l.out_dim,
            cols: l.in_dim,
            bias,
        })
    }

    /// Matrices of equal shape stored one after another in one tensor (Phi-3's gate and up
    /// projections, the halves of `ffn_up`, the gate's rows first; a stack of experts): placed
    /// once, as the tensor, each part a [`DevMat`] of its own. Each part is rearranged on its
    /// own ([`repack`]) where every part starts 16-byte aligned (its arrays' loads need it),
    /// else all keep the file's layout. The parts' biases (gpt-oss's experts) go together
    /// into one vector, as the file's one tensor of them.
    fn parts(&mut self, parts: &[Linear]) -> Result<Vec<DevMat>, CudaError> {
        let f = &self.m.file;
        // (An expert's name is its stack's with its index: `blk.N.ffn_up_exps.weight[e]`.)
        let name = parts[0].name.split('[').next().unwrap_or_default();
        let info = f
            .tensor_info(name)
            .ok_or_else(|| CudaError::Unsupported(format!("tensor {name} not in the file")))?;
        let data = f.tensor_bytes(info);
        let each = data.len() / parts.len();
        let repacked = repacks(info.ty) && each.is_multiple_of(16);
        let kernels = match repacked_kernels(info.ty) {
            Some(k) if repacked => k,
            _ => format_kernels(info.ty).map_err(|e| match e {
                CudaError::Unsupported(why) => {
                    CudaError::Unsupported(format!("tensor {name}: {why}"))
                }
                e => e,
            })?,
        };
        let (rows, cols) = (parts[0].out_dim, parts[0].in_dim);
        let ptr = match repacked && self.gpu.is_some() {
            true => {
                let mut all = Vec::with_capacity(data.len());
                for part in data.chunks_exact(each) {
                    all.extend_from_slice(&repack(info.ty, part, rows, cols).expect("repacks"));
                }
                self.place(&all)?
            }
            false => self.place(&data)?,
        };
        let bias = match parts.iter().all(|p| p.bias.is_some()) {
            true => {
                let all: Vec<f32> = parts.iter().flat_map(|p| p.bias.clone().unwrap()).collect();
                Some(self.floats(&all)?)
            }
            false => None,
        };
        Ok((0..parts.len())
            .map(|i| DevMat {
                ty: info.ty,
                kernels,
                ptr: ptr + (i * each) as u64,
                rows,
                cols,
                bias: bias.map(|b| b + (i * rows * 4) as u64),
            })
            .collect())
    }

    /// A mixture-of-experts layer's router, expert stacks and shared expert's gate.
    fn moe(&mut self, moe: &crate::model::weights::Moe) -> Result<DevMoe, CudaError> {
        let router = self.matrix(&moe.router)?;
        let gate = self.parts(&moe.gate)?;
        let up = self.parts(&moe.up)?;
        let down = self.parts(&moe.down)?;
        // The shared expert's gate is a vector: on the device as f32, as every vector.
        let shared_gate = match &moe.shared_gate {
            Some(l) => {
                let mut row = vec![0f32; l.in_dim];
                l.row_f32(0, &mut row);
                Some(DevMat {
                    ty: GgmlType::F32,
                    kernels: format_kernels(GgmlType::F32)?,
                    ptr: self.floats(&row)?,
                    rows: 1,
                    cols: l.in_dim,
                    bias: None,
                })
            }
            None => None,
        };
        Ok(DevMoe {
            router,
            gate,
            up,
            down,
            shared_gate,
        })
    }

    fn norm(&mut self, n: &Norm) -> Result<DevNorm, CudaError> {
        let w = self.floats(&n.weight)?;
        let b = match &n.bias {
            Some(b) => Some(self.floats(b)?),
            None => None,
        };
        Ok(DevNorm {
            kind: n.kind,
            eps: n.eps,
            w,
            b,
            len: n.weight.len(),
        })
    }

    fn opt_norm(&mut self, n: &Option<Norm>) -> Result<Option<DevNorm>, CudaError> {
        n.as_ref().map(|n| self.norm(n)).transpose()
    }

    /// Every tensor, in order.
    fn walk(&mut self) -> Result<DeviceWeights, CudaError> {
        let w = &self.m.weights;
        let token_embd = self.matrix(&w.token_embd)?;
        let pos_embd = match &w.pos_embd {
            Some(pe) => {
                let mut all = vec![0f32; pe.out_dim * pe.in_dim];
                for (r, row) in all.chunks_exact_mut(pe.in_dim).enumerate() {
                    pe.row_f32(r, row);
                }
                Some(self.floats(&all)?)
            }
            None => None,
        };
        // The RoPE factors are one tensor shared by every layer.
        let factors = w
            .layers
            .iter()
            .find_map(|l| l.rope.as_ref().and_then(|r| r.freq_factors.as_ref()));
        let rope_factors = factors.map(|f| self.floats(f)).transpose()?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let (qkv, q, k, v) = match &l.qkv {
                Qkv::Fused(f) => (Some(self.matrix(f)?), None, None, None),
                Qkv::Separate { wq, wk, wv } => (
                    None,
                    Some(self.matrix(wq)?),
                    Some(self.matrix(wk)?),
                    Some(self.matrix(wv)?),
                ),
            };
            let o = self.matrix(&l.wo)?;
            let (gate, up) = match (&l.ffn_gate, &l.ffn_up) {
                (Some(g), Some(u)) if self.m.traits.fused_gate_up => {
                    let gu = self.parts(&[g.clone(), u.clone()])?;
                    (Some(gu[0]), Some(gu[1]))
                }
                (g, u) => (
                    g.as_ref().map(|g| self.matrix(g)).transpose()?,
                    u.as_ref().map(|u| self.matrix(u)).transpose()?,
                ),
            };
            let down = l.ffn_down.as_ref().map(|d| self.matrix(d)).transpose()?;
            let moe = l.moe.as_ref().map(|x| self.moe(x)).transpose()?;
            layers.push(DevLayer {
                qkv,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
                moe,
                sinks: l.attn_sinks.as_ref().map(|s| self.floats(s)).transpose()?,
                attn_norm: self.opt_norm(&l.attn_norm)?,
                q_norm: self.opt_norm(&l.q_norm)?,
                k_norm: self.opt_norm(&l.k_norm)?,
                attn_post: self.opt_norm(&l.attn_post_norm)?,
                ffn_norm: self.opt_norm(&l.ffn_norm)?,
                ffn_post: self.opt_norm(&l.ffn_post_norm)?,
                rope_factors: l.rope.as_ref().and(rope_factors),
            });
        }
        let output_norm = self.norm(&w.output_norm)?;
        let output = if w.output_tied {
            token_embd
        } else {
            self.matrix(&w.output)?
        };
        Ok(DeviceWeights {
            _arena: self.arena.take(),
            token_embd,
            pos_embd,
            layers,
            output_norm,
            output,
            bytes: self.layout.bytes,
        })
    }
}

impl DeviceWeights {
    /// Upload `m`'s weights into one allocation; `progress(bytes done, bytes in all)` after
    /// each tensor.
    pub fn upload(
        gpu: &Gpu,
        m: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<DeviceWeights, CudaError> {
        let total = Self::layout_bytes(m)?;
        let mut up = Uploader {
            gpu: Some(gpu),
            m,
            layout: Layout::default(),
            arena: None,
            progress,
            total,
        };
        up.arena = Some(Arena::new(gpu, total)?);
        let w = up.walk()?;
        gpu.synchronize(gpu.default_stream())?;
        Ok(w)
    }

    /// Bytes [`DeviceWeights::upload`] allocates for `m` (laid out without a GPU).
    pub fn layout_bytes(m: &Model) -> Result<usize, CudaError> {
        refuse_unsupported(m)?;
        let mut nothing = |_: usize, _: usize| {};
        let mut up = Uploader {
            gpu: None,
            m,
            layout: Layout::default(),
            arena: None,
            progress: &mut nothing,
            total: 0,
        };
        Ok(up.walk()?.bytes)
    }

    /// A matrix by role.
    pub fn mat(&self, m: Mat) -> DevMat {
        let l = |i: usize| &self.layers[i];
        let some = |x: Option<DevMat>| x.expect("the model has no such matrix");
        match m {
            Mat::Qkv(i) => some(l(i).qkv),
            Mat::Q(i) => some(l(i).q),
            Mat::K(i) => some(l(i).k),
            Mat::V(i) => some(l(i).v),
            Mat::O(i) => l(i).o,
            Mat::Gate(i) => some(l(i).gate),
            Mat::Up(i) => some(l(i).up),
            Mat::Down(i) => some(l(i).down),
            Mat::Output => self.output,
        }
    }

    /// A norm by role.
    pub fn norm(&self, n: NormW) -> DevNorm {
        let l = |i: usize| &self.layers[i];
        let some = |x: Option<DevNorm>| x.expect("the model has no such norm");
        match n {
            NormW::Attn(i) => some(l(i).attn_norm),
            NormW::QHead(i) => some(l(i).q_norm),
            NormW::KHead(i) => some(l(i).k_norm),
            NormW::AttnPost(i) => some(l(i).attn_post),
            NormW::Ffn(i) => some(l(i).ffn_norm),
            NormW::FfnPost(i) => some(l(i).ffn_post),
            NormW::Output => self.output_norm,
            // Encoders do not load on the GPU (`EngineError::Encoder`).
            NormW::Embd => panic!("the GPU does not run encoders"),
        }
    }

    /// Layer `i`'s experts, if it is a mixture-of-experts layer.
    pub fn moe(&self, i: usize) -> Option<&DevMoe> {
        self.layers[i].moe.as_ref()
    }

    /// Layer `i`'s attention sinks (0 when none).
    pub fn sinks(&self, i: usize) -> u64 {
        self.layers[i].sinks.unwrap_or(0)
    }

    /// Layer `i`'s RoPE frequency factors (0 when none).
    pub fn rope_factors(&self, i: usize) -> u64 {
        self.layers[i].rope_factors.unwrap_or(0)
    }
}

/// Refuse, by name, a model whose computation the device code does not have, before anything
/// is laid out or uploaded: Granite's residual and logit scales (not checked on the device).
fn refuse_unsupported(m: &Model) -> Result<(), CudaError> {
    let c = &m.config;
    if c.residual_scale.is_some() || c.logit_scale.is_some() {
        return Err(CudaError::Unsupported(format!(
            "{}'s residual and logit scales ({0}.residual_scale, {0}.logit_scale; not \
             checked on the device)",
            c.arch_name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_weight_format_names_kernels_that_exist() {
        let all: Vec<String> = crate::backend::cuda::nvrtc::KERNELS
            .iter()
            .flat_map(|(_, src)| crate::backend::cuda::nvrtc::entries(src))
            .collect();
        let mut formats = 0;
        for ty in GgmlType::ALL {
            let Ok(k) = format_kernels(ty) else { continue };
            formats += 1;
            let re = repacked_kernels(ty);
            for k in std::iter::once(k).chain(re) {
                let names = [Some(k.matvec), Some(k.embed), k.prompt.kernel(), k.quantize];
                let more = [k.matvec_f32, k.gated, k.gated_f32, k.matvec_post];
                let rope = k.matvec_rope.into_iter().flatten().map(Some);
                for name in names.into_iter().chain(more).chain(rope).flatten() {
                    assert!(all.iter().any(|e| e == name), "{ty}: no kernel {name}");
                }
            }
        }
        assert_eq!(formats, 23, "the 23 weight formats the GPU multiplies");
    }

    /// The random model of recipe `name`.
    fn recipe_model(name: &str) -> Model {
        let (_, recipe) = crate::fixtures::RECIPES
            .iter()
            .find(|(n, _)| *n == name)
            .expect("recipe");
        let bytes = crate::fixtures::random_f32(recipe).to_bytes();
        let f = crate::gguf::GgufFile::from_bytes(bytes).expect("parse");
        Model::from_gguf(f).expect("load")
    }

    /// Soft caps (Gemma-2), YaRN (llama-yarn) and LongRoPE with a fused gate and up (Phi-3),
    /// an attention temperature (Mistral-3) and blocks without input norms (OLMo-2, EXAONE 4)
    /// run on the device; Granite's scales are refused by name before anything is uploaded
    /// (no device needed to check it).
    #[test]
    fn architecture_features_run_and_granite_is_refused_by_name() {
        for name in [
            "gemma2",
            "llama-yarn",
            "phi3",
            "mistral3",
            "olmo2",
            "olmo3",
            "exaone4",
            "exaone",
        ] {
            let m = recipe_model(name);
            refuse_unsupported(&m).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let msg = refuse_unsupported(&recipe_model("granite"))
            .expect_err("refused")
            .to_string();
        assert!(msg.contains("granite.residual_scale"), "{msg}");
    }

    /// Every weight format has kernels, whose activations are those the CPU multiplies it
    /// with; the activation-only formats are refused by name.
    #[test]
    fn every_weight_format_has_kernels_and_activation_formats_are_refused() {
        for ty in GgmlType::ALL {
            match format_kernels(ty) {
                Ok(k) => {
                    let want = match crate::quant::dot_type(ty) {
                        GgmlType::Q8_0 => Some("quantize_q8_0"),
                        GgmlType::Q8_1 => Some("quantize_q8_1"),
                        GgmlType::Q8K => Some("quantize_q8_k"),
                        _ => None,
                    };
                    assert_eq!(k.quantize, want, "{ty}");
                }
                Err(e) => {
                    assert!(ty.is_internal(), "{ty}: {e}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains(ty.name()) && msg.contains("activation"),
                        "{msg}"
                    );
                }
            }
        }
    }
}
