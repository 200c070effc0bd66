//! Pre-tokenizers for byte-level BPE: split text into "words" before merges run.
//!
//! llama.cpp picks a list of regexes by `tokenizer.ggml.pre` and applies them in turn, each one
//! splitting every piece the previous one produced (matches and the gaps between them both
//! become pieces). The common regexes are not run through a regex engine there but through
//! hand-written scanners (`unicode_regex_split_custom_*`) whose behaviour differs from a real
//! regex in corner cases; the rest go through `std::regex` on a text where every non-ASCII
//! codepoint is collapsed to one byte per Unicode category. We reproduce both exactly: the
//! scanners line by line, the simple class regexes as the character-class runs they are.

use std::ops::Range;

mod ext;
mod o200k;

use super::unicode::{cpt_flags, CptFlags};
use o200k::CaseRegex;

/// One splitting step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (custom scanner).
    Gpt2,
    /// `(?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (custom scanner): `max_digits` 3 for llama3, 1 for qwen2.
    Llama3 { max_digits: usize },
    /// `\p{N}`: every number codepoint alone.
    EachNumber,
    /// `\p{N}+`: runs of numbers.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`: runs of punctuation (and a few ASCII symbols).
    PunctRuns,
    /// `[0-9][0-9][0-9]`: ASCII digit triples.
    AsciiDigitTriples,
    /// `[\p{P}\$\+<=>\^~\|`]+`: [`PunctRuns`](Stage::PunctRuns) and the backtick (falcon).
    PunctTickRuns,
    /// `(?i:'s|..)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|..`
    /// (custom scanner, qwen35): qwen2's with combining marks inside words.
    Qwen35,
    /// `[\r\n]`: each line-break character alone.
    EachLineBreak,
    /// `[^\n]+|[\n]+`: runs of newlines and of the rest (gemma4).
    NewlineRuns,
    /// `\s?[<letters>]+` over deepseek-llm's explicit letter ranges.
    DeepseekLetters,
    /// `\s?[!-/:-~！-／：-～‘-‟　-。]+`: deepseek-llm's punctuation.
    DeepseekPunct,
    /// `\s+$`: the whitespace that ends a piece.
    TrailingSpace,
    /// `[一-龥ࠀ-一가-퟿]+`: deepseek's CJK and Hangul runs.
    CjkRuns,
    /// `\s?\p{L}+` (deepseek-coder).
    SpaceLetters,
    /// `\s?\p{P}+` (deepseek-coder).
    SpacePunct,
    /// `\p{N}{1,3}` as a regex: runs of numbers in threes from the left (deepseek-v3).
    NumberTriples,
    /// `[一-龥぀-ゟ゠-ヿ]+`: CJK, hiragana and katakana runs (deepseek-v3).
    CjkKanaRuns,
    /// deepseek-v3's word regex (`o200k.rs`).
    Deepseek3,
    /// o200k's case-aware regex (`gpt-4o`).
    Gpt4o,
    /// Mistral's tekken regex.
    Tekken,
}

/// What a `tokenizer.ggml.pre` name implies besides its regexes (llama-vocab.cpp's table).
#[derive(Clone, Debug)]
pub(crate) struct PreTokenizer {
    pub name: String,
    pub stages: Vec<Stage>,
    /// A word that is itself a vocabulary token is emitted whole, merges skipped (llama3).
    pub ignore_merges: bool,
    /// Default for `add_bos` when the file does not say.
    pub default_add_bos: bool,
    /// llama.cpp's `clean_spaces` (clean_up_tokenization_spaces) for decoding.
    pub clean_spaces: bool,
    /// Words are mapped to GPT-2's byte characters before merging (false: raw UTF-8, with
    /// `<0xNN>` byte fallback; gemma4).
    pub byte_encode: bool,
    /// Spaces become `▁` before splitting (gemma4).
    pub escape_whitespaces: bool,
    /// BOS is added whatever `add_bos_token` says (gemma4).
    pub force_add_bos: bool,
}

