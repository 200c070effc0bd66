//! Subcommands of the `kiln` binary. Each file defines its flags (`clap::Args`) and a `run`.

mod bench;
mod chat;
mod common;
mod embedding;
mod grammar;
mod inspect;
mod list;
mod perplexity;
mod plan;
mod pull;
mod rm;
mod run;
mod serve;
mod shown;
mod spec;
mod tokenize;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Run GGUF language models on the CPU or an NVIDIA GPU",
    long_about = "kiln runs GGUF language models on the CPU or an NVIDIA GPU (--device cuda).\n\nWith no model named, commands use SmolLM2-135M-Instruct, downloading it on first use.\nExamples:\n  kiln run -p \"The capital of France is\"\n  kiln chat -m gemma3\n  kiln serve --port 8080\n  kiln inspect model.gguf --json",
    after_help = "Environment: the KILN_* variables (models directory, pip, kernel tiers, GPU switches) are listed in docs/tuning.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout).
    Run(run::RunArgs),
    /// Chat interactively, keeping the conversation in the KV cache.
    Chat(chat::ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching, prefix cache).
    Serve(serve::ServeArgs),
    /// Show the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Embeddings of prompts (llama-embedding's -p, -f, --pooling, --embd-normalize).
    Embedding(embedding::EmbeddingArgs),
    /// Prompt and generation throughput (llama-bench's pp/tg), load time, peak RSS.
    Bench(bench::BenchArgs),
    /// Memory a session will use, computed before loading any weights.
    Plan(plan::PlanArgs),
    /// Perplexity of a text file (llama-perplexity's method).
    Perplexity(perplexity::PerplexityArgs),
    /// Show a GGUF model's architecture, hyper-parameters, tokenizer and block formats.
    #[command(visible_alias = "show")]
    Inspect(inspect::InspectArgs),
    /// Download a model: a known name (default: smollm2), a Hugging Face repository
    /// (USER/REPO:QUANT) or any GGUF file by URL.
    Pull(pull::PullArgs),
    /// List the downloaded models (name, size, block format, architecture, path).
    #[command(visible_alias = "ls")]
    List(list::ListArgs),
    /// Delete downloaded models.
    Rm(rm::RmArgs),
}

/// Run the command line; errors are printed as one line per cause (never a backtrace) and give
/// exit status 1. A closed standard output (`kiln ... | head`) ends the program quietly.
pub fn main() -> ExitCode {
    quiet_broken_pipe();
    let cli = Cli::parse_from(llama_flags(std::env::args_os()));
    let verbose = cli.command.verbose();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(if verbose {
        "info"
    } else {
        "warn"
    }))
    .init();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Embedding(a) => embedding::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Inspect(args) => inspect::run(args),
        Command::Pull(args) => pull::run(args),
        Command::List(args) => list::run(args),
        Command::Rm(args) => rm::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

impl Command {
    /// Whether `-v` / `--verbose` was given (more logging).
    fn verbose(&self) -> bool {
        let model = match self {
            Command::Run(a) => &a.model,
            Command::Chat(a) => &a.model,
            Command::Serve(a) => &a.model,
            Command::Embedding(a) => &a.model,
            Command::Perplexity(a) => &a.model,
            Command::Bench(a) => &a.model,
            _ => return false,
        };
        model.verbose
    }
}

/// llama.cpp's single-dash long flags, spelled as clap's double-dash ones.
const LLAMA_FLAGS: [(&str, &str); 12] = [
    ("-ngl", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-sys", "--system-prompt"),
    ("-md", "--model-draft"),
    ("-cd", "--ctx-size-draft"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("-nr", "--no-repack"),
];

/// Flags whose value is free text.
const TEXT_FLAGS: [&str; 5] = ["-p", "--prompt", "-sys", "--system-prompt", "--system"];

/// Rewrite llama.cpp's `-ngl 99`, `-fa`, `-cnv`, `-no-cnv`, `-sys TEXT`, `-md FILE`, `-cd N`,
/// `-hf REPO`, `-hff FILE`, `-hft TOKEN`, `-nr` (also `-ngl=99`) into the long flags clap parses. Everything after `--` is left alone.
fn llama_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let mut rest = false;
    for a in args {
        // The value of a text flag (`-p -fa` prompts with "-fa") is never a flag.
        let after_text = out
            .last()
            .and_then(|p| p.to_str())
            .is_some_and(|p| TEXT_FLAGS.contains(&p));
        if rest || after_text {
            out.push(a);
            continue;
        }
        let Some(s) = a.to_str() else {
            out.push(a);
            continue;
        };
        if s == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        let (flag, value) = match s.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (s, None),
        };
        match LLAMA_FLAGS.iter().find(|(short, _)| *short == flag) {
            Some((_, long)) => out.push(match value {
                Some(v) => format!("{long}={v}").into(),
                None => (*long).into(),
            }),
            None => out.push(a),
        }
    }
    out
}

/// Whether an error comes from writing to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` panics when standard output is a closed pipe (Rust ignores SIGPIPE). Exit quietly
/// then, as a C program killed by SIGPIPE would, instead of printing a panic; any other panic
/// goes to the default hook.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::llama_flags;
    use std::ffi::OsString;

    fn rewrite(args: &[&str]) -> Vec<String> {
        llama_flags(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn llama_cpp_single_dash_flags_become_long_flags() {
        assert_eq!(
            rewrite(&["kiln", "run", "-ngl", "0", "-fa", "-cnv", "-sys", "be brief"]),
            [
                "kiln",
                "run",
                "--n-gpu-layers",
                "0",
                "--flash-attn",
                "--conversation",
                "--system-prompt",
                "be brief"
            ]
        );
        assert_eq!(
            rewrite(&["kiln", "serve", "-hf", "u/r:Q8_0", "-hff", "f.gguf", "-hfr=u/r"]),
            [
                "kiln",
                "serve",
                "--hf-repo",
                "u/r:Q8_0",
                "--hf-file",
                "f.gguf",
                "--hf-repo=u/r"
            ]
        );
        assert_eq!(
            rewrite(&["kiln", "run", "-ngl=99", "-no-cnv"]),
            ["kiln", "run", "--n-gpu-layers=99", "--no-conversation"]
        );
        // Values and anything after `--` are left alone.
        assert_eq!(
            rewrite(&["kiln", "run", "-p", "-fa", "--", "-ngl"]),
            ["kiln", "run", "-p", "-fa", "--", "-ngl"]
        );
        assert_eq!(
            rewrite(&["kiln", "run", "-sys", "-cnv", "-cnv"]),
            ["kiln", "run", "--system-prompt", "-cnv", "--conversation"]
        );
    }
}
