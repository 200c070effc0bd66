//! Request fields kiln knows and does not implement are refused by name on every protocol
//! when they ask for something (a 400 whose message, and on OpenAI's routes `param`, names
//! the field), and accepted with the values that leave generation as it is, as clients that
//! send every field they know send them (SmolLM2).

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::Server;
use serde_json::{json, Value};

fn chat() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
}

fn with(mut base: Value, field: &str, value: Value) -> Value {
    match field.split_once('.') {
        Some((outer, inner)) => base[outer][inner] = value,
        None => base[field] = value,
    }
    base
}

#[test]
fn unimplemented_fields_are_refused_by_name() {
    let model = common::real_model("smollm2");
    let s = Server::start(&model, &[]);
    let completion = json!({"prompt": "Hello", "max_tokens": 2});
    let native = json!({"prompt": "Hello", "n_predict": 2});
    let ollama = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
        "stream": false, "options": {"num_predict": 2}});
    let generate =
        json!({"model": "smollm2", "prompt": "hi", "stream": false, "options": {"num_predict": 2}});
    let anthropic = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let refused: &[(&str, &Value, &str, Value)] = &[
        (
            "/v1/chat/completions",
            &chat(),
            "functions",
            json!([{"name": "f", "parameters": {}}]),
        ),
        (
            "/v1/chat/completions",
            &chat(),
            "function_call",
            json!({"name": "f"}),
        ),
        (
            "/v1/chat/completions",
            &chat(),
            "reasoning_effort",
            json!("low"),
        ),
        (
            "/v1/chat/completions",
            &chat(),
            "modalities",
            json!(["text", "audio"]),
        ),
        ("/v1/chat/completions", &chat(), "mirostat", json!(2)),
        (
            "/v1/chat/completions",
            &chat(),
            "samplers",
            json!(["temperature", "top_k", "top_p", "min_p"]),
        ),
        ("/v1/completions", &completion, "echo", json!(true)),
        ("/v1/completions", &completion, "best_of", json!(3)),
        ("/v1/completions", &completion, "typical_p", json!(0.5)),
        ("/completion", &native, "dry_multiplier", json!(0.8)),
        ("/completion", &native, "xtc_probability", json!(0.5)),
        ("/completion", &native, "n_cmpl", json!(2)),
        ("/completions", &native, "top_n_sigma", json!(1.0)),
        ("/api/chat", &ollama, "options.mirostat", json!(1)),
        ("/api/generate", &generate, "think", json!(true)),
        ("/api/generate", &generate, "options.tfs_z", json!(0.9)),
        ("/api/generate", &generate, "logprobs", json!(true)),
        (
            "/v1/messages",
            &anthropic,
            "mcp_servers",
            json!([{"url": "https://example.com"}]),
        ),
    ];
    for (path, base, field, value) in refused {
        let body = with((*base).clone(), field, value.clone());
        let a = s.request("POST", path, &[], &body.to_string());
        assert_eq!(a.status, 400, "{path} {field}: {}", a.text());
        let v = a.json();
        let message = (v["error"]["message"].as_str())
            .or(v["error"].as_str())
            .unwrap_or_else(|| panic!("{path}: {v}"));
        assert!(
            message.contains(field) && message.contains("not supported"),
            "{path}: {message}"
        );
        if path.starts_with("/v1/c") || !path.starts_with("/v1/") && !path.starts_with("/api/") {
            assert_eq!(v["error"]["param"], *field, "{path}");
        }
    }

    // The values that ask nothing are accepted, as SillyTavern and Ollama's clients send them;
    // repeat_last_n works on the OpenAI routes too.
    let quiet = json!({"mirostat": 0, "mirostat_tau": 5, "typical_p": 1, "top_n_sigma": -1,
        "xtc_probability": 0, "xtc_threshold": 0.1, "dry_multiplier": 0, "dry_base": 1.75,
        "min_keep": 0, "dynatemp_range": 0, "n_keep": 0, "lora": [],
        "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
        "repeat_last_n": 64, "user": "u", "store": false, "metadata": {"a": "b"}});
    for (path, base) in [
        ("/v1/chat/completions", chat()),
        ("/v1/completions", completion),
        ("/completion", native),
    ] {
        let mut body = base;
        body.as_object_mut()
            .unwrap()
            .extend(quiet.as_object().unwrap().clone());
        let a = s.request("POST", path, &[], &body.to_string());
        assert_eq!(a.status, 200, "{path}: {}", a.text());
    }
    let body = with(
        with(ollama, "options.mirostat", json!(0)),
        "think",
        json!(false),
    );
    let body = with(
        with(body, "options.typical_p", json!(1.0)),
        "options.num_ctx",
        json!(4096),
    );
    let a = s.request("POST", "/api/chat", &[], &body.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    let body = with(anthropic, "metadata", json!({"user_id": "u"}));
    let a = s.request("POST", "/v1/messages", &[], &body.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    let a = s.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &with(chat(), "repeat_last_n", json!(-2)).to_string(),
    );
    assert_eq!(
        a.expect_error(400, "repeat_last_n -2")["param"],
        "repeat_last_n"
    );
}
