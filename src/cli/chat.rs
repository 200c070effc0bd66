//! `kiln chat`: an interactive conversation that keeps its KV cache between turns.
//!
//! Each turn renders the whole conversation with the model's chat template, then prefills only
//! what differs from the cached tokens (seed 004's rollback-based prefix reuse): the system
//! prompt and earlier turns are never recomputed.

use std::io::{BufRead, Write};
use std::sync::atomic::Ordering;

use anyhow::Result;
use clap::Args;

use super::common::{self, ModelArgs, SamplingArgs};
use kiln::engine::{generate, GenerateRequest};
use kiln::sampler::Sampler;
use kiln::tokenizer::ChatMessage;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System message.
    #[arg(long = "system-prompt", visible_alias = "system")]
    pub system: Option<String>,
    /// Maximum tokens per reply (-1 = until end of turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl ChatArgs {
    /// The chat `kiln run` starts (no prompt on a terminal, or -cnv).
    pub fn new(
        model: ModelArgs,
        sampling: SamplingArgs,
        system: Option<String>,
        n_predict: i64,
    ) -> ChatArgs {
        ChatArgs {
            model,
            system,
            n_predict,
            sampling,
        }
    }
}

pub fn run(args: ChatArgs) -> Result<()> {
    let loaded = common::load(&args.model)?;
    let tok = &loaded.tokenizer;
    let mut session = common::session(&loaded, &args.model)?;
    let mut sampler = Sampler::new(args.sampling.config()?, loaded.model.config.vocab_size);
    let cancel = common::cancel_flag();
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s.as_str()));
    }
    eprintln!(
        "kiln chat — {} (ctx {}). Type /exit to quit, /reset to start over.",
        loaded.path.display(),
        session.n_ctx()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else { break };
        let line = line?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                session.reset();
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input));
        let prompt = tok.apply_chat_template(&messages, true)?;
        let ids = tok.encode(&prompt, true, true);
        if let Err(e) = session.check_fits(ids.len().saturating_sub(session.common_prefix(&ids))) {
            eprintln!("error: {e}; use /reset");
            messages.pop();
            continue;
        }
        cancel.store(false, Ordering::SeqCst);
        let mut reply = String::new();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut on_token = |_id: u32, piece: &str| {
            reply.push_str(piece);
            let _ = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
            true
        };
        let req = GenerateRequest {
            prompt: &ids,
            max_new: usize::try_from(args.n_predict).ok(),
            reuse_prefix: true,
            cancel: Some(cancel),
            ignore_eos: false,
        };
        let stats = match generate(
            &mut session,
            &mut sampler,
            tok,
            &req,
            &mut |_, _| {},
            &mut on_token,
        ) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("\nerror: {e}");
                messages.pop();
                continue;
            }
        };
        let _ = writeln!(out);
        if args.model.verbose {
            eprintln!(
                "[reused {} of {} prompt tokens; prefill {:.1} tok/s; generation {} tokens at {:.1} tok/s]",
                stats.reused_tokens,
                stats.prompt_tokens,
                stats.prompt_tps(),
                stats.gen_tokens,
                stats.gen_tps()
            );
        }
        messages.push(ChatMessage::new("assistant", reply.trim_end()));
    }
    Ok(())
}
