//! A session: one sequence's state over a shared model — its KV cache, scratch buffers and the
//! tokens they hold. Everything is allocated in [`Session::new`]; prefill and decode reuse it.

use std::sync::Arc;

use crate::backend::cpu::{forward, Runtime};
use crate::cache::{
    KvBudgetError, KvCache, KvCacheError, KvLayout, KvType, KvTypeError, Scratch, ScratchSpec,
};
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
    /// Logit rows computed at once when every position's logits are wanted (perplexity).
    pub logit_rows: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// RAM for the KV cache: when the whole cache is larger, it lives in a file and a ring of
    /// layer buffers fitting this budget is streamed (None = always in RAM).
    pub kv_budget: Option<usize>,
    /// Give sliding-window layers a cache of the whole context, as the other layers
    /// (llama.cpp's `--swa-full`), instead of a ring of their window.
    pub swa_full: bool,
}

impl SessionOptions {
    pub fn new(n_ctx: usize, n_threads: usize) -> Self {
        SessionOptions {
            n_ctx,
            n_threads,
            prefill_chunk: 512,
            logit_rows: 1,
            kv_type: KvType::F16,
            kv_budget: None,
            swa_full: false,
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
    pub rt: Runtime,
    pub opts: SessionOptions,
    kv: KvCache,
    scratch: Scratch,
    /// The tokens whose keys and values are in `kv`, in order.
    tokens: Vec<u32>,
}

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session, EngineError> {
        let c = &model.config;
        let n_ctx = opts.n_ctx.max(1);
        check_context(c, n_ctx)?;
        let opts = SessionOptions { n_ctx, ..opts };
        let layout = kv_layout(c, &opts);
        let spec = scratch_spec(&model, &opts);
        let scratch = Scratch::new(c, spec);
        Ok(Session {
            rt: Runtime::new(opts.n_threads),
            kv: match layout.offload_ring(opts.kv_type, opts.kv_budget)? {
                None => KvCache::with_type(layout, opts.kv_type)?,
                Some(ring) => KvCache::offloaded(layout, opts.kv_type, ring)?,
            },
            scratch,
            tokens: Vec::with_capacity(n_ctx),
            opts,
            model,
        })
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
        &self.scratch.logits[..self.model.config.vocab_size]
    }

    /// Set the logits of `tokens` to -inf, so no sampler picks them (`--ignore-eos`).
    pub fn mask_tokens(&mut self, tokens: &[u32]) {
        let v = self.model.config.vocab_size;
        let row = &mut self.scratch.logits[..v];
        for &t in tokens {
            if let Some(l) = row.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn scratch(&self) -> &Scratch {
        &self.scratch
    }

    /// Forget the sequence.
    pub fn reset(&mut self) {
        self.kv.reset();
        self.tokens.clear();
    }

    /// Drop every token after the first `n` (seed 004's rollback) and return how many are
    /// kept: `n`, or 0 where the sliding-window rings no longer hold the window before `n`
    /// (then everything is evaluated again; see [`KvCache::rollback`]).
    pub fn rollback(&mut self, n: usize) -> usize {
        let kept = self.kv.rollback(n);
        self.tokens.truncate(kept);
        kept
    }

    /// Length of the common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Refuse a prompt of `n` more tokens that would not fit.
    pub fn check_fits(&self, n: usize) -> Result<(), EngineError> {
        if self.kv.would_overflow(n) {
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
        let chunk = self.scratch.spec.max_tokens;
        let mut done = 0;
        for part in tokens.chunks(chunk) {
            let last = done + part.len() == tokens.len();
            let want = if last { Logits::Last } else { Logits::None };
            forward(
                &self.model,
                &self.rt,
                &mut self.kv,
                &mut self.scratch,
                part,
                want,
            )?;
            self.tokens.extend_from_slice(part);
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
        if self.kv.would_overflow(1) {
            return Err(EngineError::ContextFull {
                ctx: self.opts.n_ctx,
            });
        }
        forward(
            &self.model,
            &self.rt,
            &mut self.kv,
            &mut self.scratch,
            &[token],
            Logits::Last,
        )?;
        self.tokens.push(token);
        Ok(self.logits())
    }

    /// Evaluate `tokens` and hand the logits of every position `>= first` to
    /// `sink(position_in_tokens, logits)` (teacher forcing, perplexity).
    pub fn eval_all(
        &mut self,
        tokens: &[u32],
        first: usize,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_fits(tokens.len())?;
        let chunk = self.scratch.spec.max_tokens;
        let mut base = 0;
        for part in tokens.chunks(chunk) {
            let lo = first.saturating_sub(base).min(part.len());
            let mut shifted = |row: usize, l: &[f32]| sink(base + row, l);
            let want = if lo < part.len() {
                Logits::Rows(lo..part.len(), &mut shifted)
            } else {
                Logits::None
            };
            forward(
                &self.model,
                &self.rt,
                &mut self.kv,
                &mut self.scratch,
                part,
                want,
            )?;
            self.tokens.extend_from_slice(part);
            base += part.len();
        }
        Ok(())
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
/// when that is shorter and `swa_full` is off (`max_tokens`: the most tokens of one pass, as
/// [`scratch_spec_for`] sizes it).
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

/// The scratch sizes a session with these options uses.
pub fn scratch_spec(model: &Model, opts: &SessionOptions) -> ScratchSpec {
    scratch_spec_for(&model.file, opts)
}

/// The scratch sizes for a model file, before loading it (the memory plan uses this).
pub fn scratch_spec_for(file: &crate::gguf::GgufFile, opts: &SessionOptions) -> ScratchSpec {
    let max_tokens = opts.prefill_chunk.clamp(1, opts.n_ctx.max(1));
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
