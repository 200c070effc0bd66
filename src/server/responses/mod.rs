//! OpenAI's Responses API (`POST /v1/responses`): clients written for it (the `openai` SDKs'
//! `client.responses`, Codex CLI, the OpenAI Agents SDK) talk to `kiln serve` as they talk to
//! OpenAI.
//!
//! A request becomes the job of the OpenAI chat route ([`super::jobs::chat_job`]), as
//! `/v1/messages` does: one set of checks, the same template, tools, grammar and sampler.
//!
//! - `input`: a string (one user message) or a list of items: messages (`role` `user`,
//!   `system`, `developer` or `assistant`; `content` a string or `input_text` / `output_text`
//!   parts), `function_call` items (`call_id`, `name`, `arguments`) and `function_call_output`
//!   items (`call_id`, `output`); `reasoning` items are dropped (the template renders no
//!   thoughts). A model that thinks (its template's reasoning style, as `reasoning_format`
//!   separates it on the chat route) answers with a `reasoning` item first (its text in
//!   `content` as `reasoning_text`; `summary` empty), streamed as
//!   `response.reasoning_text.delta` / `.done` events. `instructions` is the system message, first.
//! - `tools`: function tools in the Responses shape (`type: function`, `name`, `description`,
//!   `parameters`, flat); `tool_choice` (`auto`, `none`, `required`, or `{type: function,
//!   name}`); `parallel_tool_calls`.
//! - `max_output_tokens`, `temperature`, `top_p`; `text.format` (`text`, `json_object`, or
//!   `json_schema` with `name`, `schema`, `strict`) constrains the answer as `response_format`
//!   does.
//! - `stream`: the typed events (`response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`,
//!   `response.output_text.delta`, `response.output_text.done`, `response.content_part.done`,
//!   `response.function_call_arguments.delta` / `.done`, `response.output_item.done`,
//!   `response.completed`), each with its `sequence_number`.
//! - `previous_response_id`: the conversation of a stored response (its input and its output)
//!   goes before this input. Responses are kept in memory, the last [`store::STORE_CAPACITY`], per
//!   tenant (the API key's hash: one key cannot read another's responses); `store: false`
//!   keeps none.
//! - `GET /v1/responses/{id}` gives a stored response as it was answered; `DELETE
//!   /v1/responses/{id}` forgets it (`{"id", "object": "response.deleted", "deleted": true}`).
//!   An id the tenant has not stored (or no longer) is a 404.
//!
//! Refused with a 400 in OpenAI's error shape naming the field: a missing or malformed
//! `input`, items or parts kiln cannot read (images, files, built-in tools), an unknown
//! `previous_response_id`, bad sampling values. `usage` counts the whole prompt.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::api::{self, Body as RequestBody, ChatRequest};
use super::error::ApiError;
use super::jobs::{chat_job, check_model, read_body, tool_error};
use super::parts::{Part, PartStep, Parts};
use super::respond::{self, Answers, Ev, Job, Pump};
use super::tenant::tenant;
use super::{unix_now, AppState};
use crate::engine::scheduler::FinishReason;

mod store;

type St = State<Arc<AppState>>;

/// The routes' paths (the request counter names them): create, and retrieve or delete.
pub(super) const PATHS: [&str; 2] = ["/v1/responses", "/v1/responses/{id}"];

/// The routes, for the router's keyed part (`--api-key` applies).
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(PATHS[0], post(create))
        .route(PATHS[1], get(retrieve).delete(delete))
}

/// `GET /v1/responses/{id}`: a stored response, as it was answered (the tenant's own only).
async fn retrieve(Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    store::response(tenant(None), &id)
        .map(Json)
        .ok_or_else(|| store::not_found(&id))
}

/// `DELETE /v1/responses/{id}`: forget a stored response (`previous_response_id` can no longer
/// name it).
async fn delete(Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    match store::delete(tenant(None), &id) {
        true => Ok(Json(
            json!({"id": id, "object": "response.deleted", "deleted": true}),
        )),
        false => Err(store::not_found(&id)),
    }
}

