//! A session: one sequence's state over a shared model — its KV cache, scratch buffers and the
//! tokens they hold. Everything is allocated in [`Session::new`]; prefill and decode reuse it.

use std::ops::Range;
use std::sync::Arc;

use crate::backend::cpu::Runtime;
use crate::backend::cuda::{
    self, CudaKv, CudaSession, CudaSizes, CudaStep, DeviceWeights, MAX_GRAPH_ROWS,
};
use crate::backend::{Device, SeqBatch};
use crate::cache::{
    KvBudgetError, KvCache, KvCacheError, KvLayout, KvType, KvTypeError, Scratch, ScratchSpec,
};
use crate::engine::sequence::{mask_logits, Kv, Sequence};
use crate::model::forward::{forward_batch, forward_cpu, ForwardError, Logits};
use crate::model::{weights, Model};

/// How a session is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Context length (KV cache positions).
    pub n_ctx: usize,
    pub n_threads: usize,
    /// Tokens per prefill forward pass; bounds activation memory.
    pub prefill_chunk: usize,
    /// Logit rows the output head computes at once (every position's, for perplexity; a
    /// batch runner's slots and verification rows).
    pub logit_rows: usize,
    /// Rows a pass carries beside its prefill chunk: a batch runner's decode rows and
    /// verification passes, one sequence's each (0 for a session).
    pub batch_rows: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// RAM for the KV cache: when the whole cache is larger, it lives in a file and a ring of
    /// layer buffers fitting this budget is streamed (None = always in RAM).
    pub kv_budget: Option<usize>,
    /// Give sliding-window layers a cache of the whole context, as the other layers
    /// (llama.cpp's `--swa-full`), instead of a ring of their window.
    pub swa_full: bool,
    /// Where the forward pass runs.
    pub device: Device,
}

impl SessionOptions {
    pub fn new(n_ctx: usize, n_threads: usize) -> Self {
        SessionOptions {
            n_ctx,
            n_threads,
            prefill_chunk: 512,
            logit_rows: 1,
            batch_rows: 0,
            kv_type: KvType::F16,
            kv_budget: None,
            swa_full: false,
            device: Device::Cpu,
        }
    }
}

