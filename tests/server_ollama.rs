//! Ollama's API on `kiln serve` (SmolLM2): `/api/chat` and `/api/generate` give the texts of
//! the OpenAI routes for the same conversation or prompt, whole and as NDJSON lines, with
//! Ollama's counts; `format` constrains the answer; `/api/embed` and `/api/embeddings` give
//! `/v1/embeddings`' vectors; `/api/tags`, `/api/ps`, `/api/show` and `/api/version` describe
//! the model; errors are `{"error": ...}` with the status Ollama gives; the API key applies and
//! `/metrics` counts the routes.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::{Answer, Server};
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;
use serde_json::{json, Value};

const AUTH: &str = "Authorization: Bearer ollama-test-key";

fn post(s: &Server, path: &str, body: &Value) -> Answer {
    s.request("POST", path, &[AUTH], &body.to_string())
}

fn ok(s: &Server, path: &str, body: &Value) -> Value {
    let a = post(s, path, body);
    assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    a.json()
}

/// The JSON lines of an NDJSON body (read raw: chunk-size lines are skipped).
fn lines(a: &Answer) -> Vec<Value> {
    assert_eq!(a.header("content-type"), Some("application/x-ndjson"));
    a.text()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
        .collect()
}

/// The error of an Ollama answer: its status and `{"error": "..."}` containing `needle`.
fn error(a: &Answer, status: u16, needle: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    let e = a.json();
    let msg = e["error"].as_str().unwrap_or_else(|| panic!("{e}"));
    assert!(msg.contains(needle), "{msg}");
}

/// The final line's counts and durations.
fn check_done(v: &Value, reason: &str, prompt: u64, eval: u64) {
    assert_eq!(v["done"], true, "{v}");
    assert_eq!(v["done_reason"], reason, "{v}");
    assert_eq!(v["prompt_eval_count"], prompt, "{v}");
    assert_eq!(v["eval_count"], eval, "{v}");
    let total = v["total_duration"].as_u64().unwrap();
    let parts = v["prompt_eval_duration"].as_u64().unwrap() + v["eval_duration"].as_u64().unwrap();
    assert!(total > 0 && parts <= total, "{v}");
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'), "{v}");
}

