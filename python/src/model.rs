//! `kiln._kiln.Model`: a loaded model, its tokenizer and its engine's runner.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use kiln::backend::Device;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::embed::{embed_prompts, EmbedError};
use kiln::engine::pooling::{EmbedSpec, Pooling};
use kiln::gguf::GgufFile;
use kiln::grammar::{GrammarEngine, GrammarError};
use kiln::model::{Model as KilnModel, ModelError};
use kiln::tokenizer::toolcall::template::ToolSupport;
use kiln::tokenizer::Tokenizer;

use crate::errors::{self, guard};
use crate::run::{self, Run};

/// What every generation of a model shares.
pub struct Inner {
    pub path: PathBuf,
    /// The id responses report: the file's stem, as `kiln serve` names its model.
    pub id: String,
    pub model: Arc<KilnModel>,
    pub tok: Arc<Tokenizer>,
    /// The engine's runner of one sequence, lent to each generation; `None` for an
    /// encoder, which only embeds.
    pub runner: Mutex<Option<BatchRunner>>,
    pub n_ctx: usize,
    pub n_threads: usize,
    pub n_batch: usize,
    pub device: Device,
    /// The sampling seed of requests that give none.
    pub seed: Option<u64>,
    pub verbose: bool,
    /// Built on first use (walks the vocabulary), as the server builds them.
    pub grammar: OnceLock<Result<Arc<GrammarEngine>, GrammarError>>,
    pub tool_support: OnceLock<ToolSupport>,
}

/// A model loaded for generation and embeddings.
#[pyclass(module = "kiln._kiln")]
pub struct Model {
    inner: Option<Arc<Inner>>,
}

impl Model {
    fn inner(&self) -> PyResult<&Arc<Inner>> {
        self.inner
            .as_ref()
            .ok_or_else(|| errors::value("the model is closed"))
    }
}

fn count(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| errors::value(format!("{name} = {v} must not be negative")))
}

#[pymethods]
impl Model {
    /// Load `model_path` (a GGUF file, a known model's name or a pulled model's name, resolved
    /// as `kiln run -m` resolves it). `n_ctx` 0: the model's training context.
    #[new]
    #[pyo3(signature = (model_path, n_ctx, n_threads, n_batch, n_gpu_layers, seed, chat_format, verbose))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model_path: Option<String>,
        n_ctx: i64,
        n_threads: Option<i64>,
        n_batch: i64,
        n_gpu_layers: i64,
        seed: Option<u64>,
        chat_format: Option<String>,
        verbose: bool,
    ) -> PyResult<Model> {
        let n_ctx = count("n_ctx", n_ctx)?;
        let n_batch = count("n_batch", n_batch)?.max(1);
        let n_threads = match n_threads {
            None => None,
            Some(t) if t <= 0 => None,
            Some(t) => Some(kiln_threads(t)?),
        };
        // llama-cpp-python's -1 (and any N > 0) puts the whole model on the GPU, as `-ngl N`.
        let device = if n_gpu_layers != 0 {
            Device::Cuda
        } else {
            Device::Cpu
        };
        let inner = py.detach(|| {
            guard("loading the model", || {
                load(
                    model_path.as_deref(),
                    n_ctx,
                    n_threads,
                    n_batch,
                    device,
                    seed,
                    chat_format.as_deref(),
                    verbose,
                )
            })
        })?;
        Ok(Model {
            inner: Some(Arc::new(inner)),
        })
    }

    /// The context size of the session.
    fn n_ctx(&self) -> PyResult<usize> {
        Ok(self.inner()?.n_ctx)
    }

    /// The vocabulary's size.
    fn n_vocab(&self) -> PyResult<usize> {
        Ok(self.inner()?.tok.vocab_size())
    }

    /// The file the model was loaded from.
    fn path(&self) -> PyResult<String> {
        Ok(self.inner()?.path.display().to_string())
    }

    /// The name responses report.
    fn id(&self) -> PyResult<String> {
        Ok(self.inner()?.id.clone())
    }

    /// The chat template the model renders conversations with (`None`: it has none).
    fn chat_template(&self) -> PyResult<Option<String>> {
        Ok(self.inner()?.tok.chat_template().map(str::to_string))
    }

    /// Token ids of `text` (UTF-8).
    #[pyo3(signature = (text, add_bos, special))]
    fn tokenize(&self, text: &[u8], add_bos: bool, special: bool) -> PyResult<Vec<u32>> {
        let text = std::str::from_utf8(text)
            .map_err(|e| errors::value(format!("text is not valid UTF-8: {e}")))?;
        let tok = &self.inner()?.tok;
        guard("tokenizing", || Ok(tok.encode(text, add_bos, special)))
    }

    /// The bytes of `tokens`; control tokens (BOS, EOS, ...) only when `special`.
    #[pyo3(signature = (tokens, special))]
    fn detokenize<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
        special: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let tok = &self.inner()?.tok;
        let n = tok.vocab_size();
        let ids = tokens
            .iter()
            .map(|&t| match u32::try_from(t) {
                Ok(id) if (id as usize) < n => Ok(id),
                _ => Err(errors::value(format!(
                    "token id {t} is not in the vocabulary (0..{n})"
                ))),
            })
            .collect::<PyResult<Vec<u32>>>()?;
        let bytes = guard("detokenizing", || {
            Ok(if special {
                tok.decode_bytes(&ids)
            } else {
                tok.decode_bytes_skip_special(&ids)
            })
        })?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Start a generation: `kind` is `chat` or `completion`, `body` the request as the
    /// server's JSON body.
    fn start(&self, py: Python<'_>, kind: &str, body: &str) -> PyResult<Run> {
        let inner = Arc::clone(self.inner()?);
        let chat = match kind {
            "chat" => true,
            "completion" => false,
            other => return Err(errors::value(format!("unknown request kind {other:?}"))),
        };
        let body = body.to_string();
        py.detach(move || guard("starting a generation", || run::start(inner, chat, &body)))
    }

    /// The vectors of each text (one per text when pooled, one per token with pooling
    /// `none`), normalized as llama.cpp's `embd_normalize` (2: euclidean, -1: none), and the
    /// token count of all the texts.
    #[pyo3(signature = (texts, normalize))]
    fn embed(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        normalize: i32,
    ) -> PyResult<(Vec<Vec<Vec<f32>>>, usize)> {
        let inner = Arc::clone(self.inner()?);
        py.detach(move || guard("embedding", || embed(&inner, &texts, normalize)))
    }

    /// Free the model (its session, its weights' map once nothing else holds them).
    fn close(&mut self) {
        self.inner = None;
    }

    fn closed(&self) -> bool {
        self.inner.is_none()
    }
}

