//! Ollama's API (`/api/...`): apps written for Ollama (Open WebUI, Continue, LangChain's
//! `ChatOllama`, the `ollama` Python and JavaScript libraries) talk to `kiln serve` as they
//! talk to Ollama.
//!
//! A request becomes the job of the matching OpenAI route ([`super::jobs::chat_job`],
//! [`super::jobs::completion_job`]): one set of checks, the same template, tools, grammar
//! and sampler. The answers are Ollama's: newline-delimited JSON, streamed by default
//! (`"stream": false` for one object), durations in nanoseconds, errors as `{"error": "..."}`.
//!
//! - `POST /api/chat`: `messages` (assistant `tool_calls` with argument objects, `tool`
//!   answers by `tool_call_id` or `tool_name`), `tools`, `format` (`"json"` or a JSON
//!   schema), `options`. With tools, content streams as soon as it is known to be no call, and
//!   each call in a line of its own (`message.tool_calls`, its arguments an object) as soon as
//!   its arguments are whole, as Ollama streams them. No messages: `done_reason` `load` (`unload` with `keep_alive` 0).
//! - `POST /api/generate`: `prompt` as a user turn of the model's chat template after
//!   `system`, or as it is with `raw`; an empty prompt answers as no messages do. With a
//!   `suffix` (not `raw`), the model fills in the middle between `prompt` and it (its FIM
//!   tokens, as Ollama's templates put them; a model without them: `does not support
//!   insert`, as Ollama says).
//! - `POST /api/embed` (`input`: a text or a list of texts; L2-normalized) and the older
//!   `POST /api/embeddings` (`prompt`; as pooled): with `--embeddings`, as `/v1/embeddings`.
//! - `GET /api/tags`, `GET /api/ps`, `POST /api/show` (`{arch}.context_length`: the server's
//!   `-c`), `GET /api/version` (the Ollama version whose API this is).
//!
//! `options`, under Ollama's limits, not OpenAI's: `num_predict` (cut to the room the context
//! leaves; negative: no limit), `temperature` (from 0), `stop` (up to 64; empty ones
//! dropped), `repeat_last_n` (−1: the context), and `top_k`, `top_p`, `min_p`,
//! `repeat_penalty`, `presence_penalty`, `frequency_penalty`, `seed`; the load options
//! (`num_ctx`, `num_gpu`, `num_thread`, ...) and `keep_alive` are ignored: the model is loaded
//! once, with the server's flags. Refused with a 400 saying so: `images`, `template`,
//! `context` (the old conversation state of `/api/generate`: send the conversation to
//! `/api/chat`), and where they ask for something `think`, `logprobs`, `top_logprobs` and the
//! options `mirostat`, `typical_p`, `tfs_z` ([`super::unsupported`]).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::api::{self, Body as RequestBody, ChatRequest, CompletionRequest};
use super::error::ApiError;
use super::jobs::{
    chat_job, check_model, completion_job, fim_prompt, read_body, serves, tool_error,
};
use super::respond::Job;
use super::{unsupported, AppState};
use answer::{answer, loaded, Kind};

mod answer;
mod models;

type St = State<Arc<AppState>>;

/// The routes' paths (the request counter names them), in [`routes`]' order.
pub(super) const PATHS: [&str; 8] = [
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/tags",
    "/api/ps",
    "/api/show",
    "/api/version",
];

/// The routes, for the router's keyed part (`--api-key` applies).
pub(super) fn routes() -> Router<Arc<AppState>> {
    let handlers = [
        post(chat),
        post(generate),
        post(models::embed),
        post(models::embeddings_one),
        get(models::tags),
        get(models::ps),
        post(models::show),
        get(models::version),
    ];
    PATHS
        .into_iter()
        .zip(handlers)
        .fold(Router::new(), |r, (path, h)| r.route(path, h))
}

/// An error as Ollama answers it: the status, `{"error": "message"}`.
pub(super) struct OllamaError(ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.0.message });
        self.0.with_body(body)
    }
}

type Answer = Result<Response, OllamaError>;

/// `options`: the sampler's and the length's (others are ignored).
#[derive(Debug, Default, Deserialize)]
struct Options {
    num_predict: Option<i64>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
}

/// What `/api/chat` and `/api/generate` share.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    /// (`null` is no options, as clients send it.)
    #[serde(default, deserialize_with = "null_default")]
    options: Options,
    format: Option<Value>,
    stream: Option<bool>,
    images: Option<Vec<Value>>,
    keep_alive: Option<Value>,
    template: Option<String>,
}

