//! From a checked request to its answer: the request's choices queued on the engine (one
//! prefill, `n` slots), their events turned into one OpenAI response or an event stream, with
//! tool calls parsed out of each answer and log-probabilities attached.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api::{finish_reason, Endpoint, Generation, Head};
use super::error::ApiError;
use super::logprobs::Logprobs;
use super::structured::{self, Structured};
use super::tools::call_id;
use super::AppState;
use crate::engine::logprobs::TokenLogprobs;
use crate::engine::scheduler::{FinishReason, Finished, Fork, SeqRequest, SeqSink, Usage};
use crate::sampler::Rng;
use crate::tokenizer::toolcall::{ToolCallParser, ToolEvent, ToolFormat};
use crate::tokenizer::{thinking_forced_open, ReasoningSplitter, ReasoningStyle, Split, Tokenizer};

/// A request ready to run.
pub struct Job {
    pub head: Head,
    pub prompt: Vec<u32>,
    pub gen: Generation,
    /// What constrains every choice (a structured-output field, or the tool-call grammar).
    pub constraint: Option<Structured>,
    /// Parse each answer for tool calls in this format.
    pub tools: Option<ToolFormat>,
    /// Separate each answer's reasoning from its content ([`reasoning_splitter`]).
    pub reasoning: Option<ReasoningSplitter>,
}

/// The splitter of a chat answer's reasoning: its style from the model's chat template, open
/// from the start where the rendered `prompt` leaves `<think>` open.
pub(super) fn reasoning_splitter(tok: &Tokenizer, prompt: &[u32]) -> ReasoningSplitter {
    let style = tok
        .chat_template()
        .map_or(ReasoningStyle::None, ReasoningStyle::from_template);
    let tail = tok.decode(&prompt[prompt.len().saturating_sub(8)..]);
    ReasoningSplitter::new(style, thinking_forced_open(style, &tail))
}

/// What a choice's sink sends.
pub enum Ev {
    Text(String),
    Logprobs(TokenLogprobs),
    Done(Finished),
    /// The server is shutting down and its grace period has ended: the answer ends now, with
    /// [`cut_error`] (sent by [`Live::cut`], not the engine).
    Cut,
}

/// The error of an answer cut by the end of the shutdown grace period (503).
pub(super) fn cut_error() -> ApiError {
    ApiError::unavailable(
        "the server is shutting down and its --shutdown-timeout has ended: the answer was cut",
    )
}

