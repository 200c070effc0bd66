//! The model as Ollama's clients ask about it (`/api/tags`, `/api/ps`, `/api/show`,
//! `/api/version`), and its embeddings (`/api/embed`, `/api/embeddings`).

use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::Digest;

use super::answer::{nanos, rfc3339};
use super::{model, Answer, St};
use crate::engine::pooling::EmbedSpec;
use crate::gguf::summary::ModelSummary;
use crate::server::api;
use crate::server::embeddings::{self, Input};
use crate::server::error::ApiError;
use crate::server::jobs::read_body;
use crate::server::AppState;

#[derive(Debug, Deserialize)]
struct EmbedFields {
    model: Option<String>,
    input: Option<Value>,
    prompt: Option<String>,
    dimensions: Option<Value>,
}

/// `/api/embed`: `input` a text or a list of texts; vectors L2-normalized.
pub(super) async fn embed(State(st): St, headers: HeaderMap, body: Body) -> Answer {
    let start = Instant::now();
    let pooling = embeddings::pooling(&st)?;
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let f: EmbedFields = api::typed(&v)?;
    let model = model(&st, &f.model)?;
    embeddings::check_dimensions(&st, f.dimensions.as_ref())?;
    let bad = || ApiError::invalid_param("input", "input must be a text or a list of texts");
    let inputs = match f.input {
        // (Nothing to embed: no vectors, as Ollama answers.)
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) if s.is_empty() => vec![],
        Some(Value::String(s)) => vec![Input::Text(s)],
        Some(Value::Array(items)) => {
            embeddings::check_count(items.len())?;
            items
                .into_iter()
                .map(|i| match i {
                    Value::String(s) => Ok(Input::Text(s)),
                    _ => Err(bad()),
                })
                .collect::<Result<_, _>>()?
        }
        _ => return Err(bad().into()),
    };
    let spec = EmbedSpec {
        pooling,
        normalize: 2,
    };
    let (vectors, tokens) = match inputs.is_empty() {
        true => (vec![], 0),
        false => embeddings::embed(&st, inputs, spec, None).await?,
    };
    Ok(Json(json!({
        "model": model,
        "embeddings": vectors,
        "total_duration": nanos(start.elapsed()),
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }))
    .into_response())
}

/// `/api/embeddings` (Ollama's first embedding route): `prompt`, one vector, as pooled.
pub(super) async fn embeddings_one(State(st): St, headers: HeaderMap, body: Body) -> Answer {
    let pooling = embeddings::pooling(&st)?;
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let f: EmbedFields = api::typed(&v)?;
    model(&st, &f.model)?;
    let prompt = f.prompt.unwrap_or_default();
    if prompt.is_empty() {
        // (Nothing to embed: an empty vector, as Ollama answers.)
        return Ok(Json(json!({ "embedding": [] })).into_response());
    }
    let spec = EmbedSpec {
        pooling,
        normalize: -1,
    };
    let (mut vectors, _) = embeddings::embed(&st, vec![Input::Text(prompt)], spec, None).await?;
    Ok(Json(json!({ "embedding": vectors.pop().unwrap_or_default() })).into_response())
}

/// The model as `/api/tags` and `/api/ps` list it.
fn model_entry(st: &AppState) -> Value {
    let s = ModelSummary::from_file(&st.model.file);
    let arch = s.architecture.clone().unwrap_or_default();
    let name = listed_name(st);
    let started = UNIX_EPOCH + Duration::from_secs(st.started);
    json!({
        "name": name,
        "model": name,
        "modified_at": rfc3339(started),
        "size": s.file_size,
        // (An identifier of the served file, not a hash of its bytes.)
        "digest": format!("{:x}", sha2::Sha256::digest(format!("{}:{}", st.opts.model_id, s.file_size))),
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": arch,
            "families": [arch],
            "parameter_size": crate::gguf::summary::human_count(s.parameters).replace(' ', ""),
            "quantization_level": quantization_level(st, &s),
        },
    })
}

