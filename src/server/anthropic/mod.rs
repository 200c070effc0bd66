//! Anthropic's Messages API (`/v1/messages`): apps written for Claude (the `anthropic` Python
//! and TypeScript SDKs, Claude Code with `ANTHROPIC_BASE_URL`, LangChain's `ChatAnthropic`)
//! talk to `kiln serve` as they talk to Anthropic, as llama-server and Ollama let them.
//!
//! A request becomes the job of the OpenAI chat route ([`super::jobs::chat_job`]): one set of
//! checks, the same template, tools, grammar and sampler; its messages much as llama-server
//! converts them (`server_chat_convert_anthropic_to_oai`), but a user turn's tool results go
//! before its text (in the order they happened). The answer is Anthropic's: a `message` with
//! `content` blocks (`text`, `tool_use` with an `input` object), `stop_reason` (`end_turn`,
//! `max_tokens`, `stop_sequence` with the `stop_sequence` met, `tool_use`) and `usage`; streamed
//! as Anthropic's named events (`message_start`, `content_block_start`, `content_block_delta`
//! with `text_delta` or `input_json_delta`, `content_block_stop`, `message_delta`,
//! `message_stop`); errors as `{"type": "error", "error": {"type", "message"}}`.
//!
//! - `POST /v1/messages`: `model` (any name: see `check_model`; absent: the served one),
//!   `messages` (user and assistant turns; content a string or blocks: `text`, `tool_use`,
//!   `tool_result` with a string or text blocks; `thinking` blocks are dropped), `system` (a
//!   string or text blocks), `max_tokens` (absent: up to the context; llama-server takes 4096),
//!   `stop_sequences`, `temperature`, `top_p`, `top_k`, `tools` (`name`, `description`,
//!   `input_schema`), `tool_choice` (`auto`, `any`, `tool` with a `name`, `none`;
//!   `disable_parallel_tool_use`), `stream`, `thinking` (`enabled` with a `budget_tokens`
//!   below `max_tokens`: the model's reasoning as a `thinking` block, streamed as
//!   `thinking_delta`s, and the template's `enable_thinking` switch on; `disabled`: off),
//!   `chat_template_kwargs` (llama-server's). A final assistant message with text is a prefill:
//!   the answer continues it. Other fields (`metadata`, `service_tier`, ...) are ignored;
//!   `mcp_servers` and `container` are refused by name ([`super::unsupported`]). Refused with a 400 naming the block: images, documents (inside a `tool_result`
//!   they become a text placeholder), server tools, a `tool_use` input other than an object, an
//!   empty content list. `max_tokens` beyond the context is cut to the room left and
//!   `stop_sequences` take llama-server's limits ([`api::WideParams`]), not OpenAI's.
//! - `POST /v1/messages/count_tokens`: the prompt's tokens (`input_tokens`) for the same body
//!   (no `max_tokens`).
//!
//! `usage.input_tokens` counts the whole prompt (prefix-cache hits included).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::api::{self, Body as RequestBody, ChatRequest};
use super::error::ApiError;
use super::jobs::{chat_job, chat_prompt, check_model, read_body, tool_error};
use super::{unsupported, AppState};

mod answer;
#[cfg(test)]
mod tests;

type St = State<Arc<AppState>>;

/// The routes' paths (the request counter names them), in [`routes`]' order.
pub(super) const PATHS: [&str; 2] = ["/v1/messages", "/v1/messages/count_tokens"];

/// The routes, for the router's keyed part (`--api-key` applies; Anthropic's clients send it
/// as `x-api-key`).
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(PATHS[0], post(messages))
        .route(PATHS[1], post(count_tokens))
}

/// An error as Anthropic answers it: the status, `{"type": "error", "error": {"type",
/// "message"}}`.
pub(super) struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s < 500 => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error's body in Anthropic's shape.
pub(super) fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = error_body(self.0.status, &self.0.message);
        self.0.with_body(body)
    }
}

/// The fields read here; the rest of the body is ignored.
#[derive(Debug, Deserialize)]
struct Request {
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Value>,
    system: Option<Value>,
    max_tokens: Option<Value>,
    stop_sequences: Option<Value>,
    stream: Option<bool>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    top_k: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    chat_template_kwargs: Option<Value>,
}

