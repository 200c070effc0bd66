//! `kiln serve` end to end with real clients: the official `openai` Python package (installed
//! by .ci/run) drives two server processes through tests/server/openai_suite.py — greedy output
//! equal to `kiln run`, streaming, 8 concurrent streams equal to their sequential results,
//! the prefix cache on a second chat turn, every bad input, disconnects, 429, SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A `kiln serve` process, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--port", "0", "-c", "1024", "-m"])
            .arg(model)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kiln serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("kiln serve exited before listening")
                .expect("read stderr");
            if let Some(u) = line.strip_prefix("kiln: listening on ") {
                break u.trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn openai_python_client_drives_the_server() {
    let ok = Command::new("python3")
        .args(["-c", "import openai, httpx"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "this test needs python3 with the `openai` package (pip install openai; .ci/run does)"
    );
    let model = common::real_model("smollm2");
    let key = "kiln-test-key";
    let a = Server::start(&model, &["-P", "8", "--api-key", key]);
    let mut b = Server::start(&model, &["-P", "1", "--queue", "1"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/openai_suite.py");
    let status = Command::new("python3")
        .arg(&script)
        .args(["--a", &a.url, "--b", &b.url, "--key", key])
        .args(["--b-pid", &b.child.id().to_string()])
        .arg("--kiln")
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .arg("--model")
        .arg(&model)
        .args(["--ctx", "1024"])
        .status()
        .expect("run python3");
    assert!(
        status.success(),
        "the openai client suite failed (see its output above)"
    );
    // Server B was sent SIGTERM mid-response by the suite: it must have exited cleanly.
    let exit = b.child.wait().expect("wait for server B");
    assert!(exit.success(), "server B exited with {exit} after SIGTERM");
}