/// The file's quantization as Ollama names it: its `general.file_type` (`Q4_K_M`, `Q8_0`,
/// `F16`, ...; llama.cpp's names, which Ollama's are), or where the file does not say (or says
/// a type kiln has no name for), the block format holding most of its bytes.
fn quantization_level(st: &AppState, s: &ModelSummary) -> String {
    match crate::fetch::store::format_name(&st.model.file, s) {
        // (llama.cpp's `MXFP4_MOE`, as Ollama names it.)
        Some(n) if n == "MXFP4_MOE" => "MXFP4".into(),
        n => n.unwrap_or_default(),
    }
}

pub(super) async fn tags(State(st): St) -> Json<Value> {
    Json(json!({ "models": [model_entry(&st)] }))
}

/// The loaded model (always, while the server runs).
pub(super) async fn ps(State(st): St) -> Json<Value> {
    let mut m = model_entry(&st);
    m["size_vram"] = json!(0);
    m["expires_at"] = json!("9999-12-31T23:59:59Z");
    Json(json!({ "models": [m] }))
}

#[derive(Debug, Deserialize)]
struct ShowFields {
    model: Option<String>,
    name: Option<String>,
}

/// The model's details, its chat template and its header's scalar metadata (`model_info`),
/// with `{arch}.context_length` the context this server runs (`-c`, where clients read how
/// long a prompt may be; kiln refuses a longer one, Ollama would cut it) and `parameters`
/// saying `num_ctx`.
pub(super) async fn show(State(st): St, headers: HeaderMap, body: Body) -> Answer {
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let f: ShowFields = api::typed(&v)?;
    model(&st, &f.model.or(f.name))?;
    let file = &st.model.file;
    let mut info = Map::new();
    for (k, v) in file.metadata() {
        if let Some(x) = scalar(v) {
            info.insert(k.clone(), x);
        }
    }
    let s = ModelSummary::from_file(file);
    info.insert("general.parameter_count".into(), json!(s.parameters));
    info.insert(file.arch_key("context_length"), json!(st.opts.n_ctx));
    // (Every model takes tools: in its template's format, or kiln's generic one.)
    let mut capabilities = vec!["completion", "tools"];
    if st.opts.embeddings {
        capabilities.push("embedding");
    }
    // (Fill in the middle: `/api/generate`'s `suffix`.)
    if st.tokenizer.fim_tokens().is_ok() {
        capabilities.push("insert");
    }
    let entry = model_entry(&st);
    Ok(Json(json!({
        "modelfile": "",
        "parameters": format!("num_ctx {}", st.opts.n_ctx),
        "template": st.tokenizer.chat_template().unwrap_or(""),
        "details": entry["details"],
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": entry["modified_at"],
    }))
    .into_response())
}

/// A metadata value that is not an array, as JSON (arrays, the vocabulary among them, are
/// left out, as Ollama leaves them out unless asked).
fn scalar(v: &crate::gguf::Value) -> Option<Value> {
    use crate::gguf::Value as V;
    Some(match v {
        V::U8(x) => json!(x),
        V::I8(x) => json!(x),
        V::U16(x) => json!(x),
        V::I16(x) => json!(x),
        V::U32(x) => json!(x),
        V::I32(x) => json!(x),
        V::U64(x) => json!(x),
        V::I64(x) => json!(x),
        V::F32(x) => json!(x),
        V::F64(x) => json!(x),
        V::Bool(x) => json!(x),
        V::String(x) => json!(x),
        V::Array(_) => return None,
    })
}

/// The Ollama version whose API kiln answers as (clients gate features on it).
const OLLAMA_VERSION: &str = "0.12.0";

/// Ollama's version of the API kiln answers, and kiln's own.
pub(super) async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION, "kiln": env!("CARGO_PKG_VERSION") }))
}

/// The name the server lists its model under (`NAME:latest`, as Ollama's names carry a tag).
fn listed_name(st: &AppState) -> String {
    let id = &st.opts.model_id;
    match id.contains(':') {
        true => id.clone(),
        false => format!("{id}:latest"),
    }
}
