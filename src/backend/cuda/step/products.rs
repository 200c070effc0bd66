//! A session's matrix products: decode-sized ones as 8-bit integer matvecs (one launch for the
//! matrices that share an input), prompt-sized ones as bf16 dequantization and a tensor-core
//! product (see docs/gpu.md).

use super::{Capture, CudaSession, GemmLayout, GEMM_MIN_ROWS};
use crate::backend::cuda::gpu::{blocks_for, Arg, Gpu};
use crate::backend::cuda::weights::{DevMat, PromptProduct, F32_INPUT_MAX_COLS};
use crate::backend::cuda::CudaError;
use crate::cache::KvType;
use crate::kernels::ops::RopeKind;
use crate::model::Model;

/// Threads per output row of the matvec kernels: four warps on a GPU; one on the software
/// GPU, where every warp costs fiber switches and loads have no latency to hide.
/// (`KILN_CUDA_MV_THREADS` overrides it, for measuring.)
pub(super) fn mv_threads(gpu: &Gpu) -> u32 {
    match (crate::tuning::get().cuda_mv_threads, gpu.is_emulated()) {
        (Some(v), _) => v,
        (None, true) => 32,
        (None, false) => 128,
    }
}

/// How a quantized matvec over rows of `cols` elements launches: (threads per block, threads
/// per row). Rows of up to 512 groups of 32 take one warp each, eight rows to a block of 256:
/// the narrow matrices of small models, whose rows leave most of a four-warp block idle, their
/// output heads of 50,000–260,000 rows, and an 8B model's rows of 4,096 and 14,336 (a warp
/// sums its row without a barrier: the 8B shape's decode 284 → 301 tok/s on an H100 against a
/// bound of 64 groups); wider rows take a block of `mv_threads`. `KILN_CUDA_MV_WARP_GROUPS=n`
/// moves the bound (for measuring; 0 gives every row a block).
pub(super) fn mv_shape(gpu: &Gpu, cols: usize) -> (u32, u32) {
    if cols / 32 <= crate::tuning::get().cuda_mv_warp_groups {
        (256, 32)
    } else {
        let t = mv_threads(gpu);
        (t, t)
    }
}

/// The RoPE epilogue's arguments of the matvec kernels (`ROPE_PARAMS` in matvec.cu).
pub(super) const ROPE_ARGS: usize = 13;

/// The post-norm epilogue's arguments (`POST_PARAMS` in matvec.cu): the residual stream, the
/// norm's weights and epsilon, the blocks' counter.
pub(super) const POST_ARGS: usize = 4;

/// What a decode-sized product does with its sums.
#[derive(Clone, Copy)]
pub(super) enum Epilogue<'a> {
    /// y = the product.
    Store,
    /// y += the product (a residual stream: y + (w·x), as a separate add of the product
    /// would round it; not the f32 kernels of unquantized weights).
    Add,
    /// The attention's q, k and v with their RoPE (and cache store): `rope_epilogue` in
    /// matvec.cu (quantized formats, rows of a warp each).
    Rope(&'a [Arg; ROPE_ARGS]),
    /// y = the product of one matrix, then the residual stream += rms_norm(y)·w, by the last
    /// block (`matvec_post`: f32 input, narrow rows).
    PostNorm([Arg; POST_ARGS]),
}

/// The most tokens a decode-sized product quantizes its input inside its blocks for (each
/// block quantizes every token's row: more tokens quantize once, in a launch of their own).
const F32_INPUT_MAX_TOKENS: usize = 4;

/// The widest rows whose products quantize (and normalize) their f32 input in their own blocks:
/// 2048 (a small model's rows), or `KILN_CUDA_F32_INPUT_COLS` up to [`F32_INPUT_MAX_COLS`],
/// for measuring. At 4096 an 8B model's layer decodes in 7 launches instead of 10 (its norms
/// and the attention output's quantizer go into the products), each of the products' blocks
/// quantizing the token's 4096 inputs first: its speed on a GPU is unmeasured.
fn f32_input_cols() -> usize {
    crate::tuning::get()
        .cuda_f32_input_cols
        .map_or(2048, |v| v.min(F32_INPUT_MAX_COLS))
}

/// The widest rows whose q, k and v products take the RoPE in their epilogue: a small model's
/// (an 8B model's 4096-wide products were slower with it, 270 against 301 tok/s, H100,
/// 2026-11-27, 6a24356).
const ROPE_EPILOGUE_MAX_COLS: usize = 2048;

