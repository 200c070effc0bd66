//! Two `kiln serve` replicas behind sglang-router (a cache-aware router from PyPI), started by
//! scripts/replicas.py as a user starts them: concurrent requests spread across both; requests
//! sharing a long prompt prefix go to the replica that holds it (its prefix-cache hits grow,
//! the other's do not); the official `openai` client gets embeddings through the router; and
//! with one replica killed (SIGKILL) mid-run, every request sent after the kill is answered.
//!
//! The test makes its own Python environment (`target/router-venv`: the pinned router and
//! client), as tests/server_openai.rs does.

mod common;
#[path = "server/harness.rs"]
mod harness;
#[path = "server/pyenv.rs"]
mod pyenv;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The router the script installs (scripts/replicas.py pins the same) and the client.
const PY_PACKAGES: [&str; 3] = ["sglang-router==0.3.2", "openai==3.57.0", "httpx==0.28.1"];

/// scripts/replicas.py and what it started; stopped (SIGTERM, then waited for) on drop.
struct Replicas {
    child: Child,
    router: String,
    /// `127.0.0.1:PORT` and pid of each replica.
    replicas: Vec<(String, u32)>,
}

impl Replicas {
    fn start(python: &pyenv::Python, model: &Path) -> Replicas {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/replicas.py");
        let mut child = python
            .command()
            .arg(script)
            .args(["-n", "2", "--port", "0", "--timeout", "120", "--kiln"])
            .arg(env!("CARGO_BIN_EXE_kiln"))
            .arg("-m")
            .arg(model)
            .args(["--", "-t", "1", "-P", "2", "-c", "1024"])
            .args(["--embeddings", "--pooling", "mean"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run scripts/replicas.py");
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("KILN_TEST_SERVER_LOG").is_some() {
                    eprintln!("[replicas] {line}");
                }
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the script's JSON line");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!("scripts/replicas.py printed {line:?} ({e}); rerun with KILN_TEST_SERVER_LOG=1")
        });
        let addr = |url: &Value| {
            url.as_str()
                .unwrap()
                .trim_start_matches("http://")
                .to_string()
        };
        Replicas {
            router: addr(&v["router"]),
            replicas: v["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (addr(&r["url"]), r["pid"].as_u64().unwrap() as u32))
                .collect(),
            child,
        }
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(status, body)` of one request on its own connection (0: no answer).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, Vec<u8>) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, Vec::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body.as_bytes()).is_err() {
        return (0, Vec::new());
    }
    let a = harness::read_answer(&mut s);
    (a.status, a.body)
}

fn complete(router: &str, prompt: &str, max_tokens: usize) -> (u16, Value) {
    let body = json!({
        "model": "random-llama-f32",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
    });
    let (status, bytes) = http(router, "POST", "/v1/completions", &body.to_string());
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A series of a replica's /metrics (0 when absent).
fn metric(addr: &str, series: &str) -> f64 {
    let (status, body) = http(addr, "GET", "/metrics", "");
    assert_eq!(status, 200, "/metrics of {addr}");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

const DONE: &str = "kiln_requests_total{endpoint=\"/v1/completions\",status=\"200\"}";
const HITS: &str = "vllm:prefix_cache_hits_total{model_name=\"random-llama-f32\"}";

#[test]
fn two_replicas_behind_sglang_router() {
    let python = pyenv::python_env("router-venv", &PY_PACKAGES, "sglang_router, openai");
    let model = common::random_model("random-llama-f32");
    let r = Replicas::start(&python, &model);
    let (a, b) = (r.replicas[0].0.clone(), r.replicas[1].0.clone());
    assert_ne!(r.replicas[0].1, r.replicas[1].1);
    let done = |addr: &str| metric(addr, DONE);

    // Concurrent requests with unrelated prompts spread over both replicas.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let router = r.router.clone();
            std::thread::spawn(move || complete(&router, &format!("{i} apples and pears"), 200).0)
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    let (da, db) = (done(&a), done(&b));
    assert_eq!(da + db, 8.0);
    assert!(da >= 1.0 && db >= 1.0, "spread over both: {da} and {db}");

    // A long shared prefix: every request goes where the first went, and hits its cache there.
    let prefix = "Kilns fire clay into ceramics; the potter loads the kiln, seals it, and raises the heat slowly. "
        .repeat(6);
    let before = [(done(&a), metric(&a, HITS)), (done(&b), metric(&b, HITS))];
    let mut prompt_tokens = Vec::new();
    for q in [
        "Why slowly?",
        "What is glaze?",
        "How hot?",
        "How long?",
        "Why seal it?",
    ] {
        let (status, v) = complete(&r.router, &format!("{prefix}{q}"), 4);
        assert_eq!(status, 200, "{v}");
        prompt_tokens.push(v["usage"]["prompt_tokens"].as_f64().unwrap());
    }
    let after = [(done(&a), metric(&a, HITS)), (done(&b), metric(&b, HITS))];
    let served: Vec<f64> = (0..2).map(|i| after[i].0 - before[i].0).collect();
    let hits: Vec<f64> = (0..2).map(|i| after[i].1 - before[i].1).collect();
    let holder = if served[0] >= served[1] { 0 } else { 1 };
    assert_eq!(
        (served[holder], served[1 - holder]),
        (5.0, 0.0),
        "all five on one replica"
    );
    let shortest = prompt_tokens.iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        hits[holder] >= 4.0 * (shortest - 8.0),
        "the prefix is a cache hit on its replica: {hits:?}, prompts of {prompt_tokens:?} tokens"
    );
    assert_eq!(hits[1 - holder], 0.0, "nothing on the other");

    // The official client, through the router: embeddings (it asks for base64 and decodes).
    let code = format!(
        "import openai, math\n\
         c = openai.OpenAI(base_url='http://{}/v1', api_key='-')\n\
         r = c.embeddings.create(model='random-llama-f32', input=['kilns', 'clay and fire'])\n\
         assert [d.index for d in r.data] == [0, 1], r\n\
         for d in r.data:\n\
         \x20   assert len(d.embedding) == 256, len(d.embedding)\n\
         \x20   assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-4\n\
         assert r.usage.prompt_tokens > 0\n\
         print('ok')",
        r.router
    );
    let out = python.command().args(["-c", &code]).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "openai embeddings through the router: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Failover: a client sends requests in a loop, all with the shared prefix, so that the
    // router sends them to the replica holding it; that replica is killed mid-run. Every
    // request sent after the kill is answered (by the other); only those in flight may be
    // lost. (The router keeps choosing the dead replica for this prefix until its health
    // check removes it: retries must outlast that.)
    let (victim, survivor) = (r.replicas[holder].1, r.replicas[1 - holder].0.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<(Instant, Instant, u16)>>> = Arc::default();
    let clients: Vec<_> = (0..1)
        .map(|c| {
            let (router, stop, log) = (r.router.clone(), Arc::clone(&stop), Arc::clone(&log));
            let prefix = prefix.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Relaxed) {
                    let t0 = Instant::now();
                    let prompt = format!("{prefix}Client {c}, question {i}?");
                    let (status, _) = complete(&router, &prompt, 16);
                    log.lock().unwrap().push((t0, Instant::now(), status));
                    i += 1;
                }
            })
        })
        .collect();
    let wait_for = |n: usize| {
        let end = Instant::now() + Duration::from_secs(120);
        while log.lock().unwrap().len() < n {
            assert!(Instant::now() < end, "the clients stalled");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(6);
    let survivor_before = done(&survivor);
    let killed_at = Instant::now();
    let ok = Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill the replica holding the prefix");
    let n_at_kill = log.lock().unwrap().len();
    wait_for(n_at_kill + 30);
    stop.store(true, Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let log = log.lock().unwrap();
    let after_kill: Vec<_> = log.iter().filter(|(t0, _, _)| *t0 > killed_at).collect();
    let lost: Vec<_> = after_kill.iter().filter(|(_, _, s)| *s != 200).collect();
    assert!(
        after_kill.len() >= 25,
        "{} requests after the kill",
        after_kill.len()
    );
    assert!(
        lost.is_empty(),
        "{} of {} requests sent after the kill failed: {:?}",
        lost.len(),
        after_kill.len(),
        lost.iter().map(|(_, _, s)| s).collect::<Vec<_>>()
    );
    let in_flight_failed = log
        .iter()
        .filter(|(t0, t1, s)| *t0 <= killed_at && *t1 >= killed_at && *s != 200)
        .count();
    assert!(in_flight_failed <= 1, "at most the request in flight");
    let early_failed = log
        .iter()
        .filter(|(_, t1, s)| *t1 < killed_at && *s != 200)
        .count();
    assert_eq!(early_failed, 0, "no failure before the kill");
    assert!(
        done(&survivor) - survivor_before >= after_kill.len() as f64,
        "the other replica answered them"
    );
    eprintln!(
        "failover: {} requests after the kill, all answered; {in_flight_failed} of those in flight lost",
        after_kill.len()
    );
}
