//! The OpenAI request bodies we accept, their validation, and the response bodies we send.
//!
//! Unknown fields are ignored (clients send many); the fields of OpenAI's and llama-server's
//! that kiln does not implement are refused when they ask for something
//! ([`super::unsupported`]); fields with the wrong type, out-of-range values and requests that
//! cannot fit the context are refused with a 400 naming the field.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::unsupported;
use crate::engine::scheduler::{FinishReason, Usage};
use crate::sampler::SamplerConfig;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The generation parameters both endpoints share (OpenAI's, plus llama.cpp server's
/// `top_k`, `min_p`, `repeat_penalty`, `cache_prompt`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    /// llama-server's window of the penalties (−1: the context).
    pub repeat_last_n: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    /// Reuse a cached prefix of the prompt (default true).
    pub cache_prompt: Option<bool>,
    /// OpenAI's `{"token_id": bias}` (llama-server's `[[id, bias]]` too), read against the
    /// vocabulary by [`super::bias::read`] where the route knows it.
    pub logit_bias: Option<Value>,
    /// vLLM's `cache_salt`: requests share cached prefixes only with requests of the same
    /// salt (and API key).
    pub cache_salt: Option<String>,
    /// Code completion's early ends, as llama-server takes them on every route (see
    /// [`crate::engine::scheduler::CodeStops`]).
    pub n_indent: Option<i64>,
    pub t_max_predict_ms: Option<i64>,
    /// Keep generating past end-of-generation tokens (llama.cpp server's `ignore_eos`).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Structured output ([`super::structured`]): OpenAI's, and llama.cpp server's two.
    pub response_format: Option<Value>,
    pub json_schema: Option<Value>,
    pub grammar: Option<String>,
}

/// A message's content: text, or a list of parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls (checked in [`super::tools`]).
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// Tool calling ([`super::tools`]).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Log-probabilities of the answer's tokens, and how many alternatives per token.
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// llama-server's `reasoning_format`: whether the model's reasoning is separated from its
    /// answer (`reasoning_content`).
    pub reasoning: bool,
    /// llama-server's `chat_template_kwargs`: more variables of the chat template's context
    /// ([`template_kwargs`]).
    pub template_kwargs: Option<Map<String, Value>>,
    /// A final assistant message with content is the start of the answer, which the model
    /// continues (Anthropic's prefill), rather than a turn answered anew.
    pub prefill: bool,
    pub params: GenParams,
}

#[derive(Deserialize)]
struct ChatFields {
    reasoning_format: Option<String>,
    chat_template_kwargs: Option<Value>,
    messages: Vec<Message>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
}

/// `prompt` of `POST /v1/completions`: text, one text in a list, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// The legacy `logprobs`: alternatives per token (their log-probabilities with each
    /// token's own).
    pub logprobs: Option<i64>,
    /// The text after the completion (fill in the middle: the model's FIM tokens around the
    /// prompt and it).
    pub suffix: Option<String>,
    pub params: GenParams,
}

#[derive(Deserialize)]
struct CompletionFields {
    prompt: PromptField,
    logprobs: Option<i64>,
    suffix: Option<String>,
}

/// A request body: its endpoint's own fields plus the shared [`GenParams`], each read from
/// the same JSON object (not `#[serde(flatten)]`, which would lose the field names in errors).
pub trait Body: Sized {
    fn from_json(v: &Value) -> Result<Self, ApiError>;
}

impl Body for ChatRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        let f: ChatFields = typed(v)?;
        unsupported::check(v, "", unsupported::OPENAI_CHAT)?;
        unsupported::check(v, "", unsupported::LLAMA_SAMPLING)?;
        Ok(ChatRequest {
            messages: f.messages,
            tools: f.tools,
            tool_choice: f.tool_choice,
            parallel_tool_calls: f.parallel_tool_calls,
            logprobs: f.logprobs,
            top_logprobs: f.top_logprobs,
            reasoning: reasoning_format(f.reasoning_format.as_deref())?,
            template_kwargs: template_kwargs(f.chat_template_kwargs)?,
            prefill: false,
            params: typed(v)?,
        })
    }
}

/// The longest string a `chat_template_kwargs` value may be.
pub const KWARG_MAX_CHARS: usize = 256;

