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
#[path = "server/pyenv.rs"]
mod pyenv;

use std::path::Path;

use harness::Server;

/// The client packages, pinned to the versions the suite was last run with.
const PY_PACKAGES: [&str; 2] = ["openai==3.57.0", "httpx==0.28.1"];

#[test]
fn openai_python_client_drives_the_server() {
    let python = pyenv::python_env("py-venv", &PY_PACKAGES, "openai, httpx");
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
