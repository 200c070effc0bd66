//! `kiln pull URL`: any GGUF file over HTTP(S).
//!
//! The file is downloaded to `NAME.gguf.part` in the models directory, beside where it will be
//! installed, with `NAME.gguf.part.json` recording the URL, the server's validators (`ETag`,
//! `Last-Modified`) and the total size. An interrupted download (a dropped connection, a
//! timeout, Ctrl-C) leaves both; the next pull of the same URL asks for the rest with
//! `Range: bytes=N-` (and `If-Range`, so a file changed on the server is downloaded again).
//! A `206 Partial Content` answer must carry a `Content-Range` that continues the partial file
//! exactly; anything else (a `200`, which is how servers that ignore ranges answer, or a range
//! that does not fit) starts the download over from the beginning.
//!
//! When all bytes are there the file is checked (its sha256 against `--sha256` when given, its
//! GGUF magic, and that its header parses) and renamed into place: a model appears under its
//! name whole or not at all. A download that fails a check is deleted.
//!
//! The model's name is the URL's file name without `.gguf` (`.../SmolLM2-135M-Instruct.Q4_1.gguf`
//! → `SmolLM2-135M-Instruct.Q4_1`), or the `--name` given; Hugging Face links
//! (`https://huggingface.co/ORG/REPO/resolve/main/FILE.gguf`) are plain URLs (their redirect is
//! followed).

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::registry::{find_spec, marker_path};
use super::store::{self, Origin, PartMeta};
use super::support::{hash_into, hex, io_err, Progress};
use super::FetchError;
use crate::gguf::GgufFile;

/// How to pull a URL.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The models directory (created if missing).
    pub dir: PathBuf,
    /// A progress bar on a terminal, one-line messages otherwise; `false` = silent.
    pub progress: bool,
    /// The model's name instead of the one derived from the URL.
    pub name: Option<String>,
    /// The sha256 the file must have (hex, any case).
    pub sha256: Option<String>,
    /// Download again and replace a model of the same name, wherever it came from.
    pub force: bool,
    /// Limit on establishing a connection (DNS, TCP, TLS).
    pub connect_timeout: Duration,
    /// Limit on waiting for the response headers, and on each read of the body: a stalled
    /// transfer ends with an error (the partial file is kept, to resume).
    pub read_timeout: Duration,
    /// A token sent as `Authorization: Bearer TOKEN` (kept across a redirect only to the same
    /// host over https: a hub's redirect to its storage carries a signed URL instead).
    pub bearer: Option<String>,
}

impl PullOptions {
    /// Defaults: no name, no sha256, no force, no token; 30 s to connect, 60 s per read.
    pub fn new(dir: PathBuf, progress: bool) -> PullOptions {
        PullOptions {
            dir,
            progress,
            name: None,
            sha256: None,
            force: false,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            bearer: None,
        }
    }
}

/// A model pulled (or found already pulled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    pub name: String,
    pub path: PathBuf,
    /// Lower-case hex.
    pub sha256: String,
    pub size: u64,
    /// It was already there from the same URL: nothing was downloaded.
    pub already: bool,
    /// The byte the last download resumed at (0: from the start).
    pub resumed_from: u64,
}

/// `http://` or `https://` followed by something.
pub fn is_url(s: &str) -> bool {
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    (lower.starts_with("http://") && s.len() > 7) || (lower.starts_with("https://") && s.len() > 8)
}

