//! An answer as Anthropic's `message`: content blocks built from the engine's text as it comes
//! (tool calls parsed out by the chat route's parser), given whole or as Anthropic's named
//! Server-Sent Events. Both follow the same [`Step`]s.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::scheduler::{FinishReason, Finished};
use crate::server::error::ApiError;
use crate::server::parts::{Part, PartStep, Parts};
use crate::server::respond::{self, Answers, Ev, Job, Pump};
use crate::server::AppState;

/// What the answer's content does next.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// A `text` block begins.
    Text,
    /// A `thinking` block begins (the model's reasoning, where the request enabled
    /// `thinking`).
    Thinking,
    /// A `tool_use` block begins.
    Tool { id: String, name: String },
    /// More of the open block: its text, or its input's JSON text.
    More(String),
    /// The open block ends.
    Close,
    /// The answer ends.
    End {
        stop_reason: &'static str,
        stop_sequence: Option<String>,
        output_tokens: usize,
    },
    /// The engine refused the request.
    Error(String),
    /// The server's shutdown grace period ended ([`respond::cut_error`]).
    Cut,
}

/// The kind of a content block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Text,
    Thinking,
    Tool,
}

/// One answer's content blocks, as the engine's events come.
pub(super) struct Blocks {
    parts: Parts,
    /// The parts' steps of the last event.
    steps: Vec<PartStep>,
    /// The answer's text as generated.
    pub(super) raw: String,
}

impl Blocks {
    pub(super) fn new(answers: Answers) -> Blocks {
        Blocks {
            parts: Parts::new(answers),
            steps: Vec::new(),
            raw: String::new(),
        }
    }

    /// The steps one engine event makes; whether it was the last.
    pub(super) fn on(&mut self, ev: Ev, out: &mut Vec<Step>) -> bool {
        if let Ev::Text(t) = &ev {
            self.raw.push_str(t);
        }
        let last = self.parts.on(ev, &mut self.steps);
        for s in self.steps.drain(..) {
            out.push(match s {
                // (Reasoning is separated only where the request enabled `thinking`.)
                PartStep::Open(Part::Reasoning) => Step::Thinking,
                PartStep::Open(Part::Text) => Step::Text,
                PartStep::Open(Part::Call { id, name }) => Step::Tool { id, name },
                PartStep::More(t) => Step::More(t),
                PartStep::Close => Step::Close,
                PartStep::End(f) => end(self.parts.answers(), f),
                PartStep::Error(e) => Step::Error(e),
                PartStep::Cut => Step::Cut,
            });
        }
        last
    }
}

/// The answer's end, with Anthropic's reason: `max_tokens` (the limit or the context),
/// `stop_sequence` (also one met inside a tool call), `tool_use`, or `end_turn` (the model's end
/// of turn).
fn end(answers: &Answers, f: Finished) -> Step {
    let stop_reason = match (&f.reason, &f.stop_word) {
        (FinishReason::Length, _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ if answers.called(0) => "tool_use",
        _ => "end_turn",
    };
    Step::End {
        stop_reason,
        stop_sequence: f
            .stop_word
            .clone()
            .filter(|_| stop_reason == "stop_sequence"),
        output_tokens: f.usage.completion_tokens,
    }
}

/// A `thinking` block as it begins. Its `signature` is empty: kiln signs nothing, and drops
/// the `thinking` blocks a client sends back.
static THINKING: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| json!({"type": "thinking", "thinking": "", "signature": ""}));