/// The `tokenizer.ggml.pre` values kiln understands, for error messages.
pub(crate) const SUPPORTED_PRE: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "exaone4",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "gigachat",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "trillion",
    "granite-docling",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "hunyuan",
    "solar-open",
    "stablelm2",
    "megrez",
    "qwen35",
    "falcon",
    "deepseek-llm",
    "deepseek-coder",
    "gemma4",
    "granite-embed-multi-311m",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "tekken",
    "deepseek-v3",
    "hunyuan-dense",
    "joyai-llm",
    "hy_v4",
];

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `pre` (an empty name means "default").
    pub fn for_name(pre: &str) -> Option<PreTokenizer> {
        use Stage::*;
        let gpt2 = vec![Gpt2];
        let starcoder = vec![EachNumber, Gpt2];
        let llama3 = vec![Llama3 { max_digits: 3 }];
        let qwen2 = vec![Llama3 { max_digits: 1 }];
        let default = vec![PunctRuns, Gpt2, NumberRuns, AsciiDigitTriples];
        let (mut byte_encode, mut escape_whitespaces, mut force_add_bos) = (true, false, false);
        // (stages, ignore_merges, default add_bos, clean_spaces)
        let (stages, ignore_merges, default_add_bos, clean_spaces) = match pre {
            "" | "default" => (default, false, false, true),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "jina-es" | "jina-de"
            | "jina-v2-es" | "jina-v2-de" | "gigachat" | "a.x-4.0" | "mellum" | "modern-bert" => {
                (gpt2, false, false, true)
            }
            "trillion" | "granite-docling" => (gpt2, false, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (starcoder, false, false, true)
            }
            "smollm" | "command-r" => (starcoder, false, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (llama3, true, true, true),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
                (qwen2, false, false, false)
            }
            "stablelm2" | "megrez" => (qwen2, false, false, true),
            "qwen35" => (vec![Qwen35], false, false, false),
            "falcon" => (
                vec![PunctTickRuns, Gpt2, AsciiDigitTriples],
                false,
                false,
                true,
            ),
            "deepseek-llm" => (
                vec![
                    EachLineBreak,
                    DeepseekLetters,
                    DeepseekPunct,
                    TrailingSpace,
                    CjkRuns,
                    NumberRuns,
                ],
                false,
                false,
                false,
            ),
            "deepseek-coder" => (
                vec![EachLineBreak, SpaceLetters, SpacePunct, CjkRuns, EachNumber],
                false,
                false,
                false,
            ),
            // Gemma 4 (`tokenizer.ggml.model = gemma4` implies it): SentencePiece-style BPE.
            "gemma4" | "granite-embed-multi-311m" => {
                byte_encode = false;
                escape_whitespaces = true;
                force_add_bos = true;
                (vec![NewlineRuns], false, false, true)
            }
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
                (vec![Gpt4o], false, false, false)
            }
            "tekken" => (vec![Tekken], true, true, false),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => (
                vec![NumberTriples, CjkKanaRuns, Deepseek3],
                false,
                false,
                false,
            ),
            _ => return None,
        };
        Some(PreTokenizer {
            name: if pre.is_empty() {
                "default".into()
            } else {
                pre.into()
            },
            stages,
            ignore_merges,
            default_add_bos,
            clean_spaces,
            byte_encode,
            escape_whitespaces,
            force_add_bos,
        })
    }

    /// Split `text` into words, appending their byte ranges to `out` in order. The words tile
    /// the text exactly.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        // cpts[i] starts at byte starts[i]; starts has one extra entry, the text length.
        let mut cpts = Vec::with_capacity(text.len());
        let mut starts = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cpts.push(c as u32);
            starts.push(i);
        }
        starts.push(text.len());

        // Piece lengths in codepoints; they always sum to cpts.len().
        let mut pieces = vec![cpts.len()];
        let mut next = Vec::new();
        for stage in &self.stages {
            next.clear();
            let mut start = 0;
            for &len in &pieces {
                let end = start + len;
                split_piece(*stage, &cpts, start, end, &mut next);
                start = end;
            }
            std::mem::swap(&mut pieces, &mut next);
        }

        let mut start = 0;
        for len in pieces {
            out.push(starts[start]..starts[start + len]);
            start += len;
        }
    }
}

