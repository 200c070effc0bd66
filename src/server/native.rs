//! llama-server's own completion route, `POST /completion` (and `/completions`), for clients
//! written against llama.cpp's server (SillyTavern's llama.cpp backend, scripts, its older web
//! UI): its request fields and its answer, whole or as Server-Sent Events.
//!
//! The request becomes `/v1/completions`' job ([`super::routes::completion_job`]): one set of
//! checks, the same sampler, grammar and prefix cache, under llama-server's limits rather than
//! OpenAI's ([`super::api::WideParams`]: any number of `stop`s, any `temperature` and
//! penalty, `seed` −1 random). Its own fields: `prompt` (a text, token ids, or a mixed list;
//! special tokens in texts are parsed and BOS added before a leading text, as llama-server
//! does; several texts, several prompts there, are a 400), `n_predict` (−1: to the context;
//! cut to the room the context leaves; 0: the prompt evaluated into the cache only),
//! `repeat_last_n` (−1: the context), `stream`. `n_probs` above 0 and `return_tokens` are 400s
//! (`/v1/completions` gives log-probabilities).
//!
//! The answer: `content`, `stop`, `stop_type` (`eos`, `limit`, `word`; `none` when cut off),
//! `stopping_word`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached` (prompt and
//! answer, now in the cache), `generation_settings`, `prompt`, `timings` (milliseconds;
//! `cache_n` the prompt's tokens the prefix cache held); streamed, an event per piece of text
//! (`stop: false`), then the whole answer's fields with `stop: true` (no `[DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::api::{self, Body as RequestBody, CompletionRequest};
use super::error::ApiError;
use super::respond::{self, Ev, Job};
use super::routes::{check_model, completion_job, read_body};
use super::tokens::{MixedPart, TokenizeContent};
use super::AppState;
use crate::engine::scheduler::{FinishReason, Finished};

/// The fields of `/completion` that `/v1/completions` spells otherwise, or takes under
/// narrower limits (OpenAI's).
#[derive(Deserialize)]
struct Fields {
    prompt: Option<TokenizeContent>,
    n_predict: Option<i64>,
    repeat_last_n: Option<i64>,
    n_probs: Option<i64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    return_tokens: bool,
    temperature: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
}

/// The fields `/v1/completions` takes under the same names and limits.
const SAME: [&str; 9] = [
    "model",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "grammar",
    "json_schema",
    "cache_prompt",
    "ignore_eos",
];

pub(super) async fn completion(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let v: Value = serde_json::from_slice(&read_body(&st, &headers, body).await?)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = &v else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    let f: Fields = api::typed(&v)?;
    let refuse = |param: &str, why: &str| Err(ApiError::invalid_param(param, why));
    if f.n_probs.is_some_and(|n| n > 0) {
        return refuse(
            "n_probs",
            "n_probs is not supported on /completion; /v1/completions gives `logprobs`",
        );
    }
    if f.return_tokens {
        return refuse("return_tokens", "return_tokens is not supported");
    }
    let prompt = match f.prompt {
        None => return refuse("prompt", "prompt is required"),
        // (Several texts are several prompts to llama-server: one a request here.)
        Some(TokenizeContent::Mixed(parts))
            if parts.len() > 1 && parts.iter().all(|p| matches!(p, MixedPart::Text(_))) =>
        {
            return refuse("prompt", "one prompt per request: several texts were given");
        }
        Some(p) => p,
    };
    prompt.check("prompt", st.model.config.vocab_size)?;
    // (A prompt of megabytes takes a while: off the connections' threads.)
    let tok = Arc::clone(&st.tokenizer);
    let ids = tokio::task::spawn_blocking(move || prompt.ids(&tok, true, true))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?;
    if ids.is_empty() {
        return refuse("prompt", "the prompt is empty");
    }
    let mut req: Map<String, Value> = SAME
        .iter()
        .filter_map(|&k| Some((k.to_string(), obj.get(k)?.clone())))
        .collect();
    req.insert("prompt".into(), json!(ids));
    let req = CompletionRequest::from_json(&Value::Object(req))?;
    let model = check_model(&st, &req.params.model)?;
    let mut job = completion_job(&st, &req, model).map_err(|mut e| {
        if e.param.as_deref() == Some("messages") {
            e.param = Some("prompt".into());
        }
        e
    })?;
    let wide = api::WideParams {
        max_new: f.n_predict,
        max_name: "n_predict",
        zero_ok: true,
        temperature: f.temperature,
        stop: f.stop.as_deref(),
        repeat_last_n: f.repeat_last_n,
        seed: f.seed,
        presence_penalty: f.presence_penalty,
        frequency_penalty: f.frequency_penalty,
        ..Default::default()
    };
    wide.apply(&mut job.gen, st.opts.n_ctx)?;
    job.gen.stream = f.stream;
    let prompt = st.tokenizer.decode(&job.prompt);
    let rx = respond::queue(&st, &mut job).await?;
    let answer = Answer {
        settings: settings(&job),
        prompt,
        model: job.head.model.clone(),
        start,
        first: None,
        content: String::new(),
    };
    match f.stream {
        true => Ok(stream(answer, rx).into_response()),
        false => whole(answer, rx).await,
    }
}

