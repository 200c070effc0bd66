//! The models directory: what is installed, what each model is called, and its side files.
//!
//! A model is a `NAME.gguf` file directly in the directory (hidden files are ignored). Its name
//! is the file name without `.gguf`, except for the registry's files, which are called by the
//! registry's short name (`smollm2`); names are matched case-insensitively. Beside a model may
//! lie:
//!
//! - `.NAME.gguf.verified`: the registry's marker (sha256 checked at this size and mtime);
//! - `.NAME.gguf.origin.json`: where `kiln pull` got it (URL, sha256, size);
//! - `NAME.gguf.part` and `NAME.gguf.part.json`: an interrupted download and what is needed to
//!   resume it (URL, validators, total size).
//!
//! [`remove_model`] removes all of them with the model.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::registry::{find_spec, marker_path, MODELS};
use super::support::{io_err, write_atomic};
use super::FetchError;
use crate::gguf::{GgufFile, ModelSummary};

/// Where a pulled model came from, kept in `.FILE.origin.json` beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub url: String,
    pub sha256: String,
    pub size: u64,
}

/// What a partial download needs to resume, kept in `FILE.part.json` beside `FILE.part`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    pub url: String,
    /// The response's `ETag` (sent back in `If-Range` when strong).
    pub etag: Option<String>,
    /// The response's `Last-Modified` (sent in `If-Range` when there is no strong ETag).
    pub last_modified: Option<String>,
    /// The full size, when the server said.
    pub total: Option<u64>,
}

fn side_file(model: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    model.with_file_name(format!("{prefix}{name}{suffix}"))
}

/// `.FILE.origin.json`.
pub fn origin_path(model: &Path) -> PathBuf {
    side_file(model, ".", ".origin.json")
}

/// `FILE.part`: the download in progress.
pub fn part_path(model: &Path) -> PathBuf {
    side_file(model, "", ".part")
}

/// `FILE.part.json`: how to resume [`part_path`].
pub fn part_meta_path(model: &Path) -> PathBuf {
    side_file(model, "", ".part.json")
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let text = fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!("{}: ignoring unreadable file ({e})", path.display());
            None
        }
    }
}

pub(super) fn read_origin(model: &Path) -> Option<Origin> {
    read_json(&origin_path(model))
}

pub(super) fn write_origin(model: &Path, origin: &Origin) -> Result<(), FetchError> {
    let text = serde_json::to_string_pretty(origin).expect("Origin serializes");
    write_atomic(&origin_path(model), &(text + "\n"))
}

pub(super) fn read_part_meta(model: &Path) -> Option<PartMeta> {
    read_json(&part_meta_path(model))
}

pub(super) fn write_part_meta(model: &Path, meta: &PartMeta) -> Result<(), FetchError> {
    let text = serde_json::to_string_pretty(meta).expect("PartMeta serializes");
    write_atomic(&part_meta_path(model), &(text + "\n"))
}

/// Remove a partial download and its metadata (missing files are fine).
pub(super) fn remove_partial(model: &Path) {
    let _ = fs::remove_file(part_path(model));
    let _ = fs::remove_file(part_meta_path(model));
}

/// `NAME` of `NAME.gguf` (any case of the extension), or `None` for other files.
fn gguf_stem(file_name: &str) -> Option<&str> {
    let n = file_name.len();
    let ext = file_name.get(n.checked_sub(5)?..)?;
    ext.eq_ignore_ascii_case(".gguf")
        .then(|| &file_name[..n - 5])
        .filter(|s| !s.is_empty())
}

/// The name a model file is called by: the registry's short name for the registry's files,
/// else the file name without `.gguf`.
pub fn model_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(spec) = MODELS.iter().find(|s| s.file_name == file) {
        return spec.name.to_string();
    }
    gguf_stem(&file).unwrap_or(&file).to_string()
}

