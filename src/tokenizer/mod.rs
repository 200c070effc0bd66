//! Tokenizers that reproduce llama.cpp's token ids exactly, built from GGUF metadata.
//!
//! The vocabulary kinds, chosen by `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE (`bpe.rs`), with the pre-tokenizer named by `tokenizer.ggml.pre`
//!   (`pretokenize/`) and merges ranked by `tokenizer.ggml.merges`.
//! - `gemma4`: the same BPE over raw UTF-8 with spaces as `▁`, split only at newlines, byte
//!   fallback `<0xNN>` (Gemma 4).
//! - `llama`: SentencePiece-style BPE (`spm.rs`) driven by `tokenizer.ggml.scores`, spaces as
//!   `▁`, byte fallback `<0xNN>`.
//! - `bert`: WordPiece (`wordpiece.rs`): BERT's normalizer, greedy longest match, `[UNK]`;
//!   `[CLS]` ... `[SEP]` around the text when special tokens are added.
//!
//! Encoding runs in three steps, as in llama.cpp's `llama_vocab::impl::tokenize`:
//! 1. `special.rs`: cut special-token text (control / user-defined tokens) out of the input;
//! 2. tokenize each remaining raw-text fragment with the model's algorithm;
//! 3. add BOS / EOS as the file's policy says, when asked to.
//!
//! Decoding concatenates each token's bytes ([`Tokenizer::token_bytes`], precomputed once:
//! byte-level characters mapped back to bytes, `▁` to space, `<0xNN>` to the byte) and only
//! then converts to UTF-8, so partial characters split across tokens come out right;
//! [`StreamDecoder`] does the same incrementally.

/// `Ord` for a merge candidate `$t` of a heap by `$cmp` (of `$a`, `$b`: self, other; the
/// greater pops first), and the `PartialOrd`, `PartialEq` and `Eq` that agree with it.
macro_rules! heap_order {
    ($t:ty, |$a:ident, $b:ident| $cmp:expr) => {
        impl Ord for $t {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                let ($a, $b) = (self, other);
                $cmp
            }
        }
        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.cmp(other) == std::cmp::Ordering::Equal
            }
        }
        impl Eq for $t {}
    };
}

mod bpe;
mod chat;
mod config;
mod fim;
mod pretokenize;
mod reasoning;
mod special;
mod spm;
mod stream;
pub mod toolcall;
mod unicode;
mod unicode_data;
mod unicode_norm_data;
mod vocab;
mod wordpiece;

use bpe::{BpeModel, BpeScratch};
use pretokenize::{PreTokenizer, SUPPORTED_PRE};
use special::{Fragment, SpecialMatcher};
use spm::SpmScratch;
use vocab::{Vocab, VocabBuildError};
use wordpiece::{WpmModel, WpmOptions, WpmScratch};

pub use chat::{
    builtin_chat_template, render_chat, render_chat_tools, render_chat_with, ChatExtras,
    ChatMessage, TEMPLATE_VARIABLES,
};
pub use config::config_from_gguf;
pub use fim::{ExtraChunk, FimTokens, InfillBudget, InfillParts, NoFimTokens};
pub use reasoning::{thinking_forced_open, ReasoningSplitter, ReasoningStyle, Split};
pub use stream::StreamDecoder;
pub use vocab::attr;

/// Everything that can be wrong with a tokenizer's metadata or a chat template.
#[derive(thiserror::Error, Debug)]
pub enum TokenizerError {
    #[error("missing tokenizer metadata key '{0}'")]
    MissingKey(String),

    #[error("tokenizer metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        found: String,
        expected: &'static str,
    },

    #[error(
        "unsupported tokenizer model '{model}' (tokenizer.ggml.model); kiln supports: {supported}"
    )]
    UnsupportedModel { model: String, supported: String },

    #[error("unsupported pre-tokenizer '{pre}' (tokenizer.ggml.pre); kiln supports: {supported}")]
    UnsupportedPre { pre: String, supported: String },

    #[error("'{key}' has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: String,
        found: usize,
        expected: usize,
    },

    #[error("token {id} has the same text {text:?} as token {first}")]
    DuplicateToken { id: u32, first: u32, text: String },

    #[error("the vocabulary (tokenizer.ggml.tokens) is empty")]
    EmptyVocab,

    #[error("the vocabulary is too large to index ({0} tokens)")]
    TooLarge(usize),

    #[error("{what} needs {token_kind} token, but the vocabulary has none")]
    MissingSpecial {
        what: &'static str,
        token_kind: &'static str,
    },

    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),

    #[error("chat template: {0}")]
    Template(String),
}

