//! `POST /v1/embeddings`, as OpenAI and llama-server answer it.
//!
//! Enabled by `--embeddings` (llama-server's flag; without it the answer is llama-server's 501).
//! The pooling is the model's (`{arch}.pooling_type`) or `--pooling`; a model that pools
//! nothing (a generative model started without `--pooling`) answers 400, as llama-server does.
//! `input` is a string, a list of strings, a list of token ids or a list of such lists; each
//! input becomes one engine request that the scheduler evaluates in prefill chunks beside the
//! generating sequences, computing no logits. A request keeps at most `--parallel` of its
//! inputs in the engine at once and takes one admission permit (429 when none is left).
//! Vectors are L2-normalized (llama-server's `embd_normalize`, per request or
//! `--embd-normalize`, changes that), as floats or as base64 of little-endian f32.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::api::{self, Body as RequestBody};
use super::error::ApiError;
use super::jobs::{check_model, read_body};
use super::AppState;
use crate::engine::pooling::{EmbedSpec, Pooling};
use crate::engine::scheduler::{FinishReason, Finished, SeqRequest, SeqSink};

/// OpenAI's limit on the inputs of one request (on every embedding route).
pub(super) const MAX_INPUTS: usize = 2048;

/// The fields of `POST /v1/embeddings` (others, such as `user`, are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub input: Option<Value>,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<Value>,
    /// llama-server's normalization (-1 none, 0 max-abs int16, 1 taxicab, 2 euclidean, p > 2).
    pub embd_normalize: Option<i32>,
    /// vLLM's `cache_salt`: the prefix-cache tenant, as on the completion routes.
    pub cache_salt: Option<String>,
}

impl RequestBody for EmbeddingRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        api::typed(v)
    }
}

/// One input, tokenized or given as ids.
pub(super) enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// `input` in any of OpenAI's shapes.
fn inputs(input: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("input", m);
    let ids = |v: &Value, at: &str| -> Result<Vec<u32>, ApiError> {
        let Some(list) = v.as_array() else {
            return Err(bad(format!("{at} must be a string or a list of token ids")));
        };
        list.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad(format!("{at}: `{t}` is not a token id")))
            })
            .collect()
    };
    match input {
        None | Some(Value::Null) => Err(bad("`input` is required".into())),
        Some(Value::String(s)) => Ok(vec![Input::Text(s.clone())]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(bad("`input` must not be empty".into()))
        }
        Some(v @ Value::Array(items)) if items.iter().all(Value::is_number) => {
            Ok(vec![Input::Ids(ids(v, "input")?)])
        }
        Some(Value::Array(items)) => {
            check_count(items.len())?;
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(Input::Text(s.clone())),
                    v => ids(v, &format!("input[{i}]")).map(Input::Ids),
                })
                .collect()
        }
        Some(_) => Err(bad(
            "`input` must be a string, a list of strings, a list of token ids or a list of such lists"
                .into(),
        )),
    }
}

/// Refuse more than [`MAX_INPUTS`] inputs in one request (a 400 naming `input`).
pub(super) fn check_count(n: usize) -> Result<(), ApiError> {
    match n > MAX_INPUTS {
        true => Err(ApiError::invalid_param(
            "input",
            format!("{n} inputs; at most {MAX_INPUTS} per request"),
        )),
        false => Ok(()),
    }
}

/// One input's engine request: the vector and the prompt's token count, or the engine's error.
type Outcome = Result<(Vec<f32>, usize), String>;

/// Receives one input's vector from the engine. Holds a share of the request's admission
/// permit, so the permit goes back when the engine is done with every input.
struct EmbedSink {
    tx: Option<oneshot::Sender<Outcome>>,
    vector: Option<Vec<f32>>,
    _permit: Arc<OwnedSemaphorePermit>,
}

impl SeqSink for EmbedSink {
    fn text(&mut self, _text: &str) -> bool {
        // Only liveness probes come: is the client still waiting?
        self.tx.as_ref().is_some_and(|t| !t.is_closed())
    }

    fn embedding(&mut self, mut rows: Vec<Vec<f32>>) {
        self.vector = rows.drain(..).next();
    }

    fn done(&mut self, finished: Finished) {
        let outcome = match finished.reason {
            FinishReason::Stop => self
                .vector
                .take()
                .map(|v| (v, finished.usage.prompt_tokens))
                .ok_or_else(|| "the engine gave no embedding".to_string()),
            FinishReason::Error(e) => Err(e),
            other => Err(format!("the embedding ended early ({other:?})")),
        };
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(outcome);
        }
    }
}

pub(super) async fn embeddings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let pooling = pooling(&st)?;
    let req: EmbeddingRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    let model = check_model(&st, &req.model)?;
    check_dimensions(&st, req.dimensions.as_ref())?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("unknown encoding_format `{other}` (float or base64)"),
            ))
        }
    };
    let normalize = req.embd_normalize.unwrap_or(st.opts.embd_normalize);
    if req
        .cache_salt
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.len() > 256)
    {
        return Err(ApiError::invalid_param(
            "cache_salt",
            "cache_salt must be 1 to 256 bytes",
        ));
    }
    let inputs = inputs(req.input.as_ref())?;
    let spec = EmbedSpec { pooling, normalize };
    let (vectors, tokens) = embed(&st, inputs, spec, req.cache_salt.as_deref()).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| match base64 {
            true => json!({"object": "embedding", "index": index, "embedding": encode_base64(&v)}),
            false => json!({"object": "embedding", "index": index, "embedding": v}),
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// Refuse `dimensions` other than the model's (a vector cannot be cut to them).
pub(super) fn check_dimensions(st: &AppState, asked: Option<&Value>) -> Result<(), ApiError> {
    let dim = st.model.config.dim;
    match asked.filter(|d| !d.is_null()) {
        Some(d) if d.as_u64() != Some(dim as u64) => Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "this model's embeddings have {dim} dimensions; `dimensions` ({d}) cannot change that"
            ),
        )),
        _ => Ok(()),
    }
}

