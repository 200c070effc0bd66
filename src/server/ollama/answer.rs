//! An answer in Ollama's lines: newline-delimited JSON streamed a piece of text at a time, or
//! the lines folded into one object; the last line with Ollama's counts and durations.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::Answer;
use crate::engine::scheduler::{FinishReason, Usage};
use crate::server::error::ApiError;
use crate::server::respond::{self, Answers, Delta, Ev, Job, Pump};
use crate::server::AppState;
use crate::tokenizer::{ReasoningSplitter, Split};

/// Nanoseconds, as Ollama counts durations.
pub(super) fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// `2026-11-28T12:34:56.789012345Z`.
pub(super) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // The civil date of a day count (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Which route a generation answers: its text goes to `message.content` or to `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Generate,
}

/// One generation's answer in Ollama's lines.
pub(super) struct Lines {
    kind: Kind,
    model: String,
    start: Instant,
    /// When the first text came (the prompt was evaluated).
    first: Option<Instant>,
    /// With tools: the answer's calls, parsed out as it comes.
    tools: Option<ToolLines>,
    /// Where thoughts are separated (`think`): the splitter of the answer.
    splitter: Option<ReasoningSplitter>,
}

/// A chat answer with tools: its content, parsed for calls by the chat route's parser.
struct ToolLines {
    /// Parses the content (its reasoning split off before).
    answers: Answers,
    /// The content given to the parser.
    fed: String,
    calls: Calls,
}

/// What a chat answer with tools streams, as Ollama streams it: content as soon as it is
/// known to be no call, and each call, whole (its arguments an object), as soon as its
/// arguments are.
#[derive(Debug, Default)]
struct Calls {
    /// The calls begun: name, arguments' text so far, whether sent.
    begun: Vec<(String, String, bool)>,
    /// The content sent.
    sent: String,
}

/// A piece of a streamed chat answer with tools.
#[derive(Debug, PartialEq)]
enum Piece {
    Content(String),
    /// One call, as Ollama's `message.tool_calls` holds it.
    Call(Value),
}

impl Calls {
    /// The pieces of one delta of the chat route's parser.
    fn push(&mut self, d: Delta, out: &mut Vec<Piece>) {
        match d {
            Delta::Content(t) | Delta::Reasoning(t) => {
                self.sent.push_str(&t);
                out.push(Piece::Content(t));
            }
            Delta::Call(c) => {
                let f = &c["function"];
                let more = f["arguments"].as_str().unwrap_or("");
                if c.get("id").is_some() {
                    let name = f["name"].as_str().unwrap_or("").to_owned();
                    self.begun.push((name, String::new(), false));
                }
                let k = c["index"].as_u64().unwrap_or(0) as usize;
                let Some((name, args, sent)) = self.begun.get_mut(k) else {
                    return;
                };
                args.push_str(more);
                if *sent || more.is_empty() {
                    return;
                }
                // (A JSON object is whole at its closing brace: nothing can follow it.)
                if let Ok(obj @ Value::Object(_)) = serde_json::from_str::<Value>(args) {
                    *sent = true;
                    out.push(Piece::Call(
                        json!({"function": {"index": k, "name": name, "arguments": obj}}),
                    ));
                }
            }
        }
    }

    /// At the end (`fed`: the content parsed): a call whose arguments never became an object
    /// (an answer cut short by `num_predict`) is no call. With no call sent, the answer is its
    /// text, as it came (what was not sent yet follows as content); after calls, it is dropped.
    fn finish(&mut self, fed: &str, out: &mut Vec<Piece>) {
        let broken = self.begun.iter().any(|(_, _, sent)| !sent);
        if !broken || self.begun.iter().any(|(_, _, sent)| *sent) {
            return;
        }
        let rest = fed.strip_prefix(self.sent.as_str()).unwrap_or(fed);
        if !rest.is_empty() {
            out.push(Piece::Content(rest.to_owned()));
        }
    }
}

impl Lines {
    fn line(&self, mut v: Value) -> Value {
        let head = json!({"model": self.model, "created_at": rfc3339(SystemTime::now())});
        if let (Value::Object(h), Value::Object(body)) = (head, &mut v) {
            for (k, x) in h.into_iter().rev() {
                body.shift_insert(0, k, x);
            }
        }
        v
    }

    /// A piece of text (`content` of a chat message, or `response`), and a chat message's
    /// tool calls.
    fn text(&self, text: &str, calls: Option<Value>) -> Value {
        match self.kind {
            Kind::Generate => self.line(json!({"response": text, "done": false})),
            Kind::Chat => {
                let mut m = json!({"role": "assistant", "content": text});
                if let Some(c) = calls {
                    m["tool_calls"] = c;
                }
                self.line(json!({"message": m, "done": false}))
            }
        }
    }

