//! A session: one sequence's forward passes over a shared model — the device's executor (its
//! KV cache, scratch buffers and weights) and the tokens the cache holds, token by token or
//! pass by pass, with none of the engine's scheduling: the tests' references (what one
//! sequence decoded alone gives, to hold the engine to). Everything is allocated in
//! [`Session::new`]; prefill and decode reuse it. Every command (generation, perplexity,
//! embeddings) goes through the engine ([`super::Engine`]); its runner sizes itself with this
//! module's functions ([`SessionOptions`], [`kv_layout`], [`scratch_spec`]) and reports its
//! errors as [`EngineError`].

use std::ops::Range;
use std::sync::Arc;

use crate::backend::exec::{ExecError, ExecSpec, Executor, HasExecutor, SlotRows};
use crate::backend::{Device, DeviceError};
use crate::cache::{
    KvBudgetError, KvCache, KvCacheError, KvLayout, KvType, KvTypeError, ScratchSpec,
};
use crate::engine::sequence::{common_prefix, mask_logits};
use crate::model::forward::{ForwardError, Logits};
use crate::model::{weights, Model};

/// How a session is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Context length (KV cache positions).
    pub n_ctx: usize,
    pub n_threads: usize,
    /// Tokens per prefill forward pass; bounds activation memory.
    pub prefill_chunk: usize,
    /// Logit rows the output head computes at once (a session's passes of several positions'
    /// logits; a batch runner's slots and verification rows, or its scored rows).
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
    Device(#[from] DeviceError),
    #[error("the draft model: {0}")]
    Draft(String),
    /// A generation the engine's scheduler ended with an error (a forward pass or a grammar
    /// failed), in its words.
    #[error("{0}")]
    Failed(String),
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

impl From<ExecError> for EngineError {
    fn from(e: ExecError) -> Self {
        match e {
            ExecError::KvBudget(b) => EngineError::KvBudget(b),
            ExecError::KvCache(c) => c.into(),
            ExecError::Device(d) => EngineError::Device(d),
            ExecError::Vulkan(v) => EngineError::Failed(v.to_string()),
            ExecError::Encoder { arch, what } => EngineError::Encoder { arch, what },
        }
    }
}

/// One sequence being evaluated.
pub struct Session {
    pub model: Arc<Model>,
    pub opts: SessionOptions,
    /// The tokens in the cache (slot 0 of the executor's).
    tokens: Vec<u32>,
    exec: Box<dyn Executor>,
    /// Passes are computed as decode steps ([`Session::eval_as_decodes`]).
    alone: bool,
}

impl HasExecutor for Session {
    fn executor(&self) -> &dyn Executor {
        &*self.exec
    }
    fn executor_mut(&mut self) -> &mut dyn Executor {
        &mut *self.exec
    }
}

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session, EngineError> {
        let c = &model.config;
        if c.arch.is_encoder() {
            // A session gives logits: an encoder cannot.
            return Err(EngineError::encoder_generation(&c.arch_name));
        }
        let n_ctx = opts.n_ctx.max(1);
        check_context(c, n_ctx)?;
        let opts = SessionOptions {
            n_ctx,
            ..session_options(&opts)
        };
        let spec = exec_spec(&model, &opts, 1);
        let exec = crate::backend::open::executor(model.clone(), &spec, &mut |_, _| {})?;
        Ok(Session {
            tokens: Vec::with_capacity(n_ctx),
            exec,
            alone: false,
            opts,
            model,
        })
    }

    /// Run `tokens` after the cached ones on this session's device (the last token's logits
    /// brought to the host for [`Session::logits`]).
    fn run(&mut self, tokens: &[u32], logits: Logits<'_>) -> Result<(), ForwardError> {
        let last = matches!(logits, Logits::Last);
        let rows = [SlotRows {
            slot: 0,
            n_tokens: tokens.len(),
            alone: self.alone,
        }];
        self.exec.forward(&rows, tokens, logits, false)?;
        if last {
            self.exec.fetch_logits()?;
        }
        Ok(())
    }

    /// Tokens in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    /// Logits of the last evaluated token, `[vocab]`.
    pub fn logits(&self) -> &[f32] {
        self.exec.logits()
    }

    /// Set the logits of `tokens` to -inf, so no sampler picks them (`--ignore-eos`).
    pub fn mask_tokens(&mut self, tokens: &[u32]) {
        mask_logits(self.exec.logits_mut(), tokens);
    }

    /// The KV cache where it is a [`KvCache`] (in RAM or a file); `None` where it lives in a
    /// device's memory.
    pub fn kv(&self) -> Option<&KvCache> {
        self.exec.kv_cache(0)
    }

    /// Whether `n` more tokens would overflow the context.
    pub fn would_overflow(&self, n: usize) -> bool {
        self.exec.check_fits(0, n).is_err()
    }

    /// Forget the sequence.
    pub fn reset(&mut self) {
        self.exec.reset(0);
        self.tokens.clear();
    }

    /// Drop every token after the first `n` (the cache's rollback) and return how many are
    /// kept: `n`, or 0 where the sliding-window rings no longer hold the window before `n`
    /// (then everything is evaluated again; see [`KvCache::rollback`]).
    pub fn rollback(&mut self, n: usize) -> usize {
        let kept = self.exec.rollback(0, n);
        self.tokens.truncate(kept);
        kept
    }

    /// Length of the common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        common_prefix(&self.tokens, tokens)
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
            self.tokens.extend_from_slice(part);
            done += part.len();
            progress(done, tokens.len());
        }
        Ok(self.logits())
    }

    /// Evaluate one generated token; returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<&[f32], EngineError> {
        if self.would_overflow(1) {
            return Err(EngineError::ContextFull {
                ctx: self.opts.n_ctx,
            });
        }
        self.run(&[token], Logits::Last)?;
        self.tokens.push(token);
        Ok(self.logits())
    }

    /// Evaluate `tokens` and hand the logits of every position `>= first` to
    /// `sink(position_in_tokens, logits)` (teacher forcing: the reference of the engine's
    /// scoring requests).
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
    /// so that they sample what plain decoding samples. In passes of at most
    /// [`Device::alone_rows`] tokens.
    pub fn eval_as_decodes(
        &mut self,
        tokens: &[u32],
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.alone = true;
        let r = self.eval_all(tokens, 0, sink);
        self.alone = false;
        r
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
        let chunk = match self.opts.device.alone_rows() {
            // (A pass of decode rows: see `SeqBatch::alone`.)
            Some(rows) if self.alone => self.max_tokens().min(rows),
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
            self.tokens.extend_from_slice(part);
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
        self.exec.max_rows()
    }
}

