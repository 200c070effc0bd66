//! One generation: the request read and checked as the server reads it, the tokens computed by
//! the engine `kiln run` drives ([`Engine`]) on a thread of its own, and its text shaped into
//! OpenAI's dicts by the server's [`Answers`], whole or chunk by chunk.
//!
//! The generating thread hands text over a bounded channel; the Python thread waits on it with
//! the GIL released and checks for signals between pieces, so Ctrl-C (KeyboardInterrupt) stops
//! a generation between two tokens. Dropping or closing a [`Run`] stops its generation and
//! waits for the thread to let go of the model's runner.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use serde_json::{json, Value};

use kiln::engine::scheduler::{held_back, FinishReason, Finished, Usage};
use kiln::engine::{Engine, GenStats, GenerateRequest, StopReason};
use kiln::grammar::{limits, Constraint, GrammarEngine};
use kiln::sampler::Sampler;
use kiln::server::api::PromptField;
use kiln::server::api::{self, ChatRequest, CompletionRequest, Endpoint, Generation, Head};
use kiln::server::error::ApiError;
use kiln::server::respond::{Answers, Ev};
use kiln::server::structured::{self, Structured};
use kiln::server::tools;
use kiln::tokenizer::toolcall::template::ToolSupport;
use kiln::tokenizer::toolcall::ToolFormat;

use crate::errors::{self, panic_message};
use crate::model::Inner;

/// What the generating thread sends.
enum Msg {
    Text(String),
    Done(Finished, GenStats),
    Failed(String),
}

/// A generation in progress (`kiln._kiln.Run`): iterate it for its chunks, or call `whole()`.
#[pyclass(module = "kiln._kiln")]
pub struct Run {
    state: Mutex<State>,
    /// Also reachable while another thread reads the stream (and holds `state`).
    cancel: Arc<AtomicBool>,
}

impl Run {
    /// The state, or a `RuntimeError` while another thread reads the stream (waiting for it
    /// here, with the GIL held, could deadlock with that thread).
    fn state(&self) -> PyResult<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) => Err(errors::runtime(
                "this generation is being read by another thread",
            )),
        }
    }
}

struct State {
    head: Head,
    answers: Answers,
    rx: Option<Receiver<Msg>>,
    cancel: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    /// Chunks made, not yet handed out.
    pending: VecDeque<Value>,
    started: bool,
    done: bool,
}