/// The model files in `dir` (`*.gguf`, not hidden, regular files or links to them), sorted by
/// file name. A missing directory has none.
fn model_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.')
                && gguf_stem(&name).is_some()
                && fs::metadata(e.path()).is_ok_and(|m| m.is_file())
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// The model files in `dir`, sorted by file name (for lookups by origin).
pub(super) fn list_model_files(dir: &Path) -> Vec<PathBuf> {
    model_files(dir)
}

/// The model in `dir` called `name`: its name as [`model_name`] gives it, its file stem, or its
/// file name, compared case-insensitively (an exact match wins over one differing in case).
pub fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    let files = model_files(dir);
    let keys = |p: &Path| {
        let file = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = gguf_stem(&file).unwrap_or(&file).to_string();
        [model_name(p), stem, file]
    };
    files
        .iter()
        .find(|p| keys(p).iter().any(|k| k == name))
        .or_else(|| {
            files
                .iter()
                .find(|p| keys(p).iter().any(|k| k.eq_ignore_ascii_case(name)))
        })
        .cloned()
}

/// The model in `dir` that `kiln pull` got from exactly `url`.
pub fn find_by_url(dir: &Path, url: &str) -> Option<PathBuf> {
    model_files(dir)
        .into_iter()
        .find(|p| read_origin(p).is_some_and(|o| o.url == url))
}

/// The installed models' names, `a, b`, or `none`: for error messages.
pub fn installed_names(dir: &Path) -> String {
    let mut names: Vec<String> = model_files(dir).iter().map(|p| model_name(p)).collect();
    names.sort_by_key(|n| n.to_lowercase());
    list_or_none(&names)
}

/// `a, b`, or `none` for no names: a list in an error message.
pub(super) fn list_or_none<S: std::borrow::Borrow<str>>(names: &[S]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// One model in the models directory, as `kiln list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredModel {
    /// What `-m` takes.
    pub name: String,
    pub path: PathBuf,
    /// File size in bytes.
    pub size: u64,
    /// The file's block format as llama.cpp names it (`general.file_type`: `Q4_K_M`, `Q8_0`,
    /// ...), or, when the file does not say, the block format holding most of its bytes.
    pub format: Option<String>,
    /// Every block format in the file, most bytes first.
    pub formats: Vec<String>,
    pub architecture: Option<String>,
    pub parameters: Option<u64>,
    /// `registry` for the known models, the URL for pulled ones, `local` for files put there
    /// by hand.
    pub source: String,
    /// Why the header could not be read (the other fields are then empty).
    pub error: Option<String>,
}

/// Every model in `dir`, read from its GGUF header, sorted by name. A file that does not parse
/// is listed with its error; a missing directory lists nothing.
pub fn list_models(dir: &Path) -> Vec<StoredModel> {
    let mut out: Vec<StoredModel> = model_files(dir)
        .into_iter()
        .map(|path| {
            let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let name = model_name(&path);
            let file = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let source = if MODELS.iter().any(|s| Some(s.file_name) == file.as_deref()) {
                "registry".to_string()
            } else {
                read_origin(&path).map_or_else(|| "local".to_string(), |o| o.url)
            };
            let mut m = StoredModel {
                name,
                path,
                size,
                format: None,
                formats: Vec::new(),
                architecture: None,
                parameters: None,
                source,
                error: None,
            };
            match GgufFile::open(&m.path) {
                Ok(f) => {
                    let s = ModelSummary::from_file(&f);
                    m.formats = s.formats.iter().map(|f| f.ty.clone()).collect();
                    m.format = format_name(&f, &s);
                    m.architecture = s.architecture;
                    m.parameters = Some(s.parameters);
                }
                Err(e) => m.error = Some(e.to_string()),
            }
            m
        })
        .collect();
    out.sort_by(|a, b| {
        a.name
            .to_lowercase()
            .cmp(&b.name.to_lowercase())
            .then_with(|| a.path.cmp(&b.path))
    });
    out
}

