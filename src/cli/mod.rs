//! Subcommands of the `kiln` binary.
use clap::{Parser, Subcommand};

mod pull;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run GGUF language models on the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download models (default: smollm2; `--all`, `--list`).
    Pull(pull::PullArgs),
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Pull(args) => pull::run(args),
    }
}