async fn messages(
    State(st): St,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AnthropicError> {
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let (req, model, stream) = chat_request(&st, &v)?;
    let (mut job, tools) = chat_job(&st, &req.chat, model).map_err(anthropic_names)?;
    req.wide()
        .apply(&mut job.gen, st.opts.n_ctx)
        .map_err(anthropic_names)?;
    match answer::answer(&st, job, stream).await {
        Ok(r) => Ok(r),
        Err(e) => Err(anthropic_names(tool_error(e, tools.as_ref(), &st).await).into()),
    }
}

async fn count_tokens(
    State(st): St,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, AnthropicError> {
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let (req, _, _) = chat_request(&st, &v)?;
    let (_, _, prompt) = chat_prompt(&st, &req.chat).map_err(anthropic_names)?;
    Ok(Json(json!({ "input_tokens": prompt.len() })))
}

/// A request as the OpenAI route's, and the fields held to llama-server's limits rather than
/// OpenAI's ([`api::WideParams`]): `max_tokens` cut to the room the context leaves (the answer
/// then stops with `max_tokens`), `stop_sequences` beyond OpenAI's 4.
struct Converted {
    chat: ChatRequest,
    max_tokens: Option<i64>,
    stop: Option<Vec<String>>,
}

impl Converted {
    fn wide(&self) -> api::WideParams<'_> {
        api::WideParams {
            max_new: self.max_tokens,
            max_name: "max_tokens",
            stop: self.stop.as_deref(),
            ..Default::default()
        }
    }
}

/// `max_tokens`: a whole number of at least 1.
fn max_tokens(v: Option<&Value>) -> Result<Option<i64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_i64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::invalid_param(
                "max_tokens",
                format!("max_tokens = {x}: a whole number of at least 1"),
            )),
        },
    }
}

/// `stop_sequences`: a list of strings.
fn stop_sequences(v: Option<&Value>) -> Result<Option<Vec<String>>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => serde_json::from_value(x.clone()).map(Some).map_err(|_| {
            ApiError::invalid_param("stop_sequences", "stop_sequences must be a list of strings")
        }),
    }
}

