//! `kiln embedding`: embeddings of prompts, as `llama-embedding` prints them.
//!
//! The prompts (`-p`, `-f` or standard input) are split at `--embd-separator` (a newline by
//! default; empty ones dropped), tokenized as llama.cpp does (BOS/EOS by the model's policy,
//! special tokens parsed) and evaluated together through the server's scheduler (continuous
//! batching over up to four sequences). The pooling is the model's own or `--pooling`; with
//! `none` every token's vector is printed. With `rank` (a reranker) a prompt
//! `QUERY<--cls-separator>DOCUMENT` is scored as the pair (as `/v1/rerank` makes its prompts),
//! and each prompt's score is printed as llama-embedding prints it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;

use super::common::{self, ModelArgs};
use kiln::engine::batch::BatchOptions;
use kiln::engine::embed::embed_prompts;
use kiln::engine::pooling::{cosine, EmbedSpec, Pooling};
use kiln::engine::rerank::RerankFormat;

#[derive(Args, Debug)]
pub struct EmbeddingArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to embed (one prompt per line, or per --embd-separator).
    #[arg(short = 'p', long = "prompt", help_heading = "Prompt")]
    pub prompt: Option<String>,
    /// Read the prompts from a file.
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with = "prompt",
        help_heading = "Prompt"
    )]
    pub file: Option<PathBuf>,
    /// What separates prompts.
    #[arg(long = "embd-separator", default_value = "\n", help_heading = "Prompt")]
    pub separator: String,
    /// Pooling instead of the model's own: none (every token's vector), mean, cls, last,
    /// rank (a reranker's scores).
    #[arg(long, value_parser = super::serve::pooling, value_name = "none|mean|cls|last|rank",
          help_heading = "Embeddings")]
    pub pooling: Option<Pooling>,
    /// With rank pooling: what separates a prompt's query from its document.
    #[arg(
        long = "cls-separator",
        default_value = "\t",
        help_heading = "Embeddings"
    )]
    pub cls_separator: String,
    /// Normalization: -1 none, 0 max-abs int16, 1 taxicab, 2 euclidean, >2 p-norm.
    #[arg(long = "embd-normalize", default_value_t = 2, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..), help_heading = "Embeddings")]
    pub embd_normalize: i32,
    /// Print OpenAI's JSON (`{"object": "list", "data": [...]}`) with every value.
    #[arg(long, help_heading = "Embeddings")]
    pub json: bool,
}

pub fn run(args: EmbeddingArgs) -> Result<()> {
    if args.model.kv_budget.is_some() || args.model.swa_full {
        bail!("--kv-budget and --swa-full are not supported by `kiln embedding`");
    }
    let text = common::read_prompt(&args.prompt, &args.file)?;
    let sep = if args.separator.is_empty() {
        "\n"
    } else {
        &args.separator
    };
    let prompts: Vec<&str> = text.split(sep).filter(|p| !p.trim().is_empty()).collect();
    if prompts.is_empty() {
        bail!("no prompt to embed");
    }
    let device = args.model.device()?;
    let loaded = common::load(&args.model)?;
    let m = Arc::clone(&loaded.model);
    let pooling = Pooling::for_model(&m, args.pooling)?;
    let n_ctx = args.model.ctx(m.config.ctx_train, 4096);
    let tok = &loaded.tokenizer;
    let format = RerankFormat::new(tok, &m.file);
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| match p.split_once(args.cls_separator.as_str()) {
            Some((query, doc)) if pooling == Pooling::Rank && !args.cls_separator.is_empty() => {
                format.prompt(tok, query, doc)
            }
            _ => tok.encode(p, true, true),
        })
        .collect();
    let spec = EmbedSpec {
        pooling,
        normalize: args.embd_normalize,
    };
    let opts = BatchOptions {
        n_slots: 4,
        n_ctx,
        n_threads: args.model.threads(),
        prefill_chunk: args.model.batch_size.max(1),
        kv_type: args.model.kv_type,
        device,
        draft_max: 0,
    };
    let vectors = embed_prompts(&m, &loaded.tokenizer, &ids, spec, opts)?;
    let tokens: usize = ids.iter().map(Vec::len).sum();
    if args.json {
        let data: Vec<serde_json::Value> = vectors
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| serde_json::json!({"object": "embedding", "index": i, "embedding": v}))
            .collect();
        let out = serde_json::json!({
            "object": "list",
            "data": data,
            "model": loaded.path.file_stem().map(|s| s.to_string_lossy().into_owned()),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        });
        println!("{out}");
        return Ok(());
    }
    if pooling == Pooling::Rank {
        let labels = m
            .weights
            .classifier
            .as_ref()
            .map_or(&[][..], |c| &c.labels[..]);
        for (j, rows) in vectors.iter().enumerate() {
            let scores = rows.first().map_or(&[][..], |r| &r[..]);
            match scores {
                [s] => println!("rerank score {j}: {s:8.3}"),
                _ => {
                    for (i, s) in scores.iter().enumerate() {
                        let label = labels.get(i).cloned().unwrap_or_else(|| i.to_string());
                        println!("rerank score {j}: {s:8.3} [{label}]");
                    }
                }
            }
        }
        return Ok(());
    }
    print_text(&prompts, &vectors, args.embd_normalize);
    Ok(())
}

/// llama-embedding's text output: each vector (the first 16 values when there are several
/// prompts; per token, the first and last three), then the cosine similarities.
fn print_text(prompts: &[&str], vectors: &[Vec<Vec<f32>>], normalize: i32) {
    let fmt = |x: f32| {
        if normalize == 0 {
            format!("{x:6.0}")
        } else {
            format!("{x:9.6}")
        }
    };
    let join = |v: &[f32]| v.iter().map(|&x| fmt(x)).collect::<Vec<_>>().join(" ");
    let pooled = vectors.iter().all(|v| v.len() == 1);
    for (j, rows) in vectors.iter().enumerate() {
        if pooled {
            let v = &rows[0];
            let n = if prompts.len() > 1 {
                v.len().min(16)
            } else {
                v.len()
            };
            println!("embedding {j}: {}", join(&v[..n]));
        } else {
            for (t, v) in rows.iter().enumerate() {
                let k = v.len().min(3);
                println!(
                    "embedding {j} token {t}: {} ... {}",
                    join(&v[..k]),
                    join(&v[v.len() - k..])
                );
            }
        }
    }
    if pooled && prompts.len() > 1 {
        println!("\ncosine similarity matrix:\n");
        let head: Vec<String> = prompts
            .iter()
            .map(|p| format!("{:>6.6}", p.chars().take(6).collect::<String>()))
            .collect();
        println!("{}", head.join(" "));
        for (i, a) in vectors.iter().enumerate() {
            let row: Vec<String> = vectors
                .iter()
                .map(|b| format!("{:6.2}", cosine(&a[0], &b[0])))
                .collect();
            let label: String = prompts[i].chars().take(10).collect();
            println!("{} {label}", row.join(" "));
        }
    }
}
