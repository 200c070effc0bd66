//! The `kiln` command line.
mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
