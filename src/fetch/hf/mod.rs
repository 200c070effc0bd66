//! `kiln pull USER/REPO[:QUANT]` and `-hf USER/REPO[:QUANT]`: a GGUF model by its Hugging Face
//! repository and quantization, as `llama-cli -hf` and `ollama pull hf.co/...` take it.
//!
//! The repository's files are listed with the hub's model API
//! (`GET {endpoint}/api/models/USER/REPO?blobs=true`: the commit of its main branch, and every
//! file with its size and, for files kept in LFS, its sha256). The file is chosen as llama.cpp
//! chooses it (`common/download.cpp`, `find_best_model`): the first GGUF model file (not an
//! `mmproj`, `imatrix`, or a speculative-decoding side model) whose path contains the
//! quantization followed by `.` or `-`, case-insensitively; with no quantization `Q4_K_M`, then
//! `Q8_0`, then the first model file. A model split into `NAME-00001-of-0000N.gguf` files is
//! fetched whole. An `mmproj` (a vision projector) is fetched only when asked for, chosen as
//! llama.cpp chooses it (the nearest directory, then the nearest bit width).
//!
//! Each file is downloaded from `{endpoint}/USER/REPO/resolve/COMMIT/PATH` by [`pull_url`]
//! (progress bar, resume, atomic install), checked against the hub's sha256, and installed
//! in the models directory as `USER_REPO_QUANT.gguf` (parts: `USER_REPO_QUANT-0000I-of-0000N.gguf`;
//! projector: `USER_REPO_QUANT-mmproj.gguf`). Pulling it again downloads nothing while the hub's
//! sha256 is unchanged, and replaces the file when the repository updated it.
//!
//! Environment: `MODEL_ENDPOINT`, else `HF_ENDPOINT` (llama.cpp's order), else
//! `https://huggingface.co`; `HF_TOKEN` is sent as `Authorization: Bearer` to the API and with
//! the downloads.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::http::{agent, check_name, pull_url, strip_gguf, PullOptions, Pulled};
use super::store;
use super::FetchError;

/// The hub used when neither `MODEL_ENDPOINT` nor `HF_ENDPOINT` is set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The quantizations tried, in order, when none is named (llama.cpp's).
const DEFAULT_QUANTS: [&str; 2] = ["Q4_K_M", "Q8_0"];

/// A repository reference: `USER/REPO`, a quantization, or a file in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfRef {
    /// `USER/REPO`.
    pub repo: String,
    /// The quantization asked for, as given (`None`: the default; `latest` is the default too).
    pub quant: Option<String>,
    /// A file of the repository named outright (`--hf-file`, or `hf://USER/REPO/FILE`).
    pub file: Option<String>,
}

/// Prefixes that name a repository (matched case-insensitively).
const PREFIXES: [&str; 3] = ["hf://", "hf.co/", "huggingface.co/"];

/// Web addresses of a repository's page (`https://huggingface.co/USER/REPO`).
const WEB_PREFIXES: [&str; 6] = [
    "https://huggingface.co/",
    "https://www.huggingface.co/",
    "https://hf.co/",
    "http://huggingface.co/",
    "http://www.huggingface.co/",
    "http://hf.co/",
];

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    s.get(..prefix.len())
        .filter(|p| p.eq_ignore_ascii_case(prefix))
        .map(|_| &s[prefix.len()..])
}

impl HfRef {
    /// A repository named explicitly: `hf.co/USER/REPO[:QUANT]`, `huggingface.co/...`,
    /// `hf://USER/REPO[:QUANT]` or `hf://USER/REPO/FILE.gguf`, or a repository's page
    /// `https://huggingface.co/USER/REPO[:QUANT]`. `None` when `arg` is none of these (a file
    /// URL under a repository's `/resolve/` is a plain URL); an error when it is one but
    /// malformed.
    pub fn explicit(arg: &str) -> Option<Result<HfRef, FetchError>> {
        let arg = arg.trim();
        for p in WEB_PREFIXES {
            if let Some(rest) = strip_prefix_ci(arg, p) {
                let rest = rest.strip_suffix('/').unwrap_or(rest);
                return (rest.split('/').count() == 2).then(|| HfRef::parse_repo(arg, rest));
            }
        }
        let (prefix, rest) = PREFIXES
            .iter()
            .find_map(|p| strip_prefix_ci(arg, p).map(|r| (*p, r)))?;
        if prefix == "hf://" {
            let mut segs = rest.splitn(3, '/');
            if let (Some(u), Some(r), Some(file)) = (segs.next(), segs.next(), segs.next()) {
                return Some(
                    HfRef::parse_repo(arg, &format!("{u}/{r}")).and_then(|mut h| {
                        h.file = Some(check_file(file)?);
                        Ok(h)
                    }),
                );
            }
        }
        Some(HfRef::parse_repo(arg, rest))
    }