/// `n_threads`, checked as `kiln run -t` checks it.
fn kiln_threads(t: i64) -> PyResult<usize> {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max = (4 * logical).min(1024) as i64;
    if t > max {
        return Err(errors::value(format!(
            "n_threads = {t} on {logical} logical CPUs makes no sense (at most {max})"
        )));
    }
    Ok(t as usize)
}

#[allow(clippy::too_many_arguments)]
fn load(
    model_path: Option<&str>,
    n_ctx: usize,
    n_threads: Option<usize>,
    n_batch: usize,
    device: Device,
    seed: Option<u64>,
    chat_format: Option<&str>,
    verbose: bool,
) -> PyResult<Inner> {
    device.open().map_err(errors::runtime)?;
    let t0 = Instant::now();
    let path = kiln::fetch::resolve_model(model_path, verbose).map_err(errors::fetch)?;
    let model = GgufFile::open_model(&path, false)
        .map_err(ModelError::from)
        .and_then(KilnModel::from_gguf)
        .map_err(|e| errors::runtime(format!("loading {}: {e}", path.display())))?;
    let mut tok = Tokenizer::from_gguf(&model.file).map_err(|e| {
        errors::runtime(format!("reading the tokenizer of {}: {e}", path.display()))
    })?;
    if let Some(name) = chat_format {
        let template = kiln::tokenizer::builtin_chat_template(name).ok_or_else(|| {
            errors::value(format!(
                "chat_format {name:?} is not a chat format kiln knows (leave it out for the model's own template)"
            ))
        })?;
        tok.set_chat_template(template.to_string())
            .map_err(|e| errors::value(format!("chat_format {name:?}: {e}")))?;
    }
    let model = Arc::new(model);
    let c = &model.config;
    let n_ctx = match n_ctx {
        0 => c.ctx_train,
        n => n,
    };
    let n_threads = n_threads.unwrap_or_else(|| kiln::kernels::pool::default_threads().max(1));
    let runner = if c.arch.is_encoder() {
        kiln::engine::session::check_context(c, n_ctx).map_err(errors::engine)?;
        None
    } else {
        let opts = BatchOptions {
            n_slots: 1,
            n_ctx,
            n_threads,
            prefill_chunk: n_batch,
            kv_type: Default::default(),
            device,
            draft_max: 0,
        };
        Some(BatchRunner::new(Arc::clone(&model), opts).map_err(errors::engine)?)
    };
    if verbose {
        eprintln!(
            "kiln: loaded {} ({}, n_ctx {n_ctx}, {n_threads} threads) in {:.2} ms",
            path.display(),
            c.arch_name,
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    let id = path
        .file_stem()
        .map_or_else(|| "kiln".into(), |s| s.to_string_lossy().into_owned());
    Ok(Inner {
        path,
        id,
        tok: Arc::new(tok),
        model,
        runner: Mutex::new(runner),
        n_ctx,
        n_threads,
        n_batch,
        device,
        seed,
        verbose,
        grammar: OnceLock::new(),
        tool_support: OnceLock::new(),
    })
}

fn embed(inner: &Inner, texts: &[String], normalize: i32) -> PyResult<(Vec<Vec<Vec<f32>>>, usize)> {
    if texts.is_empty() {
        return Err(errors::value("input must not be empty"));
    }
    let pooling =
        Pooling::for_model(&inner.model, None).map_err(|e| errors::value(e.to_string()))?;
    // Tokenized as `kiln embedding` does: BOS/EOS by the model's policy, special tokens parsed.
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| inner.tok.encode(t, true, true))
        .collect();
    if let Some(i) = ids.iter().position(Vec::is_empty) {
        return Err(errors::value(format!("input {i} is empty")));
    }
    let tokens = ids.iter().map(Vec::len).sum();
    let opts = BatchOptions {
        n_slots: 4,
        n_ctx: inner.n_ctx,
        n_threads: inner.n_threads,
        prefill_chunk: inner.n_batch,
        kv_type: Default::default(),
        device: inner.device,
        draft_max: 0,
    };
    let spec = EmbedSpec { pooling, normalize };
    let vectors =
        embed_prompts(&inner.model, &inner.tok, &ids, spec, opts).map_err(|e| match e {
            EmbedError::Engine(e) => errors::engine(e),
            e @ EmbedError::TooLong { .. } => errors::value(e.to_string()),
            e => errors::runtime(e),
        })?;
    Ok((vectors, tokens))
}