/// llama-server's `chat_template_kwargs`: an object whose values are booleans, numbers, nulls
/// or short strings (the switches templates read, e.g. Qwen 3's `enable_thinking`); it cannot
/// name the variables kiln sets ([`crate::tokenizer::TEMPLATE_VARIABLES`]). Anything else is a
/// 400 naming the key.
fn template_kwargs(v: Option<Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    const AT: &str = "chat_template_kwargs";
    let map = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::invalid_param(
                AT,
                format!("{AT} must be an object (variable names to values), not {other}"),
            ))
        }
    };
    for (k, x) in &map {
        let at = format!("{AT}.{k}");
        if crate::tokenizer::TEMPLATE_VARIABLES.contains(&k.as_str()) {
            return Err(ApiError::invalid_param(
                &at,
                format!("{at}: `{k}` is set by kiln from the request and cannot be replaced"),
            ));
        }
        let ok = match x {
            Value::Null | Value::Bool(_) | Value::Number(_) => true,
            Value::String(s) => s.chars().count() <= KWARG_MAX_CHARS,
            _ => false,
        };
        if !ok {
            return Err(ApiError::invalid_param(
                &at,
                format!(
                    "{at} must be a boolean, a number, null or a string of at most {KWARG_MAX_CHARS} characters"
                ),
            ));
        }
    }
    Ok((!map.is_empty()).then_some(map))
}

/// llama-server's `reasoning_format`: `"deepseek"` and `"auto"` separate the reasoning,
/// `"none"` (kiln's default) leaves it in the content.
fn reasoning_format(v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("none") => Ok(false),
        Some("deepseek" | "auto") => Ok(true),
        Some(other) => Err(ApiError::invalid_param(
            "reasoning_format",
            format!(
                "reasoning_format = {other:?} is not supported: send \"none\", \"auto\" or \"deepseek\""
            ),
        )),
    }
}

impl Body for CompletionRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        let f: CompletionFields = typed(v)?;
        unsupported::check(v, "", unsupported::OPENAI_COMPLETIONS)?;
        unsupported::check(v, "", unsupported::LLAMA_SAMPLING)?;
        Ok(CompletionRequest {
            prompt: f.prompt,
            logprobs: f.logprobs,
            suffix: f.suffix,
            params: typed(v)?,
        })
    }
}

/// Parse a JSON body: malformed JSON and wrong types are 400s naming the field.
pub fn parse<T: Body>(body: &[u8]) -> Result<T, ApiError> {
    T::from_json(&object(body)?)
}

/// A request's JSON body, which must be an object (else a 400 saying what it is not).
pub(crate) fn object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    match v.is_object() {
        true => Ok(v),
        false => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

pub(crate) fn typed<'v, T: Deserialize<'v>>(value: &'v Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(&path, format!("invalid `{path}`: {inner}"))
        }
    })
}

impl Message {
    /// The text of the message (text parts joined).
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::invalid_param(
                            "messages",
                            format!("content parts of type `{}` are not supported", p.kind),
                        ));
                    }
                    out.push_str(p.text.as_deref().unwrap_or(""));
                }
                Ok(out)
            }
        }
    }
}

/// What a validated request asks of the engine.
#[derive(Debug, Clone)]
pub struct Generation {
    pub max_new: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub cache_prompt: bool,
    /// `cache_salt` (see [`super::tenant::tenant`]).
    pub cache_salt: Option<String>,
    pub ignore_eos: bool,
    pub structured: Option<super::structured::Structured>,
    /// Choices (`n`).
    pub n: usize,
    /// Log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// Code completion's early ends (llama-server's `n_indent`, `t_max_predict_ms`).
    pub code: crate::engine::scheduler::CodeStops,
}

impl ChatRequest {
    /// `logprobs` / `top_logprobs` (OpenAI: `top_logprobs` in 0..=20 needs `logprobs: true`).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let max = crate::engine::logprobs::MAX_TOP_LOGPROBS as i64;
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(k)) if !(0..=max).contains(&k) => Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs = {k} must be between 0 and {max}"),
            )),
            (false, Some(_)) => Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs needs `logprobs: true`",
            )),
            (true, k) => Ok(Some(k.unwrap_or(0) as usize)),
            (false, None) => Ok(None),
        }
    }
}

impl CompletionRequest {
    /// The legacy `logprobs: N` (0..=20; OpenAI allows 5, vLLM and llama-server more).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let max = crate::engine::logprobs::MAX_TOP_LOGPROBS as i64;
        match self.logprobs {
            Some(k) if !(0..=max).contains(&k) => Err(ApiError::invalid_param(
                "logprobs",
                format!("logprobs = {k} must be between 0 and {max}"),
            )),
            Some(k) => Ok(Some(k as usize)),
            None => Ok(None),
        }
    }
}