/// The model-level ids of the special tokens, as read from `tokenizer.ggml.*_token_id`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// The tokenizer's metadata as plain data: what `from_gguf` reads, and what tests build in
/// code. `None` means "the file does not say" (llama.cpp's defaults then apply).
#[derive(Clone, Debug, Default)]
pub struct TokenizerConfig {
    /// `tokenizer.ggml.model`: `gpt2`, `gemma4`, `llama` or `bert`.
    pub model: String,
    /// `tokenizer.ggml.pre` (byte-level BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: "left right" strings, best first.
    pub merges: Vec<String>,
    pub special: SpecialIds,
    /// `tokenizer.ggml.add_bos_token`, `add_eos_token`, `add_space_prefix`.
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` and `.strip_accents` (WordPiece only; both
    /// default to true, and stripping accents to lower-casing).
    pub lowercase: Option<bool>,
    pub strip_accents: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `general.architecture`: picks a built-in chat template when the file has none.
    pub architecture: Option<String>,
}

/// The vocabulary algorithm.
#[derive(Debug)]
enum Model {
    Bpe(Box<BpeModel>),
    Spm {
        /// The token spelling each byte (`<0xNN>`, else the one-character token, else unk).
        byte_tokens: Box<[Option<u32>; 256]>,
    },
    Wpm(WpmModel),
}

/// Which algorithm a `tokenizer.ggml.model` names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `gpt2`, and `gemma4` (its pre-tokenizer is then always `gemma4`).
    Bpe,
    Spm,
    Wpm,
}

/// A loaded tokenizer. Immutable and `Sync`: share it behind an `Arc`.
#[derive(Debug)]
pub struct Tokenizer {
    model: Model,
    vocab: Vocab,
    specials: SpecialMatcher,
    /// `token_bytes(id)` is `pieces[piece_offsets[id]..piece_offsets[id + 1]]`.
    pieces: Vec<u8>,
    piece_offsets: Vec<u32>,
    ids: SpecialIds,
    /// Sorted ids that end generation.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    chat_template: Option<String>,
    builtin_template: bool,
}

/// Token texts llama.cpp treats as end-of-turn when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts that end generation (llama.cpp's list, matched by text).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Tokenizer {
    /// Build from a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(f: &crate::gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_config(config_from_gguf(f)?)
    }

    /// Build from plain metadata, applying llama.cpp's defaults and text-based fix-ups.
    pub fn from_config(cfg: TokenizerConfig) -> Result<Tokenizer, TokenizerError> {
        let n = cfg.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n >= u32::MAX as usize / 2 {
            return Err(TokenizerError::TooLarge(n));
        }
        let kind = match cfg.model.as_str() {
            "gpt2" | "gemma4" => Kind::Bpe,
            "llama" => Kind::Spm,
            "bert" => Kind::Wpm,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_string(),
                    supported: "gpt2 (byte-level BPE), gemma4 (BPE over UTF-8), llama \
                                (SentencePiece-style), bert (WordPiece)"
                        .into(),
                })
            }
        };
        let is_bpe = kind == Kind::Bpe;
        let pre = if is_bpe {
            // llama.cpp: a `gemma4` vocabulary always has the `gemma4` pre-tokenizer.
            let name = if cfg.model == "gemma4" {
                "gemma4"
            } else {
                cfg.pre.as_deref().unwrap_or("")
            };
            let pre =
                PreTokenizer::for_name(name).ok_or_else(|| TokenizerError::UnsupportedPre {
                    pre: name.to_string(),
                    supported: SUPPORTED_PRE.join(", "),
                })?;
            if name.is_empty() {
                log::warn!("tokenizer.ggml.pre missing: using the 'default' pre-tokenizer");
            }
            Some(pre)
        } else {
            None
        };

        // Per-token data.
        let scores = match cfg.scores {
            Some(s) if s.len() < n => {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.scores".into(),
                    found: s.len(),
                    expected: n,
                })
            }
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };
        let mut attrs = match &cfg.token_types {
            Some(t) if t.len() < n => {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.token_type".into(),
                    found: t.len(),
                    expected: n,
                })
            }
            Some(t) => t[..n].iter().map(|&t| attr::from_token_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };
        let mut texts = cfg.tokens;
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                // llama.cpp renames empty tokens so that the text index stays unique.
                *t = format!("[EMPTY_{i}]");
            }
        }

        // Special ids: llama.cpp's per-model defaults, then the file's values when in range.
        // (bos, eos, unk, sep, pad, mask)
        let (def_bos, def_eos, def_unk, def_sep, def_pad, def_mask) = match kind {
            Kind::Bpe if cfg.model == "gemma4" => (None, None, None, None, None, None),
            Kind::Bpe => (Some(11), Some(11), None, None, None, None),
            Kind::Spm => (Some(1), Some(2), Some(0), None, None, None),
            Kind::Wpm => (Some(101), None, Some(100), Some(102), Some(0), Some(103)),
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |file: Option<u32>, default: Option<u32>| match file {
            Some(i) if (i as usize) < n => Some(i),
            Some(i) => {
                log::warn!("special token id {i} out of vocabulary range {n}; using the default");
                in_range(default)
            }
            None => in_range(default),
        };
        let s = &cfg.special;
        let mut ids = SpecialIds {
            bos: pick(s.bos, def_bos),
            eos: pick(s.eos, def_eos),
            eot: pick(s.eot, None),
            eom: pick(s.eom, None),
            unk: pick(s.unk, def_unk),
            sep: pick(s.sep, def_sep),
            pad: pick(s.pad, def_pad),
            mask: pick(s.mask, def_mask),
            fim_pre: pick(s.fim_pre, None),
            fim_suf: pick(s.fim_suf, None),
            fim_mid: pick(s.fim_mid, None),
            fim_pad: pick(s.fim_pad, None),
            fim_rep: pick(s.fim_rep, None),
            fim_sep: pick(s.fim_sep, None),
        };

        let (default_add_bos, clean_spaces) = match (&pre, kind) {
            (Some(p), _) => (p.default_add_bos, p.clean_spaces),
            (None, Kind::Wpm) => (true, true),
            (None, _) => (true, false),
        };
        let mut add_bos = cfg.add_bos.unwrap_or(default_add_bos);
        // llama.cpp: Gemma 4 always starts with BOS, whatever the file says.
        // WordPiece: llama.cpp adds [CLS] whenever special tokens are added, whatever the file
        // says; `adds_bos` tells it as it is.
        if pre.as_ref().is_some_and(|p| p.force_add_bos) || kind == Kind::Wpm {
            add_bos = true;
        }
        let add_eos = cfg.add_eos.unwrap_or(false);
        let add_space_prefix = cfg.add_space_prefix.unwrap_or(kind == Kind::Spm);
        // BERT's normalizer: lower-casing by default, accent stripping with it.
        let lowercase = cfg.lowercase.unwrap_or(true);
        let wpm = WpmOptions {
            lowercase,
            strip_accents: cfg.strip_accents.unwrap_or(lowercase),
        };

        // Text-based fix-ups (llama.cpp: "auto-detect special tokens by text"). llama.cpp
        // walks a hash map, so which of several matching texts wins is unspecified there; we
        // take the lowest id.
        let find = |texts: &[String], list: &[&str]| -> Option<u32> {
            texts
                .iter()
                .position(|t| list.contains(&t.as_str()))
                .map(|i| i as u32)
        };
        let mut force_control = Vec::new();
        for (slot, list) in [
            (&mut ids.eot, EOT_TEXTS),
            (&mut ids.eom, EOM_TEXTS),
            (&mut ids.fim_pre, FIM_PRE_TEXTS),
            (&mut ids.fim_suf, FIM_SUF_TEXTS),
            (&mut ids.fim_mid, FIM_MID_TEXTS),
            (&mut ids.fim_pad, FIM_PAD_TEXTS),
            (&mut ids.fim_rep, FIM_REP_TEXTS),
            (&mut ids.fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                *slot = find(&texts, list);
                if let Some(id) = *slot {
                    force_control.push(id);
                }
            }
        }
        for id in force_control {
            attrs[id as usize] |= attr::CONTROL;
        }
        // Control tokens named "unused..." are unused.
        for (i, t) in texts.iter().enumerate() {
            if attrs[i] & attr::CONTROL != 0 && t.contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }
        // End-of-generation set.
        let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for (i, t) in texts.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                eog.push(i as u32);
                attrs[i] |= attr::CONTROL;
            }
            // gpt-oss: always rendered.
            if matches!(
                t.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = attr::USER_DEFINED;
            }
        }
        eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let eog_text =
            |eog: &[u32], text: &str| eog.iter().copied().find(|&id| texts[id as usize] == text);
        let has = |eog: &[u32], text: &str| eog_text(eog, text).is_some();
        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        if let Some(end) = eog_text(&eog, "<|end|>") {
            let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            if call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
                eog.retain(|&id| id != end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there.
        if let Some(s_id) = eog_text(&eog, "</s>") {
            if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
                eog.retain(|&id| id != s_id);
                attrs[s_id as usize] = attr::NORMAL;
            }
        }

        let vocab = match Vocab::new(texts, attrs, scores) {
            Ok(v) => v,
            Err(VocabBuildError::Duplicate { id, first, text }) => {
                return Err(TokenizerError::DuplicateToken { id, first, text })
            }
            Err(VocabBuildError::TooLarge) => return Err(TokenizerError::TooLarge(n)),
        };

        let byte_level = pre.as_ref().is_some_and(|p| p.byte_encode);
        let model = match pre {
            Some(pre) => Model::Bpe(Box::new(BpeModel::new(&vocab, &cfg.merges, pre))),
            None if kind == Kind::Wpm => {
                // WordPiece adds [CLS] and [SEP] whenever special tokens are asked for, and
                // needs [UNK] for words it cannot spell.
                let need = |id: Option<u32>, token_kind| {
                    id.ok_or(TokenizerError::MissingSpecial {
                        what: "WordPiece (tokenizer.ggml.model = bert)",
                        token_kind,
                    })
                };
                // The file's id, else llama.cpp's default (100) where it is `[UNK]`, else the
                // token spelled `[UNK]`.
                let unk = match (s.unk.filter(|&i| (i as usize) < n), ids.unk) {
                    (Some(i), _) => Some(i),
                    (None, Some(i)) if vocab.text(i) == "[UNK]" => Some(i),
                    (None, _) => vocab.lookup("[UNK]"),
                };
                ids.unk = unk;
                let unk = need(unk, "an [UNK] (tokenizer.ggml.unknown_token_id)")?;
                need(ids.bos, "a [CLS] (tokenizer.ggml.bos_token_id)")?;
                need(ids.sep, "a [SEP] (tokenizer.ggml.seperator_token_id)")?;
                Model::Wpm(WpmModel { opts: wpm, unk })
            }
            None => {
                let byte_tokens = Box::new(std::array::from_fn(|b| {
                    vocab
                        .lookup(&format!("<0x{b:02X}>"))
                        .or_else(|| {
                            char::from_u32(b as u32)
                                .and_then(|c| vocab.lookup(c.encode_utf8(&mut [0; 4])))
                        })
                        .or(ids.unk)
                }));
                Model::Spm { byte_tokens }
            }
        };
        if add_bos && ids.bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                what: "add_bos_token",
                token_kind: "a BOS",
            });
        }
        if add_eos && ids.eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                what: "add_eos_token",
                token_kind: "an EOS",
            });
        }

        let specials = SpecialMatcher::new(&vocab);
        let (pieces, piece_offsets) = build_pieces(&vocab, byte_level);
        let (chat_template, builtin_template) = match cfg.chat_template {
            Some(t) => (Some(t), false),
            None => match cfg.architecture.as_deref().and_then(builtin_chat_template) {
                Some(t) => (Some(t.to_string()), true),
                None => (None, false),
            },
        };

        Ok(Tokenizer {
            model,
            vocab,
            specials,
            pieces,
            piece_offsets,
            ids,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            chat_template,
            builtin_template,
        })
    }

    /// Tokenize `text`. `add_bos` applies the model's BOS/EOS policy
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`); `parse_special` turns text equal to
    /// a control token (`<|im_start|>`) into that token instead of spelling it out.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            self.specials
                .partition(&self.vocab, text, parse_special, &mut fragments);
        }
        self.encode_fragments(text, &fragments, add_bos)
    }

    /// Steps 2 and 3 of [`encode`](Self::encode): tokenize the raw-text `fragments` (ranges of
    /// `text`) and place the special ones, in order; BOS / EOS by the file's policy if
    /// `add_bos`.
    fn encode_fragments(&self, text: &str, fragments: &[Fragment], add_bos: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if let Model::Wpm(wpm) = &self.model {
            // llama.cpp: [CLS] text [SEP] whenever special tokens are added.
            if add_bos {
                out.extend(self.ids.bos);
            }
            let mut scratch = WpmScratch::default();
            for f in fragments {
                match f {
                    Fragment::Text(r) => {
                        wpm.encode_fragment(&self.vocab, &text[r.clone()], &mut scratch, &mut out)
                    }
                    Fragment::Token(id) => out.push(*id),
                }
            }
            if add_bos {
                out.extend(self.ids.sep);
            }
            return out;
        }
        if add_bos && self.add_bos {
            out.extend(self.ids.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => {
                let mut scratch = BpeScratch::default();
                let mut escaped = String::new();
                for f in fragments {
                    match f {
                        Fragment::Text(r) => {
                            let mut raw = &text[r.clone()];
                            if bpe.pre.escape_whitespaces {
                                escaped.clear();
                                escaped.extend(raw.chars().map(|c| if c == ' ' { '▁' } else { c }));
                                raw = &escaped;
                            }
                            bpe.encode_fragment(&self.vocab, raw, &mut scratch, &mut out)
                        }
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
            Model::Spm { byte_tokens } => {
                let mut scratch = SpmScratch::default();
                let mut escaped = String::new();
                // llama.cpp prefixes a space to raw text at the start and after every special
                // token, when add_space_prefix is set.
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(r) => {
                            escaped.clear();
                            if self.add_space_prefix && prev_special {
                                escaped.push('▁');
                            }
                            for c in text[r.clone()].chars() {
                                if c == ' ' {
                                    escaped.push('▁');
                                } else {
                                    escaped.push(c);
                                }
                            }
                            spm::encode(&self.vocab, byte_tokens, &escaped, &mut scratch, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Wpm(_) => unreachable!("handled above"),
        }
        if add_bos && self.add_eos {
            out.extend(self.ids.eos);
        }
        out
    }

    /// Text of the tokens, every token rendered (control tokens as their text, like llama.cpp's
    /// detokenize with `unparse_special`). Bytes are joined first and converted to UTF-8 once,
    /// lossily only for bytes that never form a character.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Like [`decode`](Self::decode) but leaving out control and unknown tokens (BOS, EOS,
    /// `<|im_start|>`, ...), as llama.cpp does without `unparse_special`.
    pub fn decode_skip_special(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes_skip_special(ids)).into_owned()
    }

    /// [`decode_skip_special`](Self::decode_skip_special)'s bytes, before any UTF-8
    /// conversion (a prefix of a character's bytes stays as it is).
    pub fn decode_bytes_skip_special(&self, ids: &[u32]) -> Vec<u8> {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| !self.is_control(id) && !self.vocab_attr(id, attr::UNKNOWN))
            .collect();
        self.decode_bytes(&kept)
    }

    /// [`decode`](Self::decode)'s bytes, before any UTF-8 conversion.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        // With a space prefix, the first token's leading space is the one encode added.
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let mut piece = self.token_bytes(id);
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            out.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }

    /// The bytes token `id` stands for (empty for unused tokens and out-of-range ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.vocab.len() {
            return &[];
        }
        &self.pieces[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// The token's text as stored in the vocabulary (`Ġhello`, `▁hello`, `<0x0A>`); empty for
    /// out-of-range ids.
    pub fn token_text(&self, id: u32) -> &str {
        if (id as usize) < self.vocab.len() {
            self.vocab.text(id)
        } else {
            ""
        }
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.lookup(text)
    }

    /// [`attr`] bits of a token (0 for out-of-range ids).
    pub fn token_attr(&self, id: u32) -> u16 {
        self.vocab
            .attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }

    fn vocab_attr(&self, id: u32, bits: u16) -> bool {
        self.token_attr(id) & bits != 0
    }

    /// A control token: BOS, EOS, `<|im_start|>`, `<start_of_turn>`, ...
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab_attr(id, attr::CONTROL)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }

    /// End-of-turn token (from the file, else found by text as llama.cpp does).
    pub fn eot(&self) -> Option<u32> {
        self.ids.eot
    }

    /// All special ids after llama.cpp's defaults and text-based detection.
    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }

    /// `gpt2` (byte-level BPE), `gemma4` (BPE over UTF-8), `llama` (SentencePiece-style) or
    /// `bert` (WordPiece).
    pub fn model_kind(&self) -> &'static str {
        match &self.model {
            Model::Bpe(b) if !b.pre.byte_encode => "gemma4",
            Model::Bpe(_) => "gpt2",
            Model::Spm { .. } => "llama",
            Model::Wpm(_) => "bert",
        }
    }

    /// The pre-tokenizer name of a byte-level BPE vocabulary.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        match &self.model {
            Model::Bpe(b) => Some(&b.pre.name),
            Model::Spm { .. } | Model::Wpm(_) => None,
        }
    }

    /// Whether `add_bos` in [`encode`](Self::encode) prepends BOS for this model.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `add_bos` in [`encode`](Self::encode) appends EOS for this model.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `add_bos` in [`encode`](Self::encode) appends the separator (`[SEP]`): WordPiece
    /// vocabularies, where it ends every input (llama.cpp's `add_sep`).
    pub fn adds_sep(&self) -> bool {
        matches!(self.model, Model::Wpm(_))
    }

    /// End of generation: EOS, EOT, `<|im_end|>`, `<end_of_turn>`, ... as llama.cpp decides.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// `tokenizer.chat_template`, or a built-in template for the architecture when the file
    /// has none (see [`chat_template_is_builtin`](Self::chat_template_is_builtin)).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Use `template` as the chat template (llama.cpp's `--chat-template-file`); an error if it
    /// does not render a conversation.
    pub fn set_chat_template(&mut self, template: String) -> Result<(), TokenizerError> {
        let probe = [ChatMessage::new("user", "Hello")];
        render_chat(&template, &probe, true, "", "")?;
        self.chat_template = Some(template);
        self.builtin_template = false;
        Ok(())
    }

    /// True when [`chat_template`](Self::chat_template) is kiln's built-in fallback rather than
    /// the file's own.
    pub fn chat_template_is_builtin(&self) -> bool {
        self.builtin_template
    }

    /// Bytes held by the tokenizer's tables (for the memory planner).
    pub fn heap_bytes(&self) -> usize {
        let model = match &self.model {
            Model::Bpe(b) => b.heap_bytes(),
            Model::Spm { .. } => 256 * 8,
            Model::Wpm(_) => 0,
        };
        self.vocab.heap_bytes()
            + self.specials.heap_bytes()
            + self.pieces.capacity()
            + self.piece_offsets.capacity() * 4
            + self.eog.capacity() * 4
            + self.chat_template.as_ref().map_or(0, |t| t.capacity())
            + model
    }
}