/// A field's default where the body has `null`.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Deserialize)]
struct ChatFields {
    #[serde(default, deserialize_with = "null_default")]
    messages: Vec<OllamaMessage>,
    tools: Option<Value>,
    /// Separate the model's thoughts (`message.thinking`).
    think: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default, deserialize_with = "null_default")]
    content: String,
    images: Option<Vec<Value>>,
    tool_calls: Option<Vec<Value>>,
    tool_name: Option<String>,
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GenerateFields {
    #[serde(default, deserialize_with = "null_default")]
    prompt: String,
    system: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    raw: bool,
    suffix: Option<String>,
    context: Option<Vec<Value>>,
}

/// Check an Ollama model name: the served model's id or an alias, with or without
/// `:latest`, is answered under the name the request used; any other under the served
/// model's id, or (`--strict-model`) not at all.
fn model(st: &AppState, name: &Option<String>) -> Result<String, ApiError> {
    let Some(name) = name.as_deref().filter(|n| !n.is_empty()) else {
        return Err(ApiError::invalid_param("model", "model is required"));
    };
    let bare = name.strip_suffix(":latest").unwrap_or(name);
    if serves(st, name) || serves(st, bare) {
        return Ok(name.to_string());
    }
    check_model(st, &Some(name.to_string())).map_err(|e| ApiError {
        message: format!("model '{name}' not found"),
        ..e
    })
}

/// The OpenAI generation fields of `options` and `format`.
fn params(c: &Common) -> Result<Map<String, Value>, ApiError> {
    let o = &c.options;
    let mut p = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            p.insert(k.into(), v);
        }
    };
    put("top_k", o.top_k.map(|v| json!(v)));
    put("top_p", o.top_p.map(|v| json!(v)));
    put("min_p", o.min_p.map(|v| json!(v)));
    put("repeat_penalty", o.repeat_penalty.map(|v| json!(v)));
    put("presence_penalty", o.presence_penalty.map(|v| json!(v)));
    put("frequency_penalty", o.frequency_penalty.map(|v| json!(v)));
    let format = match &c.format {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(json!({"type": "json_object"})),
        Some(schema @ Value::Object(_)) => Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema},
        })),
        Some(other) => {
            return Err(ApiError::invalid_param(
                "format",
                format!("format must be \"json\" or a JSON schema, not {other}"),
            ))
        }
    };
    put("response_format", format);
    Ok(p)
}

/// An error about an OpenAI field, named as the Ollama request spells it.
fn ollama_names(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("response_format" | "json_schema") => Some(("response_format", "format")),
        Some("response_format.json_schema.schema") => {
            Some(("response_format.json_schema.schema", "format"))
        }
        Some(
            p @ ("top_k" | "top_p" | "min_p" | "repeat_penalty" | "presence_penalty"
            | "frequency_penalty"),
        ) => Some((p, "")),
        _ => None,
    };
    if let Some((from, to)) = renamed {
        let to = match to {
            "" => format!("options.{from}"),
            t => t.to_string(),
        };
        let short = to.strip_prefix("options.").unwrap_or(&to).to_string();
        e.message = e.message.replace(from, &short);
        e.param = Some(to);
    }
    e
}

/// Refuse what kiln cannot honour (images), where the request carries it.
fn no_images(images: &Option<Vec<Value>>, param: &str) -> Result<(), ApiError> {
    match images {
        Some(v) if !v.is_empty() => Err(ApiError::invalid_param(
            param,
            "images are not supported: kiln runs text models",
        )),
        _ => Ok(()),
    }
}

