//! `kiln serve`'s smaller guards and reports: Ollama's `quantization_level` from the file's
//! `general.file_type`; the `Host` check (DNS rebinding) on connections that arrive over
//! loopback when the server is bound to every address; the cap on embedding inputs on every
//! route; API keys containing commas from `--api-key-file`; request content as deep as a body
//! may be, rendered by a chat template; a burst of heavy schemas compiled a few at a time;
//! and a tool whose parameter schema fails named by its index.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::{read_answer, Answer, Server};
use kiln::gguf::{GgufFile, GgufWriter, Value as GgufValue};
use serde_json::{json, Value};

fn model() -> PathBuf {
    common::random_model("random-llama-q4_0")
}

/// `model()` with its `general.file_type` set to `ftype` (or removed), under `name`.
fn with_file_type(name: &str, ftype: Option<u32>) -> PathBuf {
    let f = GgufFile::open(model()).unwrap();
    let mut w = GgufWriter::from_file(&f);
    match ftype {
        Some(t) => w.set("general.file_type", GgufValue::U32(t)),
        None => w.remove("general.file_type"),
    };
    let path = common::tmp_dir().join(format!("{name}-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

fn ollama_levels(s: &Server) -> Vec<String> {
    let id = s.request("GET", "/v1/models", &[], "").json()["data"][0]["id"].clone();
    let tags = s.request("GET", "/api/tags", &[], "").json();
    let ps = s.request("GET", "/api/ps", &[], "").json();
    let show = s.request(
        "POST",
        "/api/show",
        &[],
        &json!({ "model": id }).to_string(),
    );
    assert_eq!(show.status, 200, "{}", show.text());
    [
        &tags["models"][0]["details"],
        &ps["models"][0]["details"],
        &show.json()["details"],
    ]
    .iter()
    .map(|d| {
        d["quantization_level"]
            .as_str()
            .unwrap_or_else(|| panic!("{d}"))
            .to_string()
    })
    .collect()
}

#[test]
fn ollama_quantization_level_is_the_files_type() {
    // A file that says Q4_K_M (llama_ftype 15) while its tensors are Q4_0.
    let said = with_file_type("ftype-q4_k_m", Some(15));
    let f = GgufFile::open(&said).unwrap();
    let dominant = kiln::gguf::summary::ModelSummary::from_file(&f).formats[0]
        .ty
        .clone();
    assert_eq!(dominant, "Q4_0");
    let s = Server::start(&said, &[]);
    assert_eq!(ollama_levels(&s), ["Q4_K_M"; 3]);
    drop(s);
    for (ftype, name) in [(7, "Q8_0"), (1, "F16"), (38, "MXFP4")] {
        let path = with_file_type(&format!("ftype-{ftype}"), Some(ftype));
        let s = Server::start(&path, &[]);
        assert_eq!(ollama_levels(&s)[2], name, "file_type {ftype}");
        drop(s);
        let _ = std::fs::remove_file(path);
    }
    // Without the key (or with one kiln has no name for): the dominant tensor type.
    for (ftype, tag) in [(None, "none"), (Some(999), "999")] {
        let path = with_file_type(&format!("ftype-{tag}"), ftype);
        let s = Server::start(&path, &[]);
        assert_eq!(ollama_levels(&s), ["Q4_0"; 3], "file_type {tag}");
        drop(s);
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(said);
}

/// A request on a new connection to `addr` with `Host: host`.
fn with_host(addr: SocketAddr, host: &str) -> Answer {
    let body = r#"{"prompt": "hi", "max_tokens": 1}"#;
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(raw.as_bytes()).unwrap();
    read_answer(&mut s)
}

/// This machine's address on its default route, if it has one (no packet is sent).
fn outward_ip() -> Option<IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    Some(s.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

#[test]
fn bound_to_every_address_loopback_connections_get_the_host_check() {
    let server = Server::start(
        &model(),
        &["--host", "0.0.0.0", "--allowed-host", " Kiln.LAN. "],
    );
    let port: u16 = server.addr.rsplit(':').next().unwrap().parse().unwrap();
    let lo: SocketAddr = ([127, 0, 0, 1], port).into();
    // DNS rebinding over loopback: refused, though the server listens on 0.0.0.0.
    let a = with_host(lo, "evil.example");
    let e = a.expect_error(403, "a foreign Host over loopback");
    assert!(
        e["message"].as_str().unwrap().contains("--allowed-host"),
        "{e}"
    );
    // The names of this server, normalized (case, port, trailing dot, brackets).
    for host in [
        "localhost",
        "LOCALHOST.:8080",
        "127.0.0.1",
        &format!("127.0.0.1:{port}"),
        "kiln.lan",
        "KILN.lan.:8080",
        "[::1]:80",
    ] {
        assert_eq!(with_host(lo, host).status, 200, "{host}");
    }
    // A connection from outside (on another address) is not checked: the server is public.
    if let Some(ip) = outward_ip() {
        let a = with_host((ip, port).into(), "evil.example");
        assert_eq!(a.status, 200, "over {ip}: {}", a.text());
    }
    drop(server);
    // Bound to `::`: IPv6 loopback, and IPv4 loopback as a mapped address, are checked too.
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        return;
    }
    let server = Server::start(&model(), &["--host", "::"]);
    let port: u16 = server.addr.rsplit(':').next().unwrap().parse().unwrap();
    for lo in [
        SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port)),
        SocketAddr::from(([127, 0, 0, 1], port)),
    ] {
        // (IPv4 reaches `::` only where the socket is dual-stack, Linux's default.)
        if lo.is_ipv4() && TcpStream::connect(lo).is_err() {
            continue;
        }
        with_host(lo, "evil.example").expect_error(403, &format!("over {lo}"));
        assert_eq!(with_host(lo, "[::1]").status, 200, "{lo}");
        assert_eq!(with_host(lo, "localhost").status, 200, "{lo}");
    }
}

#[test]
fn embedding_inputs_are_capped_on_every_route() {
    let s = Server::start(&model(), &["--embeddings", "--pooling", "mean"]);
    let many = vec!["x"; 2049];
    let a = s.request(
        "POST",
        "/v1/embeddings",
        &[],
        &json!({ "input": many }).to_string(),
    );
    let e = a.expect_error(400, "2049 inputs");
    assert_eq!(e["param"], "input", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("at most 2048"),
        "{e}"
    );
    let id = s.request("GET", "/v1/models", &[], "").json()["data"][0]["id"].clone();
    let a = s.request(
        "POST",
        "/api/embed",
        &[],
        &json!({ "model": id, "input": many }).to_string(),
    );
    assert_eq!(a.status, 400, "{}", a.text());
    let msg = a.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("input") && msg.contains("at most 2048"),
        "{msg}"
    );
    // Within the cap, answered.
    let a = s.request(
        "POST",
        "/api/embed",
        &[],
        &json!({ "model": id, "input": ["a", "b", "c"] }).to_string(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["embeddings"].as_array().unwrap().len(), 3);
}

#[test]
fn api_keys_with_commas_come_from_the_key_file() {
    let path = common::tmp_dir().join(format!("keys-{}.txt", std::process::id()));
    std::fs::write(&path, "  key,with,commas  \n\n second key\n").unwrap();
    let s = Server::start(
        &model(),
        &[
            "--api-key-file",
            path.to_str().unwrap(),
            "--api-key",
            "flag-a,flag-b",
        ],
    );
    let status = |key: &str| {
        let auth = format!("Authorization: Bearer {key}");
        s.request("GET", "/v1/models", &[&auth], "").status
    };
    for good in ["key,with,commas", "second key", "flag-a", "flag-b"] {
        assert_eq!(status(good), 200, "{good}");
    }
    for bad in [
        "key",
        "with",
        "commas",
        "second",
        "flag-a,flag-b",
        "key,with",
    ] {
        assert_eq!(status(bad), 401, "{bad}");
    }
    drop(s);
    let _ = std::fs::remove_file(path);
    // The flags' help says where such a key goes.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("A key containing a comma goes in --api-key-file"),
        "{help}"
    );
}

/// `{"a": [{"a": [... "leaf" ...]}]}`, `depth` levels of JSON nesting.
fn deep_value(depth: usize) -> Value {
    let mut v = json!("leaf");
    for i in 0..depth {
        v = match i % 2 {
            0 => json!({ "a": v }),
            _ => json!([v]),
        };
    }
    v
}

#[test]
fn request_content_as_deep_as_a_body_may_be_renders_or_is_refused() {
    let template = common::repo_dir().join("tests/server/hermes_template.jinja");
    let s = Server::start(
        &model(),
        &["--chat-template-file", template.to_str().unwrap()],
    );
    let chat = |messages: Value, tools: Option<Value>| {
        let mut body = json!({"messages": messages, "max_tokens": 1});
        if let Some(t) = tools {
            body["tools"] = t;
        }
        s.request("POST", "/v1/chat/completions", &[], &body.to_string())
    };
    let call = |arguments: Value| {
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ])
    };
    // Arguments as an object 119 deep (the body's nesting, 128 at most, around it), and as a
    // text 300 deep (a string to the body; too deep to read as an object, so kept a text).
    let a = chat(call(deep_value(119)), None);
    assert_eq!(a.status, 200, "{}", a.text());
    let text = format!("{}\"leaf\"{}", "[".repeat(300), "]".repeat(300));
    let a = chat(call(json!(text)), None);
    assert_eq!(a.status, 200, "{}", a.text());
    // A tool whose parameters nest 120 deep, rendered into the prompt by `tojson`: the whole
    // prompt is rendered and counted (longer than this server's context of 1024).
    let mut params = json!({"type": "string"});
    for _ in 0..59 {
        params = json!({"type": "object", "properties": {"a": params}});
    }
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    let a = chat(json!([{"role": "user", "content": "go"}]), Some(tools));
    let e = a.expect_error(400, "a long prompt");
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    // Content parts 10,000 deep: past the body's nesting cap, a 400. (Written as text: a
    // value that deep would overflow the test's own stack.)
    let parts = format!(
        "{}\"x\"{}",
        r#"[{"type": "text", "text": "#.repeat(5_000),
        "}]".repeat(5_000)
    );
    let body =
        format!(r#"{{"messages": [{{"role": "user", "content": {parts}}}], "max_tokens": 1}}"#);
    let a = s.request("POST", "/v1/chat/completions", &[], &body);
    let e = a.expect_error(400, "10,000 deep");
    assert!(
        e["message"].as_str().unwrap().contains("recursion limit"),
        "{e}"
    );
    assert_eq!(s.request("GET", "/health", &[], "").status, 200);
}

