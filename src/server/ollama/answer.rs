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
use crate::server::respond::{self, Answers, Ev, Job, Pump};
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
    /// With tools: the answer, gathered whole and parsed for calls at the end.
    answers: Option<Answers>,
    /// Without tools, where thoughts are separated (`think`): the splitter of the answer.
    splitter: Option<ReasoningSplitter>,
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

    /// The lines one engine event makes (an error: one `{"error": ...}` line, the last).
    fn on(&mut self, ev: Ev) -> (Vec<Value>, bool) {
        match ev {
            Ev::Logprobs(_) => (vec![], false),
            Ev::Cut => (vec![json!({ "error": respond::cut_error().message })], true),
            Ev::Text(t) => {
                self.first.get_or_insert_with(Instant::now);
                match self.answers.as_mut() {
                    Some(a) => {
                        a.push_text(0, &t);
                        (vec![], false)
                    }
                    None => match self.splitter.as_mut() {
                        Some(sp) => {
                            let mut s = Split::default();
                            sp.push(&t, &mut s);
                            let out = (!s.is_empty()).then(|| self.split(s));
                            (out.into_iter().collect(), false)
                        }
                        None => (vec![self.text(&t, None)], false),
                    },
                }
            }
            Ev::Done(f) => {
                if let FinishReason::Error(e) = &f.reason {
                    return (vec![json!({ "error": e })], true);
                }
                let mut out = Vec::new();
                if let Some(mut a) = self.answers.take() {
                    let raw = a.text(0).to_owned();
                    out.push(ollama_message(&self.line(json!({})), a.complete(0), &raw));
                }
                if let Some(mut sp) = self.splitter.take() {
                    let mut s = Split::default();
                    sp.finish(&mut s);
                    if !s.is_empty() {
                        out.push(self.split(s));
                    }
                }
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
        answers: None,
        splitter: None,
    };
    let mut v = lines.done(&FinishReason::Stop, &Usage::default());
    v["done_reason"] = json!(reason);
    v
}

/// A chat answer's OpenAI choice as an Ollama line: its content and its calls, whose
/// arguments are objects. Calls whose arguments are not a whole JSON object (an answer cut
/// short by `num_predict`) are no calls: the line carries the answer's text, `raw`.
fn ollama_message(head: &Value, choice: Value, raw: &str) -> Value {
    let m = &choice["message"];
    let mut msg = json!({
        "role": "assistant",
        "content": m["content"].as_str().unwrap_or(""),
    });
    if let Some(r) = m["reasoning_content"].as_str() {
        msg["thinking"] = json!(r);
    }
    if let Some(calls) = m["tool_calls"].as_array() {
        let calls: Option<Vec<Value>> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                let args = f["arguments"].as_str().unwrap_or("");
                let args = serde_json::from_str::<Value>(args).ok()?;
                args.is_object()
                    .then(|| json!({"function": {"name": f["name"], "arguments": args}}))
            })
            .collect();
        match calls {
            Some(calls) => msg["tool_calls"] = json!(calls),
            None => msg["content"] = json!(raw),
        }
    }
    let mut v = head.clone();
    v["message"] = msg;
    v["done"] = json!(false);
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
    let reasoning = job.reasoning.take();
    let answers = job.tools.map(|t| {
        let tok = Arc::clone(&st.tokenizer);
        Answers::new(&job.head, 1, Some(t), tok).with_reasoning(reasoning.clone())
    });
    let splitter = reasoning.filter(|_| answers.is_none());
    let lines = Lines {
        kind,
        model: job.head.model.clone(),
        start,
        first: None,
        answers,
        splitter,
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
    let mut calls = None;
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
            if let Some(c) = piece.get("tool_calls") {
                calls = Some(c.clone());
            }
            if v["done"] == json!(true) {
                let mut v = v;
                match lines.kind {
                    Kind::Chat => {
                        v["message"]["content"] = json!(text);
                        if !thinking.is_empty() {
                            v["message"]["thinking"] = json!(thinking);
                        }
                        if let Some(c) = calls.take() {
                            v["message"]["tool_calls"] = c;
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
    fn calls_come_back_with_argument_objects() {
        let choice = json!({"index": 0, "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}});
        let v = ollama_message(&json!({"model": "m"}), choice, "raw");
        assert_eq!(v["model"], "m");
        assert_eq!(v["done"], false);
        assert_eq!(v["message"]["content"], "");
        let call = &v["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather");
        assert_eq!(call["arguments"], json!({"city": "Paris"}));
        let plain = json!({"message": {"role": "assistant", "content": "hi"}});
        let v = ollama_message(&json!({}), plain, "hi");
        assert_eq!(v["message"], json!({"role": "assistant", "content": "hi"}));
        // A call cut short (its arguments not a whole object): the text, no calls.
        let cut = json!({"message": {"role": "assistant", "content": null, "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"city\": \"Par"}}]}});
        let v = ollama_message(&json!({}), cut, "<tool_call>{\"city\": \"Par");
        assert_eq!(v["message"]["content"], "<tool_call>{\"city\": \"Par");
        assert!(v["message"].get("tool_calls").is_none());
    }
}
