//! `kiln rm NAME...`: delete models from the models directory, with their side files.

use kiln::fetch;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  kiln rm SmolLM2-135M-Instruct.Q8_0
  kiln rm gemma3

Names are those `kiln list` shows (matched case-insensitively); a known model (smollm2,
gemma3) is downloaded again the next time it is used.")]
pub struct RmArgs {
    /// The models to delete.
    #[arg(required = true, value_name = "NAME")]
    names: Vec<String>,
}

pub fn run(args: RmArgs) -> anyhow::Result<()> {
    let dir = fetch::models_dir();
    for name in &args.names {
        let removed = fetch::remove_model(&dir, name)?;
        let first = removed.paths.first().map(|p| p.display().to_string());
        println!(
            "deleted {} ({})",
            removed.name,
            first.unwrap_or_else(|| "nothing left".to_string())
        );
    }
    Ok(())
}