/// The pooling of the server's embeddings; refused where it computes none: started without
/// `--embeddings` (llama-server's 501), or a model that pools nothing (400).
pub(super) fn pooling(st: &AppState) -> Result<Pooling, ApiError> {
    if !st.opts.embeddings {
        return Err(ApiError::not_supported(
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    }
    match &st.pooling {
        Ok(Pooling::None) => Err(ApiError::bad_request(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type: this model declares no pooling (start kiln with --pooling mean, cls or last)",
        )),
        Ok(Pooling::Rank) => Err(ApiError::bad_request(
            "this model is a reranker (rank pooling): it gives relevance scores on /v1/rerank, not embeddings",
        )),
        Ok(p) => Ok(*p),
        Err(e) => Err(ApiError::bad_request(e.clone())),
    }
}

/// The vectors of `inputs` (in order, pooled and normalized as `spec` says) and their
/// prompts' token count: each input one engine request, at most `--parallel` of them in the
/// engine at once, under one admission permit (429 when none is left), in the tenant of the
/// request's key and `salt`.
pub(super) async fn embed(
    st: &AppState,
    inputs: Vec<Input>,
    spec: EmbedSpec,
    salt: Option<&str>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    check_count(inputs.len())?;
    let (vocab, n_ctx) = (st.model.config.vocab_size, st.opts.n_ctx);
    let mut prompts = Vec::new();
    for (i, input) in inputs.into_iter().enumerate() {
        let param = format!("input[{i}]");
        let ids = match input {
            Input::Text(t) if t.is_empty() => {
                return Err(ApiError::invalid_param(&param, "the input is empty"))
            }
            Input::Text(t) => st.tokenizer.encode(&t, true, true),
            Input::Ids(ids) => ids,
        };
        if ids.is_empty() {
            return Err(ApiError::invalid_param(&param, "the input is empty"));
        }
        ApiError::check_token_ids(&param, ids.iter().copied(), vocab)?;
        if ids.len() > n_ctx {
            return Err(ApiError::invalid_param(
                &param,
                format!(
                    "this input has {} tokens, more than the context of {n_ctx} tokens (-c)",
                    ids.len()
                ),
            ));
        }
        prompts.push(ids);
    }
    let Ok(permit) = Arc::clone(&st.admission).try_acquire_owned() else {
        return Err(ApiError::queue_full(st.opts.n_slots, st.opts.max_queue));
    };
    let permit = Arc::new(permit);
    // In input order, at most --parallel of them in the engine at once. Dropping this future
    // (the client left) drops the receivers: the engine cancels what it still holds.
    let tenant = super::tenant::tenant(salt);
    let submit = |prompt: Vec<u32>| {
        let (tx, rx) = oneshot::channel::<Outcome>();
        let sink = EmbedSink {
            tx: Some(tx),
            vector: None,
            _permit: Arc::clone(&permit),
        };
        let mut req = SeqRequest::embedding(prompt, spec, Box::new(sink));
        req.tenant = tenant;
        let sent = st.engine.send(req);
        async move {
            sent.map_err(|_| ApiError::unavailable("the engine has stopped"))?;
            match rx.await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(ApiError::bad_request(e)),
                Err(_) => Err(ApiError::internal("the engine dropped the request")),
            }
        }
    };
    let mut results = futures_util::stream::iter(prompts)
        .map(submit)
        .buffered(st.opts.n_slots.max(1));
    let mut vectors = Vec::new();
    let mut tokens = 0;
    while let Some(r) = results.next().await {
        let (v, n) = r?;
        tokens += n;
        vectors.push(v);
    }
    Ok((vectors, tokens))
}

/// OpenAI's base64 encoding: the little-endian f32 bytes.
fn encode_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(v: Value) -> Result<Vec<Input>, ApiError> {
        inputs(Some(&v))
    }

    #[test]
    fn every_input_shape() {
        let one = parsed(json!("hello")).unwrap();
        assert!(matches!(&one[..], [Input::Text(t)] if t == "hello"));
        let texts = parsed(json!(["a", "b"])).unwrap();
        assert_eq!(texts.len(), 2);
        let ids = parsed(json!([1, 2, 3])).unwrap();
        assert!(matches!(&ids[..], [Input::Ids(v)] if v == &[1, 2, 3]));
        let lists = parsed(json!([[1, 2], [3]])).unwrap();
        assert!(matches!(&lists[..], [Input::Ids(a), Input::Ids(b)] if a == &[1, 2] && b == &[3]));
        let mixed = parsed(json!(["a", [7]])).unwrap();
        assert_eq!(mixed.len(), 2);
    }

    #[test]
    fn bad_inputs_name_the_field() {
        for (v, needle) in [
            (json!([]), "must not be empty"),
            (json!(3), "must be a string"),
            (json!([1, -2]), "`-2` is not a token id"),
            (json!([[1], [1.5]]), "input[1]: `1.5` is not a token id"),
            (json!([{"a": 1}]), "input[0] must be a string"),
        ] {
            let e = parsed(v.clone())
                .err()
                .unwrap_or_else(|| panic!("{v} accepted"));
            assert_eq!(e.status.as_u16(), 400);
            assert_eq!(e.param.as_deref(), Some("input"));
            assert!(e.message.contains(needle), "{v}: {}", e.message);
        }
        assert!(inputs(None).is_err());
        let many = Value::Array(vec![json!("x"); MAX_INPUTS + 1]);
        assert!(parsed(many).is_err());
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let s = encode_base64(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }
}
