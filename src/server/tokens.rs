//! llama-server's utility routes that applications count and shape prompts with: `/tokenize`,
//! `/detokenize`, `/apply-template` (the chat template's text for a conversation, as
//! `/v1/chat/completions` renders it) and `/props` (the server's settings).

use std::sync::Arc;

use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::api::{self, Body, ChatRequest};
use super::error::ApiError;
use super::jobs::{chat_plan, extras, read_body, template_error};
use super::AppState;
use crate::tokenizer::Tokenizer;

type St = State<Arc<AppState>>;

/// `POST /tokenize`: `{"content", "add_special" = false, "parse_special" = true,
/// "with_pieces" = false}`.
#[derive(Deserialize)]
struct TokenizeRequest {
    content: TokenizeContent,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

/// A text, or (llama-server's mixed prompt) a list of texts and token ids, the ids kept as
/// they are.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum TokenizeContent {
    Text(String),
    Mixed(Vec<MixedPart>),
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum MixedPart {
    Id(u32),
    Text(String),
}

impl TokenizeContent {
    /// Refuse an id outside the vocabulary, naming `param`.
    pub(super) fn check(&self, param: &str, vocab: usize) -> Result<(), ApiError> {
        if let TokenizeContent::Mixed(parts) = self {
            let ids = parts.iter().filter_map(|p| match p {
                MixedPart::Id(id) => Some(*id),
                MixedPart::Text(_) => None,
            });
            ApiError::check_token_ids(param, ids, vocab)?;
        }
        Ok(())
    }

    /// The token ids: texts tokenized (`add_special` on the first part only, as llama-server
    /// does with mixed prompts), ids kept.
    pub(super) fn ids(&self, tok: &Tokenizer, add_special: bool, parse_special: bool) -> Vec<u32> {
        match self {
            TokenizeContent::Text(t) => tok.encode(t, add_special, parse_special),
            TokenizeContent::Mixed(parts) => {
                let mut ids = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    match p {
                        MixedPart::Id(id) => ids.push(*id),
                        MixedPart::Text(t) => {
                            ids.extend(tok.encode(t, add_special && i == 0, parse_special))
                        }
                    }
                }
                ids
            }
        }
    }
}

fn yes() -> bool {
    true
}

impl Body for TokenizeRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        api::typed(v)
    }
}

/// `POST /detokenize`: `{"tokens": [ids]}`.
#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

impl Body for DetokenizeRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        api::typed(v)
    }
}

/// `{"tokens": [ids]}`; with `with_pieces`, `{"tokens": [{"id", "piece"}]}`, a piece being its
/// text where its bytes are UTF-8, else the bytes (llama-server's answer).
pub(super) async fn tokenize(
    State(st): St,
    headers: HeaderMap,
    body: HttpBody,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    req.content.check("content", st.model.config.vocab_size)?;
    // (A body of megabytes takes a while: off the connections' threads.)
    let tok = Arc::clone(&st.tokenizer);
    let answer = tokio::task::spawn_blocking(move || {
        let ids = req.content.ids(&tok, req.add_special, req.parse_special);
        if !req.with_pieces {
            return serde_json::to_vec(&json!({ "tokens": ids }));
        }
        let tokens: Vec<Piece<'_>> = ids
            .iter()
            .map(|&id| {
                let bytes = tok.token_bytes(id);
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => PieceText::Text(s),
                    Err(_) => PieceText::Bytes(bytes),
                };
                Piece { id, piece }
            })
            .collect();
        serde_json::to_vec(&Pieces { tokens })
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response())
}

/// `/tokenize`'s answer with pieces, serialized from borrowed tokens.
#[derive(Serialize)]
struct Pieces<'t> {
    tokens: Vec<Piece<'t>>,
}

#[derive(Serialize)]
struct Piece<'t> {
    id: u32,
    piece: PieceText<'t>,
}

/// A token's text where its bytes are UTF-8 alone, else its bytes.
#[derive(Serialize)]
#[serde(untagged)]
enum PieceText<'t> {
    Text(&'t str),
    Bytes(&'t [u8]),
}

/// `{"content": text}`: the tokens' text, control tokens written out.
pub(super) async fn detokenize(
    State(st): St,
    headers: HeaderMap,
    body: HttpBody,
) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    ApiError::check_token_ids(
        "tokens",
        req.tokens.iter().copied(),
        st.model.config.vocab_size,
    )?;
    Ok(Json(json!({ "content": st.tokenizer.decode(&req.tokens) })))
}

/// `{"prompt": text}`: a chat request's conversation (and tools) through the model's chat
/// template, with the assistant's turn opened, as `/v1/chat/completions` renders it.
pub(super) async fn apply_template(
    State(st): St,
    headers: HeaderMap,
    body: HttpBody,
) -> Result<Json<Value>, ApiError> {
    let req: ChatRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    let (_, plan, prefill) = chat_plan(&st, &req)?;
    let prompt = st
        .tokenizer
        .apply_chat_template_with(
            &plan.messages,
            &extras(&req, &plan, prefill.as_deref()),
            true,
        )
        .map_err(template_error)?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// `GET /props`: what a client needs to know of the server (llama-server's fields).
pub(super) async fn props(State(st): St) -> Json<Value> {
    let o = &st.opts;
    let c = &st.model.config;
    Json(json!({
        "default_generation_settings": {
            "n_ctx": o.n_ctx,
            "speculative": o.speculation.is_some(),
        },
        "total_slots": o.n_slots,
        "model_alias": o.model_id,
        "n_ctx_train": c.ctx_train,
        "n_vocab": c.vocab_size,
        "chat_template": st.tokenizer.chat_template(),
        "bos_token": st.tokenizer.bos().map(|id| st.tokenizer.token_text(id)),
        "eos_token": st.tokenizer.eos().map(|id| st.tokenizer.token_text(id)),
        "modalities": { "vision": false, "audio": false },
        "embeddings": o.embeddings,
        "build_info": concat!("kiln ", env!("CARGO_PKG_VERSION")),
    }))
}
