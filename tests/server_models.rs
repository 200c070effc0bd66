//! The model name a request carries: a single-model server answers any name on every route
//! (OpenAI, llama-server, Ollama, Anthropic) and reports its own (`--alias`, else the file's
//! stem), lists the alias in `/v1/models` and `/api/tags`, and under `--strict-model` refuses
//! another name with 404 in each API's shape.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::Server;
use serde_json::{json, Value};

fn model() -> std::path::PathBuf {
    common::random_model("random-llama-f32")
}

/// `--chat-template-file` with a ChatML template (the random model's file has none).
fn template() -> String {
    let path = common::tmp_dir().join("server_models_chatml.jinja");
    std::fs::write(
        &path,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
         {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

/// Each generating route, a request to it naming `name`, and where its answer reports the model.
fn requests(name: &str) -> Vec<(&'static str, Value, &'static str)> {
    let chat = json!([{"role": "user", "content": "hi"}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": name, "messages": chat, "max_tokens": 2}),
            "/model",
        ),
        (
            "/v1/completions",
            json!({"model": name, "prompt": "hi", "max_tokens": 2}),
            "/model",
        ),
        (
            "/completion",
            json!({"model": name, "prompt": "hi", "n_predict": 2}),
            "/model",
        ),
        (
            "/v1/embeddings",
            json!({"model": name, "input": "hi"}),
            "/model",
        ),
        (
            "/api/generate",
            json!({"model": name, "prompt": "hi", "stream": false,
                   "options": {"num_predict": 2}}),
            "/model",
        ),
        (
            "/api/chat",
            json!({"model": name, "messages": chat, "stream": false,
                   "options": {"num_predict": 2}}),
            "/model",
        ),
        (
            "/v1/messages",
            json!({"model": name, "messages": chat, "max_tokens": 2}),
            "/model",
        ),
    ]
}

#[test]
fn any_model_name_is_answered_under_the_servers_own() {
    let t = template();
    let s = Server::start(
        &model(),
        &[
            "--embeddings",
            "--pooling",
            "mean",
            "--chat-template-file",
            &t,
            "--alias",
            "house-model",
            "--alias",
            "other",
        ],
    );
    // The alias is the name listed.
    let list = s.request("GET", "/v1/models", &[], "").json();
    assert_eq!(list["data"][0]["id"], "house-model", "{list}");
    let tags = s.request("GET", "/api/tags", &[], "").json();
    assert_eq!(tags["models"][0]["name"], "house-model:latest", "{tags}");

    for (path, body, at) in requests("claude-sonnet-4-5") {
        let a = s.request("POST", path, &[], &body.to_string());
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        let v = a.json();
        // (llama-server's /completion reports the model too; every route names the server's.)
        assert_eq!(
            v.pointer(at).cloned(),
            Some(json!("house-model")),
            "{path}: {v}"
        );
    }
    // A name the server knows is reported as the request gave it.
    for name in ["other", "random-llama-f32"] {
        let body = json!({"model": name, "prompt": "hi", "max_tokens": 1});
        let v = s
            .request("POST", "/v1/completions", &[], &body.to_string())
            .json();
        assert_eq!(v["model"], name, "{v}");
    }
}

#[test]
fn strict_model_refuses_another_name_on_every_route() {
    let t = template();
    let s = Server::start(
        &model(),
        &[
            "--embeddings",
            "--pooling",
            "mean",
            "--chat-template-file",
            &t,
            "--strict-model",
        ],
    );
    let list = s.request("GET", "/v1/models", &[], "").json();
    assert_eq!(list["data"][0]["id"], "random-llama-f32", "{list}");
    for (path, body, _) in requests("gpt-4") {
        let a = s.request("POST", path, &[], &body.to_string());
        assert_eq!(a.status, 404, "{path}: {}", a.text());
        assert!(a.text().contains("gpt-4"), "{path}: {}", a.text());
    }
    // The served model's own name still answers.
    let body = json!({"model": "random-llama-f32", "prompt": "hi", "max_tokens": 1});
    let a = s.request("POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
}
