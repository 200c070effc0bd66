//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Each pre-tokenized word is mapped byte by byte to GPT-2's printable characters (or, for
//! gemma4's SentencePiece-style BPE, left as UTF-8 with `<0xNN>` tokens as byte fallback); every
//! character starts as one symbol; then the adjacent pair with the lowest merge rank (ties: the
//! leftmost) is merged, repeatedly, using a heap of candidate pairs over a linked list of
//! symbols: O(n log n) per word.
//!
//! Symbols are "pieces": interned strings. Pieces `0..n_vocab` are the vocabulary tokens
//! themselves; strings that occur in merges but are not tokens get ids after them. A merge is
//! then a lookup of a `(left piece, right piece)` pair, with no string building per step.

use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;

use super::pretokenize::PreTokenizer;
use super::unicode::BYTE_TO_UNICODE;
use super::vocab::Vocab;

/// A symbol that has been merged into its left neighbour.
const DEAD: u32 = u32::MAX;
/// Pieces `UNKNOWN_BYTE + b` stand for a byte whose character is in no token and no merge.
const UNKNOWN_BYTE: u32 = u32::MAX - 256;
/// A UTF-8 character (of a raw, not byte-encoded, word) in no token and no merge.
const UNKNOWN_CHAR: u32 = UNKNOWN_BYTE - 1;

/// Open-addressing map from a piece pair (packed into a `u64`) to `(rank, merged piece)`.
#[derive(Debug)]
struct PairMap {
    keys: Vec<u64>,
    values: Vec<(u32, u32)>,
}

const NO_KEY: u64 = u64::MAX;

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

#[inline]
fn pair_slot(key: u64, mask: usize) -> usize {
    // Fibonacci hashing: the high bits of the product are well mixed.
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & mask
}

impl PairMap {
    fn with_capacity(n: usize) -> PairMap {
        let slots = (n.max(1) * 2).next_power_of_two();
        PairMap {
            keys: vec![NO_KEY; slots],
            values: vec![(0, 0); slots],
        }
    }