/// The executor of a session with these options for `slots` sequences: its KV layout
/// ([`kv_layout`]), scratch ([`scratch_spec`]) and device.
pub fn exec_spec(model: &Model, opts: &SessionOptions, slots: usize) -> ExecSpec {
    let layout = kv_layout(&model.config, opts);
    exec_spec_with(opts, slots, layout, scratch_spec(model, opts))
}

/// [`exec_spec`] with the KV layout and scratch given (a batch runner's rings are sized for
/// one sequence's chunk, before the runner's rows per slot are added; the memory plan's
/// scratch is read from the file's header).
pub fn exec_spec_with(
    opts: &SessionOptions,
    slots: usize,
    layout: KvLayout,
    scratch: ScratchSpec,
) -> ExecSpec {
    ExecSpec {
        device: opts.device,
        slots,
        n_ctx: opts.n_ctx.max(1),
        n_threads: opts.n_threads,
        layout,
        kv_type: opts.kv_type,
        kv_budget: opts.kv_budget,
        scratch,
        solo: false,
    }
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
/// beside its chunk), and where a device computes rows alone only in passes of at most
/// [`Device::alone_rows`] decode rows (the GPU), at most that many logits rows at a time (its
/// verification passes hold no more: [`Session::eval_as_decodes`]). The memory plan sizes a
/// session with this.
pub fn session_options(opts: &SessionOptions) -> SessionOptions {
    let logit_rows = opts
        .logit_rows
        .min(opts.device.alone_rows().unwrap_or(usize::MAX));
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