/// The body as the OpenAI route's request, the model's name, and whether to stream.
fn chat_request(st: &AppState, v: &Value) -> Result<(Converted, String, bool), ApiError> {
    let r: Request = api::typed(v)?;
    unsupported::check(v, "", unsupported::ANTHROPIC)?;
    let model = check_model(st, &r.model)?;
    if r.messages.is_empty() {
        // (Else the system prompt alone would be the conversation.)
        return Err(ApiError::invalid_param(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let mut m = Map::new();
    let msgs = openai_messages(r.system.as_ref(), &r.messages)?;
    m.insert("messages".into(), json!(msgs));
    let wide = (
        max_tokens(r.max_tokens.as_ref())?,
        stop_sequences(r.stop_sequences.as_ref())?,
    );
    let pass = [
        ("temperature", r.temperature),
        ("top_p", r.top_p),
        ("top_k", r.top_k),
    ];
    for (k, x) in pass {
        if let Some(x) = x {
            m.insert(k.into(), x);
        }
    }
    if let Some(tools) = r.tools.filter(|t| !t.is_empty()) {
        m.insert("tools".into(), json!(openai_tools(&tools)?));
    }
    if let Some(c) = &r.tool_choice {
        let (choice, parallel) = openai_tool_choice(c)?;
        m.insert("tool_choice".into(), choice);
        if let Some(p) = parallel {
            m.insert("parallel_tool_calls".into(), json!(p));
        }
    }
    let thinking = thinking(r.thinking.as_ref(), wide.0)?;
    let mut kwargs = r.chat_template_kwargs.unwrap_or(Value::Null);
    if let (Some(on), Value::Null | Value::Object(_)) = (thinking, &kwargs) {
        // (As the template's switch, where it has one: Qwen 3's `enable_thinking`.)
        if kwargs.get("enable_thinking").is_none() {
            kwargs["enable_thinking"] = json!(on);
        }
    }
    if !kwargs.is_null() {
        m.insert("chat_template_kwargs".into(), kwargs);
    }
    let mut chat = ChatRequest::from_json(&Value::Object(m)).map_err(anthropic_names)?;
    chat.prefill = true;
    chat.reasoning = thinking == Some(true);
    let req = Converted {
        chat,
        max_tokens: wide.0,
        stop: wide.1,
    };
    Ok((req, model, r.stream.unwrap_or(false)))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (N at least 1 and below `max_tokens`:
/// the reasoning is bounded by `max_tokens`, as the answer is) separates the model's reasoning
/// into a `thinking` block; `{"type": "disabled"}` does not. `Some(on)` where it was given.
fn thinking(v: Option<&Value>, max_tokens: Option<i64>) -> Result<Option<bool>, ApiError> {
    let v = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    match v.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(Some(false)),
        Some("enabled") => {
            let budget = v.get("budget_tokens").and_then(Value::as_i64);
            match (budget, max_tokens) {
                (Some(b), Some(m)) if b >= 1 && b < m => Ok(Some(true)),
                (Some(b), None) if b >= 1 => Ok(Some(true)),
                (Some(_), Some(m)) => Err(ApiError::invalid_param(
                    "thinking.budget_tokens",
                    format!("thinking.budget_tokens must be at least 1 and less than max_tokens ({m})"),
                )),
                _ => Err(ApiError::invalid_param(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens must be a whole number of at least 1",
                )),
            }
        }
        _ => Err(ApiError::invalid_param(
            "thinking.type",
            "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
        )),
    }
}

/// An error naming an OpenAI field (of the converted request, or of the shared job code),
/// renamed to the Anthropic field it came from.
fn anthropic_names(mut e: ApiError) -> ApiError {
    // (OpenAI's name, Anthropic's; a tool's fields after `tools[i]`.)
    const RENAMES: [(&str, &str); 5] = [
        (
            "parallel_tool_calls",
            "tool_choice.disable_parallel_tool_use",
        ),
        (".function.parameters", ".input_schema"),
        (".function.description", ".description"),
        (".function.name", ".name"),
        (".function", ""),
    ];
    let Some(param) = e.param.clone() else {
        return e;
    };
    if param == "stop" {
        e.message = e.message.replace("stop", "stop_sequences");
        e.param = Some("stop_sequences".into());
        return e;
    }
    if let Some((from, to)) = RENAMES.iter().find(|(from, _)| param.contains(from)) {
        let renamed = param.replacen(from, to, 1);
        e.message = e.message.replace(&param, &renamed);
        if *from == "parallel_tool_calls" {
            e.message = e.message.replace(from, to);
        }
        e.param = Some(renamed);
    }
    e
}

/// A block's `type`, or a 400 naming it.
fn block_type<'a>(b: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    b.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_param(at, format!("{at}: a content block needs a `type`")))
}

/// A string field of a block, or a 400 naming it.
fn text_of<'a>(b: &'a Value, field: &str, at: &str) -> Result<&'a str, ApiError> {
    b.get(field).and_then(Value::as_str).ok_or_else(|| {
        let at = format!("{at}.{field}");
        ApiError::invalid_param(&at, format!("{at} must be a string"))
    })
}

/// The texts of a list of `text` blocks (a system prompt, a tool result), joined as
/// llama-server joins them (nothing between). In a tool result (`media`), an image or a
/// document becomes a placeholder naming it (the model reads text).
fn texts(v: &Value, at: &str, media: bool) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("{at}[{i}]");
                match block_type(b, &at)? {
                    "text" => out.push_str(text_of(b, "text", &at)?),
                    kind @ ("image" | "document") if media => {
                        out.push_str(&format!("[{kind} omitted: this model reads text only]"))
                    }
                    other => return Err(unsupported(&at, other)),
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid_param(
            at,
            format!("{at} must be a string or a list of text blocks"),
        )),
    }
}

/// A 400 for a block kiln cannot read.
fn unsupported(at: &str, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => format!("{kind} blocks are not supported (the model reads text)"),
        _ => format!("content blocks of type `{kind}` are not supported here"),
    };
    ApiError::invalid_param(at, format!("{at}: {why}"))
}

/// Claude Code opens its system prompt with `x-anthropic-billing-header: ...; cch=XXXXX;`,
/// the `cch` stamp different on every request: blanked (to `fffff`), as llama-server does, so
/// that the prompt's prefix is the same from one request to the next (the prefix cache).
fn steady_billing_header(system: &mut String) {
    const HEAD: &str = "x-anthropic-billing-header:";
    if !system.starts_with(HEAD) {
        return;
    }
    if let Some(at) = system[HEAD.len()..].find("cch=") {
        let start = HEAD.len() + at + 4;
        let stamp = system.get(start..start + 5);
        if stamp.is_some_and(|s| s.is_ascii()) && system.as_bytes().get(start + 5) == Some(&b';') {
            system.replace_range(start..start + 5, "fffff");
        }
    }
}

