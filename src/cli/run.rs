//! `kiln run`: generate text from a prompt, streaming it to stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::common::{self, ModelArgs, SamplingArgs};
use kiln::engine::{generate, GenerateRequest};
use kiln::sampler::Sampler;
use kiln::tokenizer::ChatMessage;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1 = until end of generation or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Apply the model's chat template to the prompt (as a user message).
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print the prompt before the generated text.
    #[arg(long)]
    pub echo: bool,
    /// Print the statistics as JSON on stderr at the end.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: RunArgs) -> Result<()> {
    let text = common::read_prompt(&args.prompt, &args.file)?;
    let sampler_cfg = args.sampling.config()?;
    let loaded = common::load(&args.model)?;
    let tok = &loaded.tokenizer;
    let prompt_text = if args.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(ChatMessage::new("system", s.as_str()));
        }
        msgs.push(ChatMessage::new("user", text.as_str()));
        tok.apply_chat_template(&msgs, true)?
    } else {
        text
    };
    let ids = tok.encode(&prompt_text, true, args.chat);
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    let mut session = common::session(&loaded, &args.model)?;
    session.check_fits(ids.len())?;
    let mut sampler = Sampler::new(sampler_cfg, loaded.model.config.vocab_size);
    let cancel = common::cancel_flag();

    if args.echo {
        print!("{prompt_text}");
    }
    let bar = common::prefill_bar(ids.len(), 2 * args.model.batch_size);
    let mut progress = |done: usize, _total: usize| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut on_token = |_id: u32, piece: &str| {
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let ok = out
            .write_all(piece.as_bytes())
            .and_then(|_| out.flush())
            .is_ok();
        ok // stop if stdout closed (e.g. piped into `head`)
    };
    let req = GenerateRequest {
        prompt: &ids,
        max_new: usize::try_from(args.n_predict).ok(),
        reuse_prefix: false,
        cancel: Some(cancel),
    };
    let stats = generate(
        &mut session,
        &mut sampler,
        tok,
        &req,
        &mut progress,
        &mut on_token,
    )?;
    let _ = writeln!(out);
    eprintln!();
    eprintln!("load time      = {:10.2} ms", loaded.load_ms);
    eprintln!(
        "prompt eval    = {:10.2} ms / {:5} tokens ({:8.2} tokens per second)",
        stats.prompt_ms,
        stats.prompt_tokens,
        stats.prompt_tps()
    );
    eprintln!(
        "eval           = {:10.2} ms / {:5} tokens ({:8.2} tokens per second)",
        stats.gen_ms,
        stats.gen_tokens,
        stats.gen_tps()
    );
    if args.json {
        let j = serde_json::json!({
            "model": loaded.path,
            "load_ms": loaded.load_ms,
            "prompt_tokens": stats.prompt_tokens,
            "prompt_ms": stats.prompt_ms,
            "prompt_tps": stats.prompt_tps(),
            "gen_tokens": stats.gen_tokens,
            "gen_ms": stats.gen_ms,
            "gen_tps": stats.gen_tps(),
            "stop": stats.stop,
            "peak_rss_bytes": super::bench::peak_rss(),
        });
        eprintln!("{j}");
    }
    Ok(())
}