/// The model name a URL gives: its last path segment, percent-decoded, without `.gguf`.
/// The query and fragment are ignored (signed links carry them).
pub fn name_from_url(url: &str) -> Result<String, FetchError> {
    if !is_url(url) {
        return Err(FetchError::BadUrl {
            url: url.to_string(),
        });
    }
    let rest = &url[url.find("://").map_or(0, |i| i + 3)..];
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let Some((host, path)) = rest.split_once('/') else {
        return Err(FetchError::BadName {
            name: String::new(),
            reason: format!("{url} has no file name to name the model by: pass --name"),
        });
    };
    if host.is_empty() {
        return Err(FetchError::BadUrl {
            url: url.to_string(),
        });
    }
    let file = percent_decode(path.rsplit('/').next().unwrap_or(""));
    let stem = strip_gguf(&file);
    check_name(stem).map_err(|e| match e {
        FetchError::BadName { name, reason } => FetchError::BadName {
            name,
            reason: format!("{reason} (derived from {url}: pass --name)"),
        },
        e => e,
    })
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

pub(super) fn strip_gguf(name: &str) -> &str {
    let n = name.len();
    match name.get(n.saturating_sub(5)..) {
        Some(ext) if n > 5 && ext.eq_ignore_ascii_case(".gguf") => &name[..n - 5],
        _ => name,
    }
}

/// A name usable as a file name in the models directory and on the command line.
pub(super) fn check_name(name: &str) -> Result<String, FetchError> {
    let bad = |reason: &str| FetchError::BadName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.starts_with('.') {
        return Err(bad("it starts with a dot"));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == '\\' || c.is_control())
    {
        return Err(bad("it contains a slash or a control character"));
    }
    if name.len() > 200 {
        return Err(bad("it is longer than 200 bytes"));
    }
    if let Some(spec) = find_spec(name) {
        return Err(FetchError::BadName {
            name: name.to_string(),
            reason: format!(
                "it is a name of the known model {}; choose another with --name",
                spec.name
            ),
        });
    }
    Ok(name.to_string())
}

fn parse_sha256(given: &str) -> Result<String, FetchError> {
    let s = given.trim().to_ascii_lowercase();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err(FetchError::BadSha256 {
            given: given.to_string(),
        })
    }
}

/// Download the GGUF file at `url` into the models directory (see the module docs); return
/// where it is. Pulling a URL already pulled under the same name is a no-op.
pub fn pull_url(url: &str, opts: &PullOptions) -> Result<Pulled, FetchError> {
    if !is_url(url) {
        return Err(FetchError::BadUrl {
            url: url.to_string(),
        });
    }
    let expected = opts.sha256.as_deref().map(parse_sha256).transpose()?;
    let name = match &opts.name {
        Some(n) => check_name(strip_gguf(n.trim()))?,
        None => name_from_url(url)?,
    };
    let dir = &opts.dir;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let dest = store::find(dir, &name).unwrap_or_else(|| dir.join(format!("{name}.gguf")));
    let name = store::model_name(&dest);

    if let Some(done) = already_pulled(&dest, url, expected.as_deref(), &name, opts.force)? {
        return Ok(done);
    }
    let part = store::part_path(&dest);
    let mut file = lock_part(&part)?;
    // Another pull may have installed the model while this one waited for the lock; then the
    // part file is the empty one this pull created. (Side files are removed while the lock is
    // held, so that a pull waiting for it never works on a file about to disappear.)
    let unused_part = |file: File| {
        if store::read_part_meta(&dest).is_none() {
            store::remove_partial(&dest);
        }
        drop(file);
    };
    match already_pulled(&dest, url, expected.as_deref(), &name, opts.force) {
        Ok(None) => {}
        Ok(Some(done)) => {
            unused_part(file);
            return Ok(done);
        }
        Err(e) => {
            unused_part(file);
            return Err(e);
        }
    }

    let mut bar = Progress::hidden();
    let got = download(url, &dest, &mut file, opts, &name, &mut bar).and_then(|d| {
        bar.finish();
        if let Some(e) = &expected {
            if *e != d.sha256 {
                return Err(FetchError::DownloadChecksum {
                    url: url.to_string(),
                    expected: e.clone(),
                    actual: d.sha256,
                });
            }
        }
        file.sync_all().map_err(io_err(&part))?;
        GgufFile::open(&part).map_err(|error| FetchError::InvalidGguf {
            url: url.to_string(),
            error,
        })?;
        Ok(d)
    });
    drop(bar);
    let d = match got {
        Ok(d) => d,
        Err(e) => {
            let empty = fs::metadata(&part).map_or(true, |m| m.len() == 0);
            let delete = matches!(
                e,
                FetchError::DownloadChecksum { .. }
                    | FetchError::NotGguf { .. }
                    | FetchError::InvalidGguf { .. }
                    | FetchError::Protocol { .. }
            );
            if empty || delete {
                store::remove_partial(&dest);
            }
            drop(file);
            return Err(e);
        }
    };

    // Install while still holding the lock: a pull waiting for it then finds the model in
    // place (renaming an open file is fine on Unix, and on Windows, where the standard library
    // opens files with FILE_SHARE_DELETE).
    let _ = fs::remove_file(marker_path(&dest));
    fs::rename(&part, &dest).map_err(io_err(&dest))?;
    let _ = fs::remove_file(store::part_meta_path(&dest));
    let origin = Origin {
        url: url.to_string(),
        sha256: d.sha256.clone(),
        size: d.size,
    };
    store::write_origin(&dest, &origin)?;
    drop(file);
    Ok(Pulled {
        name,
        path: dest,
        sha256: d.sha256,
        size: d.size,
        already: false,
        resumed_from: d.resumed_from,
    })
}