    /// `USER/REPO[:QUANT]` as `-hf` and `kiln pull` take it, or any of the [`HfRef::explicit`]
    /// forms.
    pub fn parse(arg: &str) -> Result<HfRef, FetchError> {
        match HfRef::explicit(arg) {
            Some(r) => r,
            None => HfRef::parse_repo(arg, arg.trim()),
        }
    }

    /// `USER/REPO[:QUANT]` (`given` is what the user typed, for the error).
    fn parse_repo(given: &str, s: &str) -> Result<HfRef, FetchError> {
        let bad = |reason: &str| FetchError::BadRepo {
            given: given.to_string(),
            reason: reason.to_string(),
        };
        let (repo, quant) = match s.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        let mut segs = repo.split('/');
        let (Some(user), Some(name), None) = (segs.next(), segs.next(), segs.next()) else {
            return Err(bad("expected USER/REPO[:QUANT]"));
        };
        for seg in [user, name] {
            let ok_chars = seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if seg.is_empty() || !ok_chars || seg.starts_with(['.', '-']) || seg.contains("..") {
                return Err(bad(&format!(
                    "{seg:?} is not a user or repository name (letters, digits, '-', '_' and \
                     '.', not first)"
                )));
            }
            if seg.len() > 96 {
                return Err(bad(
                    "a user or repository name is longer than 96 characters",
                ));
            }
        }
        let quant = match quant {
            None => None,
            Some(q) if q.eq_ignore_ascii_case("latest") => None,
            Some(q) => {
                let ok = !q.is_empty()
                    && q.len() <= 64
                    && q.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
                if !ok {
                    return Err(bad(&format!(
                        "{q:?} is not a quantization (e.g. Q4_K_M: letters, digits, '_', '-', '.')"
                    )));
                }
                Some(q.to_string())
            }
        };
        Ok(HfRef {
            repo: format!("{user}/{name}"),
            quant,
            file: None,
        })
    }

    /// This reference with `file` named (`--hf-file`), which overrides the quantization.
    pub fn with_file(mut self, file: Option<&str>) -> Result<HfRef, FetchError> {
        if let Some(f) = file {
            self.file = Some(check_file(f)?);
        }
        Ok(self)
    }

    /// `USER_REPO`: the start of the names of the models pulled from this repository.
    fn name_base(&self) -> String {
        self.repo.replace('/', "_")
    }
}

/// A file path inside a repository: relative, no `..`, no backslash or control character.
fn check_file(f: &str) -> Result<String, FetchError> {
    let bad = FetchError::BadRepo {
        given: f.to_string(),
        reason: "a file of a repository is a relative path without '..'".to_string(),
    };
    let f = f.trim();
    if f.is_empty()
        || f.starts_with('/')
        || f.split('/').any(|s| s.is_empty() || s == "." || s == "..")
        || f.chars().any(|c| c == '\\' || c.is_control())
    {
        return Err(bad);
    }
    Ok(f.to_string())
}

/// How to reach the hub and what to fetch besides the model.
#[derive(Debug, Clone)]
pub struct HfOptions {
    /// `https://huggingface.co`, or a mirror (no trailing slash).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` (`HF_TOKEN`).
    pub token: Option<String>,
    /// Fetch the repository's `mmproj` file too.
    pub mmproj: bool,
    /// Where and how files are downloaded (`name` and `sha256` are set per file).
    pub pull: PullOptions,
}

impl HfOptions {
    /// The endpoint and token from the environment ([`endpoint_from`], `HF_TOKEN`).
    pub fn from_env(pull: PullOptions) -> HfOptions {
        let var = |k: &str| std::env::var(k).ok();
        HfOptions {
            endpoint: endpoint_from(var),
            token: var("HF_TOKEN").filter(|t| !t.trim().is_empty()),
            mmproj: false,
            pull,
        }
    }
}

/// `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`], without a trailing slash.
pub fn endpoint_from(env: impl Fn(&str) -> Option<String>) -> String {
    ["MODEL_ENDPOINT", "HF_ENDPOINT"]
        .iter()
        .find_map(|k| env(k).filter(|v| !v.trim().is_empty()))
        .map_or_else(
            || DEFAULT_ENDPOINT.to_string(),
            |v| v.trim().trim_end_matches('/').to_string(),
        )
}

