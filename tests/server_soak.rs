//! Soak test of `kiln serve` (ignored by default: it runs for minutes). 16 clients for
//! `KILN_SOAK_SECS` seconds (300 by default) mix whole and streamed completions, clients that
//! leave mid-answer, hostile requests (malformed HTTP, oversized heads and bodies, bad JSON,
//! half-sent requests), JSON schemas past the depth limit and just within it, and prefix-cache
//! probes across the server's two API keys; then 16 streams are started and the server gets
//! SIGTERM.
//!
//! What it checks:
//! - nothing is lost: every request a client sent whole gets a whole answer (a completion of
//!   exactly `max_tokens` tokens, a stream that ends in `[DONE]`, or OpenAI's JSON error with the
//!   expected status; 429 with `Retry-After` is the only refusal allowed), and the server's
//!   `kiln_requests_total` agrees with the clients' counts;
//! - a schema 300 `$ref`s deep is a 400 naming the field, one 200 deep is answered;
//! - the prefix cache tells one key nothing of another's prompts: after one key's prompt ends
//!   in a secret, the other key's guesses of it never reuse more tokens than the longest prefix
//!   they share with that key's own earlier prompts;
//! - memory is flat: the server's RSS at the end is within a bound of its RSS after the warm-up
//!   (the first fifth of the run);
//! - SIGTERM with 16 responses in progress finishes all of them and exits 0.
//!
//! ```text
//! KILN_SOAK_SECS=300 cargo test --release --test server_soak -- --ignored --nocapture
//! ```

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use harness::{read_answer, read_head, Answer, Server};

const CLIENTS: usize = 16;
const PARALLEL: usize = 4;
const QUEUE: usize = 16;
/// Tokens of each stream in progress at SIGTERM (16 of them, 4 at a time).
const SHUTDOWN_TOKENS: u64 = 400;
/// Largest request body the server accepts (`--max-body`).
const MAX_BODY: usize = 64 << 10;
/// The server's two API keys: every request but the probes' guesses uses the first.
const KEYS: &str = "soak-key-a,soak-key-b";
const AUTH_A: &str = "Authorization: Bearer soak-key-a";
const AUTH_B: &str = "Authorization: Bearer soak-key-b";

/// What a client does in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Act {
    /// Non-streaming completion, read whole.
    Whole,
    /// Streaming completion, read to `[DONE]`.
    Stream,
    /// Streaming completion, left after the head and a chunk or two.
    StreamLeave,
    /// Non-streaming completion, left before the answer.
    WholeLeave,
    /// `temperature: 1e-38`: well defined, the same text as greedy.
    TinyTemperature,
    /// Body that is not JSON: 400 from the route.
    BadJson,
    /// `temperature: 5`: 400 from the route.
    BadParam,
    /// Declared body over --max-body: 413 from the route.
    BodyTooLarge,
    /// `Content-Length: abc`: 400 from hyper, as JSON.
    BadContentLength,
    /// `GET /health` without a version: 400 from hyper, as JSON.
    Http09,
    /// Binary garbage: 400 from hyper, as JSON.
    Garbage,
    /// A 1 MB header: 431 from hyper, as JSON.
    HugeHeader,
    /// Half a head, then the client leaves.
    HalfHead,
    /// A head and half a body, then the client leaves.
    HalfBody,
    /// A JSON schema 300 `$ref`s deep: 400 naming the field and the limit.
    DeepSchema,
    /// A JSON schema 200 `$ref`s deep: answered.
    NearSchema,
    /// One key's prompt ending in a secret, then the other key's guesses of it.
    TenantProbe,
}

const ACTS: [(Act, u32); 17] = [
    (Act::Whole, 20),
    (Act::Stream, 20),
    (Act::StreamLeave, 8),
    (Act::WholeLeave, 8),
    (Act::TinyTemperature, 4),
    (Act::BadJson, 4),
    (Act::BadParam, 4),
    (Act::BodyTooLarge, 4),
    (Act::BadContentLength, 4),
    (Act::Http09, 4),
    (Act::Garbage, 4),
    (Act::HugeHeader, 2),
    (Act::HalfHead, 4),
    (Act::HalfBody, 4),
    (Act::DeepSchema, 2),
    (Act::NearSchema, 2),
    (Act::TenantProbe, 2),
];