impl State {
    /// The next message of the generating thread (`None`: it is gone), waiting without the
    /// GIL and checking for signals (Ctrl-C) in between.
    fn recv(&mut self, py: Python<'_>) -> PyResult<Option<Msg>> {
        loop {
            if let Err(e) = py.check_signals() {
                self.stop(py);
                return Err(e);
            }
            let Some(rx) = self.rx.take() else {
                return Ok(None);
            };
            let (r, rx) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
            self.rx = Some(rx);
            match r {
                Ok(m) => return Ok(Some(m)),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Stop the generation and wait for its thread (which then lets go of the runner).
    fn stop(&mut self, py: Python<'_>) {
        self.cancel.store(true, Ordering::Relaxed);
        self.rx = None;
        self.done = true;
        if let Some(h) = self.worker.take() {
            py.detach(|| {
                let _ = h.join();
            });
        }
    }

    fn failed(&mut self, py: Python<'_>, msg: Option<String>) -> PyErr {
        self.stop(py);
        errors::runtime(msg.unwrap_or_else(|| "the generation ended without an answer".into()))
    }
}

#[pymethods]
impl Run {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next chunk (a JSON text of OpenAI's chunk object).
    fn __next__(&self, py: Python<'_>) -> PyResult<String> {
        let mut st = self.state()?;
        if !st.started {
            st.started = true;
            if st.head.endpoint == Endpoint::Chat {
                let c = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null});
                let first = st.head.chunk(vec![c], None);
                st.pending.push_back(first);
            }
        }
        loop {
            if let Some(v) = st.pending.pop_front() {
                return Ok(v.to_string());
            }
            if st.done {
                return Err(PyStopIteration::new_err(()));
            }
            let st = &mut *st;
            match st.recv(py)? {
                Some(Msg::Text(t)) => {
                    let chunks = st.answers.on_event(&st.head, 0, Ev::Text(t), false);
                    st.pending.extend(chunks);
                }
                Some(Msg::Done(f, _)) => {
                    let chunks = st.answers.on_event(&st.head, 0, Ev::Done(f), false);
                    st.pending.extend(chunks);
                    st.stop(py);
                }
                Some(Msg::Failed(m)) => return Err(st.failed(py, Some(m))),
                None => return Err(st.failed(py, None)),
            }
        }
    }

    /// The whole response (a JSON text of OpenAI's completion object).
    fn whole(&self, py: Python<'_>) -> PyResult<String> {
        let mut st = self.state()?;
        if st.started {
            return Err(errors::runtime("this generation is already being streamed"));
        }
        st.started = true;
        loop {
            let st = &mut *st;
            match st.recv(py)? {
                Some(Msg::Text(t)) => st.answers.push_text(0, &t),
                Some(Msg::Done(f, stats)) => {
                    st.stop(py);
                    st.answers.finish(0, f);
                    let usage = st.answers.usage();
                    let choice = st.answers.complete(0);
                    let mut v = st.head.complete(vec![choice], &usage);
                    v["timings"] = timings(&stats);
                    return Ok(v.to_string());
                }
                Some(Msg::Failed(m)) => return Err(st.failed(py, Some(m))),
                None => return Err(st.failed(py, None)),
            }
        }
    }

    /// Stop the generation (a stream left unfinished stops when it is garbage-collected too).
    fn close(&self, py: Python<'_>) {
        self.cancel.store(true, Ordering::Relaxed);
        // While another thread reads the stream, it sees the generation end (cancelled).
        if let Ok(mut st) = self.state() {
            st.stop(py);
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        st.cancel.store(true, Ordering::Relaxed);
        st.rx = None;
        if let Some(h) = st.worker.take() {
            // The thread stops at its next token (its channel is closed).
            let _ = h.join();
        }
    }
}

/// What a generation runs with.
struct Job {
    prompt: Vec<u32>,
    gen: Generation,
    constraint: Option<Constraint>,
    tools: Option<ToolFormat>,
}

/// Read and check a request, compile its constraint, and start its generation.
pub fn start(inner: Arc<Inner>, chat: bool, body: &str) -> PyResult<Run> {
    let job = if chat {
        chat_job(&inner, body)?
    } else {
        completion_job(&inner, body)?
    };
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (prefix, endpoint) = match chat {
        true => ("chatcmpl", Endpoint::Chat),
        false => ("cmpl", Endpoint::Completion),
    };
    let head = Head {
        id: format!(
            "{prefix}-{created:x}{:06x}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
        created,
        model: inner.id.clone(),
        endpoint,
    };
    let answers = Answers::new(&head, 1, job.tools, Arc::clone(&inner.tok));
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = sync_channel(16);
    let worker = {
        let cancel = Arc::clone(&cancel);
        std::thread::Builder::new()
            .name("kiln-generate".into())
            .spawn(move || work(&inner, job, &cancel, &tx))
            .map_err(|e| errors::runtime(format!("cannot start a generation thread: {e}")))?
    };
    Ok(Run {
        state: Mutex::new(State {
            head,
            answers,
            rx: Some(rx),
            cancel: Arc::clone(&cancel),
            worker: Some(worker),
            pending: VecDeque::new(),
            started: false,
            done: false,
        }),
        cancel,
    })
}

/// A chat request: its conversation rendered by the model's template with its tools (as
/// `kiln serve` renders it), its answer constrained by its structured-output field or the
/// tool-call grammar.
fn chat_job(inner: &Inner, body: &str) -> PyResult<Job> {
    let c = &inner.model.config;
    if c.arch.is_encoder() {
        let e = kiln::engine::EngineError::encoder_generation(&c.arch_name);
        return Err(errors::engine(e));
    }
    let req: ChatRequest = api::parse(body.as_bytes()).map_err(errors::api)?;
    if req.messages.is_empty() {
        return Err(errors::value("messages must not be empty"));
    }
    one_choice(req.params.n)?;
    if req.logprobs().map_err(errors::api)?.is_some() {
        return Err(no_logprobs());
    }
    let tools = tools::read(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )
    .map_err(errors::api)?;
    let msgs = tools::chat_messages(&req.messages).map_err(errors::api)?;
    let support = (inner.tool_support).get_or_init(|| ToolSupport::probe(&inner.tok));
    let plan = tools::plan(msgs, tools.as_ref(), support, &inner.tok);
    let prompt = inner
        .tok
        .encode_chat_tools(&plan.messages, plan.template_tools.as_ref(), true, false)
        .map_err(|e| errors::value(format!("messages: {e}")))?;
    let mut gen = params(inner, &req.params, prompt.len())?;
    let structured =
        structured::chat_constraint(plan.grammar, gen.structured.take()).map_err(errors::api)?;
    let constraint = compile(inner, structured).map_err(errors::api)?;
    Ok(Job {
        prompt,
        gen,
        constraint,
        tools: plan.format,
    })
}

/// A completion request: its prompt (text, tokenized as `kiln run --raw` tokenizes it, or
/// token ids) and its generation.
fn completion_job(inner: &Inner, body: &str) -> PyResult<Job> {
    let c = &inner.model.config;
    if c.arch.is_encoder() {
        let e = kiln::engine::EngineError::encoder_generation(&c.arch_name);
        return Err(errors::engine(e));
    }
    let req: CompletionRequest = api::parse(body.as_bytes()).map_err(errors::api)?;
    one_choice(req.params.n)?;
    if req.logprobs().map_err(errors::api)?.is_some() {
        return Err(no_logprobs());
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(errors::value(
            "suffix (fill in the middle) is not supported by the Python bindings; use kiln serve's /infill",
        ));
    }
    let vocab = inner.tok.vocab_size();
    let prompt = match req.prompt {
        PromptField::Text(t) => inner.tok.encode(&t, true, false),
        PromptField::Texts(v) if v.len() == 1 => inner.tok.encode(&v[0], true, false),
        PromptField::Texts(v) => {
            return Err(errors::value(format!(
                "{} prompts given; one per call is supported",
                v.len()
            )))
        }
        PromptField::Tokens(ids) => {
            ApiError::check_token_ids("prompt", ids.iter().copied(), vocab).map_err(errors::api)?;
            ids
        }
    };
    if prompt.is_empty() {
        return Err(errors::value("the prompt is empty"));
    }
    let mut gen = params(inner, &req.params, prompt.len())?;
    let constraint = compile(inner, gen.structured.take()).map_err(errors::api)?;
    Ok(Job {
        prompt,
        gen,
        constraint,
        tools: None,
    })
}

fn one_choice(n: Option<i64>) -> PyResult<()> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(errors::value(format!(
            "n = {n}: the Python bindings generate one choice per call"
        ))),
    }
}

fn no_logprobs() -> PyErr {
    errors::value("logprobs are not supported by the Python bindings (kiln serve returns them)")
}

/// The request's generation, checked as the server checks it; the model's seed where the
/// request gives none.
fn params(inner: &Inner, p: &api::GenParams, prompt_len: usize) -> PyResult<Generation> {
    let mut gen = p.validate(prompt_len, inner.n_ctx).map_err(errors::api)?;
    if p.seed.is_none() {
        if let Some(s) = inner.seed {
            gen.sampler.seed = s;
        }
    }
    Ok(gen)
}

/// Compile a structured-output constraint for the model (its grammar engine built once), on
/// a thread with the compiler's stack.
fn compile(inner: &Inner, s: Option<Structured>) -> Result<Option<Constraint>, ApiError> {
    let Some(s) = s else {
        return Ok(None);
    };
    let engine = GrammarEngine::shared(&inner.grammar, &inner.tok)
        .map_err(|e| structured::error(s.field, s.path, e))?;
    let spec = s.spec.clone();
    let compiled = limits::on_compile_stack(move || engine.compile(&spec))
        .and_then(|r| r)
        .map_err(|e| structured::error(s.field, s.path, e))?;
    Ok(Some(compiled))
}

/// Text held back while it may still become a stop sequence, as the server's scheduler holds
/// it ([`held_back`]).
struct Stops<'a> {
    stop: &'a [String],
    held: String,
    hit: Option<usize>,
}

impl Stops<'_> {
    /// Add a piece: the text that may be sent now, and whether a stop sequence ended it.
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first = (self.stop.iter().enumerate())
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i)))
            .min();
        match first {
            Some((at, i)) => {
                self.hit = Some(i);
                let out = self.held[..at].to_string();
                self.held.clear();
                (out, true)
            }
            None => {
                let n = self.held.len() - held_back(&self.held, self.stop);
                (self.held.drain(..n).collect(), false)
            }
        }
    }
}