/// One file of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The LFS sha256 (lower-case hex), for files the hub keeps in LFS.
    pub sha256: Option<String>,
}

/// A repository's files at one commit.
#[derive(Debug, Clone)]
pub struct Listing {
    /// The commit of the main branch (`main` when the hub did not say).
    pub revision: String,
    pub files: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct ApiModel {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: Option<String>,
    /// The tree API's spelling of the same digest.
    oid: Option<String>,
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Percent-encode each segment of a repository path for a URL.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// List `repo`'s files with the hub's model API.
pub fn list_repo(repo: &str, opts: &HfOptions) -> Result<Listing, FetchError> {
    let url = format!("{}/api/models/{repo}?blobs=true", opts.endpoint);
    let mut req = agent(&opts.pull)
        .get(&url)
        .header("Accept", "application/json");
    if let Some(t) = &opts.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let resp = req.call().map_err(|e| FetchError::Http {
        url: url.clone(),
        error: Box::new(e),
    })?;
    let status = resp.status().as_u16();
    let code = resp
        .headers()
        .get("x-error-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let not_found = |hint: &'static str| FetchError::RepoNotFound {
        repo: repo.to_string(),
        endpoint: opts.endpoint.clone(),
        status,
        hint,
    };
    match status {
        200 => {}
        404 => return Err(not_found("")),
        // The hub answers 401 for a repository that does not exist or that this caller may
        // not see (it does not tell them apart).
        401 | 403 if code != "GatedRepo" => {
            return Err(not_found(if opts.token.is_some() {
                " (or private, and HF_TOKEN has no access to it)"
            } else {
                " (or private or gated: set HF_TOKEN to a token with access)"
            }))
        }
        _ => {
            let hint = match status {
                401 | 403 => {
                    " (a gated repository: accept its terms on its page, and set HF_TOKEN)"
                }
                500..=599 => " (a server error: try again later)",
                _ => "",
            };
            return Err(FetchError::HttpStatus {
                url,
                status: format!(
                    "{status} {}",
                    resp.status().canonical_reason().unwrap_or("")
                ),
                hint,
            });
        }
    }
    let text = resp
        .into_body()
        .read_to_string()
        .map_err(|e| FetchError::Http {
            url: url.clone(),
            error: Box::new(e),
        })?;
    let model: ApiModel = serde_json::from_str(&text).map_err(|e| FetchError::Protocol {
        url: url.clone(),
        detail: format!("the hub's answer is not a model's file listing ({e})"),
    })?;
    let revision = model
        .sha
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "main".to_string());
    let files = model
        .siblings
        .into_iter()
        .filter(|s| check_file(&s.rfilename).is_ok())
        .map(|s| RepoFile {
            sha256: s
                .lfs
                .and_then(|l| l.sha256.or(l.oid))
                .map(|h| h.to_ascii_lowercase())
                .filter(|h| is_sha256(h)),
            size: s.size,
            path: s.rfilename,
        })
        .collect();
    Ok(Listing { revision, files })
}

/// What llama.cpp reads from a GGUF file's path: `PREFIX[-0000I-of-0000N].gguf`, and the
/// quantization that ends `PREFIX` after a `-` or `.`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SplitInfo {
    prefix: String,
    /// Upper-case (`Q4_K_M`), or empty.
    quant: String,
    index: u32,
    count: u32,
}

fn has_gguf_ext(path: &str) -> bool {
    path.len() > 5 && path[path.len() - 5..].eq_ignore_ascii_case(".gguf")
}

fn split_info(path: &str) -> Option<SplitInfo> {
    if !has_gguf_ext(path) {
        return None;
    }
    let mut prefix = &path[..path.len() - 5];
    let (mut index, mut count) = (1, 1);
    // `-00001-of-00003`: 15 bytes.
    if prefix.len() > 15 {
        let tail = &prefix[prefix.len() - 15..];
        let b = tail.as_bytes();
        let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
        if b[0] == b'-'
            && digits(1..6)
            && tail[6..10].eq_ignore_ascii_case("-of-")
            && digits(10..15)
        {
            index = tail[1..6].parse().ok()?;
            count = tail[10..15].parse().ok()?;
            prefix = &prefix[..prefix.len() - 15];
        }
    }
    let quant = prefix
        .rfind(['-', '.'])
        .map(|i| &prefix[i + 1..])
        .filter(|q| !q.is_empty() && q.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .unwrap_or("")
        .to_ascii_uppercase();
    Some(SplitInfo {
        prefix: prefix.to_string(),
        quant,
        index,
        count,
    })
}

/// A GGUF file holding a model (llama.cpp's `gguf_filename_is_model`).
fn is_model_file(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    has_gguf_ext(path)
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|k| file.contains(k))
}

