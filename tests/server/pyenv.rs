//! A Python environment for the tests that drive kiln from Python packages (the `openai`
//! client, sglang-router): a virtual environment under the target directory, created once
//! with pinned packages and reused (`pip install --target DIR/site` where `python3 -m venv`
//! is unavailable). Only `python3` and network access to PyPI (the first time) are needed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to run a Python that imports the packages.
pub struct Python {
    program: PathBuf,
    /// `PYTHONPATH`, for the `pip install --target` layout.
    path: Option<PathBuf>,
}

impl Python {
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        if let Some(p) = &self.path {
            c.env("PYTHONPATH", p);
        }
        c
    }

    /// The environment in `dir`, in whichever layout it has.
    fn at(dir: &Path) -> Python {
        let venv = if cfg!(windows) {
            dir.join("Scripts").join("python.exe")
        } else {
            dir.join("bin").join("python")
        };
        if venv.exists() {
            Python {
                program: venv,
                path: None,
            }
        } else {
            Python {
                program: "python3".into(),
                path: Some(dir.join("site")),
            }
        }
    }

    fn imports(&self, modules: &str) -> bool {
        self.command()
            .args(["-c", &format!("import {modules}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

/// `target/NAME` with the pinned `packages` (which provide the Python `modules`, as `import`
/// takes them), made if missing or out of date. It is built under a private name and renamed
/// into place, so test processes running at once never see a half-built one (the first rename
/// wins; the others use the winner's).
pub fn python_env(name: &str, packages: &[&str], modules: &str) -> Python {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let dir = target.join(name);
    let stamp = packages.join(" ");
    let ready = |dir: &Path| {
        std::fs::read_to_string(dir.join("KILN_PACKAGES")).is_ok_and(|s| s == stamp)
            && Python::at(dir).imports(modules)
    };
    if ready(&dir) {
        return Python::at(&dir);
    }
    let unique = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let tmp = target.join(format!("{name}.tmp-{unique}"));
    if let Err(e) = build_env(&tmp, packages) {
        let _ = std::fs::remove_dir_all(&tmp);
        panic!("cannot make the Python environment {name} ({stamp}): {e}");
    }
    std::fs::write(tmp.join("KILN_PACKAGES"), &stamp).expect("write the stamp");
    if dir.exists() && !ready(&dir) {
        // Out of date or broken: move it aside (atomically), then delete it.
        let old = target.join(format!("{name}.old-{unique}"));
        if std::fs::rename(&dir, &old).is_ok() {
            let _ = std::fs::remove_dir_all(&old);
        }
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another test process put its environment in place first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    assert!(
        ready(&dir),
        "the Python environment in {} does not import {modules}",
        dir.display()
    );
    Python::at(&dir)
}

/// A virtual environment with the packages in `dir`, or, where `venv` (or its `ensurepip`) is
/// missing, the packages installed with `pip install --target dir/site`.
fn build_env(dir: &Path, packages: &[&str]) -> Result<(), String> {
    let run = |c: &mut Command| -> Result<(), String> {
        let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{c:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let pip_args = [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ];
    let venv = run(Command::new("python3").args(["-m", "venv"]).arg(dir));
    if venv.is_ok() {
        let py = Python::at(dir);
        return run(py.command().args(pip_args).args(packages));
    }
    let _ = std::fs::remove_dir_all(dir);
    let site = dir.join("site");
    std::fs::create_dir_all(&site).map_err(|e| format!("{}: {e}", site.display()))?;
    run(Command::new("python3")
        .args(pip_args)
        .arg("--target")
        .arg(&site)
        .args(packages))
    .map_err(|e| format!("python3 -m venv failed ({}), then {e}", venv.unwrap_err()))
}
