//! llama-server's own completion route, `POST /completion` (and `/completions`), for clients
//! written against llama.cpp's server (SillyTavern's llama.cpp backend, scripts, its older web
//! UI): its request fields and its answer, whole or as Server-Sent Events.
//!
//! The request becomes `/v1/completions`' job ([`super::jobs::completion_job`]): one set of
//! checks, the same sampler, grammar and prefix cache, under llama-server's limits rather than
//! OpenAI's ([`super::api::WideParams`]: any number of `stop`s, any `temperature` and
//! penalty, `seed` −1 random). Its own fields: `prompt` (a text, token ids, or a mixed list;
//! special tokens in texts are parsed and BOS added before a leading text, as llama-server
//! does; several texts, several prompts there, are a 400), `n_predict` (−1: to the context;
//! cut to the room the context leaves; 0: the prompt evaluated into the cache only),
//! `repeat_last_n` (−1: the context), `stream`, `n_probs` (each token's log-probability and
//! its `n_probs` most likely alternatives, at most 20, in `completion_probabilities`: the
//! model's, before penalties and temperature, as llama-server gives by default;
//! `post_sampling_probs` is a 400), `return_tokens` (the answer's ids in `tokens`),
//! `response_fields` (only these fields of the answer, by path: `timings/prompt_n`), and for
//! code completion `n_indent` (a line after the first that starts less indented ends the
//! text before its first other character) and `t_max_predict_ms` (past this time since the
//! first token, the text ends with the next token that ends a line after the first); both end
//! it as the token limit does (`stop_type` `limit`). `logit_bias` takes llama-server's forms
//! ([`super::bias`]); llama-server's samplers kiln lacks (`mirostat`, `dry_multiplier`,
//! `xtc_probability`, ...) are refused where they ask for something ([`super::unsupported`]).
//!
//! The answer: `content`, `stop`, `stop_type` (`eos`, `limit`, `word`; `none` when cut off),
//! `stopping_word`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached` (prompt and
//! answer, now in the cache), `generation_settings`, `prompt`, `timings` (milliseconds;
//! `cache_n` the prompt's tokens the prefix cache held); streamed, an event per piece of text
//! (`stop: false`), then the whole answer's fields with `stop: true` (no `[DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use super::bias::{self, Dialect};
use super::error::ApiError;
use super::jobs::{check_model, completion_job, read_body};
use super::logprobs::finite;
use super::respond::{self, Ev, Job};
use super::tokens::{MixedPart, TokenizeContent};
use super::{unsupported, AppState};
use crate::engine::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::engine::scheduler::{CodeStops, FinishReason, Finished};
use crate::tokenizer::{ExtraChunk, InfillBudget, InfillParts, Tokenizer};

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
    #[serde(default)]
    post_sampling_probs: bool,
    #[serde(default)]
    response_fields: Vec<String>,
    n_indent: Option<i64>,
    t_max_predict_ms: Option<i64>,
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
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let mut f: Fields = api::typed(&v)?;
    let prompt = match f.prompt.take() {
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
    generate(&st, start, &v, f, ids).await
}

/// `/infill`'s own fields: the text before and after the cursor, other files.
#[derive(Deserialize)]
struct InfillFields {
    input_prefix: Option<TokenizeContent>,
    input_suffix: Option<TokenizeContent>,
    input_extra: Option<Vec<ExtraChunk>>,
}

