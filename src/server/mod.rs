//! `kiln serve`: an OpenAI-compatible HTTP server over the continuous-batching scheduler.
//!
//! ```text
//! HTTP (tokio + axum)                       engine thread
//! ─────────────────────                     ────────────────────────────────
//! handler: parse, validate, tokenize  ──►   Scheduler::run: admit → prefill chunk
//!          SeqRequest (std mpsc)             → one batched decode step → ...
//! handler ◄── SeqEvent (tokio mpsc) ───     sink(event) == false ⇒ cancel, free slot
//! ```
//!
//! The model runs on one dedicated thread (with its own worker pool); the async side only
//! parses, tokenizes and streams. A dropped response (client gone) drops the event receiver,
//! which the engine notices at its next event and frees the slot.
//!
//! At most `--parallel + --queue` requests are in the engine at once: a request takes a permit
//! of `AppState::admission` before it is sent and gives it back when the engine has finished
//! with it, however it ends; without a permit the answer is 429. The connections themselves
//! (limit, timeouts, shutdown) are `conn.rs`.
//!
//! The port is bound before the model loads: until it is ready every route answers 503
//! (llama-server's "Loading model"; `/health` adds `"status": "loading"`), so that a router or
//! a Kubernetes readiness probe sees a replica that is up but not ready (`ready.rs`).

mod anthropic;
pub mod api;
mod bias;
mod conn;
mod embeddings;
pub mod error;
mod io;
mod jobs;
mod logprobs;
mod metrics;
mod native;
mod ollama;
mod parts;
mod ready;
mod rerank;
pub mod respond;
mod responses;
mod routes;
pub mod structured;
mod tenant;
mod tokens;
pub mod tools;
mod unsupported;
mod webui;

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::batch::{BatchOptions, BatchRunner};
use crate::engine::pooling::Pooling;
use crate::engine::scheduler::{SchedMetrics, Scheduler, SeqRequest};
use crate::engine::slot_drafter::SlotDrafter;
use crate::engine::speculative::{draft_context, NgramDrafter};
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Sequences generated at once (each with its own KV region of `n_ctx`).
    pub n_slots: usize,
    /// Context per sequence.
    pub n_ctx: usize,
    pub n_threads: usize,
    pub prefill_chunk: usize,
    /// Element type of the KV caches.
    pub kv_type: crate::cache::KvType,
    /// Where the model runs (`--device`).
    pub device: crate::backend::Device,
    /// Requests allowed to wait for a slot; more are refused with 429.
    pub max_queue: usize,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// The keys `Authorization: Bearer` (or `x-api-key`) must give, if any (on `/v1/*`, and
    /// `/metrics` unless `metrics_public`); each key is its own prefix-cache tenant.
    pub api_keys: Vec<String>,
    /// `/metrics` answers without the API key.
    pub metrics_public: bool,
    /// Parse special-token text inside chat message content (by default it is literal text,
    /// so that a message cannot forge a turn).
    pub special_in_content: bool,
    /// The model id reported by `/v1/models` (the first `--alias`, else the file's stem);
    /// requests may name it or any alias.
    pub model_id: String,
    pub model_aliases: Vec<String>,
    /// `--strict-model`: a request naming another model is refused (404); otherwise it is
    /// answered by the served model under its own name.
    pub strict_model: bool,
    pub http: HttpLimits,
    /// Serve `/v1/embeddings` (`--embeddings`).
    pub embeddings: bool,
    /// `--pooling`: instead of the model's own.
    pub pooling: Option<Pooling>,
    /// `--embd-normalize`: llama.cpp's normalization of embeddings (2: euclidean).
    pub embd_normalize: i32,
    /// Speculative decoding (`--spec-type ngram-simple`), if on.
    pub speculation: Option<ServeSpeculation>,
    /// Fill-in-the-middle prompts with the suffix first (`--spm-infill`).
    pub spm_infill: bool,
    /// Serve the web chat page at `/` ([`webui`]; `--no-webui` turns it off).
    pub webui: bool,
}

/// Speculative decoding in the server: prompt lookup of the context's last `ngram_n` tokens,
/// or a draft model's guesses; `draft_min..=draft_max` drafts a pass
/// ([`Scheduler::speculate`]).
#[derive(Clone, Debug)]
pub struct ServeSpeculation {
    pub ngram_n: usize,
    pub draft_max: usize,
    pub draft_min: usize,
    pub draft: Option<ServeDraftModel>,
}

/// A draft model (`--model-draft`), of the served model's vocabulary.
#[derive(Clone)]
pub struct ServeDraftModel {
    pub model: Arc<Model>,
    /// Guessing stops where the draft's most likely token is less likely than this.
    pub p_min: f32,
    /// Its context (`-cd`; `None`: the server's, or its training context where shorter).
    pub n_ctx: Option<usize>,
}

impl std::fmt::Debug for ServeDraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeDraftModel")
            .field("arch", &self.model.config.arch)
            .field("p_min", &self.p_min)
            .finish()
    }
}