/// The fields read here; the rest of the body is ignored.
#[derive(Debug, Deserialize)]
struct Request {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
    max_output_tokens: Option<Value>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    text: Option<Value>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
}

/// What the answer reports of its request.
struct Echo {
    id: String,
    created: u64,
    model: String,
    fields: Map<String, Value>,
    /// The request's conversation (for the store), `None` with `store: false`.
    keep: Option<(u64, Vec<Value>)>,
}

async fn create(State(st): St, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let r: Request = api::typed(&v)?;
    let model = check_model(&st, &r.model)?;
    let tenant = tenant(None);
    let mut messages = match &r.previous_response_id {
        Some(id) => store::messages(tenant, id).ok_or_else(|| {
            ApiError::invalid_param(
                "previous_response_id",
                format!("previous_response_id: no stored response {id:?}"),
            )
        })?,
        None => Vec::new(),
    };
    if let Some(i) = &r.instructions {
        let text = i.as_str().ok_or_else(|| {
            ApiError::invalid_param("instructions", "instructions must be a string")
        })?;
        messages.insert(0, json!({"role": "system", "content": text}));
    }
    let input = r
        .input
        .as_ref()
        .ok_or_else(|| ApiError::invalid_param("input", "input is required"))?;
    messages.extend(input_messages(input)?);
    let chat = chat_request(&r, &messages)?;
    let (mut job, tools) = chat_job(&st, &chat, model.clone()).map_err(responses_names)?;
    job.head.id = format!(
        "resp_{}",
        job.head.id.rsplit('-').next().unwrap_or_default()
    );
    let mut fields = Map::new();
    let echo_fields = [
        ("instructions", r.instructions.clone()),
        ("max_output_tokens", r.max_output_tokens.clone()),
        ("temperature", r.temperature.clone()),
        ("top_p", r.top_p.clone()),
        ("tools", r.tools.clone().or(Some(json!([])))),
        ("tool_choice", r.tool_choice.clone().or(Some(json!("auto")))),
        (
            "parallel_tool_calls",
            r.parallel_tool_calls.clone().or(Some(json!(true))),
        ),
        (
            "previous_response_id",
            r.previous_response_id.clone().map(Value::from),
        ),
        ("store", Some(json!(r.store.unwrap_or(true)))),
        (
            "text",
            r.text.clone().or(Some(json!({"format": {"type": "text"}}))),
        ),
        ("metadata", r.metadata.clone().or(Some(json!({})))),
    ];
    for (k, x) in echo_fields {
        fields.insert(k.into(), x.unwrap_or(Value::Null));
    }
    // The stored conversation: this request's (the system message of `instructions` is not
    // carried on, as OpenAI's is not).
    let carried: Vec<Value> = match &r.instructions {
        Some(_) => messages[1..].to_vec(),
        None => messages,
    };
    let echo = Echo {
        id: job.head.id.clone(),
        created: unix_now(),
        model,
        fields,
        keep: r.store.unwrap_or(true).then_some((tenant, carried)),
    };
    let answer = answer(&st, job, echo, r.stream.unwrap_or(false)).await;
    match answer {
        Ok(r) => Ok(r),
        Err(e) => Err(tool_error(e, tools.as_ref(), &st).await),
    }
}

/// An error naming a chat field, renamed to the Responses field it came from.
fn responses_names(mut e: ApiError) -> ApiError {
    let renames = [
        ("max_tokens", "max_output_tokens"),
        ("response_format", "text.format"),
        ("messages", "input"),
    ];
    for (from, to) in renames {
        if e.param.as_deref() == Some(from) {
            e.message = e.message.replace(from, to);
            e.param = Some(to.into());
        }
    }
    e
}