/// The threads of process `pid` named `name` now.
fn threads_named(pid: u32, name: &str) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == name)
        .count()
}

/// `{"$ref": a0}`, each `a_i` a `$ref` to the next, the last a string.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let d = match i + 1 == n {
            true => json!({"type": "string"}),
            false => json!({"$ref": format!("#/$defs/a{}", i + 1)}),
        };
        defs.insert(format!("a{i}"), d);
    }
    json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

#[test]
fn a_burst_of_heavy_schemas_compiles_a_few_at_a_time() {
    // One sequence slot: one compile at a time, two waiting (--queue 2), more refused.
    let server = Server::start(&model(), &["-P", "1", "--queue", "2"]);
    let pid = server.child.id();
    // A thousand alternatives, each an object with a key of its own, and a chain of 200 `$ref`s.
    let mut any: Vec<Value> = (0..1000)
        .map(|i| json!({"type": "object", "properties": {format!("k{i}"): {"type": "integer"}}, "required": [format!("k{i}")]}))
        .collect();
    let chain = ref_chain(200);
    any.push(json!({"$ref": chain["$ref"]}));
    let schema = json!({"$defs": chain["$defs"], "anyOf": any});
    let body = json!({"prompt": "hi", "max_tokens": 2, "response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "schema": schema}}})
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conns: Vec<TcpStream> = (0..12).map(|_| server.connect()).collect();
    for c in &mut conns {
        c.write_all(request.as_bytes()).unwrap();
    }
    let readers: Vec<_> = conns
        .into_iter()
        .map(|mut c| std::thread::spawn(move || read_answer(&mut c)))
        .collect();
    let mut most = 0;
    while readers.iter().any(|r| !r.is_finished()) {
        most = most.max(threads_named(pid, "kiln-grammar"));
        std::thread::sleep(Duration::from_millis(2));
    }
    // One compiling, and at most one more ending: a place is given back as its compile
    // returns, a moment before its thread is gone.
    assert!(most <= 2, "{most} compile threads at once");
    let (mut ok, mut busy) = (0, 0);
    for r in readers {
        let a = r.join().unwrap();
        match a.status {
            200 => ok += 1,
            429 => {
                let e = a.expect_error(429, "busy");
                assert_eq!(a.header("retry-after"), Some("1"));
                let msg = e["message"].as_str().unwrap();
                assert!(msg.contains("--queue"), "{msg}");
                busy += 1;
            }
            s => panic!("{s}: {}", a.text()),
        }
    }
    assert_eq!(ok + busy, 12);
    assert!(ok >= 1, "none answered");
    assert_eq!(server.request("GET", "/health", &[], "").status, 200);
}

#[test]
fn a_tool_whose_schema_fails_is_named_by_its_index() {
    let template = common::repo_dir().join("tests/server/hermes_template.jinja");
    let server = Server::start(
        &model(),
        &["--chat-template-file", template.to_str().unwrap()],
    );
    let tool = |name: &str, params: Value| json!({"type": "function", "function": {"name": name, "parameters": params}});
    let body = json!({
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 4,
        "tool_choice": "required",
        "tools": [
            tool("good", json!({"type": "object", "properties": {"a": {"type": "string"}}})),
            tool("bad", json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}})),
        ],
    });
    let start = Instant::now();
    let a = server.request("POST", "/v1/chat/completions", &[], &body.to_string());
    let e = a.expect_error(400, "a bad tool schema");
    assert_eq!(e["param"], "tools[1].function.parameters", "{e}");
    assert!(start.elapsed() < Duration::from_secs(60));
    assert_eq!(server.request("GET", "/health", &[], "").status, 200);
}