/// `path` contains `quant` followed by `.` or `-`, case-insensitively.
fn names_quant(path: &str, quant: &str) -> bool {
    let (p, q) = (path.to_ascii_lowercase(), quant.to_ascii_lowercase());
    p.match_indices(&q)
        .any(|(i, _)| matches!(p.as_bytes().get(i + q.len()), Some(b'.' | b'-')))
}

/// The first part of a model (or a model that is not split).
fn is_first_part(path: &str) -> bool {
    split_info(path).is_some_and(|s| s.count <= 1 || s.index == 1)
}

/// llama.cpp's choice of the model file for `quant` (see the module docs).
fn find_best_model<'a>(files: &'a [RepoFile], quant: Option<&str>) -> Option<&'a RepoFile> {
    let quants: Vec<&str> = match quant {
        Some(q) => vec![q],
        None => DEFAULT_QUANTS.to_vec(),
    };
    let candidates = || {
        files
            .iter()
            .filter(|f| is_model_file(&f.path) && is_first_part(&f.path))
    };
    for q in quants {
        if let Some(f) = candidates().find(|f| names_quant(&f.path, q)) {
            return Some(f);
        }
    }
    quant.is_none().then(|| candidates().next()).flatten()
}

/// Every part of `primary`'s model, in order; an error when the listing lacks one.
fn split_files(
    repo: &str,
    files: &[RepoFile],
    primary: &RepoFile,
) -> Result<Vec<RepoFile>, FetchError> {
    let Some(info) = split_info(&primary.path).filter(|s| s.count > 1) else {
        return Ok(vec![primary.clone()]);
    };
    let mut parts: Vec<(u32, &RepoFile)> = files
        .iter()
        .filter_map(|f| {
            let s = split_info(&f.path)?;
            (s.count == info.count && s.prefix == info.prefix).then_some((s.index, f))
        })
        .collect();
    parts.sort_by_key(|(i, _)| *i);
    parts.dedup_by_key(|(i, _)| *i);
    let have: Vec<u32> = parts.iter().map(|(i, _)| *i).collect();
    if have != (1..=info.count).collect::<Vec<_>>() {
        return Err(FetchError::IncompleteSplit {
            repo: repo.to_string(),
            file: primary.path.clone(),
            count: info.count,
            have: have
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(parts.into_iter().map(|(_, f)| f.clone()).collect())
}

/// The bit width in a quantization's name (`Q4_K_M` → 4, `F16` → 16, none → 0).
fn quant_bits(quant: &str) -> i64 {
    let digits: String = quant
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// llama.cpp's choice of the `mmproj` for `model` (`find_best_sibling`): the deepest shared
/// directory, then the nearest bit width.
fn find_best_mmproj<'a>(files: &'a [RepoFile], model: &str) -> Option<&'a RepoFile> {
    let model_bits = split_info(model).map_or(0, |s| quant_bits(&s.quant));
    let model_dirs: Vec<&str> = model.split('/').collect();
    let model_dirs = &model_dirs[..model_dirs.len() - 1];
    let mut best: Option<(&RepoFile, usize, i64)> = None;
    for f in files {
        if !has_gguf_ext(&f.path) || !f.path.contains("mmproj") {
            continue;
        }
        let dirs: Vec<&str> = f.path.split('/').collect();
        let dirs = &dirs[..dirs.len() - 1];
        let shared = model_dirs
            .iter()
            .zip(dirs)
            .take_while(|(a, b)| a == b)
            .count();
        if shared != dirs.len() {
            continue; // not in one of the model's directories
        }
        let bits = split_info(&f.path).map_or(0, |s| quant_bits(&s.quant));
        let diff = (bits - model_bits).abs();
        if best.is_none_or(|(_, d, bd)| shared > d || (shared == d && diff < bd)) {
            best = Some((f, shared, diff));
        }
    }
    best.map(|(f, _, _)| f)
}

/// The quantizations the repository's model files hold, in listing order (a file without one
/// by its path): for the error naming what there is.
fn held_quants(files: &[RepoFile]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for f in files.iter().filter(|f| is_model_file(&f.path)) {
        let q = split_info(&f.path)
            .map(|s| s.quant)
            .filter(|q| !q.is_empty())
            .unwrap_or_else(|| f.path.clone());
        if !seen.contains(&q) {
            seen.push(q);
        }
    }
    seen.join(", ")
}

fn gguf_files(files: &[RepoFile]) -> String {
    let v: Vec<&str> = files
        .iter()
        .filter(|f| has_gguf_ext(&f.path))
        .map(|f| f.path.as_str())
        .collect();
    store::list_or_none(&v)
}

/// What to download for a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The model's name in the models directory (`USER_REPO_QUANT`).
    pub name: String,
    /// The model's files: one, or every part of a split model in order.
    pub parts: Vec<RepoFile>,
    pub mmproj: Option<RepoFile>,
}

/// Choose the files for `r` from `listing` (see the module docs).
pub fn plan(r: &HfRef, files: &[RepoFile], mmproj: bool) -> Result<Plan, FetchError> {
    let primary = match (&r.file, &r.quant) {
        (Some(file), _) => {
            files
                .iter()
                .find(|f| f.path == *file)
                .ok_or_else(|| FetchError::NoSuchRepoFile {
                    repo: r.repo.clone(),
                    file: file.clone(),
                    held: gguf_files(files),
                })?
        }
        (None, quant) => find_best_model(files, quant.as_deref()).ok_or_else(|| match quant {
            _ if !files.iter().any(|f| is_model_file(&f.path)) => FetchError::NoGgufInRepo {
                repo: r.repo.clone(),
            },
            Some(q) => FetchError::NoSuchQuant {
                repo: r.repo.clone(),
                quant: q.clone(),
                held: held_quants(files),
            },
            None => FetchError::NoGgufInRepo {
                repo: r.repo.clone(),
            },
        })?,
    };
    let info = split_info(&primary.path);
    let label = match (&r.file, &r.quant, &info) {
        (None, Some(q), _) => q.to_ascii_uppercase(),
        (None, None, Some(s)) if !s.quant.is_empty() => s.quant.clone(),
        // A file named outright, or one with no quantization in its name: by its file name.
        _ => {
            let prefix = info.as_ref().map_or(primary.path.as_str(), |s| &s.prefix);
            let file = prefix.rsplit('/').next().unwrap_or(prefix);
            strip_gguf(file).to_string()
        }
    };
    let name = check_name(&format!("{}_{label}", r.name_base()))?;
    let parts = split_files(&r.repo, files, primary)?;
    let mmproj = if mmproj {
        Some(
            find_best_mmproj(files, &primary.path)
                .ok_or_else(|| FetchError::NoMmproj {
                    repo: r.repo.clone(),
                    held: gguf_files(files),
                })?
                .clone(),
        )
    } else {
        None
    };
    Ok(Plan {
        name,
        parts,
        mmproj,
    })
}

/// The name each planned file is installed under: `NAME`, `NAME-0000I-of-0000N`, and
/// `NAME-mmproj` for the projector.
fn part_names(plan: &Plan) -> Vec<String> {
    let n = plan.parts.len();
    if n == 1 {
        return vec![plan.name.clone()];
    }
    (1..=n)
        .map(|i| format!("{}-{i:05}-of-{n:05}", plan.name))
        .collect()
}

/// A model pulled from a repository.
#[derive(Debug, Clone)]
pub struct HfPulled {
    /// The name `-m` takes.
    pub name: String,
    /// The model's file (the first part of a split model).
    pub path: PathBuf,
    /// Every model file, with the repository path it came from.
    pub files: Vec<(String, Pulled)>,
    pub mmproj: Option<(String, Pulled)>,
}

impl HfPulled {
    /// Nothing was downloaded: every file was there already.
    pub fn already(&self) -> bool {
        self.files
            .iter()
            .chain(self.mmproj.iter())
            .all(|(_, p)| p.already)
    }
}

/// `.../USER/REPO/resolve/...`: where files of `repo` are downloaded from.
fn resolve_marker(repo: &str) -> String {
    format!("/{repo}/resolve/")
}

/// Download `r`'s files into the models directory (see the module docs).
pub fn pull_hf(r: &HfRef, opts: &HfOptions) -> Result<HfPulled, FetchError> {
    let listing = list_repo(&r.repo, opts)?;
    let plan = plan(r, &listing.files, opts.mmproj)?;
    let mut jobs: Vec<(String, RepoFile)> = part_names(&plan)
        .into_iter()
        .zip(plan.parts.iter().cloned())
        .collect();
    if let Some(m) = &plan.mmproj {
        jobs.push((format!("{}-mmproj", plan.name), m.clone()));
    }
    let mut done = Vec::with_capacity(jobs.len());
    for (name, file) in jobs {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            opts.endpoint,
            r.repo,
            listing.revision,
            encode_path(&file.path)
        );
        let mut pull = opts.pull.clone();
        pull.name = Some(name.clone());
        pull.sha256 = file.sha256.clone();
        pull.bearer = opts.token.clone();
        let source = if pull.force {
            Source::Other
        } else {
            same_source(&pull.dir, &name, &r.repo, &file)
        };
        let got = match source {
            Source::Current(p) => p,
            Source::Updated => {
                pull.force = true;
                pull_url(&url, &pull)?
            }
            Source::Other => pull_url(&url, &pull)?,
        };
        done.push((file.path, got));
    }
    let mmproj = plan.mmproj.is_some().then(|| done.pop()).flatten();
    Ok(HfPulled {
        name: done[0].1.name.clone(),
        path: done[0].1.path.clone(),
        files: done,
        mmproj,
    })
}