    /// Insert unless present (the first merge listed for a pair wins, as in llama.cpp).
    fn insert_first(&mut self, key: u64, value: (u32, u32)) {
        let mask = self.keys.len() - 1;
        let mut i = pair_slot(key, mask);
        loop {
            if self.keys[i] == NO_KEY {
                self.keys[i] = key;
                self.values[i] = value;
                return;
            }
            if self.keys[i] == key {
                return;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn get(&self, key: u64) -> Option<(u32, u32)> {
        let mask = self.keys.len() - 1;
        let mut i = pair_slot(key, mask);
        loop {
            let k = self.keys[i];
            if k == key {
                return Some(self.values[i]);
            }
            if k == NO_KEY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.values.capacity() * 8
    }
}

#[derive(Debug)]
pub(crate) struct BpeModel {
    pub pre: PreTokenizer,
    merges: PairMap,
    /// Texts of the non-token pieces, piece id `n_vocab + i`.
    extra: Vec<String>,
    /// The piece of each byte's GPT-2 character, or `UNKNOWN_BYTE + b`.
    byte_piece: [u32; 256],
    n_vocab: u32,
    /// Raw UTF-8 words (`!pre.byte_encode`): the non-token pieces by text, and each byte's
    /// `<0xNN>` token.
    raw: Option<Box<RawBpe>>,
}

#[derive(Debug)]
struct RawBpe {
    extra_index: HashMap<String, u32>,
    byte_tokens: [Option<u32>; 256],
}

/// One symbol of the word being merged (a node of a doubly linked list over a Vec).
#[derive(Clone, Copy)]
struct Symbol {
    piece: u32,
    prev: i32,
    next: i32,
    /// Byte offset of the symbol's first character in the word (for `UNKNOWN_CHAR`).
    at: u32,
}

/// A candidate merge of two adjacent symbols. The heap pops the lowest rank, then the lowest
/// left index (llama.cpp's comparator).
struct Bigram {
    rank: u32,
    left: u32,
    right: u32,
    left_piece: u32,
    right_piece: u32,
    merged: u32,
}

// (BinaryHeap is a max-heap: "greater" is popped first.)
heap_order!(Bigram, |a, b| b.rank.cmp(&a.rank).then(b.left.cmp(&a.left)));

/// Reusable buffers for one `encode` call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
    encoded: String,
    words: Vec<Range<usize>>,
}

impl BpeModel {
    /// Build from `tokenizer.ggml.merges` ("left right" strings, rank = position).
    pub fn new(vocab: &Vocab, merges: &[String], pre: PreTokenizer) -> BpeModel {
        let n_vocab = vocab.len() as u32;
        let mut extra: Vec<String> = Vec::new();
        let mut extra_index: HashMap<String, u32> = HashMap::new();
        let mut intern = |s: &str| -> u32 {
            if let Some(id) = vocab.lookup(s) {
                return id;
            }
            if let Some(&id) = extra_index.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.push(s.to_string());
            extra_index.insert(s.to_string(), id);
            id
        };

        let mut map = PairMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space at byte index >= 1; a merge without one is
            // the pair ("", ""), which can never match a symbol, so it is skipped here.
            let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                continue;
            };
            let pos = pos + 1;
            let (first, second) = (&m[..pos], &m[pos + 1..]);
            if first.is_empty() || second.is_empty() {
                continue;
            }
            let left = intern(first);
            let right = intern(second);
            let merged = intern(&format!("{first}{second}"));
            map.insert_first(pair_key(left, right), (rank as u32, merged));
        }

        let mut byte_piece = [0u32; 256];
        let mut buf = [0u8; 4];
        for b in 0..256usize {
            let s = BYTE_TO_UNICODE[b].encode_utf8(&mut buf);
            byte_piece[b] = match vocab.lookup(s) {
                Some(id) => id,
                None => extra_index
                    .get(&*s)
                    .copied()
                    .unwrap_or(UNKNOWN_BYTE + b as u32),
            };
        }

        let raw = (!pre.byte_encode).then(|| {
            Box::new(RawBpe {
                extra_index,
                byte_tokens: std::array::from_fn(|b| vocab.lookup(&format!("<0x{b:02X}>"))),
            })
        });
        BpeModel {
            pre,
            merges: map,
            extra,
            byte_piece,
            n_vocab,
            raw,
        }
    }

    /// Tokenize one raw-text fragment (no special tokens inside), appending ids.
    pub fn encode_fragment(
        &self,
        vocab: &Vocab,
        text: &str,
        scratch: &mut BpeScratch,
        out: &mut Vec<u32>,
    ) {
        let mut words = std::mem::take(&mut scratch.words);
        words.clear();
        self.pre.split(text, &mut words);
        for w in &words {
            self.encode_word(vocab, &text.as_bytes()[w.clone()], scratch, out);
        }
        scratch.words = words;
    }

    fn encode_word(&self, vocab: &Vocab, word: &[u8], s: &mut BpeScratch, out: &mut Vec<u32>) {
        if let Some(raw) = &self.raw {
            return self.encode_raw_word(vocab, raw, word, s, out);
        }
        if self.pre.ignore_merges {
            s.encoded.clear();
            s.encoded
                .extend(word.iter().map(|&b| BYTE_TO_UNICODE[b as usize]));
            if let Some(id) = vocab.lookup(&s.encoded) {
                out.push(id);
                return;
            }
        }

        // symbols: one per byte (= one per GPT-2 character of the encoded word).
        s.symbols.clear();
        let n = word.len();
        for (i, &b) in word.iter().enumerate() {
            s.symbols.push(Symbol {
                piece: self.byte_piece[b as usize],
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
                at: i as u32,
            });
        }
        self.merge_and_emit(vocab, word, s, out);
    }

    /// gemma4: a word of raw UTF-8, one symbol per character; a word of newlines only that is
    /// a token is emitted whole (llama.cpp's fix for Gemma 4).
    fn encode_raw_word(
        &self,
        vocab: &Vocab,
        raw: &RawBpe,
        word: &[u8],
        s: &mut BpeScratch,
        out: &mut Vec<u32>,
    ) {
        if word.iter().all(|&b| b == b'\n') {
            if let Some(id) = vocab.lookup_bytes(word) {
                out.push(id);
                return;
            }
        }
        s.symbols.clear();
        let text = std::str::from_utf8(word).expect("words are cut at character boundaries");
        let mut it = text.char_indices().peekable();
        let mut i = 0i32;
        while let Some((at, c)) = it.next() {
            let ch = &text[at..at + c.len_utf8()];
            let piece = vocab
                .lookup(ch)
                .or_else(|| raw.extra_index.get(ch).copied())
                .unwrap_or(UNKNOWN_CHAR);
            s.symbols.push(Symbol {
                piece,
                prev: i - 1,
                next: if it.peek().is_none() { -1 } else { i + 1 },
                at: at as u32,
            });
            i += 1;
        }
        self.merge_and_emit(vocab, word, s, out);
    }

    /// Merge the symbols in `s.symbols` by rank and emit the result.
    fn merge_and_emit(&self, vocab: &Vocab, word: &[u8], s: &mut BpeScratch, out: &mut Vec<u32>) {
        let n = s.symbols.len();
        s.heap.clear();
        for i in 1..n {
            self.push_bigram(s, i as i32 - 1, i as i32);
        }

        while let Some(bg) = s.heap.pop() {
            let (l, r) = (bg.left as usize, bg.right as usize);
            // Outdated: one side was merged away or has grown since the pair was queued.
            if s.symbols[l].piece != bg.left_piece || s.symbols[r].piece != bg.right_piece {
                continue;
            }
            s.symbols[l].piece = bg.merged;
            s.symbols[r].piece = DEAD;
            let next = s.symbols[r].next;
            s.symbols[l].next = next;
            if next >= 0 {
                s.symbols[next as usize].prev = l as i32;
            }
            let prev = s.symbols[l].prev;
            self.push_bigram(s, prev, l as i32);
            self.push_bigram(s, l as i32, next);
        }

        let mut i = if n == 0 { -1 } else { 0 };
        while i >= 0 {
            let sym = s.symbols[i as usize];
            if sym.piece == UNKNOWN_CHAR {
                let at = sym.at as usize;
                let len = utf8_len(word[at]).min(word.len() - at);
                self.emit_bytes(vocab, &word[at..at + len], out);
            } else {
                self.emit_piece(vocab, sym.piece, out);
            }
            i = sym.next;
        }
    }

    #[inline]
    fn push_bigram(&self, s: &mut BpeScratch, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (lp, rp) = (
            s.symbols[left as usize].piece,
            s.symbols[right as usize].piece,
        );
        if let Some((rank, merged)) = self.merges.get(pair_key(lp, rp)) {
            s.heap.push(Bigram {
                rank,
                left: left as u32,
                right: right as u32,
                left_piece: lp,
                right_piece: rp,
                merged,
            });
        }
    }

    /// A final symbol: a token if it is one; otherwise llama.cpp looks up each byte of the
    /// symbol's (encoded) text as a one-byte token and drops those that are not.
    fn emit_piece(&self, vocab: &Vocab, piece: u32, out: &mut Vec<u32>) {
        if piece < self.n_vocab {
            out.push(piece);
            return;
        }
        let mut buf = [0u8; 4];
        let text: &str = if piece >= UNKNOWN_BYTE {
            BYTE_TO_UNICODE[(piece - UNKNOWN_BYTE) as usize].encode_utf8(&mut buf)
        } else {
            &self.extra[(piece - self.n_vocab) as usize]
        };
        self.emit_bytes(vocab, text.as_bytes(), out);
    }

    /// Byte fallback: each byte's one-byte token (GPT-2 character) or, for raw words, its
    /// `<0xNN>` token; bytes with neither are dropped, as in llama.cpp.
    fn emit_bytes(&self, vocab: &Vocab, bytes: &[u8], out: &mut Vec<u32>) {
        for &b in bytes {
            let id = match &self.raw {
                Some(raw) => raw.byte_tokens[b as usize],
                None => vocab.lookup_bytes(&[b]),
            };
            out.extend(id);
        }
    }

    pub fn heap_bytes(&self) -> usize {
        let raw = self.raw.as_ref().map_or(0, |r| {
            std::mem::size_of::<RawBpe>()
                + r.extra_index
                    .keys()
                    .map(|k| k.capacity() + 32)
                    .sum::<usize>()
        });
        raw + self.merges.heap_bytes()
            + self.extra.iter().map(|s| s.capacity() + 24).sum::<usize>()
            + self.pre.stages.capacity() * std::mem::size_of::<super::pretokenize::Stage>()
    }
}

/// llama.cpp's `unicode_len_utf8`: the sequence length a lead byte announces.
fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xF => 4,
        0xE => 3,
        0xC | 0xD => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::attr;
    use super::*;

