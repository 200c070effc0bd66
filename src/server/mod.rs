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

pub mod api;
pub mod error;
mod metrics;
mod routes;

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;

use crate::engine::batch::{BatchOptions, BatchRunner};
use crate::engine::scheduler::{SchedMetrics, Scheduler, SeqRequest};
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
    /// Requests allowed to wait for a slot; more are refused with 429.
    pub max_queue: usize,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Required `Authorization: Bearer` key, if any.
    pub api_key: Option<String>,
    /// The model id reported by `/v1/models`; requests may name it or any alias.
    pub model_id: String,
    pub model_aliases: Vec<String>,
}

/// Shared by every handler.
pub(crate) struct AppState {
    pub engine: std_mpsc::Sender<SeqRequest>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: Arc<Model>,
    pub opts: ServeOptions,
    pub sched: Arc<SchedMetrics>,
    pub http: metrics::HttpMetrics,
    pub started: u64,
    pub kv_bytes: usize,
}

/// Serve on `listener` until `shutdown` resolves, then finish the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let runner = BatchRunner::new(
        Arc::clone(&model),
        BatchOptions {
            n_slots: opts.n_slots,
            n_ctx: opts.n_ctx,
            n_threads: opts.n_threads,
            prefill_chunk: opts.prefill_chunk,
            kv_type: opts.kv_type,
        },
    )?;
    let kv_bytes = runner.kv_bytes();
    let sched = Arc::new(SchedMetrics::default());
    let (tx, rx) = std_mpsc::channel::<SeqRequest>();
    let engine = {
        let tok = Arc::clone(&tokenizer);
        let metrics = Arc::clone(&sched);
        std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || Scheduler::new(runner, &tok, metrics).run(rx))?
    };
    let state = Arc::new(AppState {
        engine: tx,
        tokenizer,
        model,
        opts,
        sched,
        http: metrics::HttpMetrics::default(),
        started: unix_now(),
        kv_bytes,
    });
    let app = routes::router(Arc::clone(&state));
    drop(state);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await?;
    // Every handler (and so every sender) is gone: the engine finishes and exits.
    tokio::task::spawn_blocking(move || engine.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    Ok(())
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
