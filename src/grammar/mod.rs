//! Structured output: decoding constrained by a JSON schema or a grammar, with llguidance.
//!
//! - [`GrammarEngine`]: built once per model from kiln's tokenizer (the bytes of every token,
//!   control tokens behind llguidance's `0xFF` marker so that no text rule can produce them)
//!   into an llguidance `ParserFactory`. Building it walks the whole vocabulary, so callers
//!   build it on first use ([`GrammarEngine::shared`]).
//! - [`GrammarSpec`]: what a request asks for: a JSON schema, any JSON object, a GBNF grammar
//!   (llama.cpp's, translated by [`gbnf`]) or a Lark grammar (llguidance's own dialect, also
//!   reached by a GBNF text starting with `%llguidance`, as in llama.cpp).
//! - [`Constraint`]: one sequence's matcher and the mask of the tokens allowed next.
//!
//! The mask of step *n + 1* depends only on the token sampled at step *n*, so it is computed
//! while the forward pass of that token runs: [`overlap`] runs the matchers of a step on a
//! helper thread (scoped, one per step, so nothing outlives the step) while the calling thread
//! runs the forward pass; the sampler then reads the logits through [`Constraint::apply`],
//! which sets the disallowed ones to -inf. When the grammar is complete (nothing more can
//! follow), [`Constraint::is_done`] ends the generation with finish reason `stop`; where the
//! grammar may end or go on, the model's end-of-generation tokens are allowed.

pub mod gbnf;
pub mod limits;
pub mod tools;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::tokenizer::Tokenizer;

/// Why a constraint could not be built or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// A JSON-schema keyword or construct llguidance does not implement.
    #[error("unsupported JSON schema feature: {0}")]
    Unsupported(String),
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
    /// A bound of [`limits`] passed (`at`: where, a JSON pointer into the schema or a rule).
    #[error("{msg} (at {at})")]
    Limit { at: String, msg: String },
    #[error("GBNF grammar, line {line}: {msg}")]
    Gbnf { line: usize, msg: String },
    #[error("the model's vocabulary cannot be used for constrained decoding: {0}")]
    Vocabulary(String),
    /// The sampled token does not fit the grammar (cannot happen through [`Constraint::apply`]).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (`response_format: {"type": "json_schema"}`, `json_schema`, `-j`).
    JsonSchema(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A llama.cpp GBNF grammar (`grammar`, `--grammar`).
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl GrammarSpec {
    /// A `grammar` text: GBNF, or Lark when it starts with `%llguidance` (llama.cpp's marker).
    pub fn from_grammar_text(text: &str) -> GrammarSpec {
        let t = text.trim_start();
        match t.strip_prefix("%llguidance") {
            Some(rest) => GrammarSpec::Lark(rest.trim_start_matches([' ', '{', '}']).to_string()),
            None => GrammarSpec::Gbnf(text.to_string()),
        }
    }

    /// llguidance's grammar for this spec.
    fn to_llg(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonSchema(s) => {
                if !s.is_object() && !s.is_boolean() {
                    return Err(GrammarError::InvalidSchema(
                        "a schema must be a JSON object (or true/false)".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_layout(s.clone()))
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            GrammarSpec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(g)?),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// JSON laid out as `json.dumps` does (`", "`, `": "`, no other whitespace) unless the schema
/// sets llguidance's own `x-guidance` options: free whitespace lets a small model emit
/// newlines until its token limit.
fn with_layout(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    } else if schema == Value::Bool(true) {
        return with_layout(json!({}));
    }
    schema
}

/// Sort llguidance's compile errors into ours: an unimplemented keyword or construct is
/// [`GrammarError::Unsupported`] (its message names it).
fn classify(spec: &GrammarSpec, msg: String) -> GrammarError {
    let unsupported = ["Unimplemented keys", "not supported", "Unknown applicator"];
    match spec {
        GrammarSpec::JsonSchema(_) | GrammarSpec::JsonObject => {
            if unsupported.iter().any(|u| msg.contains(u)) {
                GrammarError::Unsupported(msg)
            } else {
                GrammarError::InvalidSchema(msg)
            }
        }
        GrammarSpec::Gbnf(_) | GrammarSpec::Lark(_) => GrammarError::InvalidGrammar(msg),
    }
}

/// The grammar compiler of one model's vocabulary.
pub struct GrammarEngine {
    factory: ParserFactory,
    /// The token llguidance treats as end of sequence.
    trie_eos: u32,
    /// Every end-of-generation id of the model: allowed exactly when `trie_eos` is.
    eog: Arc<[u32]>,
}

impl GrammarEngine {
    /// Build from kiln's tokenizer.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<GrammarEngine, GrammarError> {
        let n = tok.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                if tok.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).as_bytes());
                    w
                } else {
                    tok.token_bytes(id).to_vec()
                }
            })
            .collect();
        let eos = tok
            .eos()
            .or(tok.eot())
            .or_else(|| tok.eog_ids().first().copied())
            .ok_or_else(|| GrammarError::Vocabulary("it has no end-of-generation token".into()))?;
        Self::from_words(words, eos, tok.eog_ids())
    }

    /// Build from the bytes of every token (control tokens prefixed with `0xFF`), the id
    /// llguidance treats as end of sequence and all end-of-generation ids.
    pub fn from_words(
        words: Vec<Vec<u8>>,
        eos: u32,
        eog: &[u32],
    ) -> Result<GrammarEngine, GrammarError> {
        let n = words.len();
        if n == 0 || eos as usize >= n {
            return Err(GrammarError::Vocabulary(format!(
                "end-of-generation id {eos} outside a vocabulary of {n}"
            )));
        }
        let info = TokRxInfo::new(n as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // Errors name the problem, not the parser's state and the whole grammar.
        factory.limits_mut().verbose_errors = false;
        let mut eog: Vec<u32> = eog.iter().copied().filter(|&t| (t as usize) < n).collect();
        eog.push(eos);
        eog.sort_unstable();
        eog.dedup();
        Ok(GrammarEngine {
            factory,
            trie_eos: eos,
            eog: eog.into(),
        })
    }

    /// The engine in `cell`, built from `tok` on first use (a failure is kept too).
    pub fn shared(
        cell: &OnceLock<Result<Arc<GrammarEngine>, GrammarError>>,
        tok: &Tokenizer,
    ) -> Result<Arc<GrammarEngine>, GrammarError> {
        cell.get_or_init(|| GrammarEngine::from_tokenizer(tok).map(Arc::new))
            .clone()
    }

    /// Compile `spec` into a fresh per-sequence constraint (its first mask not yet computed),
    /// once it is within the [`limits`]. The compiler recurses up to those limits: call this
    /// on a thread with a [`limits::COMPILE_STACK`] stack ([`limits::on_compile_stack`]).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        limits::check(spec)?;
        let grammar = spec.to_llg()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| classify(spec, e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(classify(spec, e));
        }
        Ok(Constraint {
            matcher,
            mask: None,
            error: None,
            trie_eos: self.trie_eos,
            eog: Arc::clone(&self.eog),
            masked: Vec::new(),
        })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The tokens allowed next (`None` until the first [`Constraint::advance`]).
    mask: Option<SimpleVob>,
    /// A failure of the last advance, reported by [`Constraint::apply`].
    error: Option<GrammarError>,
    trie_eos: u32,
    eog: Arc<[u32]>,
    /// The masked copy of the logits the sampler reads.
    masked: Vec<f32>,
}

