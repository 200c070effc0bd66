//! `kiln serve` shutting down and clients that stop reading, over raw TCP: SIGTERM closes at
//! once every connection whose request has not all arrived (head or body) and lets the others
//! finish; a stream still running when `--shutdown-timeout` ends gets a last error event in its
//! protocol's shape (OpenAI, llama-server, Ollama, Anthropic) and a whole answer a 503; a client
//! that stops reading gives its slot back after the write timeout, not after megabytes of
//! kernel buffers.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use harness::{read_answer, read_head, wait_closed, Server};
use serde_json::{json, Value};

fn model() -> std::path::PathBuf {
    common::random_model("random-llama-q4_0")
}

/// A POST of `body` as JSON, keeping the connection open.
fn post(path: &str, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Everything the server sends until it closes the connection.
fn read_rest(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Poll `series` on /metrics until `ok` holds of it (0 where absent), for at most `limit`.
fn wait_metric(server: &Server, series: &str, limit: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let end = Instant::now() + limit;
    loop {
        let v = server.metric(series, &[]).unwrap_or(0.0);
        if ok(v) {
            return v;
        }
        assert!(
            Instant::now() < end,
            "{series} is still {v} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_closes_at_once_what_has_not_all_arrived() {
    // Long timeouts and grace: only the shutdown itself can close these connections soon.
    let mut server = Server::start(
        &model(),
        &[
            "--shutdown-timeout",
            "600",
            "--header-timeout",
            "600",
            "--body-timeout",
            "600",
            "--idle-timeout",
            "600",
        ],
    );
    // A whole request, generating.
    let body = json!({"prompt": "hello", "max_tokens": 64, "ignore_eos": true, "stream": true});
    let mut stream = server.connect();
    stream.write_all(&post("/v1/completions", &body)).unwrap();
    assert_eq!(read_head(&mut stream).0, 200);
    // A head half sent, a body half sent (the head whole), an idle keep-alive connection.
    let mut head = server.connect();
    head.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    let mut half_body = server.connect();
    half_body
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        .unwrap();
    let mut idle = server.connect();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(read_answer(&mut idle).status, 200);
    // (The half-sent body reaches its handler before the signal.)
    std::thread::sleep(Duration::from_millis(300));

    server.terminate();
    for (what, s) in [
        ("half-sent head", &mut head),
        ("half-sent body", &mut half_body),
        ("idle keep-alive", &mut idle),
    ] {
        assert!(
            wait_closed(s, Duration::from_secs(30)).is_some(),
            "{what}: still open 30 s after SIGTERM (grace 600 s)"
        );
    }
    // The request that had arrived finishes.
    let rest = read_rest(&mut stream);
    assert!(
        rest.contains("data: [DONE]") && rest.contains("\"finish_reason\":\"length\""),
        "the stream was cut: {rest:?}"
    );
    let exit = server.wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|e| e.success()),
        "not exited 30 s after SIGTERM (grace 600 s): {exit:?}"
    );
}

/// The data of each `data:` line of an event stream.
fn data_lines(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

fn parse(what: &str, data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{what}: {data:?}: {e}"))
}

/// A cut answer's message.
fn says_shutting_down(what: &str, message: &Value) {
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("shutting down") && m.contains("--shutdown-timeout")),
        "{what}: {message}"
    );
}

#[test]
fn streams_cut_at_the_end_of_the_grace_end_with_an_error_event() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/server/hermes_template.jinja"
    );
    let mut server = Server::start_ctx(
        &model(),
        4096,
        &[
            "-P",
            "5",
            "--shutdown-timeout",
            "1",
            "--chat-template-file",
            template,
        ],
    );
    // Each runs far past the grace: the whole context, at temperature 0 (the random model's
    // answers to these prompts reach the context before an end-of-generation token).
    let n = 3900;
    let chat = json!([{"role": "user", "content": "hello"}]);
    let requests = [
        (
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": n, "ignore_eos": true, "stream": true}),
        ),
        (
            "/completion",
            json!({"prompt": "hello", "n_predict": n, "ignore_eos": true, "stream": true}),
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": chat, "stream": true,
                   "options": {"num_predict": n, "temperature": 0}}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "messages": chat, "max_tokens": n, "temperature": 0,
                   "stream": true}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": n, "ignore_eos": true}),
        ),
    ];
    let readers: Vec<_> = requests
        .iter()
        .map(|(path, body)| {
            let mut s = server.connect();
            s.write_all(&post(path, body)).unwrap();
            std::thread::spawn(move || {
                let (status, headers) = read_head(&mut s);
                (status, headers, read_rest(&mut s))
            })
        })
        .collect();
    // All five generating, then the signal; the grace ends a second later.
    wait_metric(
        &server,
        "kiln_kv_slots_in_use",
        Duration::from_secs(60),
        |v| v >= 5.0,
    );
    let start = Instant::now();
    server.terminate();
    let answers: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();

    // OpenAI: `data: {"error": ...}` (a server error), then `data: [DONE]`; no finish reason.
    let (status, _, body) = &answers[0];
    assert_eq!(*status, 200, "{body}");
    let data = data_lines(body);
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let last = parse("openai", data[data.len() - 2]);
    assert_eq!(last["error"]["type"], "server_error", "{last}");
    says_shutting_down("openai", &last["error"]["message"]);
    assert!(!body.contains("\"finish_reason\":\"length\""), "{body}");

    // llama-server: a last `data: {"error": ...}`, no `stop: true`.
    let (status, _, body) = &answers[1];
    assert_eq!(*status, 200, "{body}");
    let data = data_lines(body);
    let last = parse("completion", data.last().expect("events"));
    assert_eq!(last["error"]["type"], "server_error", "{last}");
    says_shutting_down("completion", &last["error"]["message"]);
    assert!(!body.contains("\"stop\":true"), "{body}");

    // Ollama: a last `{"error": "..."}` line, no `done: true`.
    let (status, headers, body) = &answers[2];
    assert_eq!(*status, 200, "{body}");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == "application/x-ndjson"),
        "{headers:?}"
    );
    // (Chunked: the lines of JSON objects are those that start with `{`.)
    let lines: Vec<Value> = body
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| parse("ollama", l))
        .collect();
    let last = lines.last().expect("lines");
    says_shutting_down("ollama", &last["error"]);
    assert!(lines.iter().all(|l| l["done"] != true), "{body}");

    // Anthropic: a last `event: error` with an `overloaded_error`, no `message_stop`.
    let (status, _, body) = &answers[3];
    assert_eq!(*status, 200, "{body}");
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.last(), Some(&"error"), "{body}");
    assert!(!events.contains(&"message_stop"), "{body}");
    let last = parse("anthropic", data_lines(body).last().expect("events"));
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["error"]["type"], "overloaded_error", "{last}");
    says_shutting_down("anthropic", &last["error"]["message"]);

    // A whole answer not ready: 503, OpenAI's error.
    let (status, _, body) = &answers[4];
    assert_eq!(*status, 503, "{body}");
    let (_, json_body) = body.split_once('{').expect("a JSON body");
    let v = parse("whole", &format!("{{{json_body}"));
    says_shutting_down("whole", &v["error"]["message"]);

    let exit = server.wait_exit(Duration::from_secs(60));
    assert!(exit.is_some_and(|e| e.success()), "{exit:?}");
    eprintln!(
        "five answers cut and the server gone {:?} after SIGTERM (grace 1 s)",
        start.elapsed()
    );
}