    /// A byte-level vocabulary: the 256 byte characters, then `extra` tokens.
    fn byte_vocab(extra: &[&str]) -> Vocab {
        let mut texts: Vec<String> = BYTE_TO_UNICODE.iter().map(|c| c.to_string()).collect();
        texts.extend(extra.iter().map(|s| s.to_string()));
        let n = texts.len();
        Vocab::new(texts, vec![attr::NORMAL; n], vec![0.0; n]).unwrap()
    }

    fn encode(vocab: &Vocab, merges: &[&str], pre: &str, text: &str) -> Vec<String> {
        let merges: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
        let m = BpeModel::new(vocab, &merges, PreTokenizer::for_name(pre).unwrap());
        let mut out = Vec::new();
        m.encode_fragment(vocab, text, &mut BpeScratch::default(), &mut out);
        out.iter().map(|&id| vocab.text(id).to_string()).collect()
    }

    #[test]
    fn merges_apply_by_rank_not_position() {
        let v = byte_vocab(&["Ġt", "he", "Ġthe", "th"]);
        // "th" has a worse rank than "he", so " the" -> "Ġt" + "he" -> "Ġthe".
        let merges = ["Ġ t", "h e", "Ġt he", "t h"];
        assert_eq!(encode(&v, &merges, "gpt-2", " the"), ["Ġthe"]);
        assert_eq!(encode(&v, &merges, "gpt-2", "the"), ["t", "he"]);
        // Without "h e" the word falls back to "th" + "e".
        assert_eq!(encode(&v, &["t h"], "gpt-2", "the"), ["th", "e"]);
    }