impl Constraint {
    /// Consume `token` (if any; `None` for the first step) and compute the mask of the next.
    /// Failures are kept for [`Constraint::apply`] (this runs on the helper thread).
    pub fn advance(&mut self, token: Option<u32>) {
        if self.error.is_some() {
            return;
        }
        if let Some(t) = token {
            if let Err(e) = self.matcher.consume_token(t) {
                self.error = Some(GrammarError::Matcher(e.to_string()));
                return;
            }
        }
        if self.matcher.is_stopped() {
            self.mask = None;
            return;
        }
        match self.matcher.compute_mask() {
            Ok(m) => self.mask = Some(m),
            Err(e) => self.error = Some(GrammarError::Matcher(e.to_string())),
        }
    }

    /// The grammar is complete: nothing more may follow (finish with `stop`).
    pub fn is_done(&self) -> bool {
        self.error.is_none() && self.matcher.is_stopped()
    }

    /// `logits` with every token the grammar does not allow next set to -inf. End-of-generation
    /// tokens are allowed where the grammar may end.
    pub fn apply(&mut self, logits: &[f32]) -> Result<&[f32], GrammarError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mask = self
            .mask
            .as_ref()
            .ok_or_else(|| GrammarError::Matcher("no mask computed for this step".into()))?;
        self.masked.clear();
        self.masked.resize(logits.len(), f32::NEG_INFINITY);
        let words = mask.as_slice();
        let n = logits.len().min(mask.len());
        for (w, &bits) in words.iter().enumerate() {
            if bits == 0 {
                continue;
            }
            let base = w * 32;
            for b in 0..32 {
                let i = base + b;
                if i < n && bits & (1 << b) != 0 {
                    self.masked[i] = logits[i];
                }
            }
        }
        let eos_ok = mask.is_allowed(self.trie_eos);
        for &t in self.eog.iter() {
            if let Some(m) = self.masked.get_mut(t as usize) {
                *m = if eos_ok {
                    logits[t as usize]
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        Ok(&self.masked)
    }
}

/// Run `forward` on this thread while `steps` advance on a helper thread (each constraint
/// consumes its token and computes its next mask). With no steps, just `forward`.
pub fn overlap<R>(steps: &mut [(&mut Constraint, Option<u32>)], forward: impl FnOnce() -> R) -> R {
    if steps.is_empty() {
        return forward();
    }
    std::thread::scope(|s| {
        let helper = s.spawn(|| {
            for (c, t) in steps.iter_mut() {
                c.advance(*t);
            }
        });
        let r = forward();
        if let Err(p) = helper.join() {
            std::panic::resume_unwind(p);
        }
        r
    })
}

#[cfg(test)]
mod tests;