/// A whole (not streamed) answer: each of the engine's events turned into steps by `on` (of
/// the answer's `state`; true on the request's last event), each step handed to `take` until
/// it gives the response (or refuses the answer). Dropping this future (the client went away)
/// drops `rx`: the engine cancels.
pub(super) async fn collect_steps<T, S>(
    mut rx: mpsc::UnboundedReceiver<(usize, Ev)>,
    mut state: T,
    on: impl Fn(&mut T, Ev, &mut Vec<S>) -> bool,
    mut take: impl FnMut(&T, S) -> Result<Option<Response>, ApiError>,
) -> Result<Response, ApiError> {
    let mut steps = Vec::new();
    while let Some((_, ev)) = rx.recv().await {
        let last = on(&mut state, ev, &mut steps);
        for s in steps.drain(..) {
            if let Some(r) = take(&state, s)? {
                return Ok(r);
            }
        }
        if last {
            break;
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// The event channels of the requests in the engine, so that a shutdown whose grace period
/// ends while they run can end each answer with an error event ([`Ev::Cut`]). Weak: a request
/// the engine is done with is forgotten.
#[derive(Default)]
pub(crate) struct Live(std::sync::Mutex<Vec<mpsc::WeakUnboundedSender<(usize, Ev)>>>);

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::WeakUnboundedSender<(usize, Ev)>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, tx: &mpsc::UnboundedSender<(usize, Ev)>) {
        let mut live = self.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(tx.downgrade());
    }

    /// Send [`Ev::Cut`] to every request still in the engine; how many there were.
    pub(crate) fn cut(&self) -> usize {
        let mut n = 0;
        for w in self.lock().drain(..) {
            if let Some(tx) = w.upgrade() {
                n += usize::from(tx.send((0, Ev::Cut)).is_ok());
            }
        }
        n
    }
}

/// One choice's events, tagged with its index; the admission permit goes back when the last
/// choice is done (before its final event is sent).
struct ChoiceSink {
    index: usize,
    tx: mpsc::UnboundedSender<(usize, Ev)>,
    permit: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl SeqSink for ChoiceSink {
    fn text(&mut self, text: &str) -> bool {
        if text.is_empty() {
            return !self.tx.is_closed();
        }
        self.tx
            .send((self.index, Ev::Text(text.to_owned())))
            .is_ok()
    }
    fn logprobs(&mut self, lp: &TokenLogprobs) {
        let _ = self.tx.send((self.index, Ev::Logprobs(lp.clone())));
    }
    fn done(&mut self, finished: Finished) {
        self.permit.take();
        let _ = self.tx.send((self.index, Ev::Done(finished)));
    }
}

/// Queue the job on the engine and answer with the whole result or an event stream.
pub(super) async fn run(st: &AppState, mut job: Job) -> Result<Response, ApiError> {
    let rx = queue(st, &mut job).await?;
    let answers = Answers::new(
        &job.head,
        job.gen.n.max(1),
        job.tools,
        Arc::clone(&st.tokenizer),
    )
    .with_reasoning(job.reasoning.take());
    if job.gen.stream {
        let include_usage = job.gen.include_usage;
        return Ok(stream(job.head, answers, rx, include_usage).into_response());
    }
    whole(job.head, answers, rx).await
}

/// Queue the job's choices on the engine (its grammars compiled, an admission permit taken;
/// the prompt goes to the engine, leaving the job's empty); their events come tagged with the
/// choice's index. Dropping the receiver cancels them.
pub(super) async fn queue(
    st: &AppState,
    job: &mut Job,
) -> Result<mpsc::UnboundedReceiver<(usize, Ev)>, ApiError> {
    let n = job.gen.n.max(1);
    let mut grammars = Vec::with_capacity(n);
    if let Some(c) = &job.constraint {
        for _ in 0..n {
            let g = structured::compile(st, c.clone()).await?;
            grammars.push(Some(g));
        }
    } else {
        grammars.resize_with(n, || None);
    }
    // Taken here, atomically: at most --parallel + --queue requests are in the engine.
    let Ok(permit) = Arc::clone(&st.admission).try_acquire_owned() else {
        return Err(ApiError::queue_full(st.opts.n_slots, st.opts.max_queue));
    };
    let permit = Arc::new(permit);
    let (tx, rx) = mpsc::unbounded_channel::<(usize, Ev)>();
    st.live.add(&tx);
    let mut forks = Vec::with_capacity(n - 1);
    let mut first = None;
    for (i, grammar) in grammars.into_iter().enumerate() {
        let mut sampler = job.gen.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(i as u64);
        let sink = Box::new(ChoiceSink {
            index: i,
            tx: tx.clone(),
            permit: Some(Arc::clone(&permit)),
        });
        if i == 0 {
            first = Some((sampler, grammar, sink));
        } else {
            forks.push(Fork {
                sampler,
                grammar,
                sink,
            });
        }
    }
    drop((tx, permit));
    let (sampler, grammar, sink) = first.expect("at least one choice");
    let gen = &job.gen;
    st.engine
        .send(SeqRequest {
            prompt: std::mem::take(&mut job.prompt),
            max_new: gen.max_new,
            sampler,
            stop: gen.stop.clone(),
            code: gen.code,
            cache_prompt: gen.cache_prompt,
            tenant: super::tenant::tenant(gen.cache_salt.as_deref()),
            ignore_eos: gen.ignore_eos,
            grammar,
            logprobs: gen.logprobs,
            forks,
            embed: None,
            score: None,
            sink,
        })
        .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
    Ok(rx)
}

/// The state of every choice of a response.
pub struct Answers {
    chat: bool,
    tok: Arc<Tokenizer>,
    choices: Vec<Answer>,
    rng: Rng,
    /// A choice failed (the stream ends with the error).
    failed: bool,
}

struct Answer {
    /// The answer's text (without tools: its content).
    text: String,
    /// Separates the answer's reasoning (before the tool-call parser).
    splitter: Option<ReasoningSplitter>,
    parser: Option<ToolCallParser>,
    /// Ids of the calls begun.
    ids: Vec<String>,
    logprobs: Logprobs,
    done: Option<Finished>,
}

impl Answers {
    pub fn new(head: &Head, n: usize, tools: Option<ToolFormat>, tok: Arc<Tokenizer>) -> Answers {
        let seed = (head.created << 20)
            ^ head
                .id
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31) ^ b as u64);
        Answers {
            chat: head.endpoint == Endpoint::Chat,
            tok,
            choices: (0..n)
                .map(|_| Answer {
                    text: String::new(),
                    splitter: None,
                    parser: tools.map(ToolCallParser::new),
                    ids: Vec::new(),
                    logprobs: Logprobs::default(),
                    done: None,
                })
                .collect(),
            rng: Rng::new(seed),
            failed: false,
        }
    }

    /// Separate every choice's reasoning with `splitter` (a fresh one each).
    pub(super) fn with_reasoning(mut self, splitter: Option<ReasoningSplitter>) -> Answers {
        for c in &mut self.choices {
            c.splitter = splitter.clone();
        }
        self
    }

    /// Choice `i`'s next `text` (or, `None`, its end) split into reasoning and content
    /// (all content where its reasoning is not separated).
    fn split(&mut self, i: usize, text: Option<&str>) -> Split {
        let mut out = Split::default();
        match (self.choices[i].splitter.as_mut(), text) {
            (Some(s), Some(t)) => s.push(t, &mut out),
            (Some(s), None) => s.finish(&mut out),
            (None, Some(t)) => out.content.push_str(t),
            (None, None) => {}
        }
        out
    }

    fn all_done(&self) -> bool {
        self.choices.iter().all(|c| c.done.is_some())
    }

    /// The request's usage: the prompt once, every choice's completion.
    pub fn usage(&self) -> Usage {
        let main = self.choices[0]
            .done
            .as_ref()
            .map(|f| f.usage)
            .unwrap_or_default();
        Usage {
            prompt_tokens: main.prompt_tokens,
            completion_tokens: self
                .choices
                .iter()
                .filter_map(|c| c.done.as_ref())
                .map(|f| f.usage.completion_tokens)
                .sum(),
            cached_tokens: main.cached_tokens,
        }
    }

    /// OpenAI's finish reason of a choice: `tool_calls` where the answer called tools.
    fn reason(&self, i: usize) -> &'static str {
        let c = &self.choices[i];
        let r = c
            .done
            .as_ref()
            .map(|f| &f.reason)
            .unwrap_or(&FinishReason::Stop);
        if *r == FinishReason::Stop && !c.ids.is_empty() {
            "tool_calls"
        } else {
            finish_reason(r)
        }
    }

    /// Tool-call events as delta entries (`delta.tool_calls` items) or content; new calls get
    /// their ids.
    fn tool_deltas(&mut self, i: usize, events: Vec<ToolEvent>) -> Vec<Delta> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            match e {
                ToolEvent::Content(t) => out.push(Delta::Content(t)),
                ToolEvent::Call { index, name } => {
                    let format = self.choices[i]
                        .parser
                        .as_ref()
                        .map_or(ToolFormat::Generic, ToolCallParser::format);
                    let id = call_id(format, &mut self.rng);
                    self.choices[i].ids.push(id.clone());
                    out.push(Delta::Call(
                        json!({"index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}),
                    ));
                }
                ToolEvent::Args { index, text } => out.push(Delta::Call(
                    json!({"index": index, "function": {"arguments": text}}),
                )),
            }
        }
        out
    }

    /// Choice `i`'s pieces for the next `text` of its answer, or (`None`) for its end, what
    /// its tool-call parser held back: content, and calls as OpenAI streams them (a call's
    /// start with its `id` and name, then pieces of its arguments' text).
    ///
    /// Where the answer's reasoning is separated, its reasoning comes first as
    /// [`Delta::Reasoning`].
    pub(super) fn pieces(&mut self, i: usize, text: Option<&str>) -> Vec<Delta> {
        let split = self.split(i, text);
        let mut out = Vec::new();
        if !split.reasoning.is_empty() {
            out.push(Delta::Reasoning(split.reasoning));
        }
        let Some(p) = self.choices[i].parser.as_mut() else {
            if !split.content.is_empty() {
                out.push(Delta::Content(split.content));
            }
            return out;
        };
        let mut events = Vec::new();
        if !split.content.is_empty() {
            p.push(&split.content, &mut events);
        }
        if text.is_none() {
            p.finish(&mut events);
        }
        out.extend(self.tool_deltas(i, events));
        out
    }

    /// Whether choice `i`'s answer called a tool.
    pub(super) fn called(&self, i: usize) -> bool {
        !self.choices[i].ids.is_empty()
    }

    /// Add to choice `i`'s text (its answer, gathered whole).
    pub fn push_text(&mut self, i: usize, text: &str) {
        self.choices[i].text.push_str(text);
    }

    /// Choice `i` ended (its answer gathered whole; before [`Answers::complete`]).
    pub fn finish(&mut self, i: usize, finished: Finished) {
        self.choices[i].done = Some(finished);
    }

    /// The whole choice `i` (non-streaming): OpenAI's choice object, a chat answer's message
    /// with its tool calls parsed out.
    pub fn complete(&mut self, i: usize) -> Value {
        let mut text = std::mem::take(&mut self.choices[i].text);
        let chat = self.chat;
        let logprobs = if self.choices[i].logprobs.is_empty() {
            Value::Null
        } else {
            self.choices[i].logprobs.take(chat)
        };
        if !chat {
            return json!({"index": i, "text": text, "logprobs": logprobs,
                          "finish_reason": self.reason(i)});
        }
        let mut reasoning = None;
        if self.choices[i].splitter.is_some() {
            let mut split = self.split(i, Some(&text));
            let end = self.split(i, None);
            split.reasoning.push_str(&end.reasoning);
            split.content.push_str(&end.content);
            text = split.content;
            reasoning = Some(split.reasoning).filter(|r| !r.is_empty());
        }
        let mut message = json!({"role": "assistant", "content": text});
        if let Some(r) = reasoning {
            message["reasoning_content"] = json!(r);
        }
        if let Some(mut p) = self.choices[i].parser.take() {
            let mut events = Vec::new();
            p.push(&text, &mut events);
            p.finish(&mut events);
            let mut content = String::new();
            let mut calls: Vec<Value> = Vec::new();
            for d in self.tool_deltas(i, events) {
                match d {
                    // (The tool-call parser gives no reasoning: it was split off above.)
                    Delta::Content(c) | Delta::Reasoning(c) => content.push_str(&c),
                    Delta::Call(c) => match c.get("id") {
                        Some(_) => calls.push(c),
                        None => {
                            let k = c["index"].as_u64().unwrap_or(0) as usize;
                            let more = c["function"]["arguments"].as_str().unwrap_or("");
                            if let Some(call) = calls.get_mut(k) {
                                let args = call["function"]["arguments"]
                                    .as_str()
                                    .unwrap_or("")
                                    .to_owned()
                                    + more;
                                call["function"]["arguments"] = json!(args);
                            }
                        }
                    },
                }
            }
            if calls.is_empty() {
                message["content"] = json!(content);
            } else {
                for c in &mut calls {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("index");
                    }
                }
                message["content"] = if content.trim().is_empty() {
                    Value::Null
                } else {
                    json!(content)
                };
                message["tool_calls"] = json!(calls);
            }
        }
        json!({"index": i, "message": message, "logprobs": logprobs,
               "finish_reason": self.reason(i)})
    }
}

