//! `kiln serve`: the OpenAI-compatible HTTP server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::common::{self, ModelArgs};
use kiln::engine::pooling::Pooling;
use kiln::server::{self, HttpLimits, Loaded, ServeOptions};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: super::spec::SpecArgs,
    /// Address to listen on (loopback by default; use 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences generated at once (continuous batching); each gets its own KV region of
    /// --ctx-size positions.
    #[arg(short = 'P', long = "parallel", alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Requests allowed to wait for a free sequence slot; beyond that the server answers 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on the /v1 routes and /metrics (/health stays open).
    /// A comma-separated list gives several keys; each key is its own prefix-cache tenant. A
    /// key containing a comma goes in --api-key-file.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read API keys from a file, one a line, each line whole (commas included; spaces around
    /// it trimmed, blank lines skipped); with --api-key, both.
    #[arg(long)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Serve /metrics without the API key.
    #[arg(long)]
    pub metrics_public: bool,
    /// Parse special-token text (`<|im_end|>`) inside chat message content. By default content
    /// is literal text, so that a message cannot forge turns; only the template's own markup
    /// becomes special tokens.
    #[arg(long)]
    pub special_in_content: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// The model's name in answers and in `/v1/models` and `/api/tags` (the first one;
    /// repeatable: more names clients may use). Default: the file's stem.
    #[arg(long = "alias")]
    pub aliases: Vec<String>,
    /// Refuse (404) a request naming a model other than the served one or an alias; by
    /// default any name is answered by the served model, under its own name.
    #[arg(long)]
    pub strict_model: bool,
    /// Connections served at once; more are answered 503 and closed. Keep it below the
    /// descriptor limit (`ulimit -n`).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds a client has to send a request's head (request line and headers), counted from
    /// the connection's opening or from the first byte of a later request; then the connection
    /// is closed.
    #[arg(long, default_value = "10", value_parser = seconds, value_name = "SECS")]
    pub header_timeout: Duration,
    /// Seconds a client has to send a request's body once its head has arrived (408).
    #[arg(long, default_value = "60", value_parser = seconds, value_name = "SECS")]
    pub body_timeout: Duration,
    /// Seconds a kept-alive connection may wait for its next request before it is closed.
    #[arg(long, default_value = "30", value_parser = seconds, value_name = "SECS")]
    pub idle_timeout: Duration,
    /// Seconds a write to a client may make no progress (a client that stopped reading) before
    /// the connection is closed and its generation cancelled.
    #[arg(long, default_value = "600", value_parser = seconds, value_name = "SECS")]
    pub write_timeout: Duration,
    /// A web origin (`https://app.example`) whose pages may call the server, answered with
    /// CORS headers; repeat it or give a comma-separated list; `*` allows any page. Requests
    /// from any other origin but the server's own are refused (403).
    #[arg(long = "cors-origin", value_delimiter = ',', value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// A `Host` name accepted besides the bound address and `localhost` (repeatable or a
    /// comma-separated list; compared without case, port or trailing dot); checked on
    /// connections that arrive over loopback (DNS rebinding), also when bound to 0.0.0.0 or ::.
    #[arg(long = "allowed-host", value_delimiter = ',', value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Seconds the responses in progress have to finish after SIGTERM / Ctrl-C; a stream still
    /// running then ends with an error event in its API's shape (an answer not yet sent: 503).
    /// Connections whose request has not all arrived (idle, a head or a body still arriving)
    /// close at once.
    #[arg(long, default_value = "30", value_parser = seconds, value_name = "SECS")]
    pub shutdown_timeout: Duration,
    /// Serve POST /v1/embeddings (llama-server's flag; completions are served too). The
    /// pooling is the model's own (GGUF `{arch}.pooling_type`) or --pooling.
    #[arg(long = "embeddings", alias = "embedding", help_heading = "Embeddings")]
    pub embeddings: bool,
    /// Pooling of embeddings instead of the model's: mean, cls or last (none: per-token
    /// vectors, which /v1/embeddings refuses; rank: a reranker's scores, on /v1/rerank).
    #[arg(long, value_parser = pooling, value_name = "none|mean|cls|last|rank", help_heading = "Embeddings")]
    pub pooling: Option<Pooling>,
    /// Serve POST /v1/rerank with a reranker (llama-server's flag: --embeddings --pooling
    /// rank).
    #[arg(long = "reranking", alias = "rerank", help_heading = "Embeddings")]
    pub reranking: bool,
    /// Normalization of embeddings, as llama.cpp's: -1 none, 0 max-abs int16, 1 taxicab,
    /// 2 euclidean, >2 p-norm.
    #[arg(long = "embd-normalize", default_value_t = 2, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..), help_heading = "Embeddings")]
    pub embd_normalize: i32,
    /// Fill-in-the-middle prompts (POST /infill, a completion's `suffix`) in suffix, prefix,
    /// middle order instead of prefix, suffix, middle, for models trained so.
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// Do not serve the web chat page at / (llama-server's flag): / answers 404.
    #[arg(long = "no-webui")]
    pub no_webui: bool,
}

/// `--pooling` as llama.cpp spells it.
pub fn pooling(s: &str) -> Result<Pooling, String> {
    Pooling::parse(s).map_err(|e| e.to_string())
}

