//! `logit_bias`: the request field read into the sampler's `(token id, bias)` list
//! ([`crate::sampler::SamplerConfig::logit_bias`], added to the logits before every other
//! stage).
//!
//! Its shapes, as OpenAI and llama-server take them:
//! - `{"15043": -100}`: token ids (as strings) to biases (OpenAI's). On llama-server's own
//!   routes ([`Dialect::LlamaServer`]) a key that is not a number is a text, as below;
//!   elsewhere it is refused.
//! - `[[15043, 1.5], ["Hello", -2]]`: `[token, bias]` pairs (llama-server's, on every route);
//!   a text is tokenized without special tokens or BOS and the bias applies to each of its
//!   tokens, as llama-server does.
//!
//! A bias is a number, or `false` to ban the token (`-inf`, llama-server's). OpenAI's routes
//! take −100 to 100 (−100 bans in practice, +100 forces); llama-server's any finite number. A
//! token listed twice gets both biases, in order (llama.cpp's sampler adds each entry).
//! Anything else is refused with a 400 naming `logit_bias` and the entry: an id outside the
//! vocabulary, a bias out of range, `true`, a malformed pair, an empty text, and more entries
//! (or tokens, texts counted by theirs) than the vocabulary has tokens. llama-server skips
//! such entries silently; here none is dropped.

use serde_json::Value;

use super::error::ApiError;
use crate::tokenizer::Tokenizer;

/// Whose rules a route reads `logit_bias` by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's routes: map keys are token ids, biases within −100..=100.
    OpenAi,
    /// llama-server's `/completion` and `/infill`: map keys may be texts, any finite bias.
    LlamaServer,
}

/// OpenAI's range of a bias.
pub const OPENAI_RANGE: f32 = 100.0;

/// The `(id, bias)` list of a request's `logit_bias` (`None` or `null`: empty), for a model
/// of `vocab` tokens (the logits row's length).
pub fn read(
    v: Option<&Value>,
    tok: &Tokenizer,
    vocab: usize,
    dialect: Dialect,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::new();
    let entries = match v {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        Some(other) => {
            return Err(bad(format!(
                "logit_bias must be an object {{\"token id\": bias}} or a list of [token, bias] pairs, not {}",
                kind(other)
            )))
        }
    };
    if entries > vocab {
        return Err(too_many(entries, vocab));
    }
    let mut add = |at: &str, token: Token, bias: f32| -> Result<(), ApiError> {
        match token {
            Token::Id(id) => out.push((id, bias)),
            Token::Text("") => {
                return Err(bad(format!("{at}: an empty text has no tokens to bias")))
            }
            Token::Text(t) => {
                let ids = tok.encode(t, false, false);
                out.extend(ids.into_iter().map(|id| (id, bias)));
            }
        }
        match out.len() > vocab {
            true => Err(too_many(out.len(), vocab)),
            false => Ok(()),
        }
    };
    match v {
        Some(Value::Object(m)) => {
            for (key, b) in m {
                let at = format!("logit_bias[{key:?}]");
                let token = match key.trim().parse::<i64>() {
                    Ok(id) => Token::Id(id_in(id, vocab, &at)?),
                    Err(_) if dialect == Dialect::LlamaServer => Token::Text(key),
                    Err(_) => {
                        return Err(bad(format!(
                            "{at}: the key `{key}` is not a token id (keys are token ids, as strings: {{\"15043\": -100}})"
                        )))
                    }
                };
                add(&at, token, bias(b, dialect, &at)?)?;
            }
        }
        Some(Value::Array(pairs)) => {
            for (i, pair) in pairs.iter().enumerate() {
                let at = format!("logit_bias[{i}]");
                let Some([t, b]) = pair.as_array().map(Vec::as_slice) else {
                    return Err(bad(format!(
                        "{at} must be a [token, bias] pair, not {pair}"
                    )));
                };
                let token = match t {
                    Value::String(s) => Token::Text(s.as_str()),
                    Value::Number(n) => match n.as_i64() {
                        Some(id) => Token::Id(id_in(id, vocab, &at)?),
                        None => return Err(bad(format!("{at}: `{n}` is not a token id"))),
                    },
                    other => {
                        return Err(bad(format!(
                            "{at}: the token must be an id or a text, not {}",
                            kind(other)
                        )))
                    }
                };
                add(&at, token, bias(b, dialect, &at)?)?;
            }
        }
        _ => unreachable!("checked above"),
    }
    Ok(out)
}

/// An entry's token: an id, or a text whose every token gets the bias.
enum Token<'a> {
    Id(u32),
    Text(&'a str),
}

fn bad(why: String) -> ApiError {
    ApiError::invalid_param("logit_bias", why)
}

fn too_many(n: usize, vocab: usize) -> ApiError {
    bad(format!(
        "logit_bias lists {n} tokens; at most {vocab}, the vocabulary's size"
    ))
}

/// A token id within the vocabulary.
fn id_in(id: i64, vocab: usize, at: &str) -> Result<u32, ApiError> {
    match u32::try_from(id) {
        Ok(t) if (t as usize) < vocab => Ok(t),
        _ => Err(bad(format!(
            "{at}: token id {id} is outside the vocabulary (0 to {})",
            vocab - 1
        ))),
    }
}

/// A bias: a number in the dialect's range, or `false` (banned: `-inf`).
fn bias(v: &Value, dialect: Dialect, at: &str) -> Result<f32, ApiError> {
    let x = match v {
        Value::Bool(false) => return Ok(f32::NEG_INFINITY),
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        other => {
            return Err(bad(format!(
                "{at}: the bias must be a number (or false to ban the token), not {other}"
            )))
        }
    };
    let b = x as f32;
    match dialect {
        Dialect::OpenAi if !(-OPENAI_RANGE..=OPENAI_RANGE).contains(&b) => Err(bad(format!(
            "{at}: bias {x} is outside -{OPENAI_RANGE} to {OPENAI_RANGE}"
        ))),
        _ if !b.is_finite() => Err(bad(format!("{at}: bias {x} is not a finite number"))),
        _ => Ok(b),
    }
}

/// A JSON value's kind, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