/// Why a session refused work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error("the prompt has {prompt} tokens but the context holds {ctx} ({used} already in use); raise -c or shorten the prompt")]
    PromptTooLong {
        prompt: usize,
        ctx: usize,
        used: usize,
    },
    #[error("the context of {ctx} tokens is full")]
    ContextFull { ctx: usize },
    #[error("context size {ctx} exceeds what this model supports ({max} positions, its training context); lower -c")]
    ContextTooLarge { ctx: usize, max: usize },
    #[error("empty prompt")]
    EmptyPrompt,
    #[error(transparent)]
    KvType(#[from] KvTypeError),
    #[error(transparent)]
    KvBudget(#[from] KvBudgetError),
    #[error("cannot create the KV cache: {0}")]
    KvCache(String),
    #[error(transparent)]
    Grammar(#[from] crate::grammar::GrammarError),
    #[error(transparent)]
    Cuda(#[from] crate::backend::cuda::CudaError),
    #[error("the draft model: {0}")]
    Draft(String),
    /// Something an encoder (an embedding model) cannot do: generate text, or run where
    /// kiln does not run encoders.
    #[error("'{arch}' is an encoder (an embedding model): {what}")]
    Encoder { arch: String, what: &'static str },
}

impl EngineError {
    /// Refuse to generate with an encoder.
    pub fn encoder_generation(arch: &str) -> EngineError {
        EngineError::Encoder {
            arch: arch.to_string(),
            what: "it gives embeddings (kiln embedding, /v1/embeddings, /api/embed), not text",
        }
    }
}

impl From<KvCacheError> for EngineError {
    fn from(e: KvCacheError) -> Self {
        match e {
            KvCacheError::Type(t) => EngineError::KvType(t),
            KvCacheError::Offload(o) => EngineError::KvCache(o.to_string()),
        }
    }
}

/// One sequence being evaluated.
pub struct Session {
    pub model: Arc<Model>,
    /// The CPU's threads (a session on the GPU keeps one, for host work).
    pub rt: Runtime,
    pub opts: SessionOptions,
    /// The KV cache and the tokens in it.
    seq: Sequence<Kv>,
    exec: Exec,
}

/// Where a session's buffers live (its cache is on the same device).
#[allow(clippy::large_enum_variant)]
enum Exec {
    Cpu {
        scratch: Scratch,
    },
    Cuda {
        s: Box<CudaSession>,
        /// `[vocab]`: the last token's logits, copied back.
        logits: Vec<f32>,
        /// Passes are computed as decode steps ([`Session::eval_as_decodes`]).
        alone: bool,
    },
}

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session, EngineError> {
        Session::with_progress(model, opts, &mut |_, _| {})
    }

    /// [`Session::new`], calling `progress(bytes done, bytes in all)` while the weights go to
    /// the GPU (not at all on the CPU, or when another session already put them there).
    pub fn with_progress(
        model: Arc<Model>,
        opts: SessionOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Session, EngineError> {
        let c = &model.config;
        if c.arch.is_encoder() {
            // A session generates (run, chat, perplexity, bench): an encoder cannot.
            return Err(EngineError::encoder_generation(&c.arch_name));
        }
        let n_ctx = opts.n_ctx.max(1);
        check_context(c, n_ctx)?;
        let opts = SessionOptions {
            n_ctx,
            ..session_options(&opts)
        };
        let spec = scratch_spec(&model, &opts);
        let (kv, exec, threads) = match opts.device {
            Device::Cpu => {
                let layout = kv_layout(c, &opts);
                let kv = match layout.offload_ring(opts.kv_type, opts.kv_budget)? {
                    None => KvCache::with_type(layout, opts.kv_type)?,
                    Some(ring) => KvCache::offloaded(layout, opts.kv_type, ring)?,
                };
                let scratch = Scratch::new(c, spec);
                (Kv::Cpu(kv), Exec::Cpu { scratch }, opts.n_threads)
            }
            Device::Cuda => {
                let layout = kv_layout(c, &opts);
                let s = cuda_session(&model, &opts, spec, &layout, 1, progress)?;
                let exec = Exec::Cuda {
                    s,
                    logits: vec![0.0; c.vocab_size],
                    alone: false,
                };
                (Kv::Cuda(CudaKv::new(0, layout)), exec, 1)
            }
        };
        Ok(Session {
            rt: Runtime::new(threads),
            seq: Sequence::new(kv, n_ctx),
            exec,
            opts,
            model,
        })
    }

    /// Run `tokens` after the cached ones on this session's device.
    fn run(&mut self, tokens: &[u32], logits: Logits<'_>) -> Result<(), ForwardError> {
        self.run_copy(tokens, logits, true)
    }

    /// [`Session::run`]; on the GPU, the last token's logits come back to the host only with
    /// `copy` (else they stay on the device, for [`Session::decode_greedy`]).
    fn run_copy(
        &mut self,
        tokens: &[u32],
        logits: Logits<'_>,
        copy: bool,
    ) -> Result<(), ForwardError> {
        match (&mut self.seq.kv, &mut self.exec) {
            (Kv::Cpu(kv), Exec::Cpu { scratch }) => {
                forward_cpu(&self.model, &self.rt, kv, scratch, tokens, logits)
            }
            (
                Kv::Cuda(kv),
                Exec::Cuda {
                    s,
                    logits: host,
                    alone,
                },
            ) => {
                let last = copy && matches!(logits, Logits::Last);
                let m = &*self.model;
                let n_tokens = tokens.len();
                let seqs = &mut [SeqBatch {
                    kv,
                    n_tokens,
                    alone: *alone,
                }];
                forward_batch(m, &mut CudaStep { m, s }, seqs, tokens, logits)?;
                if last {
                    let l = s
                        .logits(0..1)
                        .map_err(|e| ForwardError::Device(e.to_string()))?;
                    host.copy_from_slice(l);
                }
                Ok(())
            }
            _ => Err(ForwardError::Device(
                "the cache and the buffers are on different devices".into(),
            )),
        }
    }

    /// Tokens in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.seq.tokens
    }

    pub fn n_past(&self) -> usize {
        self.seq.tokens.len()
    }

    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    /// Logits of the last evaluated token, `[vocab]`.
    pub fn logits(&self) -> &[f32] {
        let v = self.model.config.vocab_size;
        match &self.exec {
            Exec::Cpu { scratch, .. } => &scratch.logits[..v],
            Exec::Cuda { logits, .. } => logits,
        }
    }

    /// Set the logits of `tokens` to -inf, so no sampler picks them (`--ignore-eos`).
    pub fn mask_tokens(&mut self, tokens: &[u32]) {
        let v = self.model.config.vocab_size;
        match &mut self.exec {
            Exec::Cpu { scratch } => mask_logits(&mut scratch.logits[..v], tokens),
            Exec::Cuda { logits, .. } => mask_logits(logits, tokens),
        }
    }

    /// The KV cache of a session on the CPU; `None` on the GPU, whose cache is in device memory
    /// ([`Session::cuda`]).
    pub fn kv(&self) -> Option<&KvCache> {
        match &self.seq.kv {
            Kv::Cpu(kv) => Some(kv),
            Kv::Cuda(_) => None,
        }
    }

    /// The scratch buffers of a session on the CPU; `None` on the GPU.
    pub fn scratch(&self) -> Option<&Scratch> {
        match &self.exec {
            Exec::Cpu { scratch, .. } => Some(scratch),
            Exec::Cuda { .. } => None,
        }
    }

    /// The session's state on the GPU, if it runs there.
    pub fn cuda(&self) -> Option<&CudaSession> {
        match &self.exec {
            Exec::Cpu { .. } => None,
            Exec::Cuda { s, .. } => Some(s),
        }
    }

    /// Record decode steps as CUDA graphs (the default) or launch every op (for comparison).
    /// Nothing on the CPU.
    pub fn set_cuda_graphs(&mut self, on: bool) {
        if let Exec::Cuda { s, .. } = &mut self.exec {
            s.use_graphs = on;
        }
    }

    /// Fuse ops on the GPU (the default) or launch each alone (for comparison). Nothing on the
    /// CPU.
    pub fn set_cuda_fusion(&mut self, on: bool) {
        if let Exec::Cuda { s, .. } = &mut self.exec {
            s.set_fusion(on);
        }
    }

    /// On the GPU, the CPU's f16 attention arithmetic on short decode contexts, or f32
    /// (`KILN_CUDA_MIRROR=0`); nothing on the CPU.
    pub fn set_cuda_mirror(&mut self, on: bool) {
        if let Exec::Cuda { s, .. } = &mut self.exec {
            s.set_mirror(on);
        }
    }

    /// Whether `n` more tokens would overflow the context.
    pub fn would_overflow(&self, n: usize) -> bool {
        self.seq.would_overflow(n)
    }

    /// Forget the sequence.
    pub fn reset(&mut self) {
        self.seq.reset();
    }

    /// Drop every token after the first `n` (the cache's rollback) and return how many are
    /// kept: `n`, or 0 where the sliding-window rings no longer hold the window before `n`
    /// (then everything is evaluated again; see [`KvCache::rollback`]).
    pub fn rollback(&mut self, n: usize) -> usize {
        self.seq.rollback(n)
    }

    /// The most tokens a pass may add after a position and still roll back to it exactly:
    /// a sliding-window ring's `rows − window + 1` (see `KvWindow::max_pass`); unbounded
    /// without rings.
    pub fn rollback_reach(&self) -> usize {
        kv_layout(&self.model.config, &self.opts)
            .window
            .map_or(usize::MAX, |w| w.max_pass())
    }

    /// Length of the common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.seq.common_prefix(tokens)
    }

    /// Refuse a prompt of `n` more tokens that would not fit.
    pub fn check_fits(&self, n: usize) -> Result<(), EngineError> {
        if self.would_overflow(n) {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                ctx: self.opts.n_ctx,
                used: self.n_past(),
            });
        }
        Ok(())
    }

    /// Evaluate `tokens` after what is cached, in chunks of `prefill_chunk`, and leave the
    /// last token's logits in [`Session::logits`]. `progress(done, total)` is called per chunk.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<&[f32], EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_fits(tokens.len())?;
        let chunk = self.max_tokens();
        let mut done = 0;
        for part in tokens.chunks(chunk) {
            let last = done + part.len() == tokens.len();
            let want = if last { Logits::Last } else { Logits::None };
            self.run(part, want)?;
            self.seq.tokens.extend_from_slice(part);
            done += part.len();
            progress(done, tokens.len());
        }
        Ok(self.logits())
    }

    /// Evaluate `tokens` reusing the longest cached prefix (chat turns, repeated system
    /// prompts): rolls back to the shared part and prefills only the rest. Returns the number
    /// of tokens that were reused.
    pub fn prefill_reuse(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<usize, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        // Keep at least one token to evaluate so that fresh logits exist.
        let reuse = self.common_prefix(tokens).min(tokens.len() - 1);
        if tokens.len() > self.opts.n_ctx {
            return Err(EngineError::PromptTooLong {
                prompt: tokens.len(),
                ctx: self.opts.n_ctx,
                used: 0,
            });
        }
        let reuse = self.rollback(reuse);
        self.prefill(&tokens[reuse..], progress)?;
        Ok(reuse)
    }

    /// Evaluate one generated token; returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<&[f32], EngineError> {
        if self.would_overflow(1) {
            return Err(EngineError::ContextFull {
                ctx: self.opts.n_ctx,
            });
        }
        self.run(&[token], Logits::Last)?;
        self.seq.tokens.push(token);
        Ok(self.logits())
    }

    /// Evaluate one token and return the most likely next one (greedy decoding). On the GPU
    /// the choice is made there and only the token id comes back; [`Session::logits`] then
    /// still holds the logits before this step.
    pub fn decode_greedy(&mut self, token: u32) -> Result<u32, EngineError> {
        if self.cuda().is_none() {
            return Ok(crate::sampler::argmax(self.decode(token)?));
        }
        if self.would_overflow(1) {
            return Err(EngineError::ContextFull {
                ctx: self.opts.n_ctx,
            });
        }
        self.run_copy(&[token], Logits::Last, false)?;
        self.seq.tokens.push(token);
        let mut next = [0u32];
        if let Exec::Cuda { s, .. } = &mut self.exec {
            s.argmax(1, &mut next)?;
        }
        Ok(next[0])
    }

    /// Evaluate `tokens` and hand the logits of every position `>= first` to
    /// `sink(position_in_tokens, logits)` (teacher forcing, perplexity).
    pub fn eval_all(
        &mut self,
        tokens: &[u32],
        first: usize,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.eval_parts(tokens, first, &mut |s, part, base, rows| {
            let mut shifted = |row: usize, l: &[f32]| sink(base + row, l);
            Ok(s.run(part, Logits::Rows(rows, &mut shifted))?)
        })
    }

    /// [`Session::eval_all`] with every row's logits those a decode step of it would give, bit
    /// for bit, where a batch computes them otherwise (the K-quants on the CPU: see
    /// `kernels::matmul::batch_dependent`; every format on the GPU, whose prompt products and
    /// attention differ from its decode steps'): speculative decoding's verification passes,
    /// so that they sample what plain decoding samples. On the GPU, in passes of at most
    /// [`crate::backend::cuda::MAX_GRAPH_ROWS`] tokens.
    pub fn eval_as_decodes(
        &mut self,
        tokens: &[u32],
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let alone = |s: &mut Session, on: bool| match &mut s.exec {
            Exec::Cpu { scratch } => scratch.rows_alone = on,
            Exec::Cuda { alone, .. } => *alone = on,
        };
        alone(self, true);
        let r = self.eval_all(tokens, 0, sink);
        alone(self, false);
        r
    }

    /// [`Session::eval_all`] with `f(position_in_tokens, logits)` called in any order, on any
    /// of the session's threads: per-position work (scoring a position's logits) runs in
    /// parallel.
    pub fn eval_all_each(
        &mut self,
        tokens: &[u32],
        first: usize,
        f: &(dyn Fn(usize, &[f32]) + Sync),
    ) -> Result<(), EngineError> {
        self.eval_parts(tokens, first, &mut |s, part, base, rows| {
            let shifted = |row: usize, l: &[f32]| f(base + row, l);
            Ok(s.run(part, Logits::EachRow(rows, &shifted))?)
        })
    }

    /// Evaluate `tokens` a forward pass at a time: `pass(self, part, base, rows)` runs a part
    /// that starts at `base` and whose rows `rows` (relative to the part) are at or after
    /// `first`; parts with no such row only fill the cache.
    fn eval_parts(
        &mut self,
        tokens: &[u32],
        first: usize,
        pass: &mut EvalPass<'_>,
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_fits(tokens.len())?;
        let chunk = match self.exec {
            // (A pass of decode rows: see `SeqBatch::alone`.)
            Exec::Cuda { alone: true, .. } => self.max_tokens().min(MAX_GRAPH_ROWS),
            _ => self.max_tokens(),
        };
        let mut base = 0;
        for part in tokens.chunks(chunk) {
            let lo = first.saturating_sub(base).min(part.len());
            if lo < part.len() {
                pass(self, part, base, lo..part.len())?;
            } else {
                self.run(part, Logits::None)?;
            }
            self.seq.tokens.extend_from_slice(part);
            base += part.len();
        }
        Ok(())
    }
}