/// The chat route's request for these messages and the request's other fields.
fn chat_request(r: &Request, messages: &[Value]) -> Result<ChatRequest, ApiError> {
    let mut m = Map::new();
    m.insert("messages".into(), json!(messages));
    for (k, x) in [
        ("max_tokens", &r.max_output_tokens),
        ("temperature", &r.temperature),
        ("top_p", &r.top_p),
        ("parallel_tool_calls", &r.parallel_tool_calls),
    ] {
        if let Some(x) = x.clone().filter(|x| !x.is_null()) {
            m.insert(k.into(), x);
        }
    }
    if let Some(tools) = r.tools.as_ref().filter(|t| !t.is_null()) {
        m.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(c) = r.tool_choice.as_ref().filter(|c| !c.is_null()) {
        m.insert("tool_choice".into(), chat_tool_choice(c)?);
    }
    if let Some(f) = r.text.as_ref().and_then(|t| t.get("format")) {
        if let Some(rf) = response_format(f)? {
            m.insert("response_format".into(), rf);
        }
    }
    let mut chat = ChatRequest::from_json(&Value::Object(m)).map_err(responses_names)?;
    // (A model that thinks answers with a reasoning item: the style is its template's.)
    chat.reasoning = true;
    Ok(chat)
}

/// `input` as chat messages.
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "input must be a string or a non-empty list of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = str_field(item, "role", &at)?;
                let role = match role {
                    "user" | "system" | "assistant" => role,
                    "developer" => "system",
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.role"),
                            format!("{at}.role: {role:?} is not user, system, developer or assistant"),
                        ))
                    }
                };
                let content = content_text(&item["content"], &format!("{at}.content"))?;
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let call = json!({
                    "id": str_field(item, "call_id", &at)?,
                    "type": "function",
                    "function": {
                        "name": str_field(item, "name", &at)?,
                        "arguments": str_field(item, "arguments", &at)?,
                    },
                });
                // Calls in a row are one assistant turn's.
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                        if let Some(calls) = m["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(o @ Value::Array(_)) => content_text(o, &format!("{at}.output"))?,
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.output"),
                            format!("{at}.output must be a string"),
                        ))
                    }
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": str_field(item, "call_id", &at)?,
                    "content": output,
                }));
            }
            // Thoughts of an earlier turn: the template renders none.
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    format!("{at}.type: items of type {other:?} are not supported (message, function_call, function_call_output)"),
                ))
            }
        }
    }
    Ok(out)
}

/// A string field of an item, or a 400 naming it.
fn str_field<'a>(item: &'a Value, field: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(field).and_then(Value::as_str).ok_or_else(|| {
        let at = format!("{at}.{field}");
        ApiError::invalid_param(&at, format!("{at} must be a string"))
    })
}

/// A message's content: a string, or text parts (`input_text`, `output_text`, `text`) joined.
fn content_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        out.push_str(str_field(p, "text", &at)?)
                    }
                    Some(other) => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.type"),
                            format!("{at}.type: {other:?} parts are not supported (the model reads text: input_text, output_text)"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.type"),
                            format!("{at}.type is required"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid_param(
            at,
            format!("{at} must be a string or a list of parts"),
        )),
    }
}