impl GenParams {
    /// Check the parameters against a prompt of `prompt_len` tokens and a context of `n_ctx`.
    /// `n`: at least 1, at most the server's slots (each choice generates in one).
    pub fn choices(&self, n_slots: usize) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if n < 1 => Err(ApiError::invalid_param(
                "n",
                format!("n = {n} must be at least 1"),
            )),
            Some(n) if n as u64 > n_slots as u64 => Err(ApiError::invalid_param(
                "n",
                format!(
                    "n = {n} is more choices than this server generates at once (--parallel {n_slots})"
                ),
            )),
            Some(n) => Ok(n as usize),
        }
    }

    pub fn validate(&self, prompt_len: usize, n_ctx: usize) -> Result<Generation, ApiError> {
        if prompt_len >= n_ctx {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid_param(
                    "messages",
                    format!(
                        "the prompt has {prompt_len} tokens but the context holds {n_ctx}; shorten it"
                    ),
                )
            });
        }
        let room = n_ctx - prompt_len;
        let (name, asked) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        let max_new = match asked {
            None => room,
            Some(m) if m < 1 => {
                return Err(ApiError::invalid_param(
                    name,
                    format!("{name} = {m} must be at least 1"),
                ))
            }
            Some(m) if m as u64 > room as u64 => {
                return Err(ApiError {
                    code: Some("context_length_exceeded"),
                    ..ApiError::invalid_param(
                        name,
                        format!(
                            "{name} = {m} plus the prompt's {prompt_len} tokens exceeds the context of {n_ctx} tokens (at most {room})"
                        ),
                    )
                });
            }
            Some(m) => m as usize,
        };
        let mut sampler = SamplerConfig::default();
        let set = |dst: &mut f32, name: &str, v: Option<f32>, lo: f32, hi: f32| match v {
            Some(v) if !(lo..=hi).contains(&v) => Err(ApiError::invalid_param(
                name,
                format!("{name} = {v} must be between {lo} and {hi}"),
            )),
            Some(v) => {
                *dst = v;
                Ok(())
            }
            None => Ok(()),
        };
        set(
            &mut sampler.temperature,
            "temperature",
            self.temperature,
            0.0,
            2.0,
        )?;
        set(&mut sampler.top_p, "top_p", self.top_p, 0.0, 1.0)?;
        set(&mut sampler.min_p, "min_p", self.min_p, 0.0, 1.0)?;
        let (f, p) = (self.frequency_penalty, self.presence_penalty);
        set(
            &mut sampler.frequency_penalty,
            "frequency_penalty",
            f,
            -2.0,
            2.0,
        )?;
        set(
            &mut sampler.presence_penalty,
            "presence_penalty",
            p,
            -2.0,
            2.0,
        )?;
        if let Some(k) = self.top_k {
            sampler.top_k = k;
        }
        if let Some(r) = self.repeat_penalty {
            if !(r.is_finite() && r > 0.0) {
                return Err(ApiError::invalid_param(
                    "repeat_penalty",
                    format!("repeat_penalty = {r} must be > 0"),
                ));
            }
            sampler.repeat_penalty = r;
        }
        match self.repeat_last_n {
            None => {}
            Some(-1) => sampler.repeat_last_n = n_ctx,
            Some(n) if n >= 0 => sampler.repeat_last_n = n as usize,
            Some(n) => {
                return Err(ApiError::invalid_param(
                    "repeat_last_n",
                    format!("repeat_last_n = {n}: 0 or more, or -1 (the context)"),
                ))
            }
        }
        if let Some(s) = self.seed {
            sampler.seed = s as u64;
        }
        let stop = match &self.stop {
            None => vec![],
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(|s| s.is_empty() || s.len() > 256) {
            return Err(ApiError::invalid_param(
                "stop",
                "stop takes up to 4 non-empty sequences of at most 256 bytes",
            ));
        }
        Ok(Generation {
            max_new,
            sampler,
            stop,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            cache_prompt: self.cache_prompt.unwrap_or(true),
            cache_salt: match &self.cache_salt {
                Some(s) if s.is_empty() || s.len() > 256 => {
                    return Err(ApiError::invalid_param(
                        "cache_salt",
                        "cache_salt must be 1 to 256 bytes",
                    ))
                }
                s => s.clone(),
            },
            ignore_eos: self.ignore_eos,
            structured: super::structured::read(
                self.response_format.as_ref(),
                self.json_schema.as_ref(),
                self.grammar.as_deref(),
            )?,
            n: 1,
            logprobs: None,
            code: crate::engine::scheduler::CodeStops {
                n_indent: self.n_indent.unwrap_or(0).max(0) as usize,
                t_max_predict: (self.t_max_predict_ms.filter(|&t| t > 0))
                    .map(|t| std::time::Duration::from_millis(t as u64)),
            },
        })
    }
}