/// Anthropic's system prompt and messages as OpenAI's messages: a message's `text` blocks its
/// content parts, an assistant's `tool_use` blocks its `tool_calls` (the input object as the
/// arguments' JSON text), a user's `tool_result` blocks `tool` messages (before its text, as
/// Anthropic puts the results first).
fn openai_messages(system: Option<&Value>, msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if let Some(s) = system.filter(|s| !s.is_null()) {
        let mut text = texts(s, "system", false)?;
        steady_billing_header(&mut text);
        out.push(json!({"role": "system", "content": text}));
    }
    for (i, m) in msgs.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        let role = match role {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                let at = format!("{at}.role");
                return Err(ApiError::invalid_param(
                    &at,
                    format!(
                        "{at} must be \"user\" or \"assistant\" (the system prompt is `system`)"
                    ),
                ));
            }
        };
        let content = m.get("content").unwrap_or(&Value::Null);
        let blocks = match content {
            Value::String(s) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            // (Anthropic's one exception: an empty final assistant turn, no prefill.)
            Value::Array(b) if b.is_empty() && role == "assistant" && i + 1 == msgs.len() => {
                continue
            }
            Value::Array(b) if b.is_empty() => {
                let at = format!("{at}.content");
                return Err(ApiError::invalid_param(
                    &at,
                    format!("{at} is empty: a message needs at least one content block"),
                ));
            }
            Value::Array(b) => b,
            _ => {
                let at = format!("{at}.content");
                return Err(ApiError::invalid_param(
                    &at,
                    format!("{at} must be a string or a list of content blocks"),
                ));
            }
        };
        let mut parts = Vec::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            match (block_type(b, &at)?, role) {
                ("text", _) => {
                    parts.push(json!({"type": "text", "text": text_of(b, "text", &at)?}))
                }
                ("thinking" | "redacted_thinking", _) => {}
                ("tool_use", "assistant") => {
                    let input = match b.get("input") {
                        None => json!({}),
                        Some(i @ Value::Object(_)) => i.clone(),
                        Some(other) => {
                            let at = format!("{at}.input");
                            return Err(ApiError::invalid_param(
                                &at,
                                format!(
                                    "{at} must be an object (the tool's arguments), not {other}"
                                ),
                            ));
                        }
                    };
                    calls.push(json!({"id": text_of(b, "id", &at)?, "type": "function",
                        "function": {"name": text_of(b, "name", &at)?,
                                     "arguments": input.to_string()}}));
                }
                ("tool_result", "user") => {
                    let id = text_of(b, "tool_use_id", &at)?;
                    let result = texts(
                        b.get("content").unwrap_or(&Value::Null),
                        &format!("{at}.content"),
                        true,
                    )?;
                    out.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                }
                (kind @ ("tool_use" | "tool_result"), _) => {
                    let owner = if kind == "tool_use" {
                        "an assistant"
                    } else {
                        "a user"
                    };
                    return Err(ApiError::invalid_param(
                        &at,
                        format!(
                            "{at}: a `{kind}` block belongs in {owner} message, not a {role} one"
                        ),
                    ));
                }
                (other, _) => return Err(unsupported(&at, other)),
            }
        }
        if !parts.is_empty() || !calls.is_empty() {
            let mut v = json!({"role": role, "content": parts});
            if parts.is_empty() {
                v["content"] = json!("");
            }
            if !calls.is_empty() {
                v["tool_calls"] = json!(calls);
            }
            out.push(v);
        }
    }
    Ok(out)
}

/// Anthropic's tools (`name`, `description`, `input_schema`) as OpenAI's functions. Server
/// tools (a `type` other than `custom`: web search, code execution, ...) run at Anthropic.
fn openai_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(ApiError::invalid_param(
                    &at,
                    format!("{at}: server tools (`type` {kind}) are not supported: give a `name`, a `description` and an `input_schema`"),
                ));
            }
            let name = text_of(t, "name", &at)?;
            let mut f = json!({"name": name});
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f["description"] = d.clone();
            }
            f["parameters"] = t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}));
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// Anthropic's `tool_choice` as OpenAI's, and `parallel_tool_calls` where it says.
fn openai_tool_choice(c: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let at = "tool_choice";
    let kind = c.get("type").and_then(Value::as_str).unwrap_or("");
    let choice = match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => json!({"type": "function", "function": {"name": text_of(c, "name", at)?}}),
        _ => {
            return Err(ApiError::invalid_param(
                at,
                "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}",
            ))
        }
    };
    let parallel = c
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    Ok((choice, parallel))
}