/// A piece of a streamed chat answer.
pub(super) enum Delta {
    Content(String),
    /// Reasoning, where it is separated.
    Reasoning(String),
    /// One `delta.tool_calls` entry.
    Call(Value),
}

/// Collect every choice, then answer once.
async fn whole(
    head: Head,
    mut answers: Answers,
    mut rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Result<Response, ApiError> {
    // Dropping this future (the client went away) drops `rx`: the engine cancels.
    while let Some((i, ev)) = rx.recv().await {
        match ev {
            Ev::Text(t) => answers.choices[i].text.push_str(&t),
            Ev::Logprobs(lp) => {
                let chat = answers.chat;
                answers.choices[i].logprobs.push(&answers.tok, &lp, chat);
            }
            Ev::Cut => return Err(cut_error()),
            Ev::Done(f) => {
                if let FinishReason::Error(e) = &f.reason {
                    return Err(ApiError::bad_request(e.clone()));
                }
                answers.choices[i].done = Some(f);
                if answers.all_done() {
                    let usage = answers.usage();
                    let choices = (0..answers.choices.len())
                        .map(|i| answers.complete(i))
                        .collect();
                    return Ok(Json(head.complete(choices, &usage)).into_response());
                }
            }
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// What a streamed answer makes of each engine event: `on` adds the items of one event of a
/// choice to `out` and says whether the answer is done; `dropped` is the last item when the
/// engine lets go without a last event.
pub(super) struct Pump<S, T> {
    pub(super) state: S,
    pub(super) on: fn(&mut S, usize, Ev, &mut VecDeque<T>) -> bool,
    pub(super) dropped: fn() -> Option<T>,
}

impl<S: Send + 'static, T: Send + 'static> Pump<S, T> {
    /// The items, `first` first, as the events come. Dropping the stream (the client left)
    /// drops `rx`: the engine cancels.
    pub(super) fn stream(
        self,
        rx: mpsc::UnboundedReceiver<(usize, Ev)>,
        first: Vec<T>,
    ) -> impl futures_util::Stream<Item = Result<T, Infallible>> + Send {
        let s = (self, rx, VecDeque::from(first), false);
        futures_util::stream::unfold(s, |(mut p, mut rx, mut out, mut done)| async move {
            loop {
                if let Some(x) = out.pop_front() {
                    return Some((Ok(x), (p, rx, out, done)));
                }
                if done {
                    return None;
                }
                match rx.recv().await {
                    Some((i, ev)) => done = (p.on)(&mut p.state, i, ev, &mut out),
                    None => {
                        out.extend((p.dropped)());
                        done = true;
                    }
                }
            }
        })
    }
}

/// Server-Sent Events as OpenAI clients parse them: a first chunk per chat choice with the
/// assistant role, one chunk per piece of text (or of a tool call), a final chunk per choice
/// with its `finish_reason`, optionally a usage chunk, then `data: [DONE]`.
fn stream(
    head: Head,
    answers: Answers,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    fn data(v: Value) -> Event {
        Event::default().data(v.to_string())
    }
    let mut first = Vec::new();
    if head.endpoint == Endpoint::Chat {
        for i in 0..answers.choices.len() {
            let c = json!({"index": i, "delta": {"role": "assistant", "content": ""},
                           "logprobs": null, "finish_reason": null});
            first.push(data(head.chunk(vec![c], None)));
        }
    }
    let pump = Pump {
        state: (head, answers, include_usage),
        on: |(head, answers, include_usage), i, ev, out| {
            for v in answers.on_event(head, i, ev, *include_usage) {
                out.push_back(data(v));
            }
            let done = answers.failed || answers.all_done();
            if done {
                out.push_back(Event::default().data("[DONE]"));
            }
            done
        },
        dropped: || None,
    };
    Sse::new(pump.stream(rx, first)).keep_alive(KeepAlive::default())
}

impl Answers {
    /// The chunks one event of choice `i` makes.
    pub fn on_event(&mut self, head: &Head, i: usize, ev: Ev, include_usage: bool) -> Vec<Value> {
        let chat = self.chat;
        let mut chunks = Vec::new();
        match ev {
            Ev::Logprobs(lp) => self.choices[i].logprobs.push(&self.tok, &lp, chat),
            Ev::Text(t) => {
                if !chat {
                    let lp = self.take_logprobs(i);
                    let c = json!({"index": i, "text": t, "logprobs": lp, "finish_reason": null});
                    chunks.push(head.chunk(vec![c], None));
                } else {
                    for d in self.pieces(i, Some(&t)) {
                        chunks.push(self.delta_chunk(head, i, d));
                    }
                }
            }
            Ev::Cut => {
                self.failed = true;
                return vec![cut_error().body()];
            }
            Ev::Done(f) => {
                if let FinishReason::Error(e) = &f.reason {
                    self.failed = true;
                    return vec![ApiError::bad_request(e.clone()).body()];
                }
                self.choices[i].done = Some(f);
                if chat {
                    for d in self.pieces(i, None) {
                        chunks.push(self.delta_chunk(head, i, d));
                    }
                }
                let lp = self.take_logprobs(i);
                let reason = self.reason(i);
                let c = if chat {
                    json!({"index": i, "delta": {}, "logprobs": lp, "finish_reason": reason})
                } else {
                    json!({"index": i, "text": "", "logprobs": lp, "finish_reason": reason})
                };
                let mut last = head.chunk(vec![c], None);
                if self.all_done() {
                    let usage = self.usage();
                    if include_usage {
                        chunks.push(last);
                        last = head.chunk(vec![], Some(&usage));
                    } else {
                        last["usage"] = super::api::usage_json(&usage);
                    }
                }
                chunks.push(last);
            }
        }
        chunks
    }

    fn take_logprobs(&mut self, i: usize) -> Value {
        let c = &mut self.choices[i];
        if c.logprobs.is_empty() {
            Value::Null
        } else {
            c.logprobs.take(self.chat)
        }
    }

    fn delta_chunk(&mut self, head: &Head, i: usize, d: Delta) -> Value {
        let delta = match d {
            Delta::Content(t) => json!({"content": t}),
            Delta::Reasoning(t) => json!({"reasoning_content": t}),
            Delta::Call(c) => json!({"tool_calls": [c]}),
        };
        let lp = self.take_logprobs(i);
        head.chunk(
            vec![json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": null})],
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_cuts_the_requests_still_in_the_engine_once() {
        let live = Live::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        live.add(&tx);
        // A request the engine is done with (its sender dropped) is forgotten at the next add.
        for _ in 0..100 {
            let (done, _rx) = mpsc::unbounded_channel();
            live.add(&done);
        }
        assert_eq!(live.lock().len(), 2);
        assert_eq!(live.cut(), 1);
        assert!(matches!(rx.try_recv(), Ok((0, Ev::Cut))));
        // Each is cut once.
        assert_eq!(live.cut(), 0);
        assert!(rx.try_recv().is_err());
        drop(tx);
    }
}