/// `generation_settings`: what the request runs with.
fn settings(job: &Job) -> Value {
    let (g, s) = (&job.gen, &job.gen.sampler);
    json!({
        "n_predict": g.max_new,
        "seed": s.seed,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": g.stop,
        "ignore_eos": g.ignore_eos,
        "n_probs": 0,
        "stream": g.stream,
    })
}

/// One request's answer, built as its events come.
struct Answer {
    settings: Value,
    prompt: String,
    model: String,
    start: Instant,
    /// When the first text came (the prompt was evaluated).
    first: Option<Instant>,
    /// The text so far.
    content: String,
}

impl Answer {
    /// A piece of text's event (streaming).
    fn piece(&self, text: &str) -> Value {
        json!({"index": 0, "content": text, "stop": false, "id_slot": -1})
    }

    /// The last event: the whole answer's fields (`content` empty: streamed before it).
    fn last(&self, f: &Finished) -> Value {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let (prompt_ms, predicted_ms) = (ms(first - self.start), ms(now - first));
        let (n_prompt, n_pred) = (f.usage.prompt_tokens, f.usage.completion_tokens);
        // (The prompt's tokens evaluated: those the prefix cache did not hold.)
        let n_eval = n_prompt.saturating_sub(f.usage.cached_tokens);
        let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let rate = |ms: f64, n: usize| if ms > 0.0 { 1e3 * n as f64 / ms } else { 0.0 };
        let stop_type = match (&f.reason, &f.stop_word) {
            (FinishReason::Length, _) => "limit",
            (FinishReason::Stop, Some(_)) => "word",
            (FinishReason::Stop, None) => "eos",
            _ => "none",
        };
        json!({
            "index": 0,
            "content": "",
            "tokens": [],
            "id_slot": -1,
            "stop": true,
            "model": self.model,
            "tokens_predicted": n_pred,
            "tokens_evaluated": n_prompt,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": self.content.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": f.stop_word.clone().unwrap_or_default(),
            "tokens_cached": n_prompt + n_pred,
            "timings": {
                "cache_n": f.usage.cached_tokens,
                "prompt_n": n_eval,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": per(prompt_ms, n_eval),
                "prompt_per_second": rate(prompt_ms, n_eval),
                "predicted_n": n_pred,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": per(predicted_ms, n_pred),
                "predicted_per_second": rate(predicted_ms, n_pred),
            },
        })
    }

    /// What an event adds: a piece of text, or the end (an error as OpenAI's error body).
    fn on(&mut self, ev: Ev) -> Option<Result<Value, ApiError>> {
        match ev {
            Ev::Logprobs(_) => None,
            Ev::Text(t) => {
                self.first.get_or_insert_with(Instant::now);
                self.content.push_str(&t);
                Some(Ok(self.piece(&t)))
            }
            Ev::Done(f) => Some(match &f.reason {
                FinishReason::Error(e) => Err(ApiError::bad_request(e.clone())),
                _ => Ok(self.last(&f)),
            }),
        }
    }
}

/// Gather the answer, then send it whole.
async fn whole(
    mut a: Answer,
    mut rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Result<Response, ApiError> {
    while let Some((_, ev)) = rx.recv().await {
        if let Some(r) = a.on(ev) {
            let v = r?;
            if v["stop"] == true {
                let mut v = v;
                v["content"] = json!(a.content);
                return Ok(Json(v).into_response());
            }
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// Server-Sent Events: an event per piece of text, then the last one (`stop: true`).
fn stream(
    a: Answer,
    rx: mpsc::UnboundedReceiver<(usize, Ev)>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    // Dropping the stream (the client left) drops `rx`: the engine cancels.
    let events = futures_util::stream::unfold((a, rx, false), |(mut a, mut rx, done)| async move {
        if done {
            return None;
        }
        loop {
            let Some((_, ev)) = rx.recv().await else {
                // (The engine let go without a last event: say so.)
                let e = ApiError::internal("the engine dropped the request").body();
                return Some((Ok(Event::default().data(e.to_string())), (a, rx, true)));
            };
            match a.on(ev) {
                None => continue,
                Some(Ok(v)) => {
                    let last = v["stop"] == true;
                    return Some((Ok(Event::default().data(v.to_string())), (a, rx, last)));
                }
                Some(Err(e)) => {
                    let data = e.body().to_string();
                    return Some((Ok(Event::default().data(data)), (a, rx, true)));
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
