//! `kiln perplexity`: perplexity of a text file, as `llama-perplexity` computes it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::common::{self, ModelArgs};
use kiln::engine::perplexity::scoring_options;
use kiln::engine::{perplexity, Engine, SessionOptions};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Maximum number of chunks (default: all).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let loaded = common::load(&args.model)?;
    let tok = &loaded.tokenizer;
    let tokens = tok.encode(&text, true, false);
    let n_ctx = args.model.ctx(loaded.model.config.ctx_train, 512);
    let mut opts = SessionOptions::new(n_ctx, args.model.threads());
    opts.prefill_chunk = args.model.batch_size.min(n_ctx);
    opts.kv_type = args.model.kv_type;
    opts.kv_budget = args.model.kv_budget.map(|b| b as usize);
    opts.swa_full = args.model.swa_full;
    opts.device = args.model.device_not_vulkan("perplexity")?;
    let (batch, cache) = scoring_options(&opts);
    let runner = common::new_runner_with(&loaded.model, batch, cache)?;
    let mut engine = Engine::new(runner, tok)?;
    let bos = if tok.adds_bos() { tok.bos() } else { None };
    eprintln!("perplexity: {} tokens, {} per chunk", tokens.len(), n_ctx);
    let t0 = std::time::Instant::now();
    let json = args.json;
    let mut on_chunk = |i: usize, ppl: f64| {
        if !json {
            eprint!("[{}]{:.4},", i + 1, ppl);
        }
    };
    let report = perplexity(&mut engine, &tokens, n_ctx, args.chunks, bos, &mut on_chunk)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            report.final_ppl, report.stderr
        );
        eprintln!(
            "{} tokens scored in {:.2} s ({:.1} tokens/s evaluated)",
            report.tokens_scored,
            t0.elapsed().as_secs_f64(),
            (report.chunks * n_ctx) as f64 / t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
