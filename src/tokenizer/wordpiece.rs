//! WordPiece (`tokenizer.ggml.model = "bert"`): llama.cpp's `llm_tokenizer_wpm_session`.
//!
//! The text is normalized as BERT's `BasicTokenizer` does in llama.cpp: NFD (first codepoint of
//! the decomposition) and accent marks dropped when stripping accents, lower-cased when
//! lower-casing, control characters, NUL and U+FFFD dropped, split at whitespace, and every
//! punctuation character, ASCII symbol and CJK ideograph made a word of its own. Each word,
//! prefixed with `▁` (GGUF spells word-initial pieces `▁x` and continuations `x`, where Hugging
//! Face spells them `x` and `##x`), is covered greedily by the longest vocabulary tokens from
//! the left; a word with any position no token starts at becomes `[UNK]`.

use super::unicode::{cpt_flags, CptFlags};
use super::unicode_norm_data::{LOWERCASE, NFD_RANGES};
use super::vocab::Vocab;

/// `tokenizer.ggml.normalizer.*` (BERT's normalizer options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WpmOptions {
    pub lowercase: bool,
    pub strip_accents: bool,
}

#[derive(Debug)]
pub(crate) struct WpmModel {
    pub opts: WpmOptions,
    /// The token a word no token sequence covers becomes.
    pub unk: u32,
}

/// Reusable buffers for one `encode` call.
#[derive(Default)]
pub(crate) struct WpmScratch {
    word: String,
}

/// The phantom space GGUF WordPiece vocabularies put before word-initial pieces.
const WORD_START: &str = "\u{2581}";

impl WpmModel {
    /// Tokenize one raw-text fragment (no special tokens inside), appending ids.
    pub fn encode_fragment(
        &self,
        vocab: &Vocab,
        text: &str,
        scratch: &mut WpmScratch,
        out: &mut Vec<u32>,
    ) {
        let word = &mut scratch.word;
        word.clear();
        word.push_str(WORD_START);
        for c in text.chars() {
            let mut cpt = c as u32;
            if self.opts.strip_accents {
                cpt = nfd_first(cpt);
            }
            let flags = cpt_flags(cpt);
            if flags.is_whitespace() {
                self.finish_word(vocab, word, out);
                continue;
            }
            let category = flags.category();
            if cpt == 0 || cpt == 0xFFFD || category & CptFlags::CONTROL != 0 {
                continue;
            }
            if self.opts.strip_accents && category & CptFlags::ACCENT_MARK != 0 {
                continue;
            }
            let mapped = if self.opts.lowercase {
                to_lower(cpt)
            } else {
                cpt
            };
            // llama.cpp writes codepoints (not chars): a surrogate from the tables cannot
            // occur, but keep the text valid whatever they hold.
            let ch = char::from_u32(mapped).unwrap_or('\u{FFFD}');
            let alone = flags.is_punctuation()
                || (cpt < 0x7F && category & CptFlags::SYMBOL != 0)
                || is_chinese_char(cpt);
            if alone {
                self.finish_word(vocab, word, out);
                word.push(ch);
                self.finish_word(vocab, word, out);
            } else {
                word.push(ch);
            }
        }
        self.finish_word(vocab, word, out);
    }

    /// Tokenize the word in `word` (after its `▁`) if it is not empty, and reset it to `▁`.
    fn finish_word(&self, vocab: &Vocab, word: &mut String, out: &mut Vec<u32>) {
        if word.len() > WORD_START.len() {
            self.encode_word(vocab, word.as_bytes(), out);
            word.truncate(WORD_START.len());
        }
    }

