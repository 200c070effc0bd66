//! Log-probabilities in OpenAI's two response shapes.
//!
//! The values are the engine's ([`crate::engine::logprobs`]): the log-softmax of the model's
//! raw logits, before penalties, temperature and any grammar, as OpenAI and vLLM report them.
//! A token's text is its bytes as UTF-8 (lossy for a piece of a character; `bytes` has them
//! exactly). `-inf` is written as -9999.0, as vLLM does (JSON has no infinity).
//!
//! - chat: `logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//!   "logprob", "bytes"}]}]}`;
//! - completions (legacy): `logprobs: {"tokens", "token_logprobs", "top_logprobs": [{text:
//!   logprob}], "text_offset"}`, the alternatives with the token itself (as vLLM), offsets in
//!   characters of the choice's text.

use serde_json::{json, Map, Value};

use crate::engine::logprobs::TokenLogprobs;
use crate::tokenizer::Tokenizer;

/// A log-probability for JSON: `-inf` as -9999.0.
pub(super) fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}

fn text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_bytes(id)).into_owned()
}

/// Log-probabilities of some tokens of one choice, in the endpoint's shape.
#[derive(Debug, Clone, Default)]
pub struct Logprobs {
    chat: Vec<Value>,
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top: Vec<Value>,
    offsets: Vec<Value>,
    /// Characters of the choice's text before the next token (legacy `text_offset`).
    offset: usize,
    /// Tokens added since the last [`Logprobs::take`].
    pending: usize,
}

impl Logprobs {
    /// Add one token.
    pub fn push(&mut self, tok: &Tokenizer, lp: &TokenLogprobs, chat: bool) {
        self.pending += 1;
        if chat {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(id, l)| {
                    json!({"token": text(tok, id), "logprob": finite(l), "bytes": tok.token_bytes(id)})
                })
                .collect();
            self.chat.push(json!({
                "token": text(tok, lp.token),
                "logprob": finite(lp.logprob),
                "bytes": tok.token_bytes(lp.token),
                "top_logprobs": top,
            }));
            return;
        }
        let t = text(tok, lp.token);
        let mut alts = Map::new();
        for &(id, l) in &lp.top {
            alts.entry(text(tok, id)).or_insert(json!(finite(l)));
        }
        alts.entry(t.clone()).or_insert(json!(finite(lp.logprob)));
        self.offsets.push(json!(self.offset));
        self.offset += t.chars().count();
        self.tokens.push(json!(t));
        self.token_logprobs.push(json!(finite(lp.logprob)));
        self.top.push(Value::Object(alts));
    }

    /// Whether tokens were added since the last [`Logprobs::take`].
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// The tokens added since the last call, as the `logprobs` of a choice or chunk.
    pub fn take(&mut self, chat: bool) -> Value {
        self.pending = 0;
        if chat {
            return json!({ "content": std::mem::take(&mut self.chat) });
        }
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top),
            "text_offset": std::mem::take(&mut self.offsets),
        })
    }
}
