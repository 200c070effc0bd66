//! What a replica shows a router: `/health` is 503 ("loading") while the model loads and 200
//! once it serves (the port is bound first), a failed load stops the server, and `/metrics`
//! carries the gauges routers and the Gateway API Inference Extension read under vLLM's names
//! (requests running and waiting, KV-cache usage, prefix-cache queries and hits).

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use harness::Server;
use serde_json::json;

#[test]
fn health_is_503_while_loading_then_200() {
    let model = common::random_model("random-llama-f32");
    let dir = std::env::temp_dir().join(format!("kiln-gate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gate = dir.join("go");
    let _ = std::fs::remove_file(&gate);
    let s = Server::start_with(
        &model,
        &[],
        &[("KILN_LOAD_GATE", gate.to_str().unwrap())],
        "kiln: bound to ",
    );
    // The model is held back: every route answers, 503 with llama-server's body.
    for _ in 0..3 {
        let h = s.request("GET", "/health", &[], "");
        let e = h.expect_error(503, "health while loading");
        assert_eq!(e["message"], "Loading model");
        assert_eq!(e["type"], "unavailable_error");
        assert_eq!(h.json()["status"], "loading");
        assert_eq!(h.header("retry-after"), Some("1"));
        let c = s.request(
            "POST",
            "/v1/completions",
            &[],
            &json!({"prompt": "hi", "max_tokens": 2}).to_string(),
        );
        c.expect_error(503, "completion while loading");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&gate, b"").unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let h = s.request("GET", "/health", &[], "");
        if h.status == 200 {
            break h;
        }
        assert_eq!(h.status, 503, "{}", h.text());
        assert!(Instant::now() < end, "still loading after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ready.json()["status"], "ok");
    let c = s.request(
        "POST",
        "/v1/completions",
        &[],
        &json!({"prompt": "hi", "max_tokens": 2}).to_string(),
    );
    assert_eq!(c.status, 200, "{}", c.text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_load_stops_the_server() {
    let dir = std::env::temp_dir().join(format!("kiln-badload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("broken.gguf");
    std::fs::write(&bad, b"GGUF this is not a model").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "-m"])
        .arg(&bad)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < end,
            "kiln serve still running with a broken model"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("broken.gguf"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server's `/metrics` text, one scrape.
fn metrics(s: &Server) -> String {
    let a = s.request("GET", "/metrics", &[], "");
    assert_eq!(a.status, 200);
    a.text()
}

/// The value of a vLLM-named series in a scrape's `text`.
fn series(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{model_name=\"random-llama-f32\"}} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

/// The value of a vLLM-named series, in a scrape of its own.
fn vllm(s: &Server, name: &str) -> f64 {
    series(&metrics(s), name)
}

#[test]
fn router_gauges_follow_the_load() {
    let model = common::random_model("random-llama-f32");
    let s = Server::start(&model, &["-P", "1", "-t", "1"]);
    assert_eq!(vllm(&s, "vllm:num_requests_running"), 0.0);
    assert_eq!(vllm(&s, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(vllm(&s, "vllm:kv_cache_usage_perc"), 0.0);
    // One long streamed generation holds the only slot; three more wait behind it.
    let body = |p: &str| {
        json!({"prompt": p, "max_tokens": 900, "ignore_eos": true, "stream": true}).to_string()
    };
    let mut first = s.connect();
    // A refused or stalled stream fails the test instead of holding it forever.
    first
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let b = body("The capital of France is");
    write!(
        first,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut reader = BufReader::new(first.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    let mut waiting = Vec::new();
    for i in 0..3 {
        let url = s.addr.clone();
        let b = body(&format!("Once upon a time {i}"));
        waiting.push(std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(url).unwrap();
            write!(
                c,
                "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )
            .unwrap();
            harness::read_answer(&mut c).status
        }));
    }
    let end = Instant::now() + Duration::from_secs(30);
    let (mut running, mut queued, mut usage) = (0.0, 0.0, 0.0);
    while Instant::now() < end {
        let m = metrics(&s);
        running = series(&m, "vllm:num_requests_running");
        queued = series(&m, "vllm:num_requests_waiting");
        usage = series(&m, "vllm:kv_cache_usage_perc");
        if running == 1.0 && queued >= 1.0 {
            break;
        }
    }
    assert_eq!(running, 1.0, "one request in the slot");
    assert!(queued >= 1.0, "requests wait behind it: {queued}");
    assert!(usage > 0.0 && usage <= 1.0, "KV usage {usage}");
    // One scrape: the generation in the slot keeps filling the cache between two.
    let m = metrics(&s);
    assert_eq!(
        series(&m, "vllm:gpu_cache_usage_perc"),
        series(&m, "vllm:kv_cache_usage_perc")
    );
    drop(reader);
    drop(first); // cancels the first; the others run in turn
    for t in waiting {
        assert_eq!(t.join().unwrap(), 200);
    }
    let end = Instant::now() + Duration::from_secs(30);
    while vllm(&s, "vllm:num_requests_running") != 0.0 {
        assert!(Instant::now() < end, "requests still running");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(vllm(&s, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(vllm(&s, "vllm:kv_cache_usage_perc"), 0.0);

    // Prefix cache: a prompt that starts as the previous one did is a hit, in tokens.
    let prefix = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let queries0 = vllm(&s, "vllm:prefix_cache_queries_total");
    let hits0 = vllm(&s, "vllm:prefix_cache_hits_total");
    let mut prompt_tokens = 0.0;
    for q in ["Why?", "How?"] {
        let a = s.request(
            "POST",
            "/v1/completions",
            &[],
            &json!({"prompt": format!("{prefix}{q}"), "max_tokens": 2}).to_string(),
        );
        assert_eq!(a.status, 200, "{}", a.text());
        prompt_tokens += a.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    }
    assert_eq!(
        vllm(&s, "vllm:prefix_cache_queries_total") - queries0,
        prompt_tokens
    );
    let hits = vllm(&s, "vllm:prefix_cache_hits_total") - hits0;
    assert!(
        hits >= 0.8 * prompt_tokens / 2.0,
        "the second prompt's shared prefix is a hit: {hits} of {prompt_tokens}"
    );
}
