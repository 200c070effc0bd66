//! Subcommands of the `kiln` binary. Each file defines its flags (`clap::Args`) and a `run`.

mod bench;
mod chat;
mod common;
mod inspect;
mod list;
mod perplexity;
mod plan;
mod pull;
mod rm;
mod run;
mod serve;
mod tokenize;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Run GGUF language models on the CPU",
    long_about = "kiln runs GGUF language models on the CPU.\n\nWith no model named, commands use SmolLM2-135M-Instruct, downloading it on first use.\nExamples:\n  kiln run -p \"The capital of France is\"\n  kiln chat -m gemma3\n  kiln serve --port 8080\n  kiln inspect model.gguf --json"
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
    /// Prompt and generation throughput (llama-bench's pp/tg), load time, peak RSS.
    Bench(bench::BenchArgs),
    /// Memory a session will use, computed before loading any weights.
    Plan(plan::PlanArgs),
    /// Perplexity of a text file (llama-perplexity's method).
    Perplexity(perplexity::PerplexityArgs),
    /// Show a GGUF model's architecture, hyper-parameters, tokenizer and block formats.
    Inspect(inspect::InspectArgs),
    /// Download a model: a known name (default: smollm2) or any GGUF file by URL.
    Pull(pull::PullArgs),
    /// List the downloaded models (name, size, block format, architecture, path).
    #[command(visible_alias = "ls")]
    List(list::ListArgs),
    /// Delete downloaded models.
    Rm(rm::RmArgs),
}

pub fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Inspect(args) => inspect::run(args),
        Command::Pull(args) => pull::run(args),
        Command::List(args) => list::run(args),
        Command::Rm(args) => rm::run(args),
    }
}