/// Which forms of a product's input exist (products that share an input make them once; the
/// 8-bit form is the session's `xq_holds`).
#[derive(Default)]
pub(super) struct Prepared {
    pub(super) bf16: bool,
}

impl CudaSession {
    /// `y = x · mᵀ` for `rows` rows of x (`[rows, m.cols]` f32) into y (`[rows, m.rows]`).
    /// `prep` remembers which forms of x the products sharing it have made.
    pub(super) fn product(&mut self, m: DevMat, x: u64, y: u64, rows: usize, prep: &mut Prepared) {
        match self.layout.gemm {
            Some(g) if rows >= GEMM_MIN_ROWS => self.gemm(m, g, x, y, rows, prep),
            _ => self.matvecs(&[(m, y)], x, rows, Epilogue::Store),
        }
        self.bias(m, y, rows);
    }

    pub(super) fn bias(&mut self, m: DevMat, y: u64, rows: usize) {
        if let Some(b) = m.bias {
            let args = [
                Arg::P(y),
                Arg::P(b),
                Arg::L(rows as i64),
                Arg::I(m.rows as i32),
            ];
            self.go("add_bias_f32", blocks_for(rows * m.rows), 256, &args);
        }
    }

    /// Decode-sized products of 1–3 matrices of one format that share the input x, into their
    /// outputs as `epi` says, in one launch (biases not included).
    pub(super) fn matvecs(
        &mut self,
        mats: &[(DevMat, u64)],
        x: u64,
        rows: usize,
        epi: Epilogue<'_>,
    ) {
        let m = mats[0].0;
        let threads = mv_threads(&self.gpu);
        let (block, tpr) = mv_shape(&self.gpu, m.cols);
        // (Blocks that quantize x themselves read it while others write: not in place.)
        let own = self
            .own_input(m.kernels.matvec_f32, m, x, rows)
            .filter(|_| mats.iter().all(|&(_, y)| y != x));
        let (quantized, norm) = self.product_input(own, m, x, rows);
        let Some(input) = quantized else {
            debug_assert!(
                matches!(epi, Epilogue::Store),
                "an f32 matvec has no epilogue"
            );
            for &(m, y) in mats {
                let args = [
                    Arg::P(m.ptr),
                    Arg::P(x),
                    Arg::P(y),
                    Arg::I(m.rows as i32),
                    Arg::I(m.cols as i32),
                    Arg::I(rows as i32),
                ];
                self.go(m.kernels.matvec, m.rows as u32, threads, &args);
            }
            return;
        };
        let at = |i: usize| mats.get(i).copied().unwrap_or((DevMat { rows: 0, ..m }, 0));
        let (a, b, c) = (at(0), at(1), at(2));
        // The kernel's arguments: 14 of the product, the RoPE epilogue's (`NAME_rope`,
        // `NAME_f_rope`), then the norm's (`NAME_f`, `NAME_f_rope`, `NAME_f_post`), then the
        // post-norm's (`NAME_f_post`).
        let add = matches!(epi, Epilogue::Add);
        let mut args = [Arg::I(0); 14 + ROPE_ARGS + 2 + POST_ARGS];
        args[..14].copy_from_slice(&[
            Arg::P(a.0.ptr),
            Arg::P(b.0.ptr),
            Arg::P(c.0.ptr),
            Arg::P(input),
            Arg::P(a.1),
            Arg::P(b.1),
            Arg::P(c.1),
            Arg::I(a.0.rows as i32),
            Arg::I(b.0.rows as i32),
            Arg::I(c.0.rows as i32),
            Arg::I(m.cols as i32),
            Arg::I(rows as i32),
            Arg::I(add as i32),
            Arg::I(tpr as i32),
        ]);
        let mut n = 14;
        let mut kernel = own.unwrap_or(m.kernels.matvec);
        if let (Epilogue::Rope(r), Some([plain, f32_input])) = (epi, m.kernels.matvec_rope) {
            args[n..n + ROPE_ARGS].copy_from_slice(r);
            n += ROPE_ARGS;
            kernel = if own.is_some() { f32_input } else { plain };
        }
        if own.is_some() {
            args[n..n + 2].copy_from_slice(&[Arg::P(norm.0), Arg::F(norm.1)]);
            n += 2;
        }
        if let Epilogue::PostNorm(p) = epi {
            // (The caller checked that the kernel over f32 input applies: `post_norm_epilogue`.)
            match (own, m.kernels.matvec_post) {
                (Some(_), Some(k)) if mats.len() == 1 => kernel = k,
                _ => {
                    self.err.get_or_insert(CudaError::Driver(
                        "internal: a post-norm epilogue without its kernel".into(),
                    ));
                    return;
                }
            }
            args[n..n + POST_ARGS].copy_from_slice(&p);
            n += POST_ARGS;
        }
        let grid = (a.0.rows + b.0.rows + c.0.rows).div_ceil((block / tpr) as usize) as u32;
        self.go(kernel, grid, block, &args[..n]);
    }

