//! `kiln run`: generate text from a prompt, streaming it to stdout.
//!
//! As llama-cli does: a model with its own chat template (an instruct model) gets the prompt as
//! a user message through that template unless `--raw` / `-no-cnv` asks for a plain completion;
//! with no prompt and a terminal on standard input, `run` starts the interactive chat; standard
//! input is read as the prompt only when it is piped.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;

use super::chat::{self, ChatArgs};
use super::common::{self, ModelArgs, SamplingArgs};
use kiln::engine::GenerateRequest;
use kiln::sampler::Sampler;
use kiln::tokenizer::ChatMessage;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text (without -p or -f: piped standard input, or the chat on a terminal).
    #[arg(short = 'p', long = "prompt", help_heading = "Prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with = "prompt",
        help_heading = "Prompt"
    )]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1 = until end of generation or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true,
        help_heading = "Prompt"
    )]
    pub n_predict: i64,
    /// A plain completion: the prompt is not put through the chat template (llama.cpp's
    /// -no-cnv). The default for models without a chat template of their own.
    #[arg(long = "raw", alias = "no-conversation", help_heading = "Prompt")]
    pub raw: bool,
    /// Start the interactive chat (llama.cpp's -cnv); -sys gives its system message.
    #[arg(long = "conversation", conflicts_with_all = ["raw", "prompt", "file", "json"], help_heading = "Prompt")]
    pub conversation: bool,
    /// Apply the chat template even to a model whose template is kiln's built-in fallback.
    #[arg(long, conflicts_with = "raw", help_heading = "Prompt")]
    pub chat: bool,
    /// System message (with the chat template).
    #[arg(
        long = "system-prompt",
        visible_alias = "system",
        conflicts_with = "raw",
        help_heading = "Prompt"
    )]
    pub system: Option<String>,
    /// Accepted for llama.cpp compatibility: kiln always renders the model's Jinja template.
    #[arg(long, help_heading = "Prompt")]
    pub jinja: bool,
    /// Print the prompt before the generated text.
    #[arg(long, help_heading = "Prompt")]
    pub echo: bool,
    /// JSON lines on stdout instead of text: {"id", "text"} per token, then one object with
    /// the statistics. Everything else goes to stderr.
    #[arg(long, help_heading = "Prompt")]
    pub json: bool,
    /// Never stop at an end-of-generation token (generate -n tokens).
    #[arg(long = "ignore-eos", help_heading = "Sampling")]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub grammar: super::grammar::GrammarArgs,
    #[command(flatten)]
    pub spec: super::spec::SpecArgs,
}

pub fn run(args: RunArgs) -> Result<()> {
    let no_prompt = args.prompt.is_none() && args.file.is_none();
    if args.conversation || (no_prompt && std::io::stdin().is_terminal()) {
        return chat::run(ChatArgs::new(
            args.model,
            args.sampling,
            args.system,
            args.n_predict,
            args.ignore_eos,
            args.spec,
        ));
    }
    let text = common::read_prompt(&args.prompt, &args.file)?;
    let sampler_cfg = args.sampling.config()?;
    let spec = args.grammar.spec()?;
    if args.spec.check()? && spec.is_some() {
        bail!("speculative decoding and a grammar together are not supported");
    }
    let loaded = common::load(&args.model)?;
    let tok = &loaded.tokenizer;
    let own_template = tok.chat_template().is_some() && !tok.chat_template_is_builtin();
    let templated = !args.raw && (args.chat || own_template || args.system.is_some());
    let prompt_text = if templated {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(ChatMessage::new("system", s.as_str()));
        }
        msgs.push(ChatMessage::new("user", text.as_str()));
        tok.apply_chat_template(&msgs, true)?
    } else {
        text
    };
    let ids = tok.encode(&prompt_text, true, templated);
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    let (mut engine, speculating) = args.spec.engine(&loaded, &args.model)?;
    engine.check_fits(ids.len())?;
    let mut sampler = Sampler::new(sampler_cfg, loaded.model.config.vocab_size);
    let constraint = super::grammar::constraint(spec.as_ref(), tok)?;
    let cancel = common::cancel_flag();

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.echo && !args.json {
        out.write_all(prompt_text.as_bytes())?;
    }
    let bar = common::prefill_bar(ids.len(), 2 * args.model.batch_size);
    let mut progress = |done: usize, _total: usize| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    };
    let json = args.json;
    let mut write_error = None;
    // (`--json` gives every token as it is.)
    let mut shown = super::shown::Shown::new(tok, templated && !json);
    let mut on_token = |id: u32, piece: &str| {
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let r = if json {
            // The tail a stream decoder flushes at the end has no token of its own.
            let id = (id != u32::MAX).then_some(id);
            writeln!(out, "{}", json!({ "id": id, "text": piece }))
        } else {
            out.write_all(shown.push(piece).as_bytes())
        };
        match r.and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_error = Some(e);
                false // stop: stdout is closed (e.g. piped into `head`)
            }
        }
    };
    let req = GenerateRequest {
        prompt: &ids,
        max_new: usize::try_from(args.n_predict).ok(),
        reuse_prefix: false,
        cancel: Some(cancel),
        ignore_eos: args.ignore_eos,
        stop: &[],
    };
    let stats = engine.generate(&req, &mut sampler, constraint, &mut progress, &mut on_token)?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    out.write_all(shown.finish().as_bytes())?;
    if json {
        let j = json!({
            "model": loaded.path,
            "load_ms": loaded.load_ms,
            "prompt_tokens": stats.prompt_tokens,
            "prompt_ms": stats.prompt_ms,
            "prompt_tps": stats.prompt_tps(),
            "gen_tokens": stats.gen_tokens,
            "gen_ms": stats.gen_ms,
            "gen_tps": stats.gen_tps(),
            "stop": stats.stop,
            "speculative": speculating.then_some(stats.spec),
            "peak_rss_bytes": super::bench::peak_rss(),
        });
        writeln!(out, "{j}")?;
        return Ok(());
    }
    writeln!(out)?;
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
    if speculating {
        eprintln!("speculative    = {}", super::spec::describe(&stats.spec));
    }
    Ok(())
}