enum Source {
    /// Installed from this repository's file, with the hub's sha256 now: nothing to do.
    Current(Pulled),
    /// Installed from this repository's file, which the repository has changed since.
    Updated,
    /// Not installed, or from elsewhere (`pull_url` decides).
    Other,
}

/// Whether the model called `name` is `file` of `repo` already.
fn same_source(dir: &Path, name: &str, repo: &str, file: &RepoFile) -> Source {
    let Some(dest) = store::find(dir, name) else {
        return Source::Other;
    };
    let Some(origin) = store::read_origin(&dest) else {
        return Source::Other;
    };
    let from_file = origin.url.contains(&resolve_marker(repo))
        && origin
            .url
            .ends_with(&format!("/{}", encode_path(&file.path)));
    if !from_file {
        return Source::Other;
    }
    let size = std::fs::metadata(&dest).map(|m| m.len()).ok();
    match &file.sha256 {
        Some(s) if *s == origin.sha256 && size == Some(origin.size) => Source::Current(Pulled {
            name: store::model_name(&dest),
            path: dest,
            sha256: origin.sha256,
            size: origin.size,
            already: true,
            resumed_from: 0,
        }),
        // No digest to compare: the URL decides (`pull_url`: the same commit is a no-op).
        None => Source::Other,
        Some(_) => Source::Updated,
    }
}