/// Split `cpts[ini..end]` with one stage, appending piece lengths.
fn split_piece(stage: Stage, cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    match stage {
        Stage::Gpt2 => scan_gpt2(cpts, ini, end, out),
        Stage::Llama3 { max_digits } => scan_llama3(cpts, ini, end, max_digits, out),
        Stage::EachNumber => class_split(cpts, ini, end, out, is_collapsed_number, false),
        Stage::NumberRuns => class_split(cpts, ini, end, out, is_collapsed_number, true),
        Stage::PunctRuns => class_split(cpts, ini, end, out, is_default_punct, true),
        Stage::AsciiDigitTriples => ascii_digit_triples(cpts, ini, end, out),
        Stage::PunctTickRuns => class_split(cpts, ini, end, out, is_falcon_punct, true),
        Stage::Qwen35 => ext::scan_qwen35(cpts, ini, end, out),
        Stage::EachLineBreak => class_split(cpts, ini, end, out, |c| c == CR || c == LF, false),
        Stage::NewlineRuns => ext::newline_runs(cpts, ini, end, out),
        Stage::DeepseekLetters => ext::space_then_runs(cpts, ini, end, out, ext::ds_letter),
        Stage::DeepseekPunct => ext::space_then_runs(cpts, ini, end, out, ext::ds_punct),
        Stage::TrailingSpace => ext::trailing_space(cpts, ini, end, out),
        Stage::CjkRuns => class_split(cpts, ini, end, out, ext::ds_cjk, true),
        Stage::SpaceLetters => ext::space_then_runs(cpts, ini, end, out, ext::collapsed_letter),
        Stage::SpacePunct => ext::space_then_runs(cpts, ini, end, out, ext::collapsed_punct),
        Stage::NumberTriples => ext::number_triples(cpts, ini, end, out),
        Stage::CjkKanaRuns => class_split(cpts, ini, end, out, ext::cjk_kana, true),
        Stage::Deepseek3 => o200k::split_deepseek3(cpts, ini, end, out),
        Stage::Gpt4o => o200k::split_case(CaseRegex::Gpt4o, cpts, ini, end, out),
        Stage::Tekken => o200k::split_case(CaseRegex::Tekken, cpts, ini, end, out),
    }
}

/// Records piece boundaries inside one input piece; empty pieces are dropped.
pub(super) struct Emitter<'a> {
    pub prev_end: usize,
    pub out: &'a mut Vec<usize>,
}

impl Emitter<'_> {
    pub fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

pub(super) const OUT_OF_RANGE: u32 = u32::MAX;

pub(super) const CR: u32 = '\r' as u32;
pub(super) const LF: u32 = '\n' as u32;
pub(super) const SPACE: u32 = ' ' as u32;
pub(super) const APOSTROPHE: u32 = '\'' as u32;

/// The window `cpts[ini..end]` as llama.cpp's custom scanners read it: a position outside it
/// reads as `OUT_OF_RANGE` with no flags.
#[derive(Clone, Copy)]
pub(super) struct Window<'a> {
    pub cpts: &'a [u32],
    pub ini: usize,
    pub end: usize,
}