/// Responses tools (flat) as chat tools (nested under `function`).
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::invalid_param("tools", "tools must be a list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    format!(
                        "{at}.type: {} tools are not supported (function)",
                        other.unwrap_or("untyped")
                    ),
                ))
            }
        }
        let mut f = Map::new();
        f.insert("name".into(), json!(str_field(t, "name", &at)?));
        for k in ["description", "parameters", "strict"] {
            if let Some(x) = t.get(k).filter(|x| !x.is_null()) {
                f.insert(k.into(), x.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as the chat route takes it.
fn chat_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(c.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param("tool_choice.name", "tool_choice.name must be a string")
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as `response_format` (`None`: plain text).
fn response_format(f: &Value) -> Result<Option<Value>, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("text.format", format!("text.format: {m}"));
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| bad("json_schema needs a `schema` object"))?;
            let mut js = json!({"name": f.get("name").cloned().unwrap_or(json!("response")),
                                "schema": schema});
            if let Some(s) = f.get("strict").filter(|s| !s.is_null()) {
                js["strict"] = s.clone();
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(bad("type must be text, json_object or json_schema")),
    }
}

/// The response object being built: its output items, and the events that build it.
struct Building {
    echo: Echo,
    output: Vec<Value>,
    seq: u64,
    input_tokens: usize,
}

static NEXT_ITEM: AtomicU64 = AtomicU64::new(1);

fn item_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:x}{:06x}",
        unix_now(),
        NEXT_ITEM.fetch_add(1, Relaxed)
    )
}

impl Building {
    /// The response object, `status` and `usage` as given.
    fn object(&self, status: &str, usage: Value, incomplete: Value) -> Value {
        let mut o = json!({
            "id": self.echo.id,
            "object": "response",
            "created_at": self.echo.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.echo.model,
            "output": self.output,
            "usage": usage,
        });
        for (k, v) in &self.echo.fields {
            o[k] = v.clone();
        }
        o
    }

