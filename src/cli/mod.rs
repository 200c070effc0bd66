//! Subcommands of the `kiln` binary.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run GGUF language models on the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
