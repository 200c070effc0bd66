//! Subcommands of the `kiln` binary.
use clap::{Parser, Subcommand};

mod inspect;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run GGUF language models on the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF model's architecture, hyper-parameters, tokenizer and block formats.
    Inspect(inspect::InspectArgs),
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Inspect(args) => inspect::run(args),
    }
}