/// Connection limits and timeouts.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// From a connection's opening, or the first byte of a later request, to the end of the
    /// request head.
    pub header_timeout: Duration,
    /// From the end of the request head to the end of its body.
    pub body_timeout: Duration,
    /// A kept-alive connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// A write to the client that makes no progress for this long closes the connection.
    pub write_timeout: Duration,
    /// After SIGTERM, how long the responses in progress have to finish.
    pub shutdown_grace: Duration,
    /// Web origins (`scheme://host[:port]`) whose pages may call the server (`--cors-origin`;
    /// `*`: any); requests from any other `Origin` but the server's own are refused.
    pub cors_origins: Vec<String>,
    /// Host names accepted besides the bound address and `localhost` (`--allowed-host`),
    /// checked on connections that arrive over loopback (against DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// The address listened on, once bound.
    pub bound: Option<std::net::SocketAddr>,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(30),
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            bound: None,
        }
    }
}

/// Shared by every handler.
pub(crate) struct AppState {
    pub engine: std_mpsc::Sender<SeqRequest>,
    /// The answers in the engine, to cut when the shutdown grace period ends.
    pub live: Arc<respond::Live>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: Arc<Model>,
    pub opts: ServeOptions,
    pub sched: Arc<SchedMetrics>,
    /// `--parallel + --queue` permits: one per request in the engine.
    pub admission: Arc<tokio::sync::Semaphore>,
    pub http: Arc<metrics::HttpMetrics>,
    pub started: u64,
    pub kv_bytes: usize,
    /// The pooling of `/v1/embeddings`, or why the model cannot give embeddings.
    pub pooling: Result<Pooling, String>,
    /// The model's grammar compiler, built by the first structured-output request.
    pub grammar: Arc<
        std::sync::OnceLock<
            Result<Arc<crate::grammar::GrammarEngine>, crate::grammar::GrammarError>,
        >,
    >,
    /// The grammar and schema compiles running and waiting.
    pub compiles: structured::CompileGate,
    /// What the chat template renders of tools, probed by the first chat request.
    pub tool_support: std::sync::OnceLock<crate::tokenizer::toolcall::template::ToolSupport>,
}

/// What the server runs, once loaded.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub opts: ServeOptions,
}