/// [`Session::eval_parts`]'s pass: `(session, part, base, rows)`.
type EvalPass<'a> =
    dyn FnMut(&mut Session, &[u32], usize, Range<usize>) -> Result<(), EngineError> + 'a;

impl Session {
    /// Most tokens of one forward pass.
    fn max_tokens(&self) -> usize {
        match &self.exec {
            Exec::Cpu { scratch, .. } => scratch.spec.max_tokens,
            Exec::Cuda { s, .. } => s.sizes().max_rows,
        }
    }
}

/// A session's buffers and KV cache on the GPU for `slots` sequences, sized by `spec` (the
/// weights uploaded first, unless another session of the model already holds them there).
pub fn cuda_session(
    model: &Arc<Model>,
    opts: &SessionOptions,
    spec: ScratchSpec,
    kv: &KvLayout,
    slots: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<CudaSession>, EngineError> {
    if model.config.arch.is_encoder() {
        return Err(EngineError::Encoder {
            arch: model.config.arch_name.clone(),
            what: "the CUDA backend does not run encoders; use --device cpu",
        });
    }
    let ring = kv.offload_ring(opts.kv_type, opts.kv_budget)?;
    let gpu = cuda::open()?;
    let w = device_weights(&gpu, model, progress)?;
    let sizes = cuda_sizes(spec, opts, slots, ring);
    Ok(Box::new(CudaSession::new(gpu, w, model, sizes, kv)?))
}

/// How a GPU session with these options and scratch sizes is sized, for `slots` sequences
/// (`ring`: the layers of an offloaded KV cache the device holds, `KvLayout::offload_ring`).
pub(crate) fn cuda_sizes(
    spec: ScratchSpec,
    opts: &SessionOptions,
    slots: usize,
    ring: Option<usize>,
) -> CudaSizes {
    CudaSizes {
        max_rows: spec.max_tokens,
        logit_rows: spec.logit_rows,
        n_ctx: opts.n_ctx.max(1),
        slots,
        kv_type: opts.kv_type,
        kv_ring: ring,
    }
}

/// `m`'s weights on `gpu`: uploaded by the first session of a model, shared by the sessions
/// alive at the same time (freed with the last of them).
fn device_weights(
    gpu: &cuda::Gpu,
    m: &Arc<Model>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Arc<DeviceWeights>, EngineError> {
    use std::sync::{Mutex, Weak};
    type Resident = Vec<(Weak<Model>, Weak<DeviceWeights>)>;
    static RESIDENT: Mutex<Resident> = Mutex::new(Vec::new());
    let mut r = RESIDENT.lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|(m, w)| m.strong_count() > 0 && w.strong_count() > 0);
    let same = |(w, _): &&(Weak<Model>, Weak<DeviceWeights>)| w.as_ptr() == Arc::as_ptr(m);
    if let Some(dw) = r.iter().find(same).and_then(|(_, d)| d.upgrade()) {
        return Ok(dw);
    }
    let dw = Arc::new(DeviceWeights::upload(gpu, m, progress)?);
    r.push((Arc::downgrade(m), Arc::downgrade(&dw)));
    Ok(dw)
}

/// Refuse a context past the training context: there RoPE models produce garbage and learned
/// positions do not exist.
pub fn check_context(c: &crate::model::ModelConfig, n_ctx: usize) -> Result<(), EngineError> {
    if c.ctx_train > 0 && n_ctx > c.ctx_train {
        return Err(EngineError::ContextTooLarge {
            ctx: n_ctx,
            max: c.ctx_train,
        });
    }
    Ok(())
}

/// The KV cache geometry of a session with these options: `n_ctx` positions per layer, except
/// that sliding-window layers keep a ring of `window + max_tokens − 1` rows (rounded up to 64)
/// when that is shorter and `swa_full` is off (`max_tokens`: the most tokens of one sequence's
/// pass, the prefill chunk clamped to the context; a batch runner's `batch_rows` are other
/// sequences').
pub fn kv_layout(c: &crate::model::ModelConfig, opts: &SessionOptions) -> KvLayout {
    let n_ctx = opts.n_ctx.max(1);
    let full = KvLayout::full(c.n_layers, c.n_kv_heads, c.head_dim_k, c.head_dim_v, n_ctx);
    match c.sliding_window {
        Some(w) if !opts.swa_full => {
            full.with_window(w, &c.swa_layers, opts.prefill_chunk.clamp(1, n_ctx))
        }
        _ => full,
    }
}

/// The options a [`Session`] runs with: its pass is one sequence's (no batch runner's rows
/// beside its chunk), and on the GPU it computes at most [`MAX_GRAPH_ROWS`] logits rows at a
/// time (its verification passes hold no more: [`Session::eval_as_decodes`]). The memory plan
/// sizes a session with this.
pub fn session_options(opts: &SessionOptions) -> SessionOptions {
    let logit_rows = match opts.device {
        Device::Cpu => opts.logit_rows,
        Device::Cuda => opts.logit_rows.min(MAX_GRAPH_ROWS),
    };
    SessionOptions {
        batch_rows: 0,
        logit_rows,
        ..*opts
    }
}

/// The scratch sizes a session with these options uses.
pub fn scratch_spec(model: &Model, opts: &SessionOptions) -> ScratchSpec {
    scratch_spec_for(&model.file, opts)
}

/// The scratch sizes for a model file, before loading it (the memory plan uses this).
pub fn scratch_spec_for(file: &crate::gguf::GgufFile, opts: &SessionOptions) -> ScratchSpec {
    // (A chunk is at most one sequence's context; a runner's other rows come beside it.)
    let max_tokens = opts.prefill_chunk.clamp(1, opts.n_ctx.max(1)) + opts.batch_rows;
    ScratchSpec {
        max_tokens,
        up_rows: if weights::gated_ffn_fuses(file) {
            max_tokens.min(crate::kernels::matmul::GATED_MIN_ROWS - 1)
        } else {
            max_tokens
        },
        logit_rows: opts.logit_rows.max(1),
        n_threads: opts.n_threads.max(1),
        act_row_bytes: weights::max_act_row_bytes(file),
        kv_type: opts.kv_type,
    }
}
