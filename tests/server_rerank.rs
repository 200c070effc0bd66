//! `POST /v1/rerank` (and `/rerank`) over HTTP with the random BERT reranker: the reference's
//! scores (tests/golden/random-bert-rerank-f32/rerank.json) in llama-server's answer shape,
//! sorted, cut to `top_n`, with the documents when asked; TEI's shape; 256 documents in one
//! request; and the errors: no query, no documents, a model that is not a reranker, a reranker
//! asked for embeddings.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::Server;
use serde_json::{json, Value};

const RERANKER: &str = "random-bert-rerank-f32";

fn texts() -> Vec<String> {
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

/// The reference's score of (query `q`, document `d`), indices of the golden prompts.
fn golden_score(g: &Value, q: u64, d: u64) -> f64 {
    g["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["query_index"] == q && r["document_index"] == d)
        .unwrap()["scores"][0]
        .as_f64()
        .unwrap()
}

#[test]
fn rerank_answers_the_references_scores() {
    let model = common::random_model(RERANKER);
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join(RERANKER).join("rerank.json")).unwrap(),
    )
    .unwrap();
    let s = Server::start(&model, &["-P", "4"]);
    let docs = texts();
    let a = s.request(
        "POST",
        "/v1/rerank",
        &[],
        &json!({"query": docs[0], "documents": docs, "model": "x"}).to_string(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(v["object"], "list");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), docs.len());
    let mut last = f64::INFINITY;
    for r in results {
        let (i, score) = (
            r["index"].as_u64().unwrap(),
            r["relevance_score"].as_f64().unwrap(),
        );
        let want = golden_score(&g, 0, i);
        assert!(
            (score - want).abs() <= 1e-3 * want.abs().max(1.0),
            "document {i}: {score} vs {want}"
        );
        assert!(score <= last, "results sorted by relevance: {v}");
        last = score;
        assert!(r.get("document").is_none());
    }
    let ids: usize = g["rows"].as_array().unwrap()[..5]
        .iter()
        .map(|r| r["ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], ids, "every prompt's tokens");

    // top_n and return_documents, on /rerank.
    let body = json!({"query": docs[3], "documents": docs, "top_n": 2, "return_documents": true});
    let v = s.request("POST", "/rerank", &[], &body.to_string()).json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{v}");
    let mut want: Vec<(f64, usize)> = (0..5).map(|d| (golden_score(&g, 3, d as u64), d)).collect();
    want.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (r, (_, d)) in results.iter().zip(&want) {
        assert_eq!(r["index"].as_u64(), Some(*d as u64), "{v}");
        assert_eq!(r["document"]["text"], docs[*d]);
    }

    // TEI's shape: `texts` in, a bare list with `score` (and `text`) out.
    let body = json!({"query": docs[0], "texts": [docs[1]], "return_text": true});
    let v = s
        .request("POST", "/v1/rerank", &[], &body.to_string())
        .json();
    assert_eq!(v[0]["index"], 0, "{v}");
    assert_eq!(v[0]["text"], docs[1]);
    let want = golden_score(&g, 0, 1);
    assert!((v[0]["score"].as_f64().unwrap() - want).abs() <= 1e-3 * want.abs().max(1.0));

    // 256 documents in one request: every one scored, each as it is alone.
    let many: Vec<String> = (0..256).map(|i| format!("{} {i}", docs[i % 5])).collect();
    let v = s
        .request(
            "POST",
            "/v1/rerank",
            &[],
            &json!({"query": "q", "documents": many}).to_string(),
        )
        .json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 256, "{v}");
    let alone = |i: usize| -> f64 {
        let body = json!({"query": "q", "documents": [many[i]]});
        s.request("POST", "/v1/rerank", &[], &body.to_string())
            .json()["results"][0]["relevance_score"]
            .as_f64()
            .unwrap()
    };
    for i in [0usize, 100, 255] {
        let r = results.iter().find(|r| r["index"] == i).unwrap();
        let got = r["relevance_score"].as_f64().unwrap();
        let want = alone(i);
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "document {i}: {got} vs {want}"
        );
    }

    // Bad requests name the field.
    for (body, param) in [
        (json!({"documents": ["a"]}), "query"),
        (json!({"query": "q"}), "documents"),
        (json!({"query": "q", "documents": []}), "documents"),
        (json!({"query": "q", "documents": ["a", 1]}), "documents[1]"),
    ] {
        let e = s
            .request("POST", "/v1/rerank", &[], &body.to_string())
            .expect_error(400, &body.to_string());
        assert_eq!(e["param"], param, "{body}");
    }
    // A reranker gives no embeddings.
    let e = s
        .request(
            "POST",
            "/v1/embeddings",
            &[],
            &json!({"input": "hi"}).to_string(),
        )
        .expect_error(400, "embeddings of a reranker");
    assert!(e["message"].as_str().unwrap().contains("/v1/rerank"), "{e}");
}

#[test]
fn rerank_needs_a_reranker() {
    // An embedding model (no classification head): 501 saying why.
    let s = Server::start(&common::random_model("random-bert-f32"), &[]);
    let body = json!({"query": "q", "documents": ["a"]}).to_string();
    let e = s
        .request("POST", "/v1/rerank", &[], &body)
        .expect_error(501, "an embedding model");
    assert!(e["message"].as_str().unwrap().contains("reranking"), "{e}");
    drop(s);
    // --reranking with it: the server still answers, /v1/rerank names the missing head.
    let s = Server::start(&common::random_model("random-bert-f32"), &["--reranking"]);
    let e = s
        .request("POST", "/v1/rerank", &[], &body)
        .expect_error(501, "--reranking without a head");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("classification head"),
        "{e}"
    );
    drop(s);
    // A generative model.
    let s = Server::start(&common::random_model("random-llama-f32"), &[]);
    s.request("POST", "/rerank", &[], &body)
        .expect_error(501, "a generative model");
}
