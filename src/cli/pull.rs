//! `kiln pull`: download the real models into the models directory.

use anyhow::Context;
use kiln::fetch::{self, CacheState, FetchOptions, ModelSpec};

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Models to fetch, by name or alias (default: the default model). See `--list`.
    #[arg(conflicts_with_all = ["all", "list"])]
    pub names: Vec<String>,
    /// Fetch every known model.
    #[arg(long)]
    pub all: bool,
    /// List the known models, their sizes and whether they are cached; fetch nothing.
    #[arg(long, conflicts_with = "all")]
    pub list: bool,
    /// No progress output (errors still go to stderr; the paths to stdout).
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: PullArgs) -> anyhow::Result<()> {
    if args.list {
        list();
        return Ok(());
    }
    let specs: Vec<&'static ModelSpec> = if args.all {
        fetch::MODELS.iter().collect()
    } else if args.names.is_empty() {
        vec![fetch::find_spec(fetch::DEFAULT_MODEL).context("default model missing from MODELS")?]
    } else {
        args.names
            .iter()
            .map(|n| {
                fetch::find_spec(n).with_context(|| {
                    format!(
                        "unknown model {n:?}; known models: {}",
                        fetch::known_names()
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let opts = FetchOptions::from_env(!args.quiet);
    for spec in specs {
        let path = fetch::ensure_model_with(spec, &opts)
            .with_context(|| format!("fetching {}", spec.name))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn list() {
    let dir = fetch::models_dir();
    println!("models directory: {}", dir.display());
    for spec in fetch::MODELS {
        let (path, state) = fetch::cache_state(spec, &dir);
        let state = match state {
            CacheState::Missing => "not downloaded",
            CacheState::WrongSize => "incomplete (will be fetched again)",
            CacheState::Unverified => "cached (not yet verified)",
            CacheState::Verified => "cached",
        };
        let default = if spec.name == fetch::DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        println!(
            "{:<8} {:>7.1} MB  {state}{default}\n         {}\n         aliases: {}; file: {}",
            spec.name,
            spec.size as f64 / 1e6,
            spec.description,
            spec.aliases.join(", "),
            path.display(),
        );
    }
}