/// A file's block format as llama.cpp names it (`general.file_type`: `Q4_K_M`, `Q8_0`, ...), or,
/// when the file does not say, the block format holding most of its bytes.
pub fn format_name(f: &GgufFile, summary: &ModelSummary) -> Option<String> {
    f.opt_u32("general.file_type")
        .ok()
        .flatten()
        .and_then(file_type_name)
        .map(str::to_string)
        .or_else(|| summary.formats.first().map(|t| t.ty.clone()))
}

/// llama.cpp's short name of a `general.file_type` (`llama_ftype`), as `llama-quantize` takes it.
pub fn file_type_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// An interrupted download in the models directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partial {
    /// The name the model will have.
    pub name: String,
    /// The `.part` file.
    pub path: PathBuf,
    /// Bytes downloaded so far.
    pub bytes: u64,
    pub total: Option<u64>,
    /// Where it comes from (`None` when its metadata is missing: it cannot be resumed).
    pub url: Option<String>,
}

/// The interrupted downloads in `dir` (`NAME.gguf.part` files), sorted by name.
pub fn partial_downloads(dir: &Path) -> Vec<Partial> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Partial> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let model_file = file.strip_suffix(".part")?;
            let stem = gguf_stem(model_file)?;
            if file.starts_with('.') {
                return None;
            }
            let path = e.path();
            let meta = read_part_meta(&path.with_file_name(model_file));
            Some(Partial {
                name: stem.to_string(),
                bytes: fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                total: meta.as_ref().and_then(|m| m.total),
                url: meta.map(|m| m.url),
                path,
            })
        })
        .collect();
    out.sort_by_key(|p| p.name.to_lowercase());
    out
}

/// What [`remove_model`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub name: String,
    /// Every file removed: the model first (when it was there), then its side files.
    pub paths: Vec<PathBuf>,
}

/// Remove the model called `name` from `dir` (a registry name or alias, or a name `kiln list`
/// shows), with its side files: the verified marker, the origin record, and an interrupted
/// download. A name that matches only an interrupted download removes that. An unknown name
/// is [`FetchError::NotInstalled`], listing what is installed.
pub fn remove_model(dir: &Path, name: &str) -> Result<Removed, FetchError> {
    let registry_file = find_spec(name)
        .map(|s| dir.join(s.file_name))
        .filter(|p| p.is_file() || part_path(p).exists());
    let model = registry_file
        .or_else(|| find(dir, name))
        .or_else(|| {
            partial_downloads(dir)
                .into_iter()
                .find(|p| p.name.eq_ignore_ascii_case(name))
                .and_then(|p| p.path.to_str()?.strip_suffix(".part").map(PathBuf::from))
        })
        .ok_or_else(|| FetchError::NotInstalled {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            installed: installed_names(dir),
        })?;
    let mut paths = Vec::new();
    for p in [
        model.clone(),
        marker_path(&model),
        origin_path(&model),
        part_path(&model),
        part_meta_path(&model),
    ] {
        match fs::remove_file(&p) {
            Ok(()) => paths.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&p)(e)),
        }
    }
    Ok(Removed {
        name: model_name(&model),
        paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_and_side_files() {
        assert_eq!(gguf_stem("a.Q4_0.gguf"), Some("a.Q4_0"));
        assert_eq!(gguf_stem("A.GGUF"), Some("A"));
        assert_eq!(gguf_stem(".gguf"), None);
        assert_eq!(gguf_stem("a.gguf.part"), None);
        let m = Path::new("/d/x.gguf");
        assert_eq!(origin_path(m), Path::new("/d/.x.gguf.origin.json"));
        assert_eq!(part_path(m), Path::new("/d/x.gguf.part"));
        assert_eq!(part_meta_path(m), Path::new("/d/x.gguf.part.json"));
        assert_eq!(
            model_name(Path::new("/d/gemma-3-270m-q4_k_m.gguf")),
            "gemma3"
        );
        assert_eq!(model_name(Path::new("/d/Foo.Q8_0.gguf")), "Foo.Q8_0");
    }
}
