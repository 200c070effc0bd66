//! `POST /v1/rerank` (and `/rerank`, `/v1/reranking`, `/reranking`), as llama-server answers
//! it: a query and documents in, each document's relevance score out.
//!
//! Served by a reranker: an encoder with a classification head pooled `rank` (its
//! `{arch}.pooling_type = 4`, or `--pooling rank` / `--reranking`); any other model answers
//! llama-server's 501. Each document becomes one prompt with the query
//! ([`crate::engine::rerank::RerankFormat`]) and one engine request; the requests run as the
//! embeddings' do ([`super::embeddings::embed`]): up to `--parallel` prompts evaluated together
//! in each forward pass, under one admission permit.
//!
//! The request: `query` (a string), `documents` (strings, or objects with a `text`: Jina's
//! and Cohere's shape), `top_n` (all by default), `return_documents`. The answer:
//! `{"model", "object": "list", "usage", "results": [{"index", "relevance_score"}]}`, the most
//! relevant first, each with `document: {"text"}` when `return_documents` is true. TEI's shape
//! (`texts` instead of `documents`) answers a bare list of `{"index", "score"}`, with
//! `text` when `return_text` is true.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::api;
use super::embeddings::{self, Input};
use super::error::ApiError;
use super::jobs::{check_model, read_body};
use super::AppState;
use crate::engine::pooling::{EmbedSpec, Pooling};
use crate::engine::rerank::{ranked, RerankFormat};

/// The paths llama-server answers reranking on.
pub(super) const PATHS: [&str; 4] = ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"];

pub(super) fn routes() -> Router<Arc<AppState>> {
    PATHS
        .iter()
        .fold(Router::new(), |r, p| r.route(p, post(rerank)))
}

/// A parsed request.
#[derive(Debug)]
struct RerankRequest {
    model: Option<String>,
    query: String,
    documents: Vec<String>,
    top_n: usize,
    /// `texts` instead of `documents`: TEI's answer shape.
    tei: bool,
    /// Jina's `return_documents` or TEI's `return_text`.
    return_text: bool,
}

fn parse(v: &Value) -> Result<RerankRequest, ApiError> {
    let query = match v.get("query") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be provided",
            ))
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be a string",
            ))
        }
    };
    let tei = v.get("documents").is_none() && v.get("texts").is_some();
    let field = if tei { "texts" } else { "documents" };
    let docs = match v.get(field) {
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::invalid_param(
                field,
                format!("\"{field}\" must be a non-empty string array"),
            ))
        }
    };
    embeddings::check_count(docs.len()).map_err(|e| ApiError {
        param: Some(field.to_string()),
        ..e
    })?;
    let documents = docs
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) if o.get("text").is_some_and(Value::is_string) => {
                Ok(o["text"].as_str().unwrap_or_default().to_string())
            }
            _ => Err(ApiError::invalid_param(
                &format!("{field}[{i}]"),
                "a document must be a string (or an object with a string `text`)",
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let top_n = match v.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(n) => match n.as_u64() {
            Some(n) => (n as usize).min(documents.len()),
            None => {
                return Err(ApiError::invalid_param(
                    "top_n",
                    "\"top_n\" must be a non-negative integer",
                ))
            }
        },
    };
    let flag = |k: &str| -> Result<bool, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid_param(
                k,
                format!("\"{k}\" must be a boolean"),
            )),
        }
    };
    let return_text = flag("return_documents")? | flag("return_text")?;
    let model = match v.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "model",
                "\"model\" must be a string",
            ))
        }
    };
    Ok(RerankRequest {
        model,
        query,
        documents,
        top_n,
        tei,
        return_text,
    })
}

/// Refused unless the server ranks: llama-server's 501 (with why, where the model cannot).
fn check_reranker(st: &AppState) -> Result<(), ApiError> {
    let why = match &st.pooling {
        Ok(Pooling::Rank) if st.opts.embeddings => return Ok(()),
        Ok(_) => "this model has no rank pooling (a reranker: an encoder with a classification head, `{arch}.pooling_type = 4`)".to_string(),
        Err(e) => e.clone(),
    };
    Err(ApiError::not_supported(format!(
        "This server does not support reranking. Start it with `--reranking` and a reranker model: {why}"
    )))
}

pub(super) async fn rerank(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_reranker(&st)?;
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let req = parse(&v)?;
    let model = check_model(&st, &req.model)?;
    let format = RerankFormat::new(&st.tokenizer, &st.model.file);
    let (field, n_ctx) = (if req.tei { "texts" } else { "documents" }, st.opts.n_ctx);
    let mut inputs = Vec::with_capacity(req.documents.len());
    for (i, doc) in req.documents.iter().enumerate() {
        let ids = format.prompt(&st.tokenizer, &req.query, doc);
        if ids.is_empty() || ids.len() > n_ctx {
            return Err(ApiError::invalid_param(
                &format!("{field}[{i}]"),
                format!(
                    "the query with this document is {} tokens; a prompt needs 1 to {n_ctx} (-c)",
                    ids.len()
                ),
            ));
        }
        inputs.push(Input::Ids(ids));
    }
    let spec = EmbedSpec {
        pooling: Pooling::Rank,
        normalize: -1,
    };
    let (outputs, tokens) = embeddings::embed(&st, inputs, spec, None).await?;
    let scores: Vec<f32> = outputs
        .iter()
        .map(|o| o.first().copied().unwrap_or(f32::NAN))
        .collect();
    let label = if req.tei { "score" } else { "relevance_score" };
    let results: Vec<Value> = ranked(&scores, req.top_n)
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, label: scores[i]});
            match (req.return_text, req.tei) {
                (true, true) => r["text"] = json!(req.documents[i]),
                (true, false) => r["document"] = json!({"text": req.documents[i]}),
                (false, _) => {}
            }
            r
        })
        .collect();
    if req.tei {
        return Ok(Json(Value::Array(results)).into_response());
    }
    Ok(Json(json!({
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_jina_and_tei_shapes() {
        let r =
            parse(&json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1})).unwrap();
        assert_eq!((r.query.as_str(), r.top_n, r.tei), ("q", 1, false));
        assert_eq!(r.documents, ["a", "b"]);
        let r =
            parse(&json!({"query": "q", "texts": ["a"], "return_text": true, "top_n": 9})).unwrap();
        assert!(r.tei && r.return_text);
        assert_eq!(r.top_n, 1, "top_n is cut to the documents");
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (v, param) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": 3, "documents": ["a"]}), "query"),
            (json!({"query": "q"}), "documents"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q", "documents": "a"}), "documents"),
            (json!({"query": "q", "documents": ["a", 2]}), "documents[1]"),
            (json!({"query": "q", "texts": []}), "texts"),
            (
                json!({"query": "q", "documents": ["a"], "top_n": -1}),
                "top_n",
            ),
            (
                json!({"query": "q", "documents": ["a"], "return_documents": 1}),
                "return_documents",
            ),
        ] {
            let e = parse(&v).err().unwrap_or_else(|| panic!("{v} accepted"));
            assert_eq!(e.status.as_u16(), 400, "{v}");
            assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
        }
    }
}