    /// What a decode-sized product of `m` over x reads, given its kernel over f32 input `own`
    /// (if it applies): the f32 rows (those of a deferred norm's input, x's own otherwise) and
    /// the norm its blocks apply first (weights 0: none), or x quantized (`None`: the kernel
    /// takes f32), after launching a deferred norm that x would have been.
    pub(super) fn product_input(
        &mut self,
        own: Option<&'static str>,
        m: DevMat,
        x: u64,
        rows: usize,
    ) -> (Option<u64>, (u64, f32)) {
        match (own, self.deferred_for(x, rows)) {
            (Some(_), Some(d)) => (Some(d.x), (d.n.w, d.n.eps)),
            (Some(_), None) => (Some(x), (0, 0.0)),
            (None, _) => {
                self.settle();
                (self.quantized(m, x, rows), (0, 0.0))
            }
        }
    }

    /// The kernel over f32 input (`k`: `matvec_f32` or `gated_f32` of `m`) for a product of
    /// `rows` tokens of x, if it applies: narrow rows, a few tokens, x that nothing quantized
    /// yet (or the output of a deferred norm). Each block quantizes the input itself: the same
    /// bits, one launch fewer.
    pub(super) fn own_input(
        &self,
        k: Option<&'static str>,
        m: DevMat,
        x: u64,
        rows: usize,
    ) -> Option<&'static str> {
        let q = m.kernels.quantize?;
        let ok = self.fuse
            && mv_shape(&self.gpu, m.cols) == (256, 32)
            && m.cols <= f32_input_cols()
            && rows <= F32_INPUT_MAX_TOKENS
            && self.xq_holds != Some((x, q, rows));
        k.filter(|_| ok)
    }

    /// x quantized for `m`'s matvec kernel, or `None` when the kernel takes f32. Made once
    /// for the products that share it (and not at all after a norm that quantized it):
    /// `xq_holds` says what the buffer holds.
    pub(super) fn quantized(&mut self, m: DevMat, x: u64, rows: usize) -> Option<u64> {
        let q = m.kernels.quantize?;
        let xq = self.at(self.layout.xq);
        if self.xq_holds != Some((x, q, rows)) {
            let n = rows * m.cols;
            let args = [Arg::P(x), Arg::P(xq), Arg::L(n as i64)];
            // One thread per element (n is whole groups: of 32, or of 256 for Q8_K, whose
            // kernel takes a block of 256 per group).
            let grid = n.div_ceil(256) as u32;
            self.go(q, grid, 256, &args);
            self.xq_holds = Some((x, q, rows));
        }
        Some(xq)
    }

    /// A prompt-sized product: x to bf16 (once per input), then per chunk of weight rows that
    /// fits a scratch buffer, dequantize them to bf16 (ahead, on a second stream: `ahead.rs`)
    /// and multiply (cuBLAS, or `gemm_bf16` on the software GPU). Weights that bf16 would round
    /// multiply in f32: F32 rows as they are, F16 rows widened a chunk at a time, x as it is.
    fn gemm(&mut self, m: DevMat, g: GemmLayout, x: u64, y: u64, rows: usize, prep: &mut Prepared) {
        let f32 = matches!(m.kernels.prompt, PromptProduct::F32(_));
        let xs = if f32 { x } else { self.at(g.xbf) };
        if !f32 && !prep.bf16 {
            let n = rows * m.cols;
            self.elementwise("f32_to_bf16", &[Arg::P(x), Arg::P(xs), Arg::L(n as i64)], n);
            prep.bf16 = true;
        }
        // A buffer holds `wbf_elems` bf16, half as many f32; F32 rows need none.
        let kernel = m.kernels.prompt.kernel();
        let chunk = match (kernel, f32) {
            (None, _) => m.rows,
            (Some(_), true) => g.wbf_elems / 2 / m.cols.max(1),
            (Some(_), false) => g.wbf_elems / m.cols.max(1),
        }
        .max(1);
        let mut r0 = 0;
        while r0 < m.rows && self.err.is_none() {
            let nr = chunk.min(m.rows - r0);
            let n = nr * m.cols;
            let (read, w) = match kernel {
                Some(k) => {
                    let args = |wbf| {
                        vec![
                            Arg::P(m.ptr),
                            Arg::P(wbf),
                            Arg::I(m.cols as i32),
                            Arg::L(r0 as i64),
                            Arg::L(n as i64),
                            Arg::L(m.groups() as i64),
                        ]
                    };
                    match self.dequantize_chunk(k, n, args) {
                        Some((c, w)) => (Some(c), w),
                        None => return,
                    }
                }
                None => (None, m.ptr + (r0 * m.cols * 4) as u64),
            };
            let yc = y + (r0 * 4) as u64;
            let done = match self.capture {
                Capture::Replaying(_) => true,
                _ if self.err.is_some() => true,
                _ => {
                    let ws = self.at(g.workspace);
                    let t = self.start_op();
                    let r =
                        self.gpu
                            .gemm(f32, &self.stream, ws, w, xs, yc, nr, m.cols, rows, m.rows);
                    let op = if f32 {
                        "cublas_gemm_f32"
                    } else {
                        "cublas_gemm_bf16"
                    };
                    self.end_op(op, t);
                    r.unwrap_or_else(|e| {
                        self.fail(Err(e));
                        true
                    })
                }
            };
            if !done {
                let args = [
                    Arg::P(w),
                    Arg::P(xs),
                    Arg::P(yc),
                    Arg::I(nr as i32),
                    Arg::I(m.cols as i32),
                    Arg::I(rows as i32),
                    Arg::I(m.rows as i32),
                ];
                let k = if f32 { "gemm_f32" } else { "gemm_bf16" };
                self.elementwise(k, &args, nr * rows);
            }
            if let Some(c) = read {
                self.chunk_read(c);
            }
            r0 += nr;
        }
    }

    /// The RoPE epilogue's arguments for the one-launch q, k and v products `mats` of layer
    /// `layer`, when its RoPE can go there: the RoPE follows the products directly (no q/k
    /// norms, no biases), adjacent pairs (the normal kind), rows of a warp each in whole
    /// blocks of eight, of at most [`ROPE_EPILOGUE_MAX_COLS`] (a small model's launch-bound
    /// decode: SmolLM2 937 against 922 tok/s without it), the switches on. Then the layer's `rope`
    /// launches nothing, and with an f16 cache the epilogue also stores the keys and values
    /// (`kv_stored`).
    pub(super) fn rope_epilogue(
        &mut self,
        m: &Model,
        layer: usize,
        mats: &[(DevMat, u64)],
    ) -> Option<[Arg; ROPE_ARGS]> {
        let (c, l) = (&m.config, &m.weights.layers[layer]);
        let rope = l.rope.as_ref()?;
        let whole_blocks = mats
            .iter()
            .all(|(d, _)| d.rows % 8 == 0 && d.bias.is_none());
        let ok = self.fuse
            && self.rope_in_products
            && mats[0].0.kernels.matvec_rope.is_some()
            && matches!(rope.kind, RopeKind::Normal)
            && super::rope::plain(rope)
            && l.q_norm.is_none()
            && l.k_norm.is_none()
            && whole_blocks
            && c.head_dim_k % 2 == 0
            && mats.len() == 3
            && mats[0].0.cols <= ROPE_EPILOGUE_MAX_COLS
            && mv_shape(&self.gpu, mats[0].0.cols) == (256, 32);
        if !ok {
            return None;
        }
        self.roped = Some(layer);
        let a = self.rope_args(m, layer, self.layout.kv_type == KvType::F16);
        Some([
            a.pos,
            a.seq,
            a.k_cache,
            a.v_cache,
            a.k_stride,
            a.v_stride,
            a.factors,
            a.theta_scale,
            a.freq_scale,
            a.head_dim_k,
            a.n_dims,
            a.head_dim_v,
            a.slots,
        ])
    }
}
