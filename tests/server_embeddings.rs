//! `POST /v1/embeddings` over HTTP: OpenAI's input shapes and response, float and base64,
//! the reference's vectors (L2-normalized, as llama-server answers), `dimensions`, and the
//! OpenAI-shaped errors: no `--embeddings` (501, as llama-server), a model without pooling,
//! bad fields, an input longer than the context.

mod common;
#[path = "server/harness.rs"]
mod harness;

use base64::Engine as _;
use harness::Server;
use kiln::engine::pooling::cosine;
use serde_json::{json, Value};

fn post(s: &Server, body: &Value) -> harness::Answer {
    s.request("POST", "/v1/embeddings", &[], &body.to_string())
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a list of numbers")
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The reference's mean-pooled vector of golden prompt `i`, and its token ids.
fn golden_mean(i: usize) -> (Vec<f32>, Vec<u64>) {
    let path = common::golden_dir()
        .join("random-llama-f32")
        .join("embeddings.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let row = g["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pooling"] == "mean" && r["prompt_index"] == i)
        .unwrap()
        .clone();
    let ids = row["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    (floats(&row["embedding"]), ids)
}

fn prompts() -> Vec<String> {
    let t: Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("texts.json")).unwrap(),
    )
    .unwrap();
    t["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn embeddings_match_the_reference_in_every_shape() {
    let model = common::random_model("random-llama-f32");
    let s = Server::start(
        &model,
        &[
            "--embeddings",
            "--pooling",
            "mean",
            "-P",
            "2",
            "--strict-model",
        ],
    );
    let texts = prompts();
    let (want0, ids0) = golden_mean(0);

    // One string: OpenAI's shape, the reference's direction, unit length, usage.
    let a = post(&s, &json!({"input": texts[0], "model": "random-llama-f32"}));
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "random-llama-f32");
    assert_eq!(v["data"][0]["object"], "embedding");
    assert_eq!(v["data"][0]["index"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], ids0.len());
    assert_eq!(v["usage"]["total_tokens"], ids0.len());
    let got0 = floats(&v["data"][0]["embedding"]);
    assert_eq!(got0.len(), 256);
    assert!(1.0 - cosine(&got0, &want0) < 1e-3);
    let len: f64 = got0
        .iter()
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt();
    assert!((len - 1.0).abs() < 1e-5, "L2-normalized: {len}");

    // Every prompt in one request (more inputs than --parallel), in order; the same vectors
    // as one at a time; token ids give the same vector as their text.
    let a = post(&s, &json!({"input": texts}));
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), texts.len());
    let mut total = 0;
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let (want, ids) = golden_mean(i);
        total += ids.len();
        assert!(
            1.0 - cosine(&floats(&d["embedding"]), &want) < 1e-3,
            "input {i}"
        );
    }
    assert_eq!(v["usage"]["prompt_tokens"], total);
    assert_eq!(floats(&data[0]["embedding"]), got0, "batched = alone");
    let by_ids = post(&s, &json!({"input": ids0}));
    assert_eq!(by_ids.status, 200, "{}", by_ids.text());
    assert_eq!(floats(&by_ids.json()["data"][0]["embedding"]), got0);
    let lists = post(&s, &json!({"input": [ids0, [5, 6, 7]], "dimensions": 256}));
    assert_eq!(lists.status, 200, "{}", lists.text());
    let lists = lists.json();
    assert_eq!(floats(&lists["data"][0]["embedding"]), got0);
    assert_eq!(lists["usage"]["prompt_tokens"], ids0.len() + 3);

    // base64: the same floats, little-endian f32.
    let a = post(&s, &json!({"input": texts[0], "encoding_format": "base64"}));
    assert_eq!(a.status, 200, "{}", a.text());
    let b64 = a.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, got0);

    // A cache_salt is a tenant of the prefix cache: the same vector.
    let salted = post(&s, &json!({"input": texts[0], "cache_salt": "user-1"}));
    assert_eq!(floats(&salted.json()["data"][0]["embedding"]), got0);

    // llama-server's embd_normalize: -1 leaves the pooled vector as the reference gives it.
    let a = post(&s, &json!({"input": texts[0], "embd_normalize": -1}));
    let raw = floats(&a.json()["data"][0]["embedding"]);
    for (x, y) in raw.iter().zip(&want0) {
        assert!((x - y).abs() < 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
    }

    // Bad requests: OpenAI's error shape, naming the field.
    let long = vec![7u32; 1025];
    for (body, param) in [
        (json!({"input": texts[0], "dimensions": 64}), "dimensions"),
        (
            json!({"input": texts[0], "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": []}), "input"),
        (json!({"input": ""}), "input[0]"),
        (json!({"input": 12}), "input"),
        (json!({"user": "x"}), "input"),
        (json!({"input": [1, 999_999]}), "input[0]"),
        (json!({"input": ["fine", long]}), "input[1]"),
        (json!({"input": "x", "cache_salt": ""}), "cache_salt"),
    ] {
        let e = post(&s, &body).expect_error(400, &body.to_string());
        assert_eq!(e["param"], param, "{body}");
    }
    let e = post(&s, &json!({"input": "x", "model": "gpt-4"})).expect_error(404, "model");
    assert_eq!(e["code"], "model_not_found");

    // Completions are still served, and the endpoint is counted by name.
    let c = s.request(
        "POST",
        "/v1/completions",
        &[],
        &json!({"prompt": texts[1], "max_tokens": 4}).to_string(),
    );
    assert_eq!(c.status, 200, "{}", c.text());
    let ok = s
        .metric(
            "kiln_requests_total{endpoint=\"/v1/embeddings\",status=\"200\"}",
            &[],
        )
        .expect("counted");
    assert_eq!(ok, 7.0);
    let models = s.request("GET", "/v1/models", &[], "").json();
    assert_eq!(models["data"][0]["meta"]["n_embd"], 256);
}