#[test]
fn a_client_that_stops_reading_gives_its_slot_back() {
    let server = Server::start_ctx(&model(), 4096, &["-P", "1", "--write-timeout", "2"]);
    // A stream of ~750 KB (the whole context) that the client never reads: the kernel used to
    // take all of it (a send buffer grows to 4 MB), so that the write never blocked and the
    // slot stayed taken until the answer was done.
    let n = 4000;
    let body = json!({"prompt": "hello", "max_tokens": n, "ignore_eos": true, "stream": true});
    let mut stalled = server.connect();
    stalled.write_all(&post("/v1/completions", &body)).unwrap();
    wait_metric(
        &server,
        "kiln_kv_slots_in_use",
        Duration::from_secs(60),
        |v| v >= 1.0,
    );
    // A second request waits for the one slot: it is served once the writer gives up.
    let start = Instant::now();
    let mut second = server.connect();
    let short = json!({"prompt": "hi", "max_tokens": 4, "ignore_eos": true});
    second.write_all(&post("/v1/completions", &short)).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let answer = read_answer(&mut second);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let waited = start.elapsed();
    let timeouts = "kiln_http_timeouts_total{kind=\"write\"}";
    wait_metric(&server, timeouts, Duration::from_secs(60), |v| v >= 1.0);
    wait_metric(
        &server,
        "kiln_kv_slots_in_use",
        Duration::from_secs(60),
        |v| v == 0.0,
    );
    // What reached the client is a cut stream: the write timeout closed it.
    let got = read_rest(&mut stalled);
    assert!(
        !got.contains("[DONE]") && !got.contains("\"finish_reason\":\"length\""),
        "the whole stream went into the kernel's buffers ({} bytes)",
        got.len()
    );
    // Its job was cancelled, unless it had already run to its end.
    let generated = server.metric("kiln_generated_tokens_total", &[]).unwrap();
    let cancelled = server.metric("kiln_requests_cancelled_total", &[]).unwrap();
    assert!(
        cancelled >= 1.0 || generated >= (n + 4) as f64,
        "cancelled {cancelled}, generated {generated}"
    );
    eprintln!(
        "the second request waited {waited:?}; the stalled client got {} bytes; {generated} tokens generated",
        got.len()
    );
}