/// Ollama's messages as OpenAI's: a call gets an id (Ollama's have none), and a `tool` answer
/// the id of the earliest unanswered call of its `tool_name`.
fn openai_messages(msgs: &[OllamaMessage]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(msgs.len());
    // The calls not yet answered: (id, tool name).
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        no_images(&m.images, &format!("messages[{i}].images"))?;
        let mut v = json!({"role": m.role, "content": m.content});
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            open.clear();
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    let id = c
                        .get("id")
                        .and_then(Value::as_str)
                        .map_or_else(|| format!("call_{i}_{j}"), str::to_owned);
                    let f = c.get("function").cloned().unwrap_or(Value::Null);
                    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
                    open.push((id.clone(), name.to_owned()));
                    json!({"id": id, "type": "function", "function": f})
                })
                .collect();
            v["tool_calls"] = json!(calls);
        }
        if let (true, Some(id)) = (m.role == "tool", &m.tool_call_id) {
            // (The id the client kept of the call it answers.)
            open.retain(|(open_id, _)| open_id != id);
            v["tool_call_id"] = json!(id);
            if let Some(n) = &m.tool_name {
                v["name"] = json!(n);
            }
        } else if m.role == "tool" {
            let name = m.tool_name.as_deref();
            let at = open
                .iter()
                .position(|(_, n)| name.is_none_or(|t| t == n))
                .unwrap_or(0);
            let id = match open.is_empty() {
                true => format!("call_{i}"),
                false => open.remove(at).0,
            };
            v["tool_call_id"] = json!(id);
            if let Some(n) = name {
                v["name"] = json!(n);
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// A generation request's body: the fields `/api/chat` and `/api/generate` share, checked
/// (`model`, no `images`, no `template`), the route's own, and the model's name.
async fn read_request<T: serde::de::DeserializeOwned>(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
    route_fields: &[unsupported::Field],
) -> Result<(Common, T, String), ApiError> {
    let v = api::object(&read_body(st, headers, body).await?)?;
    let common: Common = api::typed(&v)?;
    let fields: T = api::typed(&v)?;
    unsupported::check(&v, "", unsupported::OLLAMA_GENERATE)?;
    unsupported::check(&v, "", route_fields)?;
    if let Some(o) = v.get("options") {
        unsupported::check(o, "options.", unsupported::OLLAMA_OPTIONS)?;
    }
    let model = model(st, &common.model)?;
    no_images(&common.images, "images")?;
    no_template(&common.template)?;
    Ok((common, fields, model))
}

async fn chat(State(st): St, headers: HeaderMap, body: Body) -> Answer {
    let start = Instant::now();
    let (common, fields, model) = read_request::<ChatFields>(&st, &headers, body, &[]).await?;
    let stream = common.stream.unwrap_or(true);
    if fields.messages.is_empty() {
        // (Ollama loads the model and says so.)
        let reason = load_reason(&common.keep_alive);
        return Ok(Json(loaded(Kind::Chat, model, start, reason)).into_response());
    }
    let mut req = params(&common)?;
    req.insert("messages".into(), json!(openai_messages(&fields.messages)?));
    // (Clients send `[]` for no tools.)
    let some = |t: &Value| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty());
    if let Some(t) = fields.tools.filter(some) {
        req.insert("tools".into(), t);
    }
    if fields.think == Some(true) {
        req.insert("reasoning_format".into(), json!("deepseek"));
    }
    let req = ChatRequest::from_json(&Value::Object(req))?;
    let (mut job, tools) = chat_job(&st, &req, model).map_err(ollama_names)?;
    apply_options(&mut job, &common.options, st.opts.n_ctx)?;
    match answer(&st, job, Kind::Chat, stream, start).await {
        Err(e) => Err(OllamaError(tool_error(e.0, tools.as_ref(), &st).await)),
        r => r,
    }
}

async fn generate(State(st): St, headers: HeaderMap, body: Body) -> Answer {
    let start = Instant::now();
    let (common, fields, model) =
        read_request::<GenerateFields>(&st, &headers, body, unsupported::OLLAMA_RAW_THINK).await?;
    if fields.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(ApiError::invalid_param(
            "context",
            "context is not supported: send the conversation to /api/chat",
        )
        .into());
    }
    let stream = common.stream.unwrap_or(true);
    // (Ollama fills in the middle only through a template: not with `raw`.)
    let suffix = (fields.suffix.as_deref()).filter(|s| !s.is_empty() && !fields.raw);
    if fields.prompt.is_empty() {
        let reason = load_reason(&common.keep_alive);
        return Ok(Json(loaded(Kind::Generate, model, start, reason)).into_response());
    }
    let mut req = params(&common)?;
    let mut job = if let Some(suffix) = suffix {
        // (Fill in the middle: the model's FIM tokens around the prompt and the suffix, as
        // Ollama's code models' templates put them, whatever `system` says.)
        let ids = fim_prompt(&st, &fields.prompt, suffix).map_err(|e| {
            ApiError::invalid_param(
                "suffix",
                format!("{model} does not support insert: {}", e.message),
            )
        })?;
        req.insert("prompt".into(), json!(ids));
        let req = CompletionRequest::from_json(&Value::Object(req))?;
        completion_job(&st, &req, model).map_err(ollama_names)?
    } else if fields.raw {
        req.insert("prompt".into(), json!(fields.prompt));
        let req = CompletionRequest::from_json(&Value::Object(req))?;
        completion_job(&st, &req, model).map_err(ollama_names)?
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = fields.system.as_ref().filter(|s| !s.is_empty()) {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": fields.prompt}));
        req.insert("messages".into(), json!(msgs));
        let req = ChatRequest::from_json(&Value::Object(req))?;
        chat_job(&st, &req, model).map_err(ollama_names)?.0
    };
    apply_options(&mut job, &common.options, st.opts.n_ctx)?;
    answer(&st, job, Kind::Generate, stream, start).await
}

/// The `options` Ollama takes beyond OpenAI's limits, on the job ([`api::WideParams`]):
/// `num_predict` (cut to the context, as Ollama does; negative: no limit), `temperature`,
/// `stop`, `repeat_last_n`, `seed` (negative: random).
fn apply_options(job: &mut Job, o: &Options, n_ctx: usize) -> Result<(), ApiError> {
    let wide = api::WideParams {
        prefix: "options.",
        max_new: o.num_predict,
        max_name: "num_predict",
        temperature: o.temperature,
        stop: o.stop.as_deref(),
        repeat_last_n: o.repeat_last_n,
        seed: o.seed,
        ..Default::default()
    };
    wide.apply(&mut job.gen, n_ctx)
}

/// `done_reason` of a request with nothing to generate: `unload` where `keep_alive` is 0.
fn load_reason(keep_alive: &Option<Value>) -> &'static str {
    match keep_alive {
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => "unload",
        Some(Value::String(s)) if s.trim_end_matches(['s', 'm', 'h']) == "0" => "unload",
        _ => "load",
    }
}

