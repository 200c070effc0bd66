//! A request's job: what every protocol's route (OpenAI's, llama-server's, Ollama's,
//! Anthropic's, the Responses API) turns its request into, with one set of checks: the body read
//! within its limits, the model name, the chat template with its tools, the generation's
//! fields, the structured-output constraint. The protocol adapters import this module; it
//! imports none of them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

use super::api::{self, ChatRequest, CompletionRequest, Endpoint, Head, PromptField};
use super::bias::Dialect;
use super::error::ApiError;
use super::respond::{self, Job};
use super::structured;
use super::{tools, unix_now, AppState};
use crate::tokenizer::toolcall::template::ToolSupport;
use crate::tokenizer::{ChatExtras, InfillBudget, InfillParts};

/// The whole body, within `--max-body` (413) and `--body-timeout` (408).
pub(super) async fn read_body(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = st.opts.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("could not read the body: {e}")))?;
            if out.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    let timeout = st.opts.http.body_timeout;
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(timeout.as_secs_f64())))
}

/// The model name an answer reports: the one the request named where it is the served
/// model's id or an alias; any other name is answered as the served model, under its own name
/// (as llama-server), or refused with 404 under `--strict-model`.
pub(super) fn check_model(st: &AppState, model: &Option<String>) -> Result<String, ApiError> {
    match model {
        None => Ok(st.opts.model_id.clone()),
        Some(m) if serves(st, m) => Ok(m.clone()),
        Some(m) if st.opts.strict_model => Err(ApiError::model_not_found(m, &st.opts.model_id)),
        Some(_) => Ok(st.opts.model_id.clone()),
    }
}

/// Whether `name` is the served model's id or one of its aliases.
pub(super) fn serves(st: &AppState, name: &str) -> bool {
    name == st.opts.model_id || st.opts.model_aliases.iter().any(|a| a == name)
}

fn head(model: String, endpoint: Endpoint) -> Head {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let created = unix_now();
    Head {
        id: format!("{prefix}-{created:x}{:06x}", NEXT.fetch_add(1, Relaxed)),
        created,
        model,
        endpoint,
    }
}

/// A chat request's job: its conversation rendered by the model's template with its tools,
/// its generation checked, its answer constrained by its structured-output field or the
/// tool-call grammar. Also its tools, for [`tool_error`].
pub(super) fn chat_job(
    st: &AppState,
    req: &ChatRequest,
    model: String,
) -> Result<(Job, Option<tools::Tools>), ApiError> {
    let c = &st.model.config;
    if c.arch.is_encoder() {
        // (Before the template: an encoder has none, and generates nothing.)
        let e = crate::engine::session::EngineError::encoder_generation(&c.arch_name);
        return Err(ApiError::bad_request(e.to_string()));
    }
    let (tools, plan, prompt) = chat_prompt(st, req)?;
    let reasoning = req
        .reasoning
        .then(|| respond::reasoning_splitter(&st.tokenizer, &prompt));
    let mut gen = req.params.validate(prompt.len(), st.opts.n_ctx)?;
    gen.sampler.logit_bias = logit_bias(st, &req.params)?;
    gen.n = req.params.choices(st.opts.n_slots)?;
    gen.logprobs = req.logprobs()?;
    let constraint = structured::chat_constraint(plan.grammar, gen.structured.take())?;
    let job = Job {
        head: head(model, Endpoint::Chat),
        prompt,
        gen,
        constraint,
        tools: plan.format,
        reasoning,
    };
    Ok((job, tools))
}

/// A chat request's tools, plan and prompt: its conversation rendered by the model's template
/// with its tools and `chat_template_kwargs`, and its prefill after the generation prompt.
pub(super) fn chat_prompt(
    st: &AppState,
    req: &ChatRequest,
) -> Result<(Option<tools::Tools>, tools::ToolPlan, Vec<u32>), ApiError> {
    let (tools, plan, prefill) = chat_plan(st, req)?;
    let prompt = st
        .tokenizer
        .encode_chat_with(
            &plan.messages,
            &extras(req, &plan, prefill.as_deref()),
            true,
            st.opts.special_in_content,
        )
        .map_err(template_error)?;
    Ok((tools, plan, prompt))
}

/// What the template renders besides the messages: the plan's tools, the request's
/// `chat_template_kwargs`, the prefill.
pub(super) fn extras<'a>(
    req: &'a ChatRequest,
    plan: &'a tools::ToolPlan,
    prefill: Option<&'a str>,
) -> ChatExtras<'a> {
    ChatExtras {
        tools: plan.template_tools.as_ref(),
        kwargs: req.template_kwargs.as_ref(),
        prefill,
    }
}

/// A template's error (one it raised, or one of rendering), naming `messages`.
pub(super) fn template_error(e: crate::tokenizer::TokenizerError) -> ApiError {
    ApiError::invalid_param("messages", e.to_string())
}