/// Serve on `listener` until `shutdown` resolves, then let the responses in progress finish
/// (within `limits.shutdown_grace`; those still running then end with an error event). `load` runs on a blocking thread while the port already
/// answers (503 until it returns); if it fails, the server stops and returns its error.
/// `ready` is called once the routes answer.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: HttpLimits,
    load: impl FnOnce() -> anyhow::Result<Loaded> + Send + 'static,
    ready: impl FnOnce(&ServeOptions) + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let http = Arc::new(metrics::HttpMetrics::default());
    let live = Arc::new(respond::Live::default());
    let app = Arc::new(std::sync::OnceLock::new());
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<()>();
    let loader = {
        let (app, http, live) = (Arc::clone(&app), Arc::clone(&http), Arc::clone(&live));
        tokio::task::spawn_blocking(move || {
            let (state, engine) = start(load, http, live).inspect_err(|_| {
                let _ = failed_tx.send(());
            })?;
            let opts = state.opts.clone();
            let _ = app.set(routes::router(state));
            ready(&opts);
            Ok::<_, anyhow::Error>(engine)
        })
    };
    let stop = async move {
        // The loader drops its sender when it succeeds: only a sent failure stops the server.
        let failed = async {
            if failed_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = shutdown => {},
            _ = failed => {},
        }
    };
    let cut = move || {
        let n = live.cut();
        log::warn!("shutdown: {n} requests cut");
    };
    let gate = ready::gate(Arc::clone(&app));
    conn::serve(listener, gate, limits, http, stop, cut).await;
    // Every connection is gone; with the app (the last sender) dropped, the engine cancels
    // what is left and exits. It is waited for a little (one step); past that, the process
    // exit that follows ends it.
    drop(app);
    let deadline = tokio::time::Instant::now() + ENGINE_EXIT_WAIT;
    let engine = match tokio::time::timeout_at(deadline, loader).await {
        Ok(Ok(r)) => r?,
        Ok(Err(_)) => anyhow::bail!("loading the model panicked"),
        Err(_) => {
            log::warn!("still loading the model; exiting without it");
            return Ok(());
        }
    };
    while !engine.is_finished() {
        if tokio::time::Instant::now() >= deadline {
            log::warn!("the engine thread is still busy; exiting without it");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    Ok(())
}

/// Load, size the runner, start the engine thread: the state the routes share.
fn start(
    load: impl FnOnce() -> anyhow::Result<Loaded>,
    http: Arc<metrics::HttpMetrics>,
    live: Arc<respond::Live>,
) -> anyhow::Result<(Arc<AppState>, std::thread::JoinHandle<()>)> {
    let Loaded {
        model,
        tokenizer,
        mut opts,
    } = load()?;
    let runner = BatchRunner::new(
        Arc::clone(&model),
        BatchOptions {
            n_slots: opts.n_slots,
            n_ctx: opts.n_ctx,
            n_threads: opts.n_threads,
            prefill_chunk: opts.prefill_chunk,
            kv_type: opts.kv_type,
            device: opts.device,
            draft_max: opts.speculation.as_ref().map_or(0, |s| s.draft_max),
        },
    )?;
    // What the runner keeps of the drafts asked for (`/props` and the drafter see it).
    let chunk = opts.prefill_chunk;
    if let Some(sp) = opts.speculation.as_mut() {
        let kept = runner.opts.draft_max;
        if kept == 0 {
            eprintln!("kiln: speculative decoding is off: a pass is one sequence's prefill chunk (-b {chunk}), with no room for drafts");
        } else if kept < sp.draft_max {
            let why = match opts.device {
                crate::backend::Device::Cuda
                    if kept + 1 == crate::backend::cuda::MAX_GRAPH_ROWS =>
                {
                    format!("a pass on the GPU is at most {kept} drafts after its token (decode rows, bit for bit)")
                }
                _ => format!("a pass is one sequence's prefill chunk (-b {chunk})"),
            };
            eprintln!("kiln: --draft-max {} cut to {kept}: {why}", sp.draft_max);
        }
        sp.draft_max = kept;
    }
    if runner.opts.draft_max == 0 {
        opts.speculation = None;
    }
    // A draft model's runner: a slot per sequence slot, on the same context (or the draft's
    // own, where shorter).
    let drafter = match opts.speculation.as_ref() {
        Some(ServeSpeculation { draft: Some(d), .. }) => {
            let n_ctx = draft_context(opts.n_ctx, d.n_ctx, &d.model.config);
            if n_ctx < opts.n_ctx {
                let why = match d.n_ctx.filter(|&c| c > 0 && c <= n_ctx) {
                    Some(_) => "-cd",
                    None => "its training context",
                };
                eprintln!("kiln: the draft model's context is {n_ctx} tokens ({why}): longer sequences decode without drafts");
            }
            // The server's slots, threads, chunk, KV type and device.
            let dr = BatchRunner::new(
                Arc::clone(&d.model),
                BatchOptions {
                    n_ctx,
                    draft_max: 0,
                    ..runner.opts
                },
            )
            .map_err(|e| anyhow::anyhow!("the draft model: {e}"))?;
            Some(SlotDrafter::new(dr, &runner, d.p_min)?)
        }
        _ => None,
    };
    let kv_bytes = runner.kv_bytes();
    let sched = Arc::new(SchedMetrics::default());
    let (tx, rx) = std_mpsc::channel::<SeqRequest>();
    let engine = {
        let spec = opts.speculation.clone();
        let tok = Arc::clone(&tokenizer);
        let metrics = Arc::clone(&sched);
        std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || {
                let mut s = Scheduler::new(runner, &tok, metrics);
                match (spec, drafter) {
                    (Some(sp), Some(d)) => s.speculate(d, sp.draft_min),
                    (Some(sp), None) => {
                        s.speculate(NgramDrafter::new(sp.ngram_n, sp.ngram_n), sp.draft_min)
                    }
                    (None, _) => {}
                }
                s.run(rx)
            })?
    };
    let pooling = Pooling::for_model(&model, opts.pooling).map_err(|e| e.to_string());
    // An encoder serves embeddings only: its routes need no --embeddings.
    opts.embeddings |= model.config.arch.is_encoder();
    if opts.embeddings {
        match &pooling {
            Ok(Pooling::None) => eprintln!(
                "kiln: --embeddings: this model declares no pooling; /v1/embeddings answers 400 until kiln is started with --pooling mean, cls or last"
            ),
            Ok(Pooling::Rank) => eprintln!("kiln: /v1/rerank with the model's classification head"),
            Ok(p) => eprintln!("kiln: /v1/embeddings with {} pooling", p.name()),
            Err(e) => eprintln!("kiln: --embeddings: {e}; /v1/embeddings answers 400"),
        }
    }
    let admitted =
        (opts.n_slots.saturating_add(opts.max_queue)).min(tokio::sync::Semaphore::MAX_PERMITS);
    // Compiles at once: a core each, at most one per sequence slot; as many may wait as the
    // queue holds.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let compiles = structured::CompileGate::new(cores.min(opts.n_slots), opts.max_queue);
    let state = Arc::new(AppState {
        grammar: Arc::default(),
        compiles,
        tool_support: std::sync::OnceLock::new(),
        engine: tx,
        live,
        tokenizer,
        model,
        sched,
        admission: Arc::new(tokio::sync::Semaphore::new(admitted)),
        http,
        started: unix_now(),
        kv_bytes,
        pooling,
        opts,
    });
    Ok((state, engine))
}

/// How long the engine thread has to exit once every request is gone.
const ENGINE_EXIT_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