/// `Some` when `dest` is the model pulled from `url` already (with the `expected` sha256 if
/// one is given); an error when a different model has that name (unless `force`).
fn already_pulled(
    dest: &Path,
    url: &str,
    expected: Option<&str>,
    name: &str,
    force: bool,
) -> Result<Option<Pulled>, FetchError> {
    if !dest.exists() || force {
        return Ok(None);
    }
    let size = fs::metadata(dest).map_err(io_err(dest))?.len();
    match store::read_origin(dest) {
        Some(o) if o.url == url && o.size == size => {
            if let Some(e) = expected.filter(|e| *e != o.sha256) {
                return Err(FetchError::ChecksumMismatch {
                    path: dest.to_path_buf(),
                    expected: e.to_string(),
                    actual: o.sha256,
                });
            }
            Ok(Some(Pulled {
                name: name.to_string(),
                path: dest.to_path_buf(),
                sha256: o.sha256,
                size,
                already: true,
                resumed_from: 0,
            }))
        }
        o => Err(FetchError::Exists {
            name: name.to_string(),
            origin: o.map_or_else(
                || "not pulled from a URL".to_string(),
                |o| format!("pulled from {}", o.url),
            ),
            path: dest.to_path_buf(),
        }),
    }
}

/// Open `part` (created if missing) and lock it against other pulls of the same model.
///
/// A lock held elsewhere is waited for a little (a child process forked by another thread holds
/// a copy of the descriptor, and so the lock, until it execs), then [`FetchError::Busy`]. Once
/// locked, the path must still name the file opened: the pull that held the lock may have
/// renamed it into place meanwhile, and then the new `part` is opened instead.
fn lock_part(part: &Path) -> Result<File, FetchError> {
    const TRIES: u32 = 40;
    const WAIT: Duration = Duration::from_millis(50);
    for _ in 0..TRIES {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(part)
            .map_err(io_err(part))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(WAIT);
                continue;
            }
            // A file system without locks: go on unprotected.
            Err(TryLockError::Error(e)) => {
                log::debug!("cannot lock {}: {e}", part.display());
                return Ok(file);
            }
        }
        if same_file(&file, part) {
            return Ok(file);
        }
    }
    Err(FetchError::Busy {
        part: part.to_path_buf(),
    })
}

/// Whether `path` names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        // Elsewhere an open file cannot be renamed, so the path still names it.
        let _ = (file, path);
        true
    }
}

struct Downloaded {
    sha256: String,
    size: u64,
    resumed_from: u64,
}

/// How a response relates to the partial file.
enum Answer {
    /// The whole file follows (a fresh download, or a server that ignores ranges).
    Whole { total: Option<u64> },
    /// The rest follows, from the partial file's end.
    Rest { total: Option<u64> },
    /// The partial file is already complete.
    Complete,
    /// Start over without a range.
    Restart(String),
}

/// The `bytes START-END/TOTAL` of a `Content-Range` (TOTAL may be `*`).
#[derive(Debug, PartialEq, Eq)]
struct ContentRange {
    start: u64,
    end: u64,
    total: Option<u64>,
}

fn parse_content_range(v: &str) -> Option<ContentRange> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse::<u64>().ok()?),
    };
    let (start, end) = range.trim().split_once('-')?;
    let (start, end) = (start.parse::<u64>().ok()?, end.parse::<u64>().ok()?);
    if end < start || total.is_some_and(|t| end >= t) {
        return None;
    }
    Some(ContentRange { start, end, total })
}