/// A positive number of seconds (fractions allowed).
/// The API keys of `--api-key` (comma-separated) and `--api-key-file` (one a line).
fn api_keys(args: &ServeArgs) -> Result<Vec<String>> {
    let mut keys: Vec<String> = Vec::new();
    if let Some(list) = &args.api_key {
        keys.extend(list.split(',').map(str::trim).map(String::from));
        if keys.iter().any(String::is_empty) {
            anyhow::bail!("--api-key: an empty key in the list");
        }
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--api-key-file {}", path.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
        if keys.len() == before {
            anyhow::bail!("--api-key-file {}: no key in the file", path.display());
        }
    }
    Ok(keys)
}

fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v > 0.0 && v <= 1e9) {
        return Err(format!("`{s}`: expected seconds > 0"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Load the model and size the server from the flags.
fn load(args: &ServeArgs, http: HttpLimits) -> Result<Loaded> {
    let loaded = common::load(&args.model)?;
    let train = loaded.model.config.ctx_train;
    let n_ctx = args.model.ctx(train, 4096);
    let stem = loaded
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    // The first --alias is the name reported (llama-server's); the stem stays a name.
    let (model_id, mut aliases) = match args.aliases.split_first() {
        Some((first, rest)) => (first.clone(), [rest, &[stem]].concat()),
        None => (stem, Vec::new()),
    };
    aliases.push(
        args.model
            .model
            .clone()
            .or_else(|| args.model.hf_repo.clone())
            .unwrap_or_else(|| kiln::fetch::DEFAULT_MODEL.to_string()),
    );
    if let Some(name) = loaded.path.file_name() {
        aliases.push(name.to_string_lossy().into_owned());
    }
    let opts = ServeOptions {
        n_slots: args.parallel.max(1),
        n_ctx,
        n_threads: args.model.threads(),
        prefill_chunk: args.model.batch_size.max(1),
        kv_type: args.model.kv_type,
        device: args.model.device()?,
        max_queue: args.queue,
        max_body_bytes: args.max_body,
        api_keys: api_keys(args)?,
        metrics_public: args.metrics_public,
        special_in_content: args.special_in_content,
        model_id,
        model_aliases: aliases,
        strict_model: args.strict_model,
        http,
        embeddings: args.embeddings || args.reranking,
        pooling: match args.reranking {
            true => Some(Pooling::Rank),
            false => args.pooling,
        },
        embd_normalize: args.embd_normalize,
        speculation: args.spec.serve(&args.model, &loaded)?,
        spm_infill: args.spm_infill,
        webui: !args.no_webui,
    };
    Ok(Loaded {
        model: Arc::clone(&loaded.model),
        tokenizer: Arc::new(loaded.tokenizer),
        opts,
    })
}

/// `KILN_LOAD_GATE=PATH` holds the load until PATH exists (tests use it to watch the loading
/// state; an orchestrator may use it to start the server before the model file is in place).
fn wait_load_gate() {
    let Some(gate) = &kiln::tuning::get().load_gate else {
        return;
    };
    while !gate.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `kiln serve --device vulkan` does not serve yet, refused by name: embeddings and
/// reranking (the Vulkan executor computes no hidden states).
fn refuse_on_vulkan(args: &ServeArgs) -> Result<()> {
    if args.model.device == kiln::backend::Device::Vulkan && (args.embeddings || args.reranking) {
        let flag = if args.reranking {
            "--reranking"
        } else {
            "--embeddings"
        };
        anyhow::bail!(
            "kiln serve --device vulkan {flag}: not supported yet (the Vulkan executor serves completions; embeddings run on cpu and cuda)"
        );
    }
    Ok(())
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.model.kv_budget.is_some() {
        anyhow::bail!(
            "--kv-budget (KV offload) is not supported by `kiln serve`; use --kv-type q8_0 or fewer --parallel sequences to save memory"
        );
    }
    if args.model.swa_full {
        anyhow::bail!("--swa-full is not supported by `kiln serve`");
    }
    // Refused before the port is bound.
    refuse_on_vulkan(&args)?;
    args.spec.serve_check()?;
    let mut limits = HttpLimits {
        max_connections: args.max_connections as usize,
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        idle_timeout: args.idle_timeout,
        write_timeout: args.write_timeout,
        shutdown_grace: args.shutdown_timeout,
        cors_origins: args
            .cors_origins
            .iter()
            .map(|o| o.trim().trim_end_matches('/').to_string())
            .collect(),
        allowed_hosts: args
            .allowed_hosts
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect(),
        bound: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        // Bound first: /health answers 503 ("loading") while the model loads.
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        limits.bound = Some(local);
        eprintln!("kiln: bound to http://{local}; loading the model (/health answers 503 until it is ready)");
        let http = limits.clone();
        let load = move || {
            wait_load_gate();
            load(&args, http)
        };
        let ready = move |opts: &ServeOptions| {
            eprintln!(
                "kiln: serving {} on http://{local} ({} sequences in parallel, context {} each; Ctrl-C to stop)",
                opts.model_id, opts.n_slots, opts.n_ctx
            );
            eprintln!("kiln: listening on http://{local}");
        };
        server::serve(listener, limits, load, ready, shutdown_signal()).await
    })?;
    eprintln!("kiln: stopped");
    Ok(())
}

/// The first SIGINT or SIGTERM starts a graceful shutdown (no new connections; requests in
/// flight finish); a second one exits at once.
async fn shutdown_signal() {
    wait_signal().await;
    eprintln!(
        "kiln: shutting down: finishing the responses in progress (--shutdown-timeout; again to force)"
    );
    tokio::spawn(async {
        wait_signal().await;
        std::process::exit(130);
    });
}

async fn wait_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await,
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