/// `POST /infill`: fill in the middle, llama-server's way (llama.vscode, llama.vim, Tabby's
/// llama.cpp backend): `input_prefix` and `input_suffix` (texts, or mixed lists of texts and
/// ids, their special-token text kept as text), `input_extra` (`[{"filename", "text"}]`: other
/// files, as repository context), `prompt` (a text the answer starts with), and
/// `/completion`'s fields; the answer is `/completion`'s. The prompt is the model's FIM
/// tokens around the parts ([`crate::tokenizer::InfillParts`]; `--spm-infill` puts the suffix
/// first); a model without them is a 501 saying so.
pub(super) async fn infill(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let v = api::object(&read_body(&st, &headers, body).await?)?;
    let mut f: Fields = api::typed(&v)?;
    let i: InfillFields = api::typed(&v)?;
    let fim = st
        .tokenizer
        .fim_tokens()
        .map_err(|e| ApiError::not_supported(e.to_string()))?;
    let prompt = match f.prompt.take() {
        None => String::new(),
        Some(TokenizeContent::Text(t)) => t,
        Some(TokenizeContent::Mixed(_)) => return refuse("prompt", "\"prompt\" must be a string"),
    };
    let Some(prefix) = i.input_prefix else {
        return refuse("input_prefix", "\"input_prefix\" is required");
    };
    let Some(suffix) = i.input_suffix else {
        return refuse("input_suffix", "\"input_suffix\" is required");
    };
    let vocab = st.model.config.vocab_size;
    prefix.check("input_prefix", vocab)?;
    suffix.check("input_suffix", vocab)?;
    let extra = i.input_extra.unwrap_or_default();
    let budget = InfillBudget::new(st.opts.n_ctx, st.opts.spm_infill);
    let tok = Arc::clone(&st.tokenizer);
    let ids = tokio::task::spawn_blocking(move || {
        let parts = InfillParts {
            prefix: prefix.ids(&tok, false, false),
            suffix: suffix.ids(&tok, false, false),
            prompt: tok.encode(&prompt, false, true),
            extra: &extra,
            repository: true,
        };
        tok.infill_prompt(&fim, &parts, budget)
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?;
    generate(&st, start, &v, f, ids).await
}

fn refuse<T>(param: &str, why: &str) -> Result<T, ApiError> {
    Err(ApiError::invalid_param(param, why))
}

/// Generate from the prompt `ids` with the request's fields (`v`, `f`), and answer as
/// llama-server does.
async fn generate(
    st: &AppState,
    start: Instant,
    v: &Value,
    f: Fields,
    ids: Vec<u32>,
) -> Result<Response, ApiError> {
    if f.post_sampling_probs {
        return refuse(
            "post_sampling_probs",
            "post_sampling_probs is not supported: n_probs gives the model's log-probabilities",
        );
    }
    unsupported::check(v, "", unsupported::LLAMA_SAMPLING)?;
    unsupported::check(v, "", unsupported::LLAMA_COMPLETION)?;
    let n_probs = f.n_probs.unwrap_or(0).clamp(0, MAX_TOP_LOGPROBS as i64) as usize;
    if ids.is_empty() {
        return refuse("prompt", "the prompt is empty");
    }
    let mut req: Map<String, Value> = SAME
        .iter()
        .filter_map(|&k| Some((k.to_string(), v.get(k)?.clone())))
        .collect();
    req.insert("prompt".into(), json!(ids));
    // (Each token's log-probabilities carry its id: `return_tokens` asks for none of them.)
    if n_probs > 0 || f.return_tokens {
        req.insert("logprobs".into(), json!(n_probs));
    }
    let req = CompletionRequest::from_json(&Value::Object(req))?;
    let model = check_model(st, &req.params.model)?;
    let mut job = completion_job(st, &req, model).map_err(|mut e| {
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
    let vocab = st.model.config.vocab_size;
    job.gen.sampler.logit_bias = bias::read(
        v.get("logit_bias"),
        &st.tokenizer,
        vocab,
        Dialect::LlamaServer,
    )?;
    job.gen.stream = f.stream;
    job.gen.code = CodeStops {
        n_indent: f.n_indent.unwrap_or(0).max(0) as usize,
        t_max_predict: (f.t_max_predict_ms.filter(|&t| t > 0))
            .map(|t| Duration::from_millis(t as u64)),
    };
    let prompt = st.tokenizer.decode(&job.prompt);
    let rx = respond::queue(st, &mut job).await?;
    let answer = Answer {
        settings: settings(&job, n_probs),
        prompt,
        model: job.head.model.clone(),
        start,
        first: None,
        content: String::new(),
        tok: Arc::clone(&st.tokenizer),
        n_probs,
        return_tokens: f.return_tokens,
        fields: f.response_fields,
        probs: Vec::new(),
        tokens: Vec::new(),
        sent: 0,
    };
    match f.stream {
        true => Ok(stream(answer, rx).into_response()),
        false => whole(answer, rx).await,
    }
}

/// `generation_settings`: what the request runs with.
fn settings(job: &Job, n_probs: usize) -> Value {
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
        "n_probs": n_probs,
        "n_indent": g.code.n_indent,
        "t_max_predict_ms": g.code.t_max_predict.map_or(-1, |t| t.as_millis() as i64),
        "stream": g.stream,
        // (As llama-server lists it; a ban's -inf is `null`, as there.)
        "logit_bias": s.logit_bias.iter().map(|&(token, bias)| json!({"bias": bias, "token": token})).collect::<Vec<_>>(),
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
    tok: Arc<Tokenizer>,
    /// Alternatives per token in `completion_probabilities` (0: none asked).
    n_probs: usize,
    /// The answer's ids in `tokens`.
    return_tokens: bool,
    /// `response_fields`: the last answer's fields to send (all: none named).
    fields: Vec<String>,
    /// Each token's `completion_probabilities` entry (`n_probs` > 0) and id, so far.
    probs: Vec<Value>,
    tokens: Vec<u32>,
    /// Tokens sent in earlier events (streaming).
    sent: usize,
}

impl Answer {
    /// A piece of text's event (streaming), with the tokens generated since the last one.
    fn piece(&mut self, text: &str) -> Value {
        let mut v = json!({"index": 0, "content": text, "stop": false, "id_slot": -1});
        self.add_tokens(&mut v, self.sent);
        self.sent = self.tokens.len();
        v
    }

    /// `tokens` and `completion_probabilities` from the answer's token `from` on, where asked.
    fn add_tokens(&self, v: &mut Value, from: usize) {
        let ids = match self.return_tokens {
            true => &self.tokens[from..],
            false => &[],
        };
        v["tokens"] = json!(ids);
        if self.n_probs > 0 {
            v["completion_probabilities"] = json!(self.probs[from..]);
        }
    }

    /// llama-server's `response_fields`: only the named fields of the last answer, each under
    /// its path (`timings/prompt_n`); a path that is not there is left out.
    fn select(&self, v: Value) -> Value {
        if self.fields.is_empty() {
            return v;
        }
        let mut out = Map::new();
        for path in &self.fields {
            let mut at = Some(&v);
            for key in path.split('/') {
                at = at.and_then(|x| x.as_object()?.get(key));
            }
            if let Some(x) = at {
                out.insert(path.clone(), x.clone());
            }
        }
        Value::Object(out)
    }

    /// A token's log-probabilities as llama-server writes them: `id`, `token` (its bytes' longest
    /// UTF-8 start), `bytes`, `logprob`, `top_logprobs` (the same for each alternative).
    fn prob(&self, lp: &TokenLogprobs) -> Value {
        let one = |id: u32, logprob: f32| {
            let bytes = self.tok.token_bytes(id);
            let valid = match std::str::from_utf8(bytes) {
                Ok(t) => t,
                // (Cut before the incomplete character, as llama-server's `validate_utf8`.)
                Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
            };
            json!({"id": id, "token": valid, "bytes": bytes, "logprob": finite(logprob)})
        };
        let mut v = one(lp.token, lp.logprob);
        let top: Vec<Value> = lp.top.iter().map(|&(id, l)| one(id, l)).collect();
        v["top_logprobs"] = json!(top);
        v
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
            Ev::Logprobs(lp) => {
                self.tokens.push(lp.token);
                if self.n_probs > 0 {
                    self.probs.push(self.prob(&lp));
                }
                None
            }
            Ev::Text(t) => {
                self.first.get_or_insert_with(Instant::now);
                self.content.push_str(&t);
                Some(Ok(self.piece(&t)))
            }
            Ev::Cut => Some(Err(super::respond::cut_error())),
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
                a.add_tokens(&mut v, 0);
                return Ok(Json(a.select(v)).into_response());
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
                    let v = match last {
                        true => {
                            // (Tokens whose text never came: a stop word's, a cut line's.)
                            let mut v = v;
                            if a.sent < a.tokens.len() {
                                a.add_tokens(&mut v, a.sent);
                            }
                            a.select(v)
                        }
                        false => v,
                    };
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
