//! Small pieces shared by the fetchers: I/O errors with their path, sha256, temporary files in
//! the models directory, and progress output.

use std::fs::{self, File};
use std::io::{self, IsTerminal, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::FetchError;

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// sha256 of a file, lower-case hex, streamed.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let file = File::open(path).map_err(io_err(path))?;
    hash_reader(file, path, &mut Progress::hidden())
}

/// Feed everything `r` yields to `hasher`, advancing `bar`.
pub(super) fn hash_into(
    hasher: &mut Sha256,
    mut r: impl Read,
    path: &Path,
    bar: &mut Progress,
) -> Result<(), FetchError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
}

pub(super) fn hash_reader(
    r: impl Read,
    path: &Path,
    bar: &mut Progress,
) -> Result<String, FetchError> {
    let mut hasher = Sha256::new();
    hash_into(&mut hasher, r, path, bar)?;
    Ok(hex(&hasher.finalize()))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Temporary files and directories in the models directory (same file system, so the final
// rename is atomic), removed on drop unless persisted.

pub(super) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub(super) struct TempFile {
    pub(super) path: PathBuf,
    keep: bool,
}

impl TempFile {
    pub(super) fn new(dir: &Path, name: &str) -> Result<TempFile, FetchError> {
        let path = dir.join(format!(".{name}.partial-{}", unique_suffix()));
        Ok(TempFile { path, keep: false })
    }

    pub(super) fn persist(mut self, to: &Path) -> Result<(), FetchError> {
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

pub(super) struct TempDir {
    pub(super) path: PathBuf,
}

impl TempDir {
    pub(super) fn new(dir: &Path, what: &str) -> Result<TempDir, FetchError> {
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

/// Write `text` to `path` through a temporary name and a rename, so readers never see a torn
/// file.
pub(super) fn write_atomic(path: &Path, text: &str) -> Result<(), FetchError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", unique_suffix()));
    if let Err(e) = fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(FetchError::Io {
            path: path.to_path_buf(),
            source: e,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Progress: an indicatif bar on a terminal, start lines otherwise, nothing when disabled.

pub(super) enum Progress {
    Hidden,
    Plain,
    Bar(indicatif::ProgressBar),
}

impl Progress {
    pub(super) fn hidden() -> Progress {
        Progress::Hidden
    }

    /// A bar for `total` bytes (`None`: unknown), on stderr. When stderr is not a terminal one
    /// line `kiln: MSG (SIZE)` is printed instead.
    pub(super) fn new(enabled: bool, msg: &str, total: Option<u64>) -> Progress {
        if !enabled {
            return Progress::Hidden;
        }
        if !io::stderr().is_terminal() {
            match total {
                Some(t) => eprintln!("kiln: {msg} ({:.1} MB)", t as f64 / 1e6),
                None => eprintln!("kiln: {msg}"),
            }
            return Progress::Plain;
        }
        let (bar, template) = match total {
            Some(t) => (
                indicatif::ProgressBar::new(t),
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            ),
            None => (
                indicatif::ProgressBar::no_length(),
                "{spinner} {msg} {bytes} {bytes_per_sec}",
            ),
        };
        let style = indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(msg.to_string());
        Progress::Bar(bar)
    }

    pub(super) fn inc(&mut self, n: u64) {
        if let Progress::Bar(b) = self {
            b.inc(n);
        }
    }

    pub(super) fn set_position(&mut self, pos: u64) {
        if let Progress::Bar(b) = self {
            b.set_position(pos);
        }
    }

    /// Show a line above the bar (or on stderr when there is no bar).
    pub(super) fn note(&self, line: &str) {
        match self {
            Progress::Hidden => {}
            Progress::Plain => eprintln!("kiln: {line}"),
            Progress::Bar(b) => b.println(format!("kiln: {line}")),
        }
    }

    pub(super) fn finish(&mut self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An error path leaves the bar: clear it so the error message starts on a clean line.
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_pairs() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("kiln-support-unit-{}", unique_suffix()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.json");
        write_atomic(&p, "one").unwrap();
        write_atomic(&p, "two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
