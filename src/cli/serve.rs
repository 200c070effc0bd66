//! `kiln serve`: the OpenAI-compatible HTTP server.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use super::common::{self, ModelArgs};
use kiln::server::{self, ServeOptions};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    /// Require `Authorization: Bearer KEY` on the /v1 routes.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Another name clients may use for the model (repeatable).
    #[arg(long = "alias")]
    pub aliases: Vec<String>,
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
    let loaded = common::load(&args.model)?;
    let train = loaded.model.config.ctx_train;
    let n_ctx = args.model.ctx_size.unwrap_or(4096.min(train)).max(8);
    let stem = loaded
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let mut aliases = args.aliases.clone();
    aliases.push(
        args.model
            .model
            .clone()
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
        max_queue: args.queue,
        max_body_bytes: args.max_body,
        api_key: args.api_key.clone(),
        model_id: stem,
        model_aliases: aliases,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "kiln: serving {} on http://{local} ({} sequences in parallel, context {} each; Ctrl-C to stop)",
            opts.model_id, opts.n_slots, opts.n_ctx
        );
        eprintln!("kiln: listening on http://{local}");
        server::serve(
            listener,
            Arc::clone(&loaded.model),
            Arc::new(loaded.tokenizer),
            opts,
            shutdown_signal(),
        )
        .await
    })?;
    eprintln!("kiln: stopped");
    Ok(())
}

/// The first SIGINT or SIGTERM starts a graceful shutdown (no new connections; requests in
/// flight finish); a second one exits at once.
async fn shutdown_signal() {
    wait_signal().await;
    eprintln!("kiln: shutting down: finishing the requests in flight (again to force)");
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
