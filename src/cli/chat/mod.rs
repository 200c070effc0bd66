//! `kiln chat`: an interactive conversation that keeps its KV cache between turns.
//!
//! Each turn renders the whole conversation with the model's chat template, then prefills only
//! what differs from the cached tokens (rollback-based prefix reuse): the system prompt and
//! earlier turns are never recomputed. When the conversation outgrows the context, its oldest
//! turns (never the system message) are dropped and the unchanged prefix is still reused.

mod input;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::common::{self, ModelArgs, SamplingArgs};
use super::spec::SpecArgs;
use input::{Command, Input, Reader};
use kiln::engine::{Engine, GenerateRequest, StopReason};
use kiln::sampler::Sampler;
use kiln::tokenizer::{ChatMessage, Tokenizer};

#[derive(Args, Debug)]
#[command(after_help = input::HELP)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System message (-sys; /system changes it during the chat).
    #[arg(
        long = "system-prompt",
        visible_alias = "system",
        help_heading = "Prompt"
    )]
    pub system: Option<String>,
    /// Maximum tokens per reply (-1 = until end of turn or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = -1,
        allow_negative_numbers = true,
        help_heading = "Prompt"
    )]
    pub n_predict: i64,
    /// Accepted for llama.cpp compatibility (-cnv): chat is always a conversation.
    #[arg(long = "conversation", help_heading = "Prompt")]
    pub conversation: bool,
    /// Accepted for llama.cpp compatibility: kiln always renders the model's Jinja template.
    #[arg(long, help_heading = "Prompt")]
    pub jinja: bool,
    /// Never stop a reply at an end-of-generation token (only -n or a full context end it).
    #[arg(long = "ignore-eos", help_heading = "Sampling")]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl ChatArgs {
    /// The chat `kiln run` starts (no prompt on a terminal, or -cnv).
    pub fn new(
        model: ModelArgs,
        sampling: SamplingArgs,
        system: Option<String>,
        n_predict: i64,
        ignore_eos: bool,
        spec: SpecArgs,
    ) -> ChatArgs {
        ChatArgs {
            model,
            system,
            n_predict,
            conversation: true,
            jinja: false,
            ignore_eos,
            sampling,
            spec,
        }
    }
}

pub fn run(args: ChatArgs) -> Result<()> {
    let verbose = args.model.verbose;
    let loaded = common::load(&args.model)?;
    let tok = &loaded.tokenizer;
    let (mut engine, speculating) = args.spec.engine(&loaded, &args.model)?;
    let mut sampler = Sampler::new(args.sampling.config()?, loaded.model.config.vocab_size);
    let cancel = common::cancel_flag();
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s.as_str()));
    }
    eprintln!(
        "kiln chat: {} (context {} tokens). /help lists the commands; Ctrl-D or /exit leaves.",
        loaded.path.display(),
        engine.n_ctx()
    );
    if tok.chat_template().is_none() {
        eprintln!("kiln: the model has no chat template; using ChatML");
    }
    let mut reader = Reader::new()?;
    let mut interrupted = false;
    loop {
        let text = match reader.read()? {
            Input::Eof => break,
            Input::Interrupted => {
                if interrupted {
                    break;
                }
                interrupted = true;
                eprintln!("(Ctrl-C again or Ctrl-D to leave)");
                continue;
            }
            Input::Command(c) => {
                interrupted = false;
                match c {
                    Command::Exit => break,
                    other => {
                        if let Err(e) = command(other, &mut messages) {
                            eprintln!("error: {e:#}");
                        }
                    }
                }
                continue;
            }
            Input::Message(m) => m,
        };
        interrupted = false;
        messages.push(ChatMessage::new("user", text));
        let reserve = reply_reserve(args.n_predict, engine.n_ctx());
        let ids = match fit(tok, &engine, &mut messages, reserve) {
            Ok((ids, dropped)) => {
                if dropped > 0 {
                    eprintln!(
                        "[context full: dropped the {dropped} oldest messages; the system message is kept]"
                    );
                }
                ids
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
                continue;
            }
        };
        cancel.store(false, Ordering::SeqCst);
        let mut reply = String::new();
        let mut write_error = None;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        // (The reply kept for the next turn is what is shown: a harmony model's final
        // channel, as its template expects an assistant turn.)
        let mut shown = super::shown::Shown::new(tok, true);
        let mut on_token = |_id: u32, piece: &str| {
            let piece = shown.push(piece);
            reply.push_str(piece);
            match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => true,
                Err(e) => {
                    write_error = Some(e);
                    false
                }
            }
        };
        let req = GenerateRequest {
            prompt: &ids,
            max_new: usize::try_from(args.n_predict).ok(),
            reuse_prefix: true,
            cancel: Some(cancel),
            ignore_eos: args.ignore_eos,
            stop: &[],
        };
        let result = engine.generate(&req, &mut sampler, None, &mut |_, _| {}, &mut on_token);
        cancel.store(false, Ordering::SeqCst);
        if let Some(e) = write_error {
            // Standard output is gone (a closed pipe ends quietly in main).
            return Err(e).context("writing the reply");
        }
        let stats = match result {
            Ok(s) => s,
            Err(e) => {
                eprintln!("\nerror: {e}");
                messages.pop();
                continue;
            }
        };
        let rest = shown.finish();
        reply.push_str(rest);
        out.write_all(rest.as_bytes())
            .and_then(|_| writeln!(out))
            .context("writing the reply")?;
        drop(out);
        match stats.stop {
            Some(StopReason::Cancelled) => eprintln!("[stopped]"),
            Some(StopReason::ContextFull) => {
                eprintln!("[context full: reply cut; the oldest turns will make room]")
            }
            _ => {}
        }
        if verbose {
            eprintln!(
                "[reused {} of {} prompt tokens; prefill {:.1} tok/s; generation {} tokens at {:.1} tok/s]",
                stats.reused_tokens,
                stats.prompt_tokens,
                stats.prompt_tps(),
                stats.gen_tokens,
                stats.gen_tps()
            );
            if speculating {
                eprintln!("[speculative: {}]", super::spec::describe(&stats.spec));
            }
        }
        messages.push(ChatMessage::new("assistant", reply.trim_end()));
    }
    Ok(())
}