    /// An event: its `type`, its fields, and its sequence number.
    fn event(&mut self, kind: &'static str, mut v: Value) -> (&'static str, Value) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (kind, v)
    }

    /// The events of one step (applied to the response object as they go).
    fn step(&mut self, s: PartStep) -> Vec<(&'static str, Value)> {
        let index = self.output.len().saturating_sub(1);
        match s {
            PartStep::Open(Part::Text) => {
                let item = json!({"type": "message", "id": item_id("msg"), "status": "in_progress",
                                  "role": "assistant", "content": []});
                self.output.push(item.clone());
                let index = self.output.len() - 1;
                let part = json!({"type": "output_text", "text": "", "annotations": []});
                let id = item["id"].clone();
                self.output[index]["content"] = json!([part.clone()]);
                vec![
                    self.event("response.output_item.added", json!({"output_index": index, "item": item})),
                    self.event("response.content_part.added", json!({"item_id": id, "output_index": index,
                                                                      "content_index": 0, "part": part})),
                ]
            }
            PartStep::Open(Part::Reasoning) => {
                let item = json!({"type": "reasoning", "id": item_id("rs"), "summary": [],
                                  "content": [], "status": "in_progress"});
                self.output.push(item.clone());
                let index = self.output.len() - 1;
                let part = json!({"type": "reasoning_text", "text": ""});
                self.output[index]["content"] = json!([part.clone()]);
                vec![
                    self.event("response.output_item.added", json!({"output_index": index, "item": item.clone()})),
                    self.event("response.content_part.added", json!({"item_id": item["id"], "output_index": index,
                                                                      "content_index": 0, "part": part})),
                ]
            }
            PartStep::Open(Part::Call { id: call_id, name }) => {
                let item = json!({"type": "function_call", "id": item_id("fc"), "call_id": call_id,
                                  "name": name, "arguments": "", "status": "in_progress"});
                self.output.push(item.clone());
                let index = self.output.len() - 1;
                vec![self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                )]
            }
            PartStep::More(t) => {
                let Some(item) = self.output.last_mut() else {
                    return Vec::new();
                };
                let id = item["id"].clone();
                if item["type"] == "reasoning" {
                    if let Value::String(text) = &mut item["content"][0]["text"] {
                        text.push_str(&t);
                    }
                    vec![self.event("response.reasoning_text.delta", json!({"item_id": id, "output_index": index,
                                                                             "content_index": 0, "delta": t}))]
                } else if item["type"] == "message" {
                    if let Value::String(text) = &mut item["content"][0]["text"] {
                        text.push_str(&t);
                    }
                    vec![self.event("response.output_text.delta", json!({"item_id": id, "output_index": index,
                                                                          "content_index": 0, "delta": t,
                                                                          "logprobs": []}))]
                } else {
                    if let Value::String(a) = &mut item["arguments"] {
                        a.push_str(&t);
                    }
                    vec![self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": t}),
                    )]
                }
            }
            PartStep::Close => {
                let Some(item) = self.output.last_mut() else {
                    return Vec::new();
                };
                item["status"] = json!("completed");
                let item = item.clone();
                let id = item["id"].clone();
                let mut out = Vec::new();
                if item["type"] == "reasoning" {
                    let part = item["content"][0].clone();
                    out.push(self.event("response.reasoning_text.done", json!({"item_id": id, "output_index": index,
                                                                                "content_index": 0, "text": part["text"]})));
                    out.push(self.event("response.content_part.done", json!({"item_id": id, "output_index": index,
                                                                             "content_index": 0, "part": part})));
                } else if item["type"] == "message" {
                    let part = item["content"][0].clone();
                    out.push(self.event("response.output_text.done", json!({"item_id": id, "output_index": index,
                                                                             "content_index": 0, "text": part["text"],
                                                                             "logprobs": []})));
                    out.push(self.event("response.content_part.done", json!({"item_id": id, "output_index": index,
                                                                             "content_index": 0, "part": part})));
                } else {
                    out.push(self.event(
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": index, "name": item["name"],
                                               "arguments": item["arguments"]}),
                    ));
                }
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                ));
                out
            }
            PartStep::End(f) => {
                let (status, incomplete) = match &f.reason {
                    FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
                    _ => ("completed", Value::Null),
                };
                let u = f.usage;
                let usage = json!({
                    "input_tokens": self.input_tokens,
                    "input_tokens_details": {"cached_tokens": u.cached_tokens},
                    "output_tokens": u.completion_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": self.input_tokens + u.completion_tokens,
                });
                let response = self.object(status, usage, incomplete);
                self.keep(&response);
                let kind = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                vec![self.event(kind, json!({"response": response}))]
            }
            PartStep::Error(e) => {
                vec![self.event(
                    "error",
                    json!({"code": "invalid_request_error", "message": e, "param": null}),
                )]
            }
            PartStep::Cut => {
                let e = respond::cut_error();
                vec![self.event(
                    "error",
                    json!({"code": "server_error", "message": e.message, "param": null}),
                )]
            }
        }
    }

    /// Store the response and its conversation (input and output), unless `store: false`.
    fn keep(&mut self, response: &Value) {
        let Some((tenant, mut messages)) = self.echo.keep.take() else {
            return;
        };
        // One assistant turn, as the chat route answers it: its text, then its calls.
        let mut text: Option<String> = None;
        let mut calls = Vec::new();
        for item in &self.output {
            if item["type"] == "message" {
                let t = item["content"][0]["text"].as_str().unwrap_or("");
                text.get_or_insert_with(String::new).push_str(t);
            } else if item["type"] == "function_call" {
                calls.push(json!({"id": item["call_id"], "type": "function",
                                  "function": {"name": item["name"], "arguments": item["arguments"]}}));
            }
        }
        let mut turn = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            turn["tool_calls"] = json!(calls);
        }
        messages.push(turn);
        store::put(tenant, self.echo.id.clone(), messages, response.clone());
    }
}

/// Queue the job and answer with the response object: whole, or streamed as its events.
async fn answer(st: &AppState, job: Job, echo: Echo, stream: bool) -> Result<Response, ApiError> {
    let mut job = job;
    let input_tokens = job.prompt.len();
    let rx = respond::queue(st, &mut job).await?;
    let items = Parts::new(
        Answers::new(&job.head, 1, job.tools, Arc::clone(&st.tokenizer))
            .with_reasoning(job.reasoning.take()),
    );
    let building = Building {
        echo,
        output: Vec::new(),
        seq: 0,
        input_tokens,
    };
    match stream {
        true => Ok(events(items, building, rx).into_response()),
        false => whole(items, building, rx).await,
    }
}