#[test]
fn embeddings_refused_as_llama_server_refuses_them() {
    let model = common::random_model("random-llama-f32");
    // Without --embeddings: 501, llama-server's message.
    let s = Server::start(&model, &[]);
    let e = post(&s, &json!({"input": "hi"})).expect_error(501, "no --embeddings");
    assert_eq!(e["type"], "not_supported_error");
    assert!(e["message"].as_str().unwrap().contains("--embeddings"));
    drop(s);
    // A generative model (no pooling declared) with --embeddings: 400 naming --pooling.
    let s = Server::start(&model, &["--embeddings"]);
    let e = post(&s, &json!({"input": "hi"})).expect_error(400, "pooling none");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("Pooling type 'none'") && m.contains("--pooling"),
        "{m}"
    );
    drop(s);
    // --pooling none is accepted (llama-server's spelling) but cannot answer /v1/embeddings.
    let s = Server::start(&model, &["--embeddings", "--pooling", "none"]);
    post(&s, &json!({"input": "hi"})).expect_error(400, "--pooling none");
}

#[test]
fn bad_pooling_flags_are_refused() {
    let model = common::random_model("random-llama-f32");
    // `rank` is a pooling (a reranker's), which this decoder cannot pool: refused by name.
    let s = Server::start(&model, &["--embeddings", "--pooling", "rank"]);
    let e = post(&s, &json!({"input": "hi"})).expect_error(400, "--pooling rank");
    assert!(
        e["message"].as_str().unwrap().contains("rank pooling"),
        "{e}"
    );
    drop(s);
    // An unknown pooling: the flag refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--port",
            "0",
            "--embeddings",
            "--pooling",
            "max",
            "-m",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success(), "--pooling max accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected none, mean"), "--pooling max: {err}");
}

/// The reference's vectors of the golden prompts for `stem` with `pooling`.
fn golden_rows(stem: &str, pooling: &str) -> Vec<Vec<f32>> {
    let path = common::golden_dir().join(stem).join("embeddings.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    g["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["pooling"] == pooling)
        .map(|r| floats(&r["embedding"]))
        .collect()
}

/// An encoder serves `/v1/embeddings` and Ollama's `/api/embed` without `--embeddings` or
/// `--pooling` (the pooling its file declares: nomic-bert mean, bert cls), the reference's
/// vectors; the completion routes refuse it by name.
#[test]
fn encoders_serve_embeddings_without_flags() {
    let texts = prompts();
    for (stem, pooling) in [
        ("random-nomic-bert-f32", "mean"),
        ("random-bert-f32", "cls"),
    ] {
        let model = common::random_model(stem);
        let s = Server::start(&model, &["-P", "4"]);
        let want = golden_rows(stem, pooling);
        let a = post(&s, &json!({ "input": texts }));
        assert_eq!(a.status, 200, "{stem}: {}", a.text());
        let v = a.json();
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), texts.len());
        for (i, d) in data.iter().enumerate() {
            let got = floats(&d["embedding"]);
            let dist = 1.0 - cosine(&got, &want[i]);
            assert!(
                dist <= 1e-3,
                "{stem} prompt {i}: cosine distance {dist:.2e}"
            );
        }
        let a = s.request(
            "POST",
            "/api/embed",
            &[],
            &json!({ "model": stem, "input": [texts[1], texts[2]] }).to_string(),
        );
        assert_eq!(a.status, 200, "{stem}: {}", a.text());
        let v = a.json();
        for (k, i) in [1, 2].into_iter().enumerate() {
            let got = floats(&v["embeddings"][k]);
            assert!(
                1.0 - cosine(&got, &want[i]) <= 1e-3,
                "{stem} /api/embed {i}"
            );
        }
        for (path, body) in [
            (
                "/v1/completions",
                json!({ "prompt": "hi", "max_tokens": 4 }),
            ),
            (
                "/v1/chat/completions",
                json!({ "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 4 }),
            ),
        ] {
            let a = s.request("POST", path, &[], &body.to_string());
            assert!(a.status >= 400, "{stem} {path}: {} {}", a.status, a.text());
            assert!(
                a.text().contains("is an encoder"),
                "{stem} {path}: {}",
                a.text()
            );
        }
    }
}
