//! `kiln serve` end to end with real clients: the official `openai` Python package drives two
//! server processes through tests/server/openai_suite.py — greedy output equal to `kiln run`,
//! streaming, 8 concurrent streams equal to their sequential results, the prefix cache on a
//! second chat turn, every bad input, disconnects, 429, SIGTERM.
//!
//! The test makes its own Python environment: a virtual environment under the target
//! directory (`target/py-venv`), created once with the pinned `openai` and `httpx` and reused
//! (`pip install --target` into `target/py-venv/site` where `python3 -m venv` is unavailable).
//! Only `python3` and network access to PyPI (the first time) are needed.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use harness::Server;

/// The client packages, pinned to the versions the suite was last run with.
const PY_PACKAGES: [&str; 2] = ["openai==3.57.0", "httpx==0.28.1"];

/// How to run a Python that imports the packages.
struct Python {
    program: PathBuf,
    /// `PYTHONPATH`, for the `pip install --target` layout.
    path: Option<PathBuf>,
}

impl Python {
    fn command(&self) -> Command {
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

    fn imports_the_packages(&self) -> bool {
        self.command()
            .args(["-c", "import openai, httpx"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

/// `target/py-venv` with the pinned packages, made if missing or out of date. It is built under
/// a private name and renamed into place, so test processes running at once never see a
/// half-built one (the first rename wins; the others use the winner's).
fn python_env() -> Python {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let dir = target.join("py-venv");
    let stamp = PY_PACKAGES.join(" ");
    let ready = |dir: &Path| {
        std::fs::read_to_string(dir.join("KILN_PACKAGES")).is_ok_and(|s| s == stamp)
            && Python::at(dir).imports_the_packages()
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
    let tmp = target.join(format!("py-venv.tmp-{unique}"));
    if let Err(e) = build_env(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        panic!("cannot make the Python environment for the openai client suite: {e}");
    }
    std::fs::write(tmp.join("KILN_PACKAGES"), &stamp).expect("write the stamp");
    if dir.exists() && !ready(&dir) {
        // Out of date or broken: move it aside (atomically), then delete it.
        let old = target.join(format!("py-venv.old-{unique}"));
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
        "the Python environment in {} does not import openai and httpx",
        dir.display()
    );
    Python::at(&dir)
}

/// A virtual environment with the packages in `dir`, or, where `venv` (or its `ensurepip`) is
/// missing, the packages installed with `pip install --target dir/site`.
fn build_env(dir: &Path) -> Result<(), String> {
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
        return run(py.command().args(pip_args).args(PY_PACKAGES));
    }
    let _ = std::fs::remove_dir_all(dir);
    let site = dir.join("site");
    std::fs::create_dir_all(&site).map_err(|e| format!("{}: {e}", site.display()))?;
    run(Command::new("python3")
        .args(pip_args)
        .arg("--target")
        .arg(&site)
        .args(PY_PACKAGES))
    .map_err(|e| format!("python3 -m venv failed ({}), then {e}", venv.unwrap_err()))
}

#[test]
fn openai_python_client_drives_the_server() {
    let python = python_env();
    let model = common::real_model("smollm2");
    let key = "kiln-test-key";
    let a = Server::start(&model, &["-P", "8", "--api-key", key]);
    let mut b = Server::start(&model, &["-P", "1", "--queue", "1"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/openai_suite.py");
    let status = python
        .command()
        .arg(&script)
        .args(["--a", &a.url, "--b", &b.url, "--key", key])
        .args(["--b-pid", &b.child.id().to_string()])
        .arg("--kiln")
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .arg("--model")
        .arg(&model)
        .args(["--ctx", "1024"])
        .status()
        .expect("run the Python suite");
    assert!(
        status.success(),
        "the openai client suite failed (see its output above)"
    );
    // Server B was sent SIGTERM mid-response by the suite: it must have exited cleanly.
    let exit = b.child.wait().expect("wait for server B");
    assert!(exit.success(), "server B exited with {exit} after SIGTERM");
}