impl Window<'_> {
    #[inline]
    pub fn cpt(&self, p: usize) -> u32 {
        if p >= self.ini && p < self.end {
            self.cpts[p]
        } else {
            OUT_OF_RANGE
        }
    }

    #[inline]
    pub fn flags(&self, p: usize) -> CptFlags {
        if p >= self.ini && p < self.end {
            cpt_flags(self.cpts[p])
        } else {
            CptFlags(0)
        }
    }

    /// The loop of llama.cpp's custom scanners over the window, its pieces' lengths pushed on
    /// `out`: at each position a contraction ([`Window::contraction`], letters compared after
    /// `fold`) is a piece; otherwise `rest(em, pos, cpt, flags)` (the codepoint at `pos` and
    /// its flags) emits what the other alternatives match there and gives where the next match
    /// starts.
    pub fn scan(
        self,
        out: &mut Vec<usize>,
        fold: fn(u32) -> u32,
        mut rest: impl FnMut(&mut Emitter, usize, u32, CptFlags) -> usize,
    ) {
        let mut em = Emitter {
            prev_end: self.ini,
            out,
        };
        let mut pos = self.ini;
        while pos < self.end {
            let n = self.contraction(pos, fold);
            pos = if n > 0 {
                pos + em.add(pos + n)
            } else {
                rest(&mut em, pos, self.cpt(pos), self.flags(pos))
            };
        }
    }

    /// The flags of the codepoint after the `<space>?` that starts several alternatives: of
    /// `pos + 1` where `pos` holds a space, else of `pos`.
    pub fn flags_past_space(&self, pos: usize) -> CptFlags {
        self.flags(if self.cpt(pos) == SPACE { pos + 1 } else { pos })
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos`, the letters compared after `fold` (the identity, or
    /// a lower-casing for `(?i:...)`): the match's length, 0 if none.
    pub fn contraction(&self, pos: usize, fold: fn(u32) -> u32) -> usize {
        if self.cpt(pos) != APOSTROPHE || pos + 1 >= self.end {
            return 0;
        }
        let next = fold(self.cpt(pos + 1));
        if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
            return 2;
        }
        if pos + 2 < self.end {
            let next2 = fold(self.cpt(pos + 2));
            let is = |a: char, b: char| next == a as u32 && next2 == b as u32;
            if is('r', 'e') || is('v', 'e') || is('l', 'l') {
                return 3;
            }
        }
        0
    }

    /// `<space>?X+` at `pos`, `X` the codepoints whose flags satisfy `class`, the space taken
    /// when `cpt` (the codepoint at `pos`) is one: the end of the run.
    pub fn space_then_run(&self, pos: usize, cpt: u32, class: impl Fn(CptFlags) -> bool) -> usize {
        let mut p = pos + (cpt == SPACE) as usize;
        while class(self.flags(p)) {
            p += 1;
        }
        p
    }

    /// `[\r\n]*` at `pos`: the end of the run of line breaks.
    pub fn line_breaks(&self, mut pos: usize) -> usize {
        while matches!(self.cpt(pos), CR | LF) {
            pos += 1;
        }
        pos
    }

    /// The scanners' last alternatives at `pos`: `\s*[\r\n]+` (with `newlines`), then
    /// `\s+(?!\S)`, then `\s+`, else a lone codepoint. The end of the match.
    pub fn whitespace_tail(&self, pos: usize, newlines: bool) -> usize {
        let mut num_ws = 0;
        let mut last_end_r_or_n = 0;
        while self.flags(pos + num_ws).is_whitespace() {
            let c = self.cpt(pos + num_ws);
            if newlines && (c == CR || c == LF) {
                last_end_r_or_n = pos + num_ws + 1;
            }
            num_ws += 1;
        }
        if last_end_r_or_n > 0 {
            last_end_r_or_n
        } else if num_ws > 1 && self.cpt(pos + num_ws) != OUT_OF_RANGE {
            pos + num_ws - 1
        } else if num_ws > 0 {
            pos + num_ws
        } else {
            pos + 1
        }
    }
}

/// Port of `unicode_regex_split_custom_gpt2`.
fn scan_gpt2(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let w = Window { cpts, ini, end };
    // 's|'t|'re|'ve|'m|'ll|'d, then:
    w.scan(
        out,
        |c| c,
        |em, pos, cpt, _| {
            let flags2 = w.flags_past_space(pos);
            let other =
                |f: CptFlags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            let end = if flags2.is_letter() {
                // <space>?\p{L}+
                w.space_then_run(pos, cpt, |f| f.is_letter())
            } else if flags2.is_number() {
                // <space>?\p{N}+
                w.space_then_run(pos, cpt, |f| f.is_number())
            } else if other(flags2) {
                // <space>?[^\s\p{L}\p{N}]+
                w.space_then_run(pos, cpt, other)
            } else {
                // \s+(?!\S)|\s+, or one codepoint
                w.whitespace_tail(pos, false)
            };
            em.add(end);
            end
        },
    );
}

/// ASCII lower-casing is all `unicode_tolower` does for the letters compared here.
pub(super) fn lower(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// Port of `unicode_regex_split_custom_llama3` (`max_digits` 3) and `_qwen2` (`max_digits` 1).
fn scan_llama3(cpts: &[u32], ini: usize, end: usize, max_digits: usize, out: &mut Vec<usize>) {
    let w = Window { cpts, ini, end };
    // (?i:'s|'t|'re|'ve|'m|'ll|'d), then:
    w.scan(out, lower, |em, mut pos, cpt, flags| {
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == CR || cpt == LF || flags.is_number())
            && (flags.is_letter() || w.flags(pos + 1).is_letter())
        {
            pos += 1;
            while w.flags(pos).is_letter() {
                pos += 1;
            }
            em.add(pos);
            return pos;
        }

        // \p{N}{1,3} (llama3) or \p{N} (qwen2)
        if flags.is_number() {
            if max_digits == 1 {
                pos += 1;
                em.add(pos);
                return pos;
            }
            let mut group_start = pos;
            while w.flags(pos).is_number() {
                pos += 1;
                if pos - group_start >= max_digits {
                    em.add(pos);
                    group_start = pos;
                }
            }
            em.add(pos);
            return pos;
        }

        // <space>?[^\s\p{L}\p{N}]+[\r\n]*   (note: the reference tests `flags`, not `flags2`,
        // for "any flag" on entry)
        let flags2 = w.flags_past_space(pos);
        let other = |f: CptFlags| !(f.is_whitespace() || f.is_letter() || f.is_number());
        pos = if other(flags2) && flags.any() {
            w.line_breaks(w.space_then_run(pos, cpt, |f| other(f) && f.any()))
        } else {
            // \s*[\r\n]+|\s+(?!\S)|\s+, or one codepoint
            w.whitespace_tail(pos, true)
        };
        em.add(pos);
        pos
    });
}

/// `\p{N}` on llama.cpp's collapsed text: ASCII digits, or a non-whitespace codepoint whose
/// category is "number".
pub(super) fn is_collapsed_number(c: u32) -> bool {
    if c < 128 {
        return (b'0' as u32..=b'9' as u32).contains(&c);
    }
    let f = cpt_flags(c);
    !f.is_whitespace() && f.category() == CptFlags::NUMBER
}

/// `[\p{P}\$\+<=>\^~\|]` on the collapsed text.
fn is_default_punct(c: u32) -> bool {
    if c < 128 {
        return b"!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(&(c as u8));
    }
    let f = cpt_flags(c);
    !f.is_whitespace() && f.category() == CptFlags::PUNCTUATION
}

/// `[\p{P}\$\+<=>\^~\|`]` on the collapsed text.
fn is_falcon_punct(c: u32) -> bool {
    c == '`' as u32 || is_default_punct(c)
}

/// Regex split with a one-class pattern: each match (a maximal run when `runs`, else a single
/// codepoint) is a piece, and so is each gap between matches.
pub(super) fn class_split(
    cpts: &[u32],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
    class: fn(u32) -> bool,
    runs: bool,
) {
    let mut em = Emitter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        if class(cpts[pos]) {
            em.add(pos); // the gap before the match
            pos += 1;
            if runs {
                while pos < end && class(cpts[pos]) {
                    pos += 1;
                }
            }
            em.add(pos);
        } else {
            pos += 1;
        }
    }
    em.add(end);
}

/// `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
fn ascii_digit_triples(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let digit = |c: u32| (b'0' as u32..=b'9' as u32).contains(&c);
    let mut em = Emitter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        if pos + 3 <= end && cpts[pos..pos + 3].iter().all(|&c| digit(c)) {
            em.add(pos);
            pos += 3;
            em.add(pos);
        } else {
            pos += 1;
        }
    }
    em.add(end);
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The pieces `pre` splits `text` into, checked to tile it.
    pub(in crate::tokenizer) fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::for_name(pre).unwrap();
        let mut out = Vec::new();
        p.split(text, &mut out);
        // The pieces tile the text.
        let mut at = 0;
        for r in &out {
            assert_eq!(r.start, at);
            at = r.end;
        }
        assert_eq!(at, text.len());
        out.into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("gpt-2", "Hello world, it's 2024!  ok\n"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!", " ", " ok", "\n"]
        );
        assert_eq!(words("gpt-2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(words("gpt-2", "end   "), ["end", "   "]);
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(
            words("smollm", "in 2024 we"),
            ["in", " ", "2", "0", "2", "4", " we"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_newlines() {
        assert_eq!(words("llama3", "12345 abc"), ["123", "45", " abc"]);
        assert_eq!(words("llama3", "x\n\n  y"), ["x", "\n\n", " ", " y"]);
        assert_eq!(words("llama3", "I'M ok"), ["I", "'M", " ok"]);
        assert_eq!(words("llama3", "hi!!\n"), ["hi", "!!\n"]);
    }

    #[test]
    fn qwen2_single_digits() {
        assert_eq!(words("qwen2", "a 123"), ["a", " ", "1", "2", "3"]);
    }

    #[test]
    fn default_pre_tokenizer() {
        // Punctuation runs are isolated first, then gpt2 splitting, then numbers.
        assert_eq!(
            words("default", "Hi, 12345!"),
            ["Hi", ",", " ", "123", "45", "!"]
        );
    }

    #[test]
    fn class_split_keeps_gaps() {
        let cpts: Vec<u32> = "ab12c3".chars().map(|c| c as u32).collect();
        let mut out = Vec::new();
        class_split(&cpts, 0, cpts.len(), &mut out, is_collapsed_number, true);
        assert_eq!(out, [2, 2, 1, 1]);
        out.clear();
        class_split(&cpts, 0, cpts.len(), &mut out, is_collapsed_number, false);
        assert_eq!(out, [2, 1, 1, 1, 1]);
        out.clear();
        let cpts: Vec<u32> = "1234567".chars().map(|c| c as u32).collect();
        ascii_digit_triples(&cpts, 0, cpts.len(), &mut out);
        assert_eq!(out, [3, 3, 1]);
    }

    #[test]
    fn unknown_name_is_none() {
        assert!(PreTokenizer::for_name("no-such-pre").is_none());
        for name in SUPPORTED_PRE {
            assert!(PreTokenizer::for_name(name).is_some(), "{name}");
        }
    }
}