    /// A piece of a chat answer split into its thoughts (`thinking`) and content.
    fn split(&self, s: Split) -> Value {
        let mut v = self.text(&s.content, None);
        if !s.reasoning.is_empty() {
            v["message"]["thinking"] = json!(s.reasoning);
        }
        v
    }

    /// The last line: the reason and the counts and durations.
    fn done(&self, reason: &FinishReason, usage: &Usage) -> Value {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let mut v = self.text("", None);
        v["done"] = json!(true);
        v["done_reason"] = json!(match reason {
            FinishReason::Length => "length",
            _ => "stop",
        });
        v["total_duration"] = json!(nanos(end - self.start));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(usage.prompt_tokens);
        v["prompt_eval_duration"] = json!(nanos(first - self.start));
        v["eval_count"] = json!(usage.completion_tokens);
        v["eval_duration"] = json!(nanos(end - first));
        v
    }

    /// The lines of the answer's next `text` (`None`: its end): its thoughts, its content and
    /// its calls.
    fn pieces(&mut self, text: Option<&str>) -> Vec<Value> {
        let mut s = Split::default();
        match (self.splitter.as_mut(), text) {
            (Some(sp), Some(t)) => sp.push(t, &mut s),
            (Some(sp), None) => sp.finish(&mut s),
            (None, Some(t)) => s.content.push_str(t),
            (None, None) => {}
        }
        let Some(tools) = self.tools.as_mut() else {
            return match s.is_empty() {
                true => vec![],
                false => vec![self.split(s)],
            };
        };
        let content = std::mem::take(&mut s.content);
        let mut deltas = Vec::new();
        if !content.is_empty() {
            tools.fed.push_str(&content);
            deltas = tools.answers.pieces(0, Some(&content));
        }
        if text.is_none() {
            deltas.extend(tools.answers.pieces(0, None));
        }
        let mut pieces = Vec::new();
        for d in deltas {
            tools.calls.push(d, &mut pieces);
        }
        if text.is_none() {
            tools.calls.finish(&tools.fed, &mut pieces);
        }
        let mut lines = Vec::new();
        if !s.reasoning.is_empty() {
            lines.push(self.split(s));
        }
        for p in pieces {
            lines.push(match p {
                Piece::Content(c) => self.text(&c, None),
                Piece::Call(c) => self.text("", Some(json!([c]))),
            });
        }
        lines
    }

    /// The lines one engine event makes (an error: one `{"error": ...}` line, the last).
    fn on(&mut self, ev: Ev) -> (Vec<Value>, bool) {
        match ev {
            Ev::Logprobs(_) => (vec![], false),
            Ev::Cut => (vec![json!({ "error": respond::cut_error().message })], true),
            Ev::Text(t) => {
                self.first.get_or_insert_with(Instant::now);
                (self.pieces(Some(&t)), false)
            }
            Ev::Done(f) => {
                if let FinishReason::Error(e) = &f.reason {
                    return (vec![json!({ "error": e })], true);
                }
                let mut out = self.pieces(None);
                out.push(self.done(&f.reason, &f.usage));
                (out, true)
            }
        }
    }
}

/// The answer to a request with nothing to generate (an empty prompt, no messages): Ollama
/// loads the model (or, with `keep_alive` 0, unloads it) and says so in `done_reason`
/// (`reason`: `load` or `unload`; the model stays loaded here).
pub(super) fn loaded(kind: Kind, model: String, start: Instant, reason: &str) -> Value {
    let lines = Lines {
        kind,
        model,
        start,
        first: None,
        tools: None,
        splitter: None,
    };
    let mut v = lines.done(&FinishReason::Stop, &Usage::default());
    v["done_reason"] = json!(reason);
    v
}

/// Queue the job and answer in Ollama's lines: streamed as NDJSON, or the whole answer.
pub(super) async fn answer(
    st: &AppState,
    job: Job,
    kind: Kind,
    stream: bool,
    start: Instant,
) -> Answer {
    let mut job = job;
    let rx = respond::queue(st, &mut job).await?;
    let tools = job.tools.map(|t| ToolLines {
        answers: Answers::new(&job.head, 1, Some(t), Arc::clone(&st.tokenizer)),
        fed: String::new(),
        calls: Calls::default(),
    });
    let lines = Lines {
        kind,
        model: job.head.model.clone(),
        start,
        first: None,
        tools,
        splitter: job.reasoning.take(),
    };
    match stream {
        true => Ok(ndjson(lines, rx)),
        false => Ok(whole(lines, rx).await?),
    }
}