/// xorshift64*, seeded per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn act(&mut self) -> Act {
        let total: u32 = ACTS.iter().map(|a| a.1).sum();
        let mut r = self.below(total as u64) as u32;
        for (act, w) in ACTS {
            if r < w {
                return act;
            }
            r -= w;
        }
        unreachable!()
    }
}

/// What became of one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// The expected answer, whole.
    Answered,
    /// 429 with Retry-After and a JSON error (the queue was full).
    Refused,
    /// The client left on purpose (nothing to check).
    Left,
}

#[derive(Default)]
struct Tally {
    /// (act, outcome) -> count
    counts: BTreeMap<(Act, Outcome), u64>,
}

/// A completion request with the first key.
fn post(path: &str, body: &str, close: bool) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{AUTH_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" },
    )
    .into_bytes()
}

/// `{"$ref": a0}`, each `a_i` a `$ref` to the next, the last a string.
fn ref_chain(n: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let d = if i + 1 == n {
            serde_json::json!({"type": "string"})
        } else {
            serde_json::json!({"$ref": format!("#/$defs/a{}", i + 1)})
        };
        defs.insert(format!("a{i}"), d);
    }
    serde_json::json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

/// A completion constrained by `schema`.
fn schema_completion(schema: &serde_json::Value, max_tokens: u64) -> String {
    serde_json::json!({"prompt": "hi", "max_tokens": max_tokens, "response_format":
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    .to_string()
}

/// Completions on `/v1/completions` beside the rounds' own: the probes' and the schemas'
/// requests, by status, and every prompt the second key sent (its token ids), which bounds
/// what its requests may reuse.
#[derive(Default)]
struct Probes {
    ok: u64,
    refused: u64,
    /// Token ids of every prompt sent with the second key.
    b_prompts: Vec<Vec<u32>>,
    /// Guesses made, and those whose cached tokens reached the secret's digit.
    guesses: u64,
}

/// A completion of one token with `auth`, retried after a 429 (counted); its cached tokens.
fn probe_completion(server: &Server, auth: &str, prompt: &str, probes: &Mutex<Probes>) -> u64 {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    loop {
        let a = server.request("POST", "/v1/completions", &[auth], &body.to_string());
        if refusal(a.status, &a.headers, "probe") {
            probes.lock().unwrap().refused += 1;
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        assert_eq!(a.status, 200, "probe: {}", a.text());
        probes.lock().unwrap().ok += 1;
        return a.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens");
    }
}

/// A prompt's token ids as `/v1/completions` encodes it (with BOS, special text as text).
fn tokens(server: &Server, prompt: &str) -> Vec<u32> {
    let body = serde_json::json!({"content": prompt, "add_special": true, "parse_special": false});
    let a = server.request("POST", "/tokenize", &[AUTH_B], &body.to_string());
    assert_eq!(a.status, 200, "tokenize: {}", a.text());
    let v = a.json();
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("tokenize: {v}"))
        .iter()
        .map(|t| t.as_u64().expect("a token id") as u32)
        .collect()
}

/// The first key's prompt ends in a secret PIN (a stream left generating, so that its slot
/// holds the secret while the guesses come); the second key guesses its next digit (the right
/// one among two wrong ones, in random order). Each guess reuses at most the longest prefix it
/// shares with a prompt the second key sent before it (or beside it).
fn tenant_probe(server: &Server, rng: &mut Rng, nonce: u64, probes: &Mutex<Probes>) {
    let head = format!("Probe {nonce:x}: the assistant keeps the user's secret. The PIN is 7");
    let pin: Vec<u64> = (0..3).map(|_| rng.below(10)).collect();
    let secret = format!("{head} {} {} {}. Hello.", pin[0], pin[1], pin[2]);
    let body = serde_json::json!({"prompt": secret, "max_tokens": 900, "ignore_eos": true,
        "stream": true, "temperature": 0});
    // Left (the connection closed) when the guesses are done.
    let _secret = loop {
        let mut s = server.connect();
        s.write_all(&post("/v1/completions", &body.to_string(), true))
            .unwrap();
        let (status, headers) = read_head(&mut s);
        if refusal(status, &headers, "probe's secret") {
            probes.lock().unwrap().refused += 1;
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        assert_eq!(status, 200, "probe's secret");
        probes.lock().unwrap().ok += 1;
        break s;
    };
    let mut digits = vec![pin[0], (pin[0] + 1 + rng.below(9)) % 10];
    digits.push((digits[1] + 1 + rng.below(8)) % 10);
    if digits[2] == pin[0] {
        digits[2] = (digits[2] + 1) % 10;
    }
    for _ in 0..rng.below(3) {
        digits.rotate_left(1);
    }
    for d in digits {
        let guess = format!("{head} {d}.");
        let ids = tokens(server, &guess);
        let index = {
            let mut p = probes.lock().unwrap();
            p.b_prompts.push(ids.clone());
            p.b_prompts.len() - 1
        };
        let cached = probe_completion(server, AUTH_B, &guess, probes);
        let mut p = probes.lock().unwrap();
        let bound = (p.b_prompts.iter().enumerate())
            .filter(|&(i, _)| i != index)
            .map(|(_, other)| other.iter().zip(&ids).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        p.guesses += 1;
        assert!(
            cached as usize <= bound,
            "the second key's guess {guess:?} reused {cached} tokens, more than the {bound} it shares with its own prompts (the first key's secret leaks)"
        );
    }
}

fn completion(prompt: &str, max_tokens: u64, stream: bool, extra: &str) -> String {
    format!(
        r#"{{"prompt": {}, "max_tokens": {max_tokens}, "ignore_eos": true, "stream": {stream}{extra}}}"#,
        serde_json::Value::from(prompt)
    )
}

const PROMPTS: [&str; 4] = [
    "hello",
    "Once upon a time, in a land far away,",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "日本語のテキスト and emoji 😀",
];

/// Whether a 429 is a proper refusal; panics otherwise.
fn refusal(status: u16, headers: &[(String, String)], what: &str) -> bool {
    if status != 429 {
        return false;
    }
    assert!(
        headers.iter().any(|(n, v)| n == "retry-after" && v == "1"),
        "{what}: 429 without Retry-After: {headers:?}"
    );
    true
}

/// A whole completion of exactly `max_tokens` tokens; its text.
fn check_whole(a: &Answer, max_tokens: u64, what: &str) -> String {
    assert_eq!(a.status, 200, "{what}: {}", a.text());
    let v = a.json();
    assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{what}: {v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{what}: {v}");
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no text in {v}"))
        .to_string()
}

/// Read an event stream to its end: every `data:` line is JSON until `[DONE]`, the last chunk
/// says `length` with `max_tokens` tokens of usage.
fn check_stream(s: &mut TcpStream, max_tokens: u64, what: &str) {
    let mut reader = BufReader::new(s);
    let mut last: Option<serde_json::Value> = None;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{what}: stream cut: {e}"));
        assert!(n > 0, "{what}: stream ended before [DONE]; last {last:?}");
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)
            .unwrap_or_else(|e| panic!("{what}: chunk is not JSON ({e}): {data:?}"));
        assert!(v.get("error").is_none(), "{what}: error in the stream: {v}");
        last = Some(v);
    }
    let last = last.unwrap_or_else(|| panic!("{what}: no chunk before [DONE]"));
    assert_eq!(
        last["choices"][0]["finish_reason"], "length",
        "{what}: {last}"
    );
    assert_eq!(
        last["usage"]["completion_tokens"], max_tokens,
        "{what}: {last}"
    );
}

/// Send a request that the server rejects before the route and check its JSON error. Returns
/// false if the server reset the connection before the client could read the answer (possible
/// only for a request it stops reading half way: the huge header).
fn hostile(server: &Server, raw: &[u8], status: u16, what: &str) -> bool {
    let mut s = server.connect();
    if s.write_all(raw).is_err() {
        return false;
    }
    let mut head = [0u8; 1];
    match s.peek(&mut head) {
        Ok(1) => {}
        _ if status == 431 => return false,
        r => panic!("{what}: no answer ({r:?})"),
    }
    read_answer(&mut s).expect_error(status, what);
    true
}

/// The greedy answers the `temperature: 1e-38` ones are compared with, by prompt and length.
#[derive(Default)]
struct Greedy {
    made: BTreeMap<String, String>,
    /// 429s while making them.
    refused: u64,
}

fn round(
    server: &Server,
    rng: &mut Rng,
    greedy: &Mutex<Greedy>,
    probes: &Mutex<Probes>,
) -> (Act, Outcome) {
    let act = rng.act();
    let what = format!("{act:?}");
    let prompt = PROMPTS[rng.below(PROMPTS.len() as u64) as usize];
    let max_tokens = 1 + rng.below(32);
    let outcome = match act {
        Act::Whole | Act::TinyTemperature => {
            let extra = if act == Act::TinyTemperature {
                r#", "temperature": 1e-38"#
            } else {
                ""
            };
            let mut s = server.connect();
            s.write_all(&post(
                "/v1/completions",
                &completion(prompt, max_tokens, false, extra),
                true,
            ))
            .unwrap();
            let a = read_answer(&mut s);
            if refusal(a.status, &a.headers, &what) {
                a.expect_error(429, &what);
                Outcome::Refused
            } else {
                let text = check_whole(&a, max_tokens, &what);
                if act == Act::TinyTemperature {
                    // Compare with a greedy answer of the same length (made once per prompt).
                    let key = format!("{prompt}\u{0}{max_tokens}");
                    let want = greedy.lock().unwrap().made.get(&key).cloned();
                    let want = want.unwrap_or_else(|| {
                        let body = completion(prompt, max_tokens, false, r#", "temperature": 0"#);
                        loop {
                            let a = server.request("POST", "/v1/completions", &[AUTH_A], &body);
                            if refusal(a.status, &a.headers, "greedy") {
                                greedy.lock().unwrap().refused += 1;
                                std::thread::sleep(Duration::from_secs(1));
                                continue;
                            }
                            let t = check_whole(&a, max_tokens, "greedy");
                            greedy.lock().unwrap().made.insert(key, t.clone());
                            break t;
                        }
                    });
                    assert_eq!(text, want, "temperature 1e-38 is not the greedy limit");
                }
                Outcome::Answered
            }
        }
        Act::Stream | Act::StreamLeave => {
            let mut s = server.connect();
            s.write_all(&post(
                "/v1/completions",
                &completion(prompt, max_tokens, true, ""),
                true,
            ))
            .unwrap();
            let (status, headers) = read_head(&mut s);
            if refusal(status, &headers, &what) {
                Outcome::Refused
            } else {
                assert_eq!(status, 200, "{what}");
                if act == Act::Stream {
                    check_stream(&mut s, max_tokens, &what);
                    Outcome::Answered
                } else {
                    let mut buf = vec![0u8; 1 + rng.below(200) as usize];
                    let _ = s.read(&mut buf);
                    Outcome::Left
                }
            }
        }
        Act::WholeLeave => {
            let mut s = server.connect();
            s.write_all(&post(
                "/v1/completions",
                &completion(prompt, 32 + max_tokens, false, ""),
                true,
            ))
            .unwrap();
            std::thread::sleep(Duration::from_millis(rng.below(50)));
            Outcome::Left
        }
        Act::BadJson => {
            let a = server.request("POST", "/v1/completions", &[AUTH_A], r#"{"prompt": "hi", "#);
            a.expect_error(400, &what);
            Outcome::Answered
        }
        Act::BadParam => {
            let body = completion(prompt, max_tokens, false, r#", "temperature": 5"#);
            let e = server
                .request("POST", "/v1/completions", &[AUTH_A], &body)
                .expect_error(400, &what);
            assert_eq!(e["param"], "temperature", "{e}");
            Outcome::Answered
        }
        Act::DeepSchema => {
            let body = schema_completion(&ref_chain(300), max_tokens);
            let e = server
                .request("POST", "/v1/completions", &[AUTH_A], &body)
                .expect_error(400, &what);
            assert_eq!(e["param"], "response_format.json_schema.schema", "{e}");
            let msg = e["message"].as_str().unwrap_or_default();
            assert!(msg.contains("deeper than 256"), "{what}: {msg}");
            Outcome::Answered
        }
        Act::NearSchema => {
            let body = schema_completion(&ref_chain(200), max_tokens);
            let a = server.request("POST", "/v1/completions", &[AUTH_A], &body);
            if refusal(a.status, &a.headers, &what) {
                a.expect_error(429, &what);
                Outcome::Refused
            } else {
                assert_eq!(a.status, 200, "{what}: {}", a.text());
                let v = a.json();
                let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                assert!(n >= 1 && n <= max_tokens, "{what}: {v}");
                let text = v["choices"][0]["text"].as_str().unwrap_or_default();
                assert!(
                    text.trim_start().starts_with('"'),
                    "{what}: not a JSON string: {v}"
                );
                Outcome::Answered
            }
        }
        Act::TenantProbe => {
            let nonce = rng.next();
            tenant_probe(server, rng, nonce, probes);
            Outcome::Answered
        }
        Act::BodyTooLarge => {
            let raw = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{AUTH_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"prompt\": ",
                MAX_BODY + 1 + rng.below(1 << 20) as usize
            );
            assert!(hostile(server, raw.as_bytes(), 413, &what));
            Outcome::Answered
        }
        Act::BadContentLength => {
            let raw = b"POST /v1/completions HTTP/1.1\r\nHost: k\r\nContent-Length: abc\r\n\r\n";
            assert!(hostile(server, raw, 400, &what));
            Outcome::Answered
        }
        Act::Http09 => {
            assert!(hostile(server, b"GET /health\r\n\r\n", 400, &what));
            Outcome::Answered
        }
        Act::Garbage => {
            let mut raw: Vec<u8> = (0..64 + rng.below(512)).map(|_| rng.next() as u8).collect();
            raw[0] = 0xff; // never a method's first byte
            raw.extend_from_slice(b"\r\n\r\n");
            assert!(hostile(server, &raw, 400, &what));
            Outcome::Answered
        }
        Act::HugeHeader => {
            let raw = [
                &b"GET /health HTTP/1.1\r\nX-Big: "[..],
                &vec![b'a'; 1 << 20],
                b"\r\n\r\n",
            ]
            .concat();
            if hostile(server, &raw, 431, &what) {
                Outcome::Answered
            } else {
                Outcome::Left
            }
        }
        Act::HalfHead => {
            let mut s = server.connect();
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
                .unwrap();
            Outcome::Left
        }
        Act::HalfBody => {
            let mut s = server.connect();
            s.write_all(
                format!("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{AUTH_A}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"pro").as_bytes(),
            )
            .unwrap();
            std::thread::sleep(Duration::from_millis(rng.below(20)));
            Outcome::Left
        }
    };
    (act, outcome)
}

/// The server's resident set in KiB (Linux), if it can be read.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Every `kiln_requests_total` series: (endpoint, status) -> count.
fn request_counts(server: &Server) -> BTreeMap<(String, String), u64> {
    let a = server.request("GET", "/metrics", &[], "");
    assert_eq!(a.status, 200);
    a.text()
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("kiln_requests_total{endpoint=\"")?;
            let (endpoint, rest) = rest.split_once("\",status=\"")?;
            let (status, value) = rest.split_once("\"} ")?;
            Some(((endpoint.into(), status.into()), value.parse().ok()?))
        })
        .collect()
}

/// Wait until no request is in the engine.
fn wait_idle(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let h = server.request("GET", "/health", &[], "").json();
        if h["slots_in_use"] == 0 && h["queue_depth"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the engine never emptied: {h}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "soak test, minutes long: cargo test --release --test server_soak -- --ignored --nocapture"]
fn sixteen_hostile_clients_for_minutes_then_sigterm() {
    let secs: u64 = std::env::var("KILN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut server = Server::start(
        &common::random_model("random-llama-q4_0"),
        &[
            "-P",
            &PARALLEL.to_string(),
            "--queue",
            &QUEUE.to_string(),
            "--max-body",
            &MAX_BODY.to_string(),
            "--header-timeout",
            "2",
            "--body-timeout",
            "2",
            "--idle-timeout",
            "2",
            "--shutdown-timeout",
            "120",
            "--metrics-public",
            "--api-key",
            KEYS,
        ],
    );
    let pid = server.child.id();
    let stop = AtomicBool::new(false);
    let greedy = Mutex::new(Greedy::default());
    let probes = Mutex::new(Probes::default());
    let start = Instant::now();
    let warmup = Duration::from_secs(secs / 5);
    // RSS every 2 s, while the clients run.
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let total = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (server, stop, greedy, probes) = (&server, &stop, &greedy, &probes);
                scope.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((i as u64 + 1) * 0x1000_0001));
                    let mut tally = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        let r = round(server, &mut rng, greedy, probes);
                        *tally.counts.entry(r).or_default() += 1;
                        if r.1 == Outcome::Refused {
                            // Retry-After: 1
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                    tally
                })
            })
            .collect();
        while start.elapsed() < Duration::from_secs(secs)
            && clients.iter().all(|c| !c.is_finished())
        {
            std::thread::sleep(Duration::from_secs(2));
            if let Some(kib) = rss_kib(pid) {
                samples.push((start.elapsed().as_secs_f64(), kib));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let mut total = Tally::default();
        for c in clients {
            let t = c.join().expect("a client failed (see its panic above)");
            for (k, n) in t.counts {
                *total.counts.entry(k).or_default() += n;
            }
        }
        total
    });
    let elapsed = start.elapsed();

    // The server's counts agree with the clients'.
    wait_idle(&server);
    let counts = request_counts(&server);
    let n = |act: Act, o: Outcome| total.counts.get(&(act, o)).copied().unwrap_or(0);
    let served = |endpoint: &str, status: &str| {
        counts
            .get(&(endpoint.to_string(), status.to_string()))
            .copied()
            .unwrap_or(0)
    };
    let c = "/v1/completions";
    let (probes_ok, probes_refused, guesses) = {
        let p = probes.lock().unwrap();
        (p.ok, p.refused, p.guesses)
    };
    let answered_200 = n(Act::Whole, Outcome::Answered)
        + n(Act::TinyTemperature, Outcome::Answered)
        + n(Act::Stream, Outcome::Answered)
        + n(Act::StreamLeave, Outcome::Left)
        + n(Act::NearSchema, Outcome::Answered)
        + probes_ok;
    let greedy_made = greedy.lock().unwrap().made.len() as u64;
    let left_whole = n(Act::WholeLeave, Outcome::Left);
    let refused: u64 = ACTS
        .iter()
        .map(|&(a, _)| n(a, Outcome::Refused))
        .sum::<u64>()
        + greedy.lock().unwrap().refused
        + probes_refused;
    // A client that left a whole completion is counted `cancelled`, or 200 if its answer was
    // ready first, or 429 if it was refused, or not at all if it left before the server read
    // its request.
    let extra_200 = served(c, "200").checked_sub(answered_200 + greedy_made);
    let extra_429 = served(c, "429").checked_sub(refused);
    assert!(
        extra_200.is_some()
            && extra_429.is_some()
            && extra_200.unwrap() + extra_429.unwrap() + served(c, "cancelled") <= left_whole,
        "server: 200 {}, 429 {}, cancelled {}; clients: 200 {answered_200} (+{greedy_made} greedy), 429 {refused}, left {left_whole}",
        served(c, "200"),
        served(c, "429"),
        served(c, "cancelled"),
    );
    // A body cut short by its client is a 400 on the route too (nobody reads it).
    let bad = n(Act::BadJson, Outcome::Answered)
        + n(Act::BadParam, Outcome::Answered)
        + n(Act::DeepSchema, Outcome::Answered);
    let half_bodies = n(Act::HalfBody, Outcome::Left);
    assert!(
        served(c, "400") >= bad && served(c, "400") <= bad + half_bodies,
        "400s on the route: server {}, clients {bad} (+{half_bodies} half bodies)",
        served(c, "400")
    );
    assert_eq!(
        served(c, "413"),
        n(Act::BodyTooLarge, Outcome::Answered),
        "413s"
    );
    let hyper_400 = n(Act::BadContentLength, Outcome::Answered)
        + n(Act::Http09, Outcome::Answered)
        + n(Act::Garbage, Outcome::Answered);
    assert_eq!(served("other", "400"), hyper_400, "hyper's 400s");
    assert!(served("other", "431") >= n(Act::HugeHeader, Outcome::Answered));
    let after_warmup = samples.iter().filter(|s| s.0 >= warmup.as_secs_f64());
    let rss_after_warmup = after_warmup.clone().next().map(|s| s.1);
    let rss_peak = after_warmup.map(|s| s.1).max();
    let rss_end = samples.last().map(|s| s.1);

    // SIGTERM with 16 streams in progress: every one of them finishes.
    let barrier = Barrier::new(CLIENTS + 1);
    let shutdown_took = std::thread::scope(|scope| {
        let streams: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (server, barrier) = (&server, &barrier);
                scope.spawn(move || {
                    let mut s = server.connect();
                    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                    let body = completion(PROMPTS[i % PROMPTS.len()], SHUTDOWN_TOKENS, true, "");
                    s.write_all(&post("/v1/completions", &body, true)).unwrap();
                    let (status, _) = read_head(&mut s);
                    barrier.wait();
                    assert_eq!(status, 200, "stream {i} at shutdown");
                    check_stream(
                        &mut s,
                        SHUTDOWN_TOKENS,
                        &format!("stream {i} across SIGTERM"),
                    );
                })
            })
            .collect();
        barrier.wait();
        // And two connections that never finish their request.
        let mut half = server.connect();
        half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
            .unwrap();
        let _silent = server.connect();
        let shutdown = Instant::now();
        server.terminate();
        for s in streams {
            s.join().expect("a stream was cut by the shutdown");
        }
        shutdown
    });
    let exit = server.wait_exit(Duration::from_secs(150));
    assert!(
        exit.is_some_and(|e| e.success()),
        "exit after SIGTERM: {exit:?}"
    );
    let shutdown_took = shutdown_took.elapsed();
    assert!(
        TcpStream::connect(&server.addr).is_err(),
        "still accepting after exit"
    );

    eprintln!(
        "soak: {CLIENTS} clients, {:.0} s, -P {PARALLEL} --queue {QUEUE}",
        elapsed.as_secs_f64()
    );
    let mut by_act: BTreeMap<Act, BTreeMap<Outcome, u64>> = BTreeMap::new();
    for (&(a, o), &k) in &total.counts {
        by_act.entry(a).or_default().insert(o, k);
    }
    for (a, outcomes) in &by_act {
        eprintln!("  {a:?}: {outcomes:?}");
    }
    let rounds: u64 = total.counts.values().sum();
    eprintln!("  rounds {rounds}; server's kiln_requests_total: {counts:?}");
    eprintln!(
        "  cross-key probes: {guesses} guesses, none reused past its own key's prefixes; probe completions 200 {probes_ok}, 429 {probes_refused}"
    );
    eprintln!(
        "  RSS KiB: after warm-up ({:.0} s) {rss_after_warmup:?}, peak after {rss_peak:?}, end {rss_end:?}; samples {}",
        warmup.as_secs_f64(),
        samples.len()
    );
    eprintln!(
        "  SIGTERM with {CLIENTS} streams in progress: all finished, exit in {:.1} s",
        shutdown_took.as_secs_f64()
    );
    if let (Some(w), Some(e)) = (rss_after_warmup, rss_end) {
        // Flat: at most 5% and 1 MiB of allocator slack above the warmed-up size (a leak of
        // 16 bytes a request is over 2 MiB in the default run's ~140,000 rounds).
        assert!(
            e <= w + w / 20 + 1024,
            "RSS grew from {w} KiB after warm-up to {e} KiB"
        );
    }
}
