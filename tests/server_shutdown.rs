//! `kiln serve` shutting down, over raw TCP: SIGTERM closes at once every connection whose
//! request has not all arrived (head or body) and lets the others finish.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

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
