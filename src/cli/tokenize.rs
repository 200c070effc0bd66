//! `kiln tokenize`: the ids a model's tokenizer gives a text (as `llama-tokenize`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::common;
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Model: a GGUF path or a known name (default smollm2).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Text to tokenize.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the text from a file.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Print only the ids, as one list `[1, 2, 3]`.
    #[arg(long)]
    pub ids: bool,
    /// Do not add BOS/EOS as the model's policy would.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Treat special-token text (e.g. `<|im_start|>`) as plain text.
    #[arg(long = "no-parse-special")]
    pub no_parse_special: bool,
    /// Print the number of tokens only.
    #[arg(long = "show-count")]
    pub show_count: bool,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let text = common::read_prompt(&args.prompt, &args.file)?;
    let path = kiln::fetch::resolve_model(args.model.as_deref(), true)?;
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&text, !args.no_bos, !args.no_parse_special);
    if args.show_count {
        println!("Total number of tokens: {}", ids.len());
    } else if args.ids {
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        println!("[{}]", list.join(", "));
    } else {
        for id in &ids {
            println!(
                "{id:6} -> '{}'",
                String::from_utf8_lossy(tok.token_bytes(*id))
            );
        }
    }
    Ok(())
}