    #[test]
    fn ties_merge_leftmost_first() {
        let v = byte_vocab(&["aa"]);
        assert_eq!(encode(&v, &["a a"], "gpt-2", "aaa"), ["aa", "a"]);
        assert_eq!(encode(&v, &["a a"], "gpt-2", "aaaa"), ["aa", "aa"]);
    }

    #[test]
    fn non_ascii_bytes_use_byte_characters() {
        let v = byte_vocab(&[]);
        // "é" is C3 A9 -> "Ã" "©".
        assert_eq!(encode(&v, &[], "gpt-2", "é"), ["Ã", "©"]);
    }

    #[test]
    fn merge_result_that_is_not_a_token_falls_back_to_single_bytes() {
        // "x y" merges into "xy" which is not a token: llama.cpp looks up each byte.
        let v = byte_vocab(&[]);
        assert_eq!(encode(&v, &["x y"], "gpt-2", "xy"), ["x", "y"]);
    }

    #[test]
    fn ignore_merges_emits_whole_word_tokens() {
        // llama3 emits a word that is a token directly, even without a merge path.
        let v = byte_vocab(&["hello"]);
        assert_eq!(encode(&v, &[], "llama3", "hello"), ["hello"]);
        assert_eq!(encode(&v, &[], "gpt-2", "hello"), ["h", "e", "l", "l", "o"]);
    }
}