#[test]
fn ollama_routes_answer_as_ollama_does() {
    let model = common::real_model("smollm2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let s = Server::start(
        &model,
        &[
            "-P",
            "2",
            "--api-key",
            "ollama-test-key",
            "--embeddings",
            "--pooling",
            "mean",
            "--alias",
            "smol",
            "--strict-model",
        ],
    );
    let name = "smol:latest";

    // The model: listed with a tag, its details and its header.
    let tags = s.request("GET", "/api/tags", &[AUTH], "").json();
    let m = &tags["models"][0];
    let listed = m["name"].as_str().unwrap().to_string();
    assert!(listed.ends_with(":latest"), "{m}");
    assert_eq!(m["details"]["format"], "gguf");
    assert_eq!(m["details"]["family"], "llama");
    assert_eq!(m["details"]["quantization_level"], "Q4_1");
    assert_eq!(
        m["size"].as_u64(),
        Some(std::fs::metadata(&model).unwrap().len())
    );
    let ps = s.request("GET", "/api/ps", &[AUTH], "").json();
    assert_eq!(ps["models"][0]["name"], listed.as_str());
    let show = ok(&s, "/api/show", &json!({"model": listed}));
    assert_eq!(show["model_info"]["general.architecture"], "llama");
    assert!(show["model_info"].get("tokenizer.ggml.tokens").is_none());
    assert_eq!(show["template"].as_str(), tok.chat_template());
    assert!(show["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("embedding")));
    assert_eq!(show["parameters"], "num_ctx 1024");
    assert_eq!(show["model_info"]["llama.context_length"], 1024);
    assert!(show["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("tools")));
    let v = s.request("GET", "/api/version", &[AUTH], "").json();
    assert_eq!(v["version"], "0.12.0");

    // /api/chat: the OpenAI route's text for the same conversation, whole and streamed.
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colours."},
    ]);
    let openai = ok(
        &s,
        "/v1/chat/completions",
        &json!({"messages": messages, "temperature": 0, "max_tokens": 12}),
    );
    let want = openai["choices"][0]["message"]["content"].as_str().unwrap();
    let (prompt, eval) = (
        openai["usage"]["prompt_tokens"].as_u64().unwrap(),
        openai["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    // (As the `ollama` Python library sends them: no tools as `[]`, no format as `""`.)
    let body = json!({"model": name, "messages": messages, "stream": false,
                      "options": {"temperature": 0, "num_predict": 12, "num_ctx": 8192},
                      "keep_alive": "5m", "tools": [], "format": "", "think": null});
    let whole = ok(&s, "/api/chat", &body);
    assert_eq!(whole["model"], name);
    assert_eq!(whole["message"]["role"], "assistant");
    assert_eq!(whole["message"]["content"], want);
    check_done(&whole, "length", prompt, eval);
    let mut streamed = body.clone();
    streamed.as_object_mut().unwrap().remove("stream");
    let ls = lines(&post(&s, "/api/chat", &streamed));
    assert!(ls.len() > 2, "{ls:?}");
    let text: String = ls
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, want);
    assert!(ls[..ls.len() - 1].iter().all(|l| l["done"] == false));
    check_done(ls.last().unwrap(), "length", prompt, eval);

    // /api/generate: the prompt as a user turn after `system`, or as it is with `raw`.
    let g = ok(
        &s,
        "/api/generate",
        &json!({"model": name, "prompt": "Name three colours.", "system": "You are terse.",
                "stream": false, "options": {"temperature": 0, "num_predict": 12}}),
    );
    assert_eq!(g["response"], want);
    check_done(&g, "length", prompt, eval);
    let raw = ok(
        &s,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}),
    );
    let raw_body = json!({"model": name, "prompt": "The capital of France is", "raw": true,
                          "options": {"temperature": 0, "num_predict": 8}});
    let ls = lines(&post(&s, "/api/generate", &raw_body));
    let text: String = ls.iter().map(|l| l["response"].as_str().unwrap()).collect();
    assert_eq!(text, raw["choices"][0]["text"].as_str().unwrap());
    let load = ok(
        &s,
        "/api/generate",
        &json!({"model": name, "options": null, "raw": null}),
    );
    assert_eq!(load["done_reason"], "load");
    let load = ok(&s, "/api/chat", &json!({"model": name, "stream": false}));
    assert_eq!(load["done_reason"], "load");
    let unload = ok(&s, "/api/chat", &json!({"model": name, "keep_alive": 0}));
    assert_eq!(unload["done_reason"], "unload");

    // Ollama's own limits, wider than OpenAI's: `num_predict` past the context is cut to it,
    // any number of stops (empty ones dropped), a temperature past 2.
    let wide = ok(
        &s,
        "/api/chat",
        &json!({"model": name, "messages": messages, "stream": false,
                "options": {"temperature": 0, "num_predict": 100000,
                            "stop": ["", "a1", "a2", "a3", "a4", "a5", "a6"]}}),
    );
    assert_eq!(wide["done"], true, "{wide}");
    let hot = ok(
        &s,
        "/api/generate",
        &json!({"model": name, "prompt": "Hi", "stream": false,
                "options": {"temperature": 3.5, "num_predict": 2, "seed": 7}}),
    );
    assert_eq!(hot["eval_count"], 2, "{hot}");

    // `format`: a schema constrains the answer.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                        "required": ["n"], "additionalProperties": false});
    let f = ok(
        &s,
        "/api/chat",
        &json!({"model": name, "stream": false, "format": schema,
                "messages": [{"role": "user", "content": "Give me a number as JSON."}],
                "options": {"temperature": 0, "num_predict": 40}}),
    );
    let answer: Value = serde_json::from_str(f["message"]["content"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{f}: {e}"));
    assert!(answer["n"].is_i64(), "{answer}");

    // Embeddings: /v1/embeddings' vectors.
    let inputs = json!(["hello world", "kiln"]);
    let e = ok(&s, "/api/embed", &json!({"model": name, "input": inputs}));
    let v1 = ok(&s, "/v1/embeddings", &json!({"input": inputs}));
    for i in 0..2 {
        assert_eq!(e["embeddings"][i], v1["data"][i]["embedding"], "input {i}");
    }
    let norm: f64 = e["embeddings"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap().powi(2))
        .sum();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    let one = ok(
        &s,
        "/api/embeddings",
        &json!({"model": name, "prompt": "hello world"}),
    );
    let raw_v: Vec<f64> = serde_json::from_value(one["embedding"].clone()).unwrap();
    let n = raw_v.iter().map(|x| x * x).sum::<f64>().sqrt();
    for (a, b) in raw_v.iter().zip(e["embeddings"][0].as_array().unwrap()) {
        assert!((a / n - b.as_f64().unwrap()).abs() < 1e-5);
    }

    // Errors, as Ollama words them.
    error(
        &post(
            &s,
            "/api/chat",
            &json!({"model": "llama3:8b", "messages": messages}),
        ),
        404,
        "model 'llama3:8b' not found",
    );
    let img =
        json!({"model": name, "messages": [{"role": "user", "content": "?", "images": ["AA=="]}]});
    error(
        &post(&s, "/api/chat", &img),
        400,
        "images are not supported",
    );
    let zero = json!({"model": name, "prompt": "x", "options": {"num_predict": 0}});
    error(&post(&s, "/api/generate", &zero), 400, "num_predict = 0");
    let tmpl = json!({"model": name, "prompt": "x", "template": "{{ .Prompt }}"});
    error(
        &post(&s, "/api/generate", &tmpl),
        400,
        "template is not supported",
    );
    let dims = json!({"model": name, "input": "x", "dimensions": 8});
    error(&post(&s, "/api/embed", &dims), 400, "576 dimensions");
    let none = ok(&s, "/api/embed", &json!({"model": name, "input": []}));
    assert_eq!(none["embeddings"], json!([]));
    // (Router-level errors on /api/ too.)
    error(
        &s.request("POST", "/api/pull", &[AUTH], "{}"),
        404,
        "/api/pull",
    );
    error(&s.request("GET", "/api/chat", &[AUTH], ""), 405, "GET");
    let ctx = json!({"model": name, "prompt": "x", "context": [1, 2]});
    error(&post(&s, "/api/generate", &ctx), 400, "/api/chat");
    let a = s.request("POST", "/api/chat", &[AUTH], "{not json");
    error(&a, 400, "not valid JSON");
    let a = s.request(
        "POST",
        "/api/generate",
        &[],
        &json!({"model": name}).to_string(),
    );
    error(&a, 401, "");

    let counted = s.metric(
        "kiln_requests_total{endpoint=\"/api/chat\",status=\"200\"}",
        &[AUTH],
    );
    assert_eq!(counted, Some(6.0));
}