    /// Greedy longest match from the left over `word` (`▁` included), as llama.cpp does it:
    /// byte positions, the longest candidate first.
    fn encode_word(&self, vocab: &Vocab, word: &[u8], out: &mut Vec<u32>) {
        let n = word.len();
        let start = out.len();
        let max_len = vocab.max_len();
        let mut i = 0;
        while i < n {
            let mut matched = None;
            let mut j = n.min(i + max_len + 1);
            while j > i {
                if let Some(id) = vocab.lookup_bytes(&word[i..j]) {
                    matched = Some((id, j));
                    break;
                }
                j -= 1;
            }
            match matched {
                Some((id, j)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            out.push(self.unk);
        }
    }
}

/// llama.cpp's `unicode_tolower`: the table's mapping, else the codepoint itself.
pub(crate) fn to_lower(cpt: u32) -> u32 {
    match LOWERCASE.binary_search_by_key(&cpt, |&(from, _)| from) {
        Ok(i) => LOWERCASE[i].1,
        Err(_) => cpt,
    }
}

/// llama.cpp's `unicode_cpts_normalize_nfd` for one codepoint: the first codepoint of its
/// canonical decomposition.
pub(crate) fn nfd_first(cpt: u32) -> u32 {
    // The last range starting at or before `cpt` (the table starts at 0).
    let i = NFD_RANGES.partition_point(|&(first, _, _)| first <= cpt);
    let (first, last, nfd) = NFD_RANGES[i.saturating_sub(1)];
    if first <= cpt && cpt <= last {
        nfd
    } else {
        cpt
    }
}

/// The CJK ideograph ranges BERT splits off, as llama.cpp has them (its 0x2B920 is Hugging
/// Face's, not the Unicode block's 0x2B820).
fn is_chinese_char(cpt: u32) -> bool {
    matches!(cpt,
        0x04E00..=0x09FFF
        | 0x03400..=0x04DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0x0F900..=0x0FAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::super::vocab::attr;
    use super::*;

    fn vocab(texts: &[&str]) -> Vocab {
        let n = texts.len();
        Vocab::new(
            texts.iter().map(|s| s.to_string()).collect(),
            vec![attr::NORMAL; n],
            vec![0.0; n],
        )
        .unwrap()
    }

    fn encode(v: &Vocab, opts: WpmOptions, text: &str) -> Vec<String> {
        let m = WpmModel { opts, unk: 0 };
        let mut out = Vec::new();
        m.encode_fragment(v, text, &mut WpmScratch::default(), &mut out);
        out.iter().map(|&id| v.text(id).to_string()).collect()
    }

    const BERT: WpmOptions = WpmOptions {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn greedy_longest_match_with_continuations() {
        let v = vocab(&["[UNK]", "▁un", "▁unaff", "able", "aff", "▁a", "▁b"]);
        assert_eq!(encode(&v, BERT, "unaffable"), ["▁unaff", "able"]);
        // A position no token starts at turns the whole word into [UNK].
        assert_eq!(encode(&v, BERT, "unaffablex a"), ["[UNK]", "▁a"]);
    }

    #[test]
    fn normalizes_and_splits_punctuation_and_cjk() {
        let v = vocab(&["[UNK]", "▁hello", "▁,", "▁cafe", "▁日", "▁本", "▁$", "▁x"]);
        assert_eq!(
            encode(&v, BERT, "  HeLLo,Café\t日本$x"),
            ["▁hello", "▁,", "▁cafe", "▁日", "▁本", "▁$", "▁x"]
        );
        // Control characters vanish; they do not split words.
        assert_eq!(encode(&v, BERT, "hel\u{7}lo"), ["▁hello"]);
        // Without lower-casing (and so without accent stripping) the vocabulary misses.
        let keep = WpmOptions {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(encode(&v, keep, "Café"), ["[UNK]"]);
    }

    #[test]
    fn case_and_decomposition_tables() {
        assert_eq!(to_lower('A' as u32), 'a' as u32);
        assert_eq!(to_lower('Ä' as u32), 'ä' as u32);
        assert_eq!(to_lower('Σ' as u32), 'σ' as u32);
        assert_eq!(to_lower('7' as u32), '7' as u32);
        assert_eq!(nfd_first('é' as u32), 'e' as u32);
        assert_eq!(nfd_first('Å' as u32), 'A' as u32);
        assert_eq!(nfd_first('x' as u32), 'x' as u32);
        assert_eq!(nfd_first(0), 0);
        assert_eq!(nfd_first(0x10FFFF), 0x10FFFF);
    }
}