/// Queue the job and answer with Anthropic's message: whole, or streamed as its events.
pub(super) async fn answer(st: &AppState, job: Job, stream: bool) -> Result<Response, ApiError> {
    let mut job = job;
    let input_tokens = job.prompt.len();
    let rx = respond::queue(st, &mut job).await?;
    let answers = Answers::new(&job.head, 1, job.tools, Arc::clone(&st.tokenizer))
        .with_reasoning(job.reasoning.take());
    let id = job.head.id.rsplit('-').next().unwrap_or_default();
    let message = json!({
        "id": format!("msg_{id}"),
        "type": "message",
        "role": "assistant",
        "model": job.head.model,
        "content": [],
        "stop_reason": null,
        "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    });
    let blocks = Blocks::new(answers);
    match stream {
        true => Ok(events(blocks, message, rx).into_response()),
        false => whole(blocks, message, rx).await,
    }
}

/// The message's content folded from the steps: text blocks, and `tool_use` blocks whose
/// input is the call's arguments as a JSON object. A call whose arguments are not a whole
/// object (cut short by `max_tokens`) is no call: the content is then the answer's text.
pub(super) struct Folded {
    pub(super) content: Vec<Value>,
    args: String,
    broken: bool,
}

impl Folded {
    pub(super) fn new() -> Folded {
        Folded {
            content: Vec::new(),
            args: String::new(),
            broken: false,
        }
    }

    /// Take one step; at the end, fill the message in (`raw`: the answer's text).
    pub(super) fn step(&mut self, s: Step, message: &mut Value, raw: &str) {
        match s {
            Step::Text => self.content.push(json!({"type": "text", "text": ""})),
            Step::Thinking => self.content.push(THINKING.clone()),
            Step::Tool { id, name } => {
                self.content
                    .push(json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
            }
            Step::More(t) => match self.content.last_mut() {
                Some(b) if b["type"] == "text" || b["type"] == "thinking" => {
                    let field = if b["type"] == "text" {
                        "text"
                    } else {
                        "thinking"
                    };
                    if let Value::String(text) = &mut b[field] {
                        text.push_str(&t);
                    }
                }
                _ => self.args.push_str(&t),
            },
            Step::Close => {
                // A call whose arguments are no object drops its own block only.
                if let Some(b) = self.content.last_mut().filter(|b| b["type"] == "tool_use") {
                    match serde_json::from_str::<Value>(&std::mem::take(&mut self.args)) {
                        Ok(input) if input.is_object() => b["input"] = input,
                        _ => {
                            self.content.pop();
                            self.broken = true;
                        }
                    }
                }
            }
            Step::End {
                stop_reason,
                stop_sequence,
                output_tokens,
            } => {
                // (With no call left, the answer is its text, as it came, after its thinking.)
                if self.broken && !self.content.iter().any(|b| b["type"] == "tool_use") {
                    self.content.retain(|b| b["type"] == "thinking");
                    self.content.push(json!({"type": "text", "text": raw}));
                }
                message["content"] = json!(std::mem::take(&mut self.content));
                message["stop_reason"] = json!(stop_reason);
                message["stop_sequence"] = json!(stop_sequence);
                message["usage"]["output_tokens"] = json!(output_tokens);
            }
            Step::Error(_) | Step::Cut => {}
        }
    }
}

/// The whole message.
async fn whole(
    blocks: Blocks,
    mut message: Value,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Result<Response, ApiError> {
    let mut folded = Folded::new();
    respond::collect_steps(rx, blocks, Blocks::on, |blocks, s| match s {
        Step::Error(e) => Err(ApiError::bad_request(e)),
        Step::Cut => Err(respond::cut_error()),
        s @ Step::End { .. } => {
            folded.step(s, &mut message, &blocks.raw);
            Ok(Some(Json(std::mem::take(&mut message)).into_response()))
        }
        s => {
            folded.step(s, &mut message, &blocks.raw);
            Ok(None)
        }
    })
    .await
}

/// The named events of the steps (`index`: the open block's).
pub(super) struct Events {
    index: usize,
    /// The open block's kind.
    kind: Kind,
}

impl Events {
    pub(super) fn new() -> Events {
        Events {
            index: 0,
            kind: Kind::Text,
        }
    }

    /// The events of one step, as `(name, data)`.
    pub(super) fn of(&mut self, s: Step) -> Vec<(&'static str, Value)> {
        let block = |index: usize, b: Value| {
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": b}),
            )
        };
        match s {
            Step::Text => {
                self.kind = Kind::Text;
                vec![block(self.index, json!({"type": "text", "text": ""}))]
            }
            Step::Thinking => {
                self.kind = Kind::Thinking;
                vec![block(self.index, THINKING.clone())]
            }
            Step::Tool { id, name } => {
                self.kind = Kind::Tool;
                let b = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                vec![block(self.index, b)]
            }
            Step::More(t) => {
                let delta = match self.kind {
                    Kind::Text => json!({"type": "text_delta", "text": t}),
                    Kind::Thinking => json!({"type": "thinking_delta", "thinking": t}),
                    Kind::Tool => json!({"type": "input_json_delta", "partial_json": t}),
                };
                let d = json!({"type": "content_block_delta", "index": self.index, "delta": delta});
                vec![("content_block_delta", d)]
            }
            Step::Close => {
                self.index += 1;
                let d = json!({"type": "content_block_stop", "index": self.index - 1});
                vec![("content_block_stop", d)]
            }
            Step::End {
                stop_reason,
                stop_sequence,
                output_tokens,
            } => vec![
                (
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                           "usage": {"output_tokens": output_tokens}}),
                ),
                ("message_stop", json!({"type": "message_stop"})),
            ],
            Step::Error(e) => {
                let status = axum::http::StatusCode::BAD_REQUEST;
                vec![("error", super::error_body(status, &e))]
            }
            Step::Cut => {
                let e = respond::cut_error();
                vec![("error", super::error_body(e.status, &e.message))]
            }
        }
    }
}

/// The message as Anthropic streams it: `message_start` (its `usage.input_tokens`), a `ping`,
/// each block's start, deltas and stop, then `message_delta` (the stop reason, the output
/// tokens) and `message_stop`; an engine error as an `error` event, the last.
fn events(
    blocks: Blocks,
    message: Value,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    fn event((name, v): (&str, Value)) -> Event {
        Event::default().event(name).data(v.to_string())
    }
    let start = json!({"type": "message_start", "message": message});
    let first = vec![
        event(("message_start", start)),
        event(("ping", json!({"type": "ping"}))),
    ];
    let pump = Pump {
        state: (blocks, Events::new(), Vec::new()),
        on: |(blocks, events, steps), _, ev, out| {
            let last = blocks.on(ev, steps);
            for step in steps.drain(..) {
                out.extend(events.of(step).into_iter().map(event));
            }
            last
        },
        dropped: || {
            let status = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
            let e = super::error_body(status, "the engine dropped the request");
            Some(event(("error", e)))
        },
    };
    Sse::new(pump.stream(rx, first)).keep_alive(KeepAlive::default())
}