/// Every token's decoded bytes (llama.cpp's `token_to_piece` with `special = true`):
/// `byte_level` for GPT-2 byte characters, else `▁` as space.
fn build_pieces(vocab: &Vocab, byte_level: bool) -> (Vec<u8>, Vec<u32>) {
    let mut pieces = Vec::new();
    let mut offsets = Vec::with_capacity(vocab.len() + 1);
    offsets.push(0u32);
    for id in 0..vocab.len() as u32 {
        let text = vocab.text(id);
        let a = vocab.attr(id);
        if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
            pieces.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if byte_level {
                decode_byte_level(text, &mut pieces);
            } else {
                pieces.extend_from_slice(text.replace('▁', " ").as_bytes());
            }
        } else if a & attr::BYTE != 0 {
            pieces.push(byte_token_value(text).unwrap_or(0));
        }
        offsets.push(pieces.len() as u32);
    }
    (pieces, offsets)
}

/// llama.cpp's `llama_decode_text`: each character back to its byte; a character that is no
/// byte's image is written as `[UNK_BYTE_0x..<text>]`, as there.
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match unicode::unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// The byte of a `<0xNN>` token (llama.cpp reads the two characters after `<0x`).
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.get(3..5)?;
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's `clean_spaces` passes (Hugging Face's clean_up_tokenization_spaces), in place.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // First pass: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // Second pass: " ' " becomes "'".
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // Third pass: " 's", " 'm", " 're", " 've" lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = text[i + 2];
                if x2 == b'e' && (x1 == b'r' || x1 == b'v') {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests;
