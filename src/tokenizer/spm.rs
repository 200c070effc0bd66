//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): llama.cpp's
//! `llm_tokenizer_spm_session`.
//!
//! Spaces are first escaped to `▁` (U+2581) by the caller. Every UTF-8 character starts as a
//! symbol; the adjacent pair whose concatenation is a vocabulary token with the highest score
//! (ties: the leftmost) is merged, repeatedly. Symbols that end up not being tokens are spelled
//! with byte tokens `<0xNN>`.

use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// A run of the text: `start..start + len` (bytes); `len == 0` once merged into its left
/// neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// A candidate merge. The heap pops the highest score, then the lowest left index.
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Byte length of the merged text when queued; a mismatch later means it is outdated.
    size: u32,
}

heap_order!(Bigram, |a, b| a
    .score
    .total_cmp(&b.score)
    .then(b.left.cmp(&a.left)));

/// Reusable buffers for one `encode` call.
#[derive(Default)]
pub(crate) struct SpmScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

/// Tokenize `text` (spaces already escaped to `▁`), appending ids. `byte_tokens[b]` is the
/// token for byte `b` (`<0xNN>`, else the one-character token, else `unk`).
pub(crate) fn encode(
    vocab: &Vocab,
    byte_tokens: &[Option<u32>; 256],
    text: &str,
    s: &mut SpmScratch,
    out: &mut Vec<u32>,
) {
    s.symbols.clear();
    s.heap.clear();
    let mut iter = text.char_indices().peekable();
    let mut index = 0i32;
    while let Some((start, c)) = iter.next() {
        let len = c.len_utf8();
        let last = iter.peek().is_none();
        s.symbols.push(Symbol {
            start: start as u32,
            len: len as u32,
            prev: index - 1,
            next: if last { -1 } else { index + 1 },
        });
        index += 1;
    }
    if s.symbols.is_empty() {
        return;
    }

    for i in 1..s.symbols.len() {
        try_add_bigram(vocab, text, s, i as i32 - 1, i as i32);
    }

    while let Some(bg) = s.heap.pop() {
        let (l, r) = (bg.left as usize, bg.right as usize);
        let (ll, rl) = (s.symbols[l].len, s.symbols[r].len);
        if ll == 0 || rl == 0 || ll + rl != bg.size {
            continue;
        }
        s.symbols[l].len += rl;
        s.symbols[r].len = 0;
        let next = s.symbols[r].next;
        s.symbols[l].next = next;
        if next >= 0 {
            s.symbols[next as usize].prev = l as i32;
        }
        let prev = s.symbols[l].prev;
        try_add_bigram(vocab, text, s, prev, l as i32);
        try_add_bigram(vocab, text, s, l as i32, next);
    }

    // Every merged symbol is a token by construction; single characters may not be, and are
    // then spelled in bytes (llama.cpp's `resegment` never finds a merge record for them).
    let mut i = 0i32;
    while i >= 0 {
        let sym = s.symbols[i as usize];
        let piece = &text.as_bytes()[sym.start as usize..(sym.start + sym.len) as usize];
        match vocab.lookup_bytes(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.iter().filter_map(|&b| byte_tokens[b as usize])),
        }
        i = sym.next;
    }
}

#[inline]
fn try_add_bigram(vocab: &Vocab, text: &str, s: &mut SpmScratch, left: i32, right: i32) {
    if left < 0 || right < 0 {
        return;
    }
    let (l, r) = (s.symbols[left as usize], s.symbols[right as usize]);
    // Adjacent symbols are contiguous in the text.
    let merged = &text.as_bytes()[l.start as usize..(l.start + l.len + r.len) as usize];
    if let Some(id) = vocab.lookup_bytes(merged) {
        s.heap.push(Bigram {
            score: vocab.scores[id as usize],
            left: left as u32,
            right: right as u32,
            size: l.len + r.len,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::attr;
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> Vocab {
        let mut texts: Vec<String> = tokens.iter().map(|t| t.0.to_string()).collect();
        let mut scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        for b in 0..256 {
            texts.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        let n = texts.len();
        Vocab::new(texts, vec![attr::NORMAL; n], scores).unwrap()
    }

    fn byte_tokens(v: &Vocab) -> [Option<u32>; 256] {
        std::array::from_fn(|b| v.lookup(&format!("<0x{b:02X}>")))
    }

    fn run(v: &Vocab, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        encode(
            v,
            &byte_tokens(v),
            text,
            &mut SpmScratch::default(),
            &mut out,
        );
        out.iter().map(|&id| v.text(id).to_string()).collect()
    }

    #[test]
    fn highest_score_merges_first() {
        let v = vocab(&[
            ("▁", -1.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
            ("abc", -3.0),
            ("▁a", -4.0),
        ]);
        // "bc" (-2) beats "ab" (-5) and "▁a" (-4); then "abc" (-3) beats "▁a", which is
        // outdated once "a" has grown.
        assert_eq!(run(&v, "▁abc"), ["▁", "abc"]);
        assert_eq!(run(&v, "abc"), ["abc"]);
        assert_eq!(run(&v, "▁ab"), ["▁a", "b"]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let v = vocab(&[("a", 0.0)]);
        assert_eq!(run(&v, "aé"), ["a", "<0xC3>", "<0xA9>"]);
    }

    #[test]
    fn equal_scores_merge_leftmost() {
        let v = vocab(&[("a", 0.0), ("aa", -1.0)]);
        assert_eq!(run(&v, "aaa"), ["aa", "a"]);
    }
}