/// The answer as one object: the lines folded together.
async fn whole(mut lines: Lines, mut rx: mpsc::UnboundedReceiver<(usize, Ev)>) -> Answer {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls: Vec<Value> = Vec::new();
    while let Some((_, ev)) = rx.recv().await {
        if matches!(ev, Ev::Cut) {
            return Err(respond::cut_error().into());
        }
        let (out, last) = lines.on(ev);
        for v in out {
            if let Some(e) = v.get("error").and_then(Value::as_str) {
                return Err(ApiError::bad_request(e).into());
            }
            let piece = match lines.kind {
                Kind::Chat => &v["message"],
                Kind::Generate => &v,
            };
            let key = if lines.kind == Kind::Chat {
                "content"
            } else {
                "response"
            };
            text.push_str(piece[key].as_str().unwrap_or(""));
            thinking.push_str(piece["thinking"].as_str().unwrap_or(""));
            if let Some(c) = piece.get("tool_calls").and_then(Value::as_array) {
                calls.extend(c.iter().cloned());
            }
            if v["done"] == json!(true) {
                let mut v = v;
                match lines.kind {
                    Kind::Chat => {
                        v["message"]["content"] = json!(text);
                        if !thinking.is_empty() {
                            v["message"]["thinking"] = json!(thinking);
                        }
                        if !calls.is_empty() {
                            v["message"]["tool_calls"] = json!(std::mem::take(&mut calls));
                        }
                    }
                    Kind::Generate => v["response"] = json!(text),
                }
                return Ok(Json(v).into_response());
            }
        }
        if last {
            break;
        }
    }
    Err(ApiError::internal("the engine dropped the request").into())
}

/// The answer as newline-delimited JSON, a line per piece of text, then the final line.
fn ndjson(lines: Lines, rx: mpsc::UnboundedReceiver<(usize, Ev)>) -> Response {
    fn line(v: Value) -> Bytes {
        Bytes::from(v.to_string() + "\n")
    }
    let pump = Pump {
        state: lines,
        on: |lines, _, ev, out| {
            let (vs, last) = lines.on(ev);
            out.extend(vs.into_iter().map(line));
            last
        },
        // (The engine let go without a last event: say so, as a last line.)
        dropped: || Some(line(json!({"error": "the engine dropped the request"}))),
    };
    let mut r = Body::from_stream(pump.stream(rx, Vec::new())).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        let at = |s: u64, n: u32| rfc3339(UNIX_EPOCH + Duration::new(s, n));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(at(1_795_869_296, 0), "2026-11-28T12:34:56.000000000Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000000Z");
    }

    #[test]
    fn calls_stream_whole_as_soon_as_their_arguments_are() {
        let call = |index: usize, id: bool, args: &str| {
            let mut c = json!({"index": index, "function": {"arguments": args}});
            if id {
                c["id"] = json!("call_x");
                c["function"]["name"] = json!(["get_weather", "get_time"][index]);
            }
            Delta::Call(c)
        };
        let mut calls = Calls::default();
        let mut out = Vec::new();
        calls.push(Delta::Content("Let me look. ".into()), &mut out);
        calls.push(call(0, true, ""), &mut out);
        calls.push(call(0, false, "{\"city\": "), &mut out);
        assert_eq!(out, [Piece::Content("Let me look. ".into())]);
        calls.push(call(0, false, "\"Paris\"}"), &mut out);
        assert_eq!(
            out[1],
            Piece::Call(json!({"function": {"index": 0, "name": "get_weather",
                                            "arguments": {"city": "Paris"}}}))
        );
        calls.push(call(1, true, "{\"zone\""), &mut out);
        assert_eq!(out.len(), 2);
        // A second call cut short after a whole one: dropped.
        calls.finish("Let me look. <tool_call>...", &mut out);
        assert_eq!(out.len(), 2);

        // Only a call cut short: the answer's text that was not sent yet, as content.
        let mut calls = Calls::default();
        let mut out = Vec::new();
        calls.push(Delta::Content("So ".into()), &mut out);
        calls.push(call(0, true, "{\"city\": \"Par"), &mut out);
        calls.finish(
            "So <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
            &mut out,
        );
        assert_eq!(
            out,
            [
                Piece::Content("So ".into()),
                Piece::Content(
                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"
                        .into()
                )
            ]
        );
        // Arguments that are JSON but no object: no call.
        let mut calls = Calls::default();
        let mut out = Vec::new();
        calls.push(call(0, true, "[1]"), &mut out);
        assert!(out.is_empty());
    }
}