/// `bytes */TOTAL` of a 416 answer.
fn unsatisfied_total(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes")?
        .trim_start()
        .strip_prefix("*/")?
        .trim()
        .parse()
        .ok()
}

fn header<'a>(resp: &'a ureq::http::Response<ureq::Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn content_length(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    header(resp, "content-length").and_then(|v| v.trim().parse().ok())
}

/// Classify a response to a request for bytes `offset..` of the file (`offset == 0`: no
/// `Range` was sent).
fn classify(
    url: &str,
    resp: &ureq::http::Response<ureq::Body>,
    offset: u64,
    meta: Option<&PartMeta>,
) -> Result<Answer, FetchError> {
    let status = resp.status();
    match status.as_u16() {
        200 => Ok(Answer::Whole {
            total: content_length(resp),
        }),
        206 if offset == 0 => Err(FetchError::Protocol {
            url: url.to_string(),
            detail: "the server answered 206 Partial Content to a request for the whole file"
                .to_string(),
        }),
        206 => {
            let raw = header(resp, "content-range").unwrap_or("(none)");
            let Some(cr) = parse_content_range(raw) else {
                return Ok(Answer::Restart(format!(
                    "the server's Content-Range {raw:?} is not valid"
                )));
            };
            let known_total = meta.and_then(|m| m.total);
            if cr.start != offset {
                return Ok(Answer::Restart(format!(
                    "the server sent bytes from {} on, not from {offset}",
                    cr.start
                )));
            }
            if let (Some(t), Some(k)) = (cr.total, known_total) {
                if t != k {
                    return Ok(Answer::Restart(format!(
                        "the file's size changed on the server ({k} → {t} bytes)"
                    )));
                }
            }
            if content_length(resp).is_some_and(|n| n != cr.end - cr.start + 1) {
                return Ok(Answer::Restart(format!(
                    "the server's Content-Range {raw:?} does not match its Content-Length"
                )));
            }
            Ok(Answer::Rest {
                total: cr.total.or(known_total),
            })
        }
        416 if offset > 0 => {
            let total = header(resp, "content-range").and_then(unsatisfied_total);
            if total == Some(offset) {
                Ok(Answer::Complete)
            } else {
                Ok(Answer::Restart(
                    "the server cannot continue the partial file".to_string(),
                ))
            }
        }
        code => {
            let hint = match code {
                401 | 403 => " (the file needs a login: a gated or private model?)",
                404 | 410 => " (check the URL)",
                500..=599 => " (a server error: try again later)",
                _ => "",
            };
            Err(FetchError::HttpStatus {
                url: url.to_string(),
                status: format!("{} {}", code, status.canonical_reason().unwrap_or("")),
                hint,
            })
        }
    }
}

pub(super) fn agent(opts: &PullOptions) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(10)
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .timeout_connect(Some(opts.connect_timeout))
        .timeout_recv_response(Some(opts.read_timeout))
        .timeout_per_read(Some(opts.read_timeout))
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

const MAGIC: &[u8; 4] = b"GGUF";

fn check_magic(url: &str, head: &[u8]) -> Result<(), FetchError> {
    if head == MAGIC {
        return Ok(());
    }
    let found = if head.is_empty() {
        "nothing: the file is empty".to_string()
    } else if head.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(head))
    } else {
        head.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let hint = if head.first() == Some(&b'<') {
        ": it looks like a web page (on Hugging Face, link to .../resolve/main/FILE.gguf, not \
         .../blob/main/FILE.gguf)"
    } else {
        ""
    };
    Err(FetchError::NotGguf {
        url: url.to_string(),
        found,
        hint,
    })
}

/// A line for the user: above the bar when there is one, else on stderr when progress is on.
fn say(bar: &Progress, progress: bool, line: &str) {
    match bar {
        Progress::Hidden if progress => eprintln!("kiln: {line}"),
        bar => bar.note(line),
    }
}