/// An error of a chat request's run: one about its tools' grammar names the tool.
pub(super) async fn tool_error(
    e: ApiError,
    tools: Option<&tools::Tools>,
    st: &AppState,
) -> ApiError {
    match tools {
        Some(t) if e.param.as_deref() == Some("tools") => tools::locate(e, t, st).await,
        _ => e,
    }
}

/// A chat request's conversation and tools, read and planned for the model's template, and
/// its prefill: where the request asks for one ([`ChatRequest::prefill`]), a final assistant
/// message with text and no calls is taken out of the conversation, to follow the generation
/// prompt as the start of the answer (as llama-server and Anthropic do).
pub(super) fn chat_plan(
    st: &AppState,
    req: &ChatRequest,
) -> Result<(Option<tools::Tools>, tools::ToolPlan, Option<String>), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let tools = tools::read(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let mut msgs = tools::chat_messages(&req.messages)?;
    let prefill = match msgs.last() {
        Some(m)
            if req.prefill
                && msgs.len() > 1
                && m.role == "assistant"
                && m.tool_calls.is_none()
                && !m.content.is_empty() =>
        {
            msgs.pop().map(|m| m.content)
        }
        _ => None,
    };
    let support = st
        .tool_support
        .get_or_init(|| ToolSupport::probe(&st.tokenizer));
    let plan = tools::plan(msgs, tools.as_ref(), support, &st.tokenizer);
    Ok((tools, plan, prefill))
}

/// A completion request's job: its prompt (text, or token ids) and its checked generation.
pub(super) fn completion_job(
    st: &AppState,
    req: &CompletionRequest,
    model: String,
) -> Result<Job, ApiError> {
    let suffix = req.suffix.as_deref().filter(|s| !s.is_empty());
    let prompt = match (req.prompt.clone(), suffix) {
        (PromptField::Text(t), Some(s)) => fim_prompt(st, &t, s)?,
        (PromptField::Texts(v), Some(s)) if v.len() == 1 => fim_prompt(st, &v[0], s)?,
        (_, Some(_)) => {
            return Err(ApiError::invalid_param(
                "suffix",
                "a suffix (fill in the middle) needs one prompt text",
            ))
        }
        (PromptField::Text(t), None) => st.tokenizer.encode(&t, true, false),
        (PromptField::Texts(v), None) if v.len() == 1 => st.tokenizer.encode(&v[0], true, false),
        (PromptField::Texts(v), None) => {
            return Err(ApiError::invalid_param(
                "prompt",
                format!(
                    "{} prompts given; only one per request is supported",
                    v.len()
                ),
            ))
        }
        (PromptField::Tokens(ids), None) => {
            ApiError::check_token_ids("prompt", ids.iter().copied(), st.model.config.vocab_size)?;
            ids
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    let mut gen = (req.params.validate(prompt.len(), st.opts.n_ctx)).map_err(|mut e| {
        if e.param.as_deref() == Some("messages") {
            e.param = Some("prompt".into());
        }
        e
    })?;
    gen.sampler.logit_bias = logit_bias(st, &req.params)?;
    gen.n = req.params.choices(st.opts.n_slots)?;
    gen.logprobs = req.logprobs()?;
    Ok(Job {
        head: head(model, Endpoint::Completion),
        prompt,
        constraint: gen.structured.take(),
        gen,
        tools: None,
        reasoning: None,
    })
}

/// A request's `logit_bias` under OpenAI's rules ([`super::bias`]).
fn logit_bias(st: &AppState, p: &api::GenParams) -> Result<Vec<(u32, f32)>, ApiError> {
    let vocab = st.model.config.vocab_size;
    super::bias::read(p.logit_bias.as_ref(), &st.tokenizer, vocab, Dialect::OpenAi)
}

/// A fill-in-the-middle prompt: the model's FIM tokens around `prefix` and `suffix`, cut as
/// `/infill` cuts them ([`crate::tokenizer::InfillBudget`]; `--spm-infill`'s order), without
/// `/infill`'s repository lines. A model without FIM tokens is a 400 naming `suffix`.
pub(super) fn fim_prompt(st: &AppState, prefix: &str, suffix: &str) -> Result<Vec<u32>, ApiError> {
    let tok = &st.tokenizer;
    let fim = (tok.fim_tokens()).map_err(|e| ApiError::invalid_param("suffix", e.to_string()))?;
    let parts = InfillParts {
        prefix: tok.encode(prefix, false, false),
        suffix: tok.encode(suffix, false, false),
        ..Default::default()
    };
    let budget = InfillBudget::new(st.opts.n_ctx, st.opts.spm_infill);
    Ok(tok.infill_prompt(&fim, &parts, budget))
}