/// The generating thread: run the job on the model's engine, sending text as it comes and
/// how it ended last. A panic is sent as a failure.
fn work(inner: &Inner, job: Job, cancel: &AtomicBool, tx: &SyncSender<Msg>) {
    let r = catch_unwind(AssertUnwindSafe(|| generate(inner, job, cancel, tx)));
    let last = match r {
        Ok(Ok((f, stats))) => Msg::Done(f, stats),
        Ok(Err(msg)) => Msg::Failed(msg),
        Err(p) => Msg::Failed(format!(
            "kiln failed while generating: {} (a bug: please report it)",
            panic_message(p.as_ref())
        )),
    };
    let _ = tx.send(last);
}

fn generate(
    inner: &Inner,
    mut job: Job,
    cancel: &AtomicBool,
    tx: &SyncSender<Msg>,
) -> Result<(Finished, GenStats), String> {
    let mut guard = match inner.runner.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Err("this model is already generating (finish or close its other stream first, or load the model once per thread)".into())
        }
    };
    if inner.model.config.arch.is_encoder() {
        return Err("this model gives embeddings, not text".into());
    }
    // The runner is lent to an engine for the generation and comes back after it (a
    // generation that panicked loses it).
    let runner = guard
        .take()
        .ok_or_else(|| "this model's engine was lost to an earlier failure".to_string())?;
    let mut engine = Engine::new(runner, &inner.tok).map_err(|e| e.to_string())?;
    let mut sampler = Sampler::new(job.gen.sampler.clone(), inner.model.config.vocab_size);
    let req = GenerateRequest {
        prompt: &job.prompt,
        max_new: Some(job.gen.max_new),
        reuse_prefix: false,
        cancel: Some(cancel),
        ignore_eos: job.gen.ignore_eos,
        stop: &[],
    };
    let mut stops = Stops {
        stop: &job.gen.stop,
        held: String::new(),
        hit: None,
    };
    let mut gone = false;
    // A whole answer is sent once, at the end: waking the waiting Python thread for every
    // token would take CPU time from the forward passes (Ctrl-C still stops the generation
    // through `cancel`).
    let whole = !job.gen.stream;
    let mut gathered = String::new();
    let mut on_token = |_id: u32, piece: &str| {
        if stops.hit.is_some() || gone {
            return false;
        }
        let (text, hit) = stops.push(piece);
        if whole {
            gathered.push_str(&text);
        } else if !text.is_empty() && tx.send(Msg::Text(text)).is_err() {
            gone = true;
            return false;
        }
        !hit
    };
    let result = engine.generate(
        &req,
        &mut sampler,
        job.constraint.take(),
        &mut |_, _| {},
        &mut on_token,
    );
    *guard = Some(engine.into_runner());
    let stats = result.map_err(|e| e.to_string())?;
    if stops.hit.is_none() && !gone {
        gathered.push_str(&stops.held);
    }
    if !gathered.is_empty() {
        let _ = tx.send(Msg::Text(gathered));
    }
    if inner.verbose {
        eprintln!(
            "kiln: prompt eval {:.2} ms / {} tokens ({:.2} tokens per second); eval {:.2} ms / {} tokens ({:.2} tokens per second)",
            stats.prompt_ms,
            stats.prompt_tokens,
            stats.prompt_tps(),
            stats.gen_ms,
            stats.gen_tokens,
            stats.gen_tps()
        );
    }
    let reason = match (stops.hit, stats.stop) {
        (Some(_), _) | (None, Some(StopReason::EndOfGeneration)) => FinishReason::Stop,
        (None, Some(StopReason::Length | StopReason::ContextFull)) => FinishReason::Length,
        (None, Some(StopReason::Cancelled) | None) => FinishReason::Cancelled,
    };
    let finished = Finished {
        reason,
        usage: Usage {
            prompt_tokens: job.prompt.len(),
            completion_tokens: stats.gen_tokens,
            cached_tokens: 0,
        },
        stop_word: stops.hit.map(|i| job.gen.stop[i].clone()),
    };
    Ok((finished, stats))
}

/// llama-server's `timings` of a response: the engine's own clock, as `kiln run` reports it.
fn timings(s: &GenStats) -> Value {
    json!({
        "prompt_n": s.prompt_tokens,
        "prompt_ms": s.prompt_ms,
        "prompt_per_second": s.prompt_tps(),
        "predicted_n": s.gen_tokens,
        "predicted_ms": s.gen_ms,
        "predicted_per_second": s.gen_tps(),
    })
}