/// The installed model pulled from `r`, found without the network: `USER_REPO_QUANT` (for no
/// quantization, the default ones in order, then any model from the repository), a split
/// model by its first part. Only models whose origin is the repository count.
pub fn find_installed(dir: &Path, r: &HfRef) -> Option<PathBuf> {
    let base = r.name_base();
    let marker = resolve_marker(&r.repo);
    let from_repo = |p: &Path| store::read_origin(p).is_some_and(|o| o.url.contains(&marker));
    let models = store::list_model_files(dir);
    let by_name = |name: &str| {
        let first_part = format!("{name}-00001-of-").to_ascii_lowercase();
        models
            .iter()
            .find(|p| {
                let stem = store::model_name(p).to_ascii_lowercase();
                stem == name.to_ascii_lowercase() || stem.starts_with(&first_part)
            })
            .filter(|p| from_repo(p))
            .cloned()
    };
    if let Some(file) = &r.file {
        // Named by file: whichever installed model came from exactly that file.
        let tail = format!("/{}", encode_path(file));
        return models
            .iter()
            .find(|p| from_repo(p) && store::read_origin(p).is_some_and(|o| o.url.ends_with(&tail)))
            .cloned();
    }
    match &r.quant {
        Some(q) => by_name(&format!("{base}_{}", q.to_ascii_uppercase())),
        None => DEFAULT_QUANTS
            .iter()
            .find_map(|q| by_name(&format!("{base}_{q}")))
            .or_else(|| {
                models
                    .iter()
                    .find(|p| {
                        let name = store::model_name(p);
                        from_repo(p)
                            && name.starts_with(&format!("{base}_"))
                            && !name.ends_with("-mmproj")
                            && split_info(&format!("{name}.gguf")).is_some_and(|s| s.index == 1)
                    })
                    .cloned()
            }),
    }
}

#[cfg(test)]
mod tests;