/// Run a slash command other than /exit.
fn command(c: Command, messages: &mut Vec<ChatMessage>) -> Result<()> {
    match c {
        Command::Help => eprintln!("{}", input::HELP),
        Command::Clear => {
            messages.retain(|m| m.role == "system");
            eprintln!("[conversation cleared]");
        }
        Command::System(text) => {
            match messages.first_mut() {
                Some(m) if m.role == "system" => m.content = text,
                _ => messages.insert(0, ChatMessage::new("system", text)),
            }
            eprintln!("[system message set]");
        }
        Command::Save(path) => {
            save(&path, messages)?;
            eprintln!("[saved {} messages to {}]", messages.len(), path.display());
        }
        Command::Load(path) => {
            *messages = load(&path)?;
            eprintln!(
                "[loaded {} messages from {}]",
                messages.len(),
                path.display()
            );
        }
        Command::Exit => {}
    }
    Ok(())
}

/// Room kept for the reply when old turns must go: the reply limit, at most a quarter of the
/// context.
fn reply_reserve(n_predict: i64, n_ctx: usize) -> usize {
    let quarter = (n_ctx / 4).max(1);
    usize::try_from(n_predict).map_or(quarter, |n| n.clamp(1, quarter))
}

/// The conversation's prompt tokens, dropping the oldest turns (never a system message, never
/// the newest message) until they leave `reserve` tokens for the reply. Returns the tokens and
/// how many messages were dropped.
fn fit(
    tok: &Tokenizer,
    engine: &Engine<'_>,
    messages: &mut Vec<ChatMessage>,
    reserve: usize,
) -> Result<(Vec<u32>, usize)> {
    let n_ctx = engine.n_ctx();
    let mut dropped = 0;
    loop {
        let ids = encode(tok, messages)?;
        if ids.len() + reserve <= n_ctx {
            return Ok((ids, dropped));
        }
        let last = messages.len() - 1;
        match messages.iter().position(|m| m.role != "system") {
            Some(i) if i < last => {
                // A user message and the replies after it go together, so that roles still
                // alternate.
                messages.remove(i);
                dropped += 1;
                while i < messages.len() - 1 && messages[i].role != "user" {
                    messages.remove(i);
                    dropped += 1;
                }
            }
            _ if ids.len() < n_ctx => return Ok((ids, dropped)),
            _ => bail!(
                "the message does not fit: the conversation needs {} tokens, the context holds {n_ctx} (see -c)",
                ids.len()
            ),
        }
    }
}

/// The conversation's tokens with a generation prompt: through the model's chat template, the
/// messages' text literal (a typed `<|im_end|>` is text, not the control token); a model
/// without a template gets ChatML, as llama.cpp's conversation mode does.
fn encode(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    if tok.chat_template().is_some() {
        return Ok(tok.encode_chat(messages, true, false)?);
    }
    let chatml = kiln::tokenizer::builtin_chat_template("chatml").context("ChatML is built in")?;
    let bos = tok.bos().map(|id| tok.token_text(id)).unwrap_or("");
    let eos = tok.eos().map(|id| tok.token_text(id)).unwrap_or("");
    let text = kiln::tokenizer::render_chat(chatml, messages, true, bos, eos)?;
    Ok(tok.encode(&text, true, true))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedMessage {
    role: String,
    content: String,
}

fn save(path: &Path, messages: &[ChatMessage]) -> Result<()> {
    let list: Vec<SavedMessage> = messages
        .iter()
        .map(|m| SavedMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect();
    let text = serde_json::to_string_pretty(&list)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

fn load(path: &Path) -> Result<Vec<ChatMessage>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let list: Vec<SavedMessage> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a JSON list of {{\"role\", \"content\"}} messages",
            path.display()
        )
    })?;
    list.into_iter()
        .enumerate()
        .map(|(i, m)| match m.role.as_str() {
            "system" | "user" | "assistant" => Ok(ChatMessage::new(m.role, m.content)),
            r => bail!(
                "{}: message {i} has role {r:?} (system, user or assistant)",
                path.display()
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_reserve_is_bounded_by_a_quarter_of_the_context() {
        assert_eq!(reply_reserve(-1, 64), 16);
        assert_eq!(reply_reserve(4, 64), 4);
        assert_eq!(reply_reserve(1000, 64), 16);
        assert_eq!(reply_reserve(0, 64), 1);
    }

    #[test]
    fn saved_conversations_load_back_and_bad_roles_are_refused() {
        let dir = std::env::temp_dir().join(format!("kiln-chat-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.json");
        let msgs = vec![
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", "hi \"there\"\nsecond line"),
            ChatMessage::new("assistant", "hello"),
        ];
        save(&p, &msgs).unwrap();
        assert_eq!(load(&p).unwrap(), msgs);
        std::fs::write(&p, r#"[{"role":"wizard","content":"x"}]"#).unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("wizard"));
        std::fs::write(&p, "{}").unwrap();
        assert!(load(&p).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