/// The whole response.
async fn whole(
    items: Parts,
    mut b: Building,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Result<Response, ApiError> {
    respond::collect_steps(rx, items, Parts::on, |_, s| {
        match s {
            PartStep::Error(e) => return Err(ApiError::bad_request(e)),
            PartStep::Cut => return Err(respond::cut_error()),
            _ => {}
        }
        for (kind, ev) in b.step(s) {
            if kind == "response.completed" || kind == "response.incomplete" {
                return Ok(Some(Json(ev["response"].clone()).into_response()));
            }
        }
        Ok(None)
    })
    .await
}

/// The response as OpenAI streams it: `response.created` and `response.in_progress`, each
/// item's events, then `response.completed` (or `response.incomplete`); an engine error as an
/// `error` event, the last.
fn events(
    items: Parts,
    mut b: Building,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    fn event((name, v): (&str, Value)) -> Event {
        Event::default().event(name).data(v.to_string())
    }
    let start = b.object("in_progress", Value::Null, Value::Null);
    let first = vec![
        event(b.event("response.created", json!({"response": start.clone()}))),
        event(b.event("response.in_progress", json!({"response": start}))),
    ];
    let pump = Pump {
        state: (items, b, Vec::new()),
        on: |(items, b, steps), _, ev, out| {
            let last = items.on(ev, steps);
            for s in steps.drain(..) {
                out.extend(b.step(s).into_iter().map(event));
            }
            last
        },
        dropped: || {
            let e = json!({"type": "error", "code": "server_error",
                           "message": "the engine dropped the request", "param": null});
            Some(Event::default().event("error").data(e.to_string()))
        },
    };
    Sse::new(pump.stream(rx, first)).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_chat_messages() {
        let m = input_messages(&json!("hi")).unwrap();
        assert_eq!(m, [json!({"role": "user", "content": "hi"})]);
        let m = input_messages(&json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                            {"type": "input_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "reasoning", "summary": []},
        ]))
        .unwrap();
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "ab"}));
        assert_eq!(
            m[2]["tool_calls"].as_array().unwrap().len(),
            2,
            "one turn's calls"
        );
        assert_eq!(m[2]["tool_calls"][1]["function"]["name"], "g");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "one"})
        );
    }

    #[test]
    fn malformed_input_names_the_field() {
        let param = |v: Value| input_messages(&v).unwrap_err().param.unwrap();
        assert_eq!(param(json!(3)), "input");
        assert_eq!(param(json!([])), "input");
        assert_eq!(
            param(json!([{"role": "robot", "content": "x"}])),
            "input[0].role"
        );
        assert_eq!(
            param(
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}])
            ),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
            "input[0].call_id"
        );
        assert_eq!(param(json!([{"type": "web_search_call"}])), "input[0].type");
        let e = chat_tools(&json!([{"type": "web_search"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = chat_tool_choice(&json!("sometimes")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = response_format(&json!({"type": "json_schema"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("text.format"));
    }

    #[test]
    fn tools_and_formats_take_the_chat_shape() {
        let t = chat_tools(
            &json!([{"type": "function", "name": "f", "description": "d",
                                     "parameters": {"type": "object"}, "strict": null}]),
        )
        .unwrap();
        assert_eq!(
            t,
            json!([{"type": "function", "function": {"name": "f", "description": "d",
                                                      "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            chat_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
            json!({"type": "function", "function": {"name": "f"}})
        );
        let f = response_format(&json!({"type": "json_schema", "name": "n",
                                         "schema": {"type": "object"}, "strict": true}))
        .unwrap()
        .unwrap();
        assert_eq!(
            f,
            json!({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"},
                                                          "strict": true}})
        );
        assert_eq!(response_format(&json!({"type": "text"})).unwrap(), None);
    }
}