/// Refuse `template` (kiln renders the model's own chat template).
fn no_template(t: &Option<String>) -> Result<(), ApiError> {
    match t {
        Some(t) if !t.is_empty() => Err(ApiError::invalid_param(
            "template",
            "template is not supported: kiln renders the model's chat template",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_format_become_openai_fields() {
        let c: Common = serde_json::from_value(json!({
            "model": "m",
            "options": {"num_predict": 7, "temperature": 0.5, "top_k": 3, "stop": ["x"],
                        "num_ctx": 4096, "seed": 9},
            "format": "json",
        }))
        .unwrap();
        let p = params(&c).unwrap();
        assert_eq!(p["top_k"], 3);
        assert_eq!(p["response_format"], json!({"type": "json_object"}));
        // (Ollama's own limits: on the job, by `apply_options`.)
        for k in ["num_ctx", "max_tokens", "temperature", "stop", "seed"] {
            assert!(!p.contains_key(k), "{k}");
        }
        let schema: Common = serde_json::from_value(json!({"format": {"type": "object"}})).unwrap();
        let p = params(&schema).unwrap();
        assert_eq!(
            p["response_format"]["json_schema"]["schema"]["type"],
            "object"
        );
        let bad: Common = serde_json::from_value(json!({"format": "yaml"})).unwrap();
        assert_eq!(params(&bad).unwrap_err().param.as_deref(), Some("format"));
    }

    #[test]
    fn load_and_unload() {
        assert_eq!(load_reason(&None), "load");
        assert_eq!(load_reason(&Some(json!("5m"))), "load");
        for zero in [json!(0), json!("0"), json!("0s"), json!(0.0)] {
            assert_eq!(load_reason(&Some(zero.clone())), "unload", "{zero}");
        }
    }

    #[test]
    fn errors_name_ollama_fields() {
        let e = ollama_names(ApiError::invalid_param(
            "top_p",
            "top_p = 9 must be at most 1",
        ));
        assert_eq!(e.param.as_deref(), Some("options.top_p"));
        let e = ollama_names(ApiError::invalid_param("json_schema", "json_schema is bad"));
        assert_eq!(e.param.as_deref(), Some("format"));
        let e = ollama_names(ApiError::invalid_param("messages", "m"));
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn tool_answers_take_their_calls_ids() {
        let msgs: Vec<OllamaMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "a", "arguments": {"x": 1}}},
                {"function": {"name": "b", "arguments": {}}}]},
            {"role": "tool", "content": "B", "tool_name": "b"},
            {"role": "tool", "content": "A"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "k1", "function": {"name": "a", "arguments": {}}},
                {"id": "k2", "function": {"name": "a", "arguments": {}}}]},
            {"role": "tool", "content": "2", "tool_call_id": "k2", "tool_name": "a"},
            {"role": "tool", "content": "1", "tool_name": "a"},
        ]))
        .unwrap();
        let v = openai_messages(&msgs).unwrap();
        assert_eq!(v[1]["tool_calls"][0]["id"], "call_1_0");
        assert_eq!(
            v[1]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(v[2]["tool_call_id"], "call_1_1");
        assert_eq!(v[2]["name"], "b");
        assert_eq!(v[3]["tool_call_id"], "call_1_0");
        // A tool answer's own `tool_call_id` wins; the next takes the call left open.
        assert_eq!(v[5]["tool_call_id"], "k2");
        assert_eq!(v[6]["tool_call_id"], "k1");
        let images: Vec<OllamaMessage> =
            serde_json::from_value(json!([{"role": "user", "content": "", "images": ["AA=="]}]))
                .unwrap();
        let e = openai_messages(&images).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].images"));
    }
}