/// OpenAI's `finish_reason` (null while streaming).
pub fn finish_reason(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Error(_) => "error",
    }
}

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Identity of one response: id, creation time, model.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl Head {
    /// A whole (non-streaming) response with these choices.
    pub fn complete(&self, choices: Vec<Value>, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "kiln",
            "choices": choices,
            "usage": usage_json(usage),
        })
    }

    /// One streaming chunk with these choices (`[]` for the usage-only chunk of
    /// `stream_options.include_usage`, which then gets `usage`).
    pub fn chunk(&self, choices: Vec<Value>, usage: Option<&Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "kiln",
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = usage_json(u);
        }
        v
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse::<ChatRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("temperature"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages": "hi"}"#).unwrap_err();
        assert!(e.message.contains("messages"), "{}", e.message);
        let e = parse::<ChatRequest>(b"{not json").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse::<ChatRequest>(b"[1, 2]").unwrap_err();
        assert!(e.message.contains("object"), "{}", e.message);
    }

    #[test]
    fn accepts_openai_shapes() {
        let r = parse::<ChatRequest>(
            br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "max_tokens": 5, "stop": "x", "stream": true, "stream_options": {"include_usage": true},
                 "temperature": 0, "seed": 7, "user": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0].text().unwrap(), "hi");
        let g = r.params.validate(10, 100).unwrap();
        assert_eq!((g.max_new, g.stream, g.include_usage), (5, true, true));
        assert_eq!(g.stop, vec!["x".to_string()]);
        assert_eq!((g.sampler.temperature, g.sampler.seed), (0.0, 7));
        let c = parse::<CompletionRequest>(br#"{"prompt": [1, 2, 3]}"#).unwrap();
        assert!(matches!(c.prompt, PromptField::Tokens(ref t) if t == &[1, 2, 3]));
        let c = parse::<CompletionRequest>(br#"{"prompt": ["a"]}"#).unwrap();
        assert!(matches!(c.prompt, PromptField::Texts(_)));
    }

    #[test]
    fn limits_are_checked() {
        let p = |j: &str| parse::<ChatRequest>(j.as_bytes()).unwrap().params;
        let base = r#"{"messages": [], "#;
        let e = p(&format!(r#"{base}"max_tokens": 95}}"#))
            .validate(10, 100)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("at most 90"), "{}", e.message);
        assert_eq!(
            p(&format!(r#"{base}"max_tokens": 90}}"#))
                .validate(10, 100)
                .unwrap()
                .max_new,
            90
        );
        assert_eq!(
            p(r#"{"messages": []}"#).validate(10, 100).unwrap().max_new,
            90
        );
        assert!(p(&format!(r#"{base}"max_tokens": 0}}"#))
            .validate(1, 9)
            .is_err());
        assert_eq!(p(&format!(r#"{base}"n": 2}}"#)).choices(2).unwrap(), 2);
        let e = p(&format!(r#"{base}"n": 3}}"#)).choices(2).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        assert!(e.message.contains("--parallel 2"), "{}", e.message);
        assert!(p(&format!(r#"{base}"n": 0}}"#)).choices(2).is_err());
        assert_eq!(p(r#"{"messages": []}"#).choices(1).unwrap(), 1);
        assert!(p(&format!(r#"{base}"temperature": 3}}"#))
            .validate(1, 9)
            .is_err());
        assert!(p(&format!(r#"{base}"top_p": -1}}"#))
            .validate(1, 9)
            .is_err());
        assert!(p(&format!(r#"{base}"stop": ["a","b","c","d","e"]}}"#))
            .validate(1, 9)
            .is_err());
        assert!(
            p(r#"{"messages": []}"#).validate(9, 9).is_err(),
            "prompt fills the context"
        );
        // llama-server's fields on the OpenAI routes: the penalties' window, code stops.
        let g = p(&format!(
            r#"{base}"repeat_last_n": 16, "n_indent": 4, "t_max_predict_ms": 250}}"#
        ))
        .validate(1, 90)
        .unwrap();
        assert_eq!((g.sampler.repeat_last_n, g.code.n_indent), (16, 4));
        assert_eq!(
            g.code.t_max_predict,
            Some(std::time::Duration::from_millis(250))
        );
        let g = p(&format!(r#"{base}"repeat_last_n": -1}}"#));
        assert_eq!(g.validate(1, 90).unwrap().sampler.repeat_last_n, 90);
        let e = p(&format!(r#"{base}"repeat_last_n": -2}}"#))
            .validate(1, 90)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("repeat_last_n"));
        let e = p(&format!(r#"{base}"cache_salt": ""}}"#))
            .validate(1, 9)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("cache_salt"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes and mutated valid bodies are answered with a value or a 400, never a
        /// panic, and validation of whatever parses never panics either.
        #[test]
        fn hostile_bodies_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            cut in 0usize..400,
            flip in 0usize..400,
            byte in proptest::prelude::any::<u8>(),
            plen in 0usize..5000,
        ) {
            let _ = parse::<ChatRequest>(&bytes);
            let valid = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0.5,"top_p":0.9,"stop":["a"],"seed":-3,"n":1,"stream":true,"stream_options":{"include_usage":true}}"#;
            let mut m = valid.to_vec();
            let f = flip % m.len();
            m[f] = byte;
            m.truncate(cut.max(1).min(m.len()));
            for body in [&m[..], &valid[..]] {
                if let Ok(r) = parse::<ChatRequest>(body) {
                    let _ = r.params.validate(plen, 4096);
                    for msg in &r.messages {
                        let _ = msg.text();
                    }
                }
                if let Ok(r) = parse::<CompletionRequest>(body) {
                    let _ = r.params.validate(plen, 4096);
                }
            }
        }
    }
}

/// Sampling fields under llama-server's and Ollama's limits, wider than OpenAI's, applied to a
/// checked [`Generation`]: any number of stops (empty ones dropped), any temperature (≤ 0:
/// greedy) and penalty, a negative seed for a random one, a token limit cut to the room the
/// context leaves. `prefix` names the fields in errors (`"options."` for Ollama's).
#[derive(Debug, Default)]
pub struct WideParams<'a> {
    pub prefix: &'static str,
    /// The token limit and its field's name; negative: none. 0 is refused unless
    /// `zero_ok` (llama-server's `n_predict: 0` evaluates the prompt only).
    pub max_new: Option<i64>,
    pub max_name: &'static str,
    pub zero_ok: bool,
    pub temperature: Option<f32>,
    pub stop: Option<&'a [String]>,
    /// −1: the context.
    pub repeat_last_n: Option<i64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

/// Most stop sequences of a request (clients such as Continue's autocomplete and SillyTavern
/// send a dozen or more), and their longest.
pub const MAX_WIDE_STOPS: usize = 64;
pub const MAX_STOP_BYTES: usize = 1024;

impl WideParams<'_> {
    pub fn apply(&self, gen: &mut Generation, n_ctx: usize) -> Result<(), ApiError> {
        let bad = |name: &str, why: String| {
            ApiError::invalid_param(&format!("{}{name}", self.prefix), why)
        };
        let finite = |name: &str, v: Option<f32>| match v {
            Some(x) if !x.is_finite() => Err(bad(name, format!("{name} = {x} must be a number"))),
            _ => Ok(v),
        };
        match self.max_new {
            None => {}
            Some(n) if n < 0 => {}
            Some(0) if self.zero_ok => gen.max_new = 0,
            Some(0) => {
                let name = self.max_name;
                return Err(bad(
                    name,
                    format!("{name} = 0: at least 1, or -1 (no limit)"),
                ));
            }
            // (`max_new` is what the context has room for.)
            Some(n) => gen.max_new = gen.max_new.min(n as usize),
        }
        if let Some(t) = finite("temperature", self.temperature)? {
            gen.sampler.temperature = t;
        }
        if let Some(p) = finite("presence_penalty", self.presence_penalty)? {
            gen.sampler.presence_penalty = p;
        }
        if let Some(f) = finite("frequency_penalty", self.frequency_penalty)? {
            gen.sampler.frequency_penalty = f;
        }
        if let Some(stop) = self.stop {
            if stop.len() > MAX_WIDE_STOPS || stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
                return Err(bad(
                    "stop",
                    format!("stop takes up to {MAX_WIDE_STOPS} sequences of at most {MAX_STOP_BYTES} bytes"),
                ));
            }
            gen.stop = stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        }
        match self.repeat_last_n {
            None => {}
            Some(-1) => gen.sampler.repeat_last_n = n_ctx,
            Some(n) if n >= 0 => gen.sampler.repeat_last_n = n as usize,
            Some(n) => {
                return Err(bad(
                    "repeat_last_n",
                    format!("repeat_last_n = {n}: 0 or more, or -1 (the context)"),
                ))
            }
        }
        if let Some(seed) = self.seed.filter(|s| *s >= 0) {
            gen.sampler.seed = seed as u64;
        }
        Ok(())
    }
}