/// Bring `file` (the `.part` of `dest`) to the complete content of `url`, hashing it.
fn download(
    url: &str,
    dest: &Path,
    file: &mut File,
    opts: &PullOptions,
    name: &str,
    bar: &mut Progress,
) -> Result<Downloaded, FetchError> {
    let part = store::part_path(dest);
    let agent = agent(opts);
    let mut meta = store::read_part_meta(dest).filter(|m| m.url == url);
    let mut offset = match meta {
        Some(_) => file.metadata().map_err(io_err(&part))?.len(),
        None => 0,
    };
    if offset == 0 {
        file.set_len(0).map_err(io_err(&part))?;
    }
    let mut restarts = 0;
    let mut resumed_from = 0;
    // The sha256 of bytes 0..offset, once known.
    let mut hasher: Option<Sha256> = None;
    let mut total: Option<u64>;
    loop {
        let mut req = agent.get(url);
        if let Some(token) = &opts.bearer {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        if offset > 0 {
            req = req.header("Range", format!("bytes={offset}-"));
            let m = meta.as_ref();
            let strong_etag = m
                .and_then(|m| m.etag.as_deref())
                .filter(|e| !e.starts_with("W/"));
            if let Some(v) = strong_etag.or(m.and_then(|m| m.last_modified.as_deref())) {
                req = req.header("If-Range", v);
            }
        }
        let resp = req.call().map_err(|e| FetchError::Http {
            url: url.to_string(),
            error: Box::new(e),
        })?;
        match classify(url, &resp, offset, meta.as_ref())? {
            Answer::Whole { total: t } => {
                if offset > 0 {
                    say(
                        bar,
                        opts.progress,
                        &format!(
                            "the server sent the whole file, not the rest (it does not resume \
                             downloads, or the file changed): downloading {name} from the start"
                        ),
                    );
                }
                offset = 0;
                total = t;
                file.set_len(0).map_err(io_err(&part))?;
                hasher = Some(Sha256::new());
                let m = PartMeta {
                    url: url.to_string(),
                    etag: header(&resp, "etag").map(str::to_string),
                    last_modified: header(&resp, "last-modified").map(str::to_string),
                    total,
                };
                store::write_part_meta(dest, &m)?;
                meta = Some(m);
            }
            Answer::Rest { total: t } => {
                total = t;
                resumed_from = offset;
            }
            Answer::Complete => {
                total = Some(offset);
            }
            Answer::Restart(why) => {
                restarts += 1;
                if restarts > 2 {
                    return Err(FetchError::Protocol {
                        url: url.to_string(),
                        detail: format!("cannot resume: {why}"),
                    });
                }
                say(
                    bar,
                    opts.progress,
                    &format!("{why}: downloading {name} from the start"),
                );
                offset = 0;
                meta = None;
                hasher = None;
                file.set_len(0).map_err(io_err(&part))?;
                continue;
            }
        }
        if matches!(bar, Progress::Hidden) && opts.progress {
            let verb = if offset > 0 {
                format!("resuming {name} at {:.1} MB", offset as f64 / 1e6)
            } else {
                format!("downloading {name}")
            };
            *bar = Progress::new(true, &verb, total);
        }
        bar.set_position(offset);

        // The first bytes: the magic of what is already there.
        let mut head = Vec::with_capacity(4);
        if offset > 0 {
            file.seek(SeekFrom::Start(0)).map_err(io_err(&part))?;
            (&mut *file)
                .take(4)
                .read_to_end(&mut head)
                .map_err(io_err(&part))?;
            if head.len() == 4 {
                check_magic(url, &head)?;
            }
        }
        if hasher.is_none() {
            let mut h = Sha256::new();
            file.seek(SeekFrom::Start(0)).map_err(io_err(&part))?;
            hash_into(
                &mut h,
                (&mut *file).take(offset),
                &part,
                &mut Progress::Hidden,
            )?;
            hasher = Some(h);
        }
        let h = hasher.as_mut().expect("hashed above");
        if matches!(total, Some(t) if t == offset) {
            break;
        }

        file.seek(SeekFrom::Start(offset)).map_err(io_err(&part))?;
        let before = offset;
        let mut body = resp.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 18];
        let read_err = loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break None,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Some(e),
            };
            let chunk = &buf[..n];
            if head.len() < 4 {
                let k = (4 - head.len()).min(n);
                head.extend_from_slice(&chunk[..k]);
                if head.len() == 4 {
                    check_magic(url, &head)?;
                }
            }
            h.update(chunk);
            // Unbuffered (the reads are up to 256 KiB): what was received is on disk, so a
            // process killed here (Ctrl-C) leaves a partial file that resumes without loss.
            file.write_all(chunk).map_err(io_err(&part))?;
            offset += n as u64;
            bar.inc(n as u64);
            if total.is_some_and(|t| offset > t) {
                return Err(FetchError::Protocol {
                    url: url.to_string(),
                    detail: format!(
                        "the server sent more than the {} bytes it announced",
                        total.unwrap_or(0)
                    ),
                });
            }
        };
        if let Some(error) = read_err {
            return Err(FetchError::Interrupted {
                url: url.to_string(),
                part,
                received: offset,
                total: total.map_or_else(|| "unknown".to_string(), |t| t.to_string()),
                error,
            });
        }
        match total {
            // A server may send a range shorter than asked: ask for the rest.
            Some(t) if offset < t => {
                if offset == before {
                    return Err(FetchError::Protocol {
                        url: url.to_string(),
                        detail: format!("the server sent no data at byte {offset} of {t}"),
                    });
                }
                continue;
            }
            _ => break,
        }
    }
    if offset < 4 {
        let mut head = Vec::new();
        file.seek(SeekFrom::Start(0)).map_err(io_err(&part))?;
        (&mut *file)
            .take(4)
            .read_to_end(&mut head)
            .map_err(io_err(&part))?;
        check_magic(url, &head)?;
    }
    let sha256 = hex(&hasher.take().expect("set in the loop").finalize());
    Ok(Downloaded {
        sha256,
        size: offset,
        resumed_from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_urls() {
        let n = |u: &str| name_from_url(u).map_err(|e| e.to_string());
        assert_eq!(
            n("https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/main/SmolLM2-135M-Instruct.Q4_1.gguf").unwrap(),
            "SmolLM2-135M-Instruct.Q4_1"
        );
        assert_eq!(
            n("http://h:8080/a/b/Model%20X.Q8_0.GGUF?download=true#x").unwrap(),
            "Model X.Q8_0"
        );
        assert_eq!(n("https://h/file").unwrap(), "file");
        assert!(n("https://h/").unwrap_err().contains("--name"));
        assert!(n("https://h").unwrap_err().contains("--name"));
        assert!(n("https://h/smollm2.gguf")
            .unwrap_err()
            .contains("known model"));
        assert!(n("https://h/.hidden.gguf").unwrap_err().contains("dot"));
        assert!(n("https://h/a%2Fb.gguf").unwrap_err().contains("slash"));
        assert!(matches!(
            name_from_url("ftp://h/x.gguf"),
            Err(FetchError::BadUrl { .. })
        ));
        assert!(is_url("HTTPS://h/x") && is_url("http://h") && !is_url("http://"));
        assert!(!is_url("model.gguf") && !is_url("smollm2"));
    }

    #[test]
    fn content_ranges() {
        let cr = |s, e, t| {
            Some(ContentRange {
                start: s,
                end: e,
                total: t,
            })
        };
        assert_eq!(parse_content_range("bytes 10-19/20"), cr(10, 19, Some(20)));
        assert_eq!(parse_content_range("bytes 0-0/*"), cr(0, 0, None));
        assert_eq!(
            parse_content_range("bytes 10-19/15"),
            None,
            "end past total"
        );
        assert_eq!(parse_content_range("bytes 19-10/20"), None, "reversed");
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_content_range("bytes 0-x/2"), None);
        assert_eq!(unsatisfied_total("bytes */1234"), Some(1234));
        assert_eq!(unsatisfied_total("bytes 0-1/2"), None);
    }

    #[test]
    fn sha256_arguments() {
        let good = "AB".repeat(32);
        assert_eq!(parse_sha256(&good).unwrap(), "ab".repeat(32));
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }

    #[test]
    fn magic_errors_say_what_was_found() {
        assert!(check_magic("u", b"GGUF").is_ok());
        let e = check_magic("u", b"<!DO").unwrap_err().to_string();
        assert!(e.contains("\"<!DO\"") && e.contains("web page"), "{e}");
        let e = check_magic("u", &[0x50, 0x4b, 3, 4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("50 4b 03 04"), "{e}");
        let e = check_magic("u", b"").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%2"), "a b%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
