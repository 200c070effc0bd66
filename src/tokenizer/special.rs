//! Splitting text around special tokens before the model tokenizer runs:
//! llama.cpp's `tokenizer_st_partition`.
//!
//! Candidates are the control, user-defined and unknown tokens. llama.cpp takes them longest
//! text first and, for each, cuts every occurrence out of the remaining raw-text fragments
//! (leftmost first, non-overlapping). User-defined tokens are always cut; control and unknown
//! ones only when `parse_special` is set.
//!
//! Instead of one `find` pass per candidate (Gemma has ~6,400), one trie walk per position
//! finds where candidates start, then llama.cpp's order is replayed by length: an occurrence is
//! accepted if it overlaps nothing accepted before it.

use std::ops::Range;

use super::vocab::{attr, Vocab};

/// A piece of the input: raw text to tokenize, or a special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    /// The candidate whose text ends here.
    token: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
    /// Bytes that start some candidate: a fast filter before walking the trie.
    first_byte: [bool; 256],
}

impl SpecialMatcher {
    /// Index the vocabulary's special tokens (call after attributes are final).
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let mut ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.has_attr(id, attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN))
            .filter(|&id| !vocab.text(id).is_empty())
            .collect();
        // Longest first; llama.cpp's unstable sort leaves equal lengths in an unspecified
        // order, we use the id.
        ids.sort_by_key(|&id| (std::cmp::Reverse(vocab.text(id).len()), id));

        let mut nodes = vec![Node::default()];
        let mut first_byte = [false; 256];
        for &id in &ids {
            let text = vocab.text(id).as_bytes();
            first_byte[text[0] as usize] = true;
            let mut at = 0usize;
            for &b in text {
                at = match nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(k) => nodes[at].children[k].1 as usize,
                    Err(k) => {
                        let new = nodes.len() as u32;
                        nodes.push(Node::default());
                        nodes[at].children.insert(k, (b, new));
                        new as usize
                    }
                };
            }
            nodes[at].token = Some(id);
        }
        SpecialMatcher { nodes, first_byte }
    }

    /// Split `text` into raw-text and special-token fragments, in order.
    pub fn partition(
        &self,
        vocab: &Vocab,
        text: &str,
        parse_special: bool,
        out: &mut Vec<Fragment>,
    ) {
        let bytes = text.as_bytes();
        let eligible =
            |id: u32| parse_special || !vocab.has_attr(id, attr::CONTROL | attr::UNKNOWN);

        // Pass 1: at each position, the longest eligible candidate starting there. Only these
        // positions (and lengths up to that) can hold a match. One entry per position keeps
        // memory linear even for runs like a million spaces, where dozens of whitespace
        // tokens match at every position.
        let mut starts: Vec<(usize, usize)> = Vec::new(); // (position, longest match length)
        let mut lengths_seen: Vec<bool> = Vec::new();
        for start in 0..bytes.len() {
            if !self.first_byte[bytes[start] as usize] {
                continue;
            }
            let mut at = 0usize;
            let mut longest = 0;
            for (k, &b) in bytes[start..].iter().enumerate() {
                match self.child(at, b) {
                    Some(next) => at = next,
                    None => break,
                }
                if let Some(id) = self.nodes[at].token {
                    if eligible(id) {
                        longest = k + 1;
                        if lengths_seen.len() <= longest {
                            lengths_seen.resize(longest + 1, false);
                        }
                        lengths_seen[longest] = true;
                    }
                }
            }
            if longest > 0 {
                starts.push((start, longest));
            }
        }
        if starts.is_empty() {
            if !bytes.is_empty() {
                out.push(Fragment::Text(0..bytes.len()));
            }
            return;
        }

        // Pass 2: llama.cpp's order, longest candidates first, each length's occurrences left
        // to right, skipping any that overlap an accepted one. Everything accepted earlier is
        // at least as long, so an overlap always covers the new span's first or last byte.
        let mut covered = vec![false; bytes.len()];
        let mut accepted: Vec<(usize, usize, u32)> = Vec::new(); // (start, end, id)
        for len in (1..lengths_seen.len()).rev().filter(|&l| lengths_seen[l]) {
            for &(start, longest) in &starts {
                if longest < len || covered[start] || covered[start + len - 1] {
                    continue;
                }
                let Some(id) = self.token_at(&bytes[start..start + len]) else {
                    continue;
                };
                if eligible(id) {
                    covered[start..start + len]
                        .iter_mut()
                        .for_each(|c| *c = true);
                    accepted.push((start, start + len, id));
                }
            }
        }

        accepted.sort_unstable();
        let mut pos = 0;
        for (start, end, id) in accepted {
            if start > pos {
                out.push(Fragment::Text(pos..start));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < bytes.len() {
            out.push(Fragment::Text(pos..bytes.len()));
        }
    }

    #[inline]
    fn child(&self, at: usize, b: u8) -> Option<usize> {
        let children = &self.nodes[at].children;
        children
            .binary_search_by_key(&b, |c| c.0)
            .ok()
            .map(|i| children[i].1 as usize)
    }

    /// The candidate whose text is exactly `text`.
    fn token_at(&self, text: &[u8]) -> Option<u32> {
        let mut at = 0;
        for &b in text {
            at = self.child(at, b)?;
        }
        self.nodes[at].token
    }

    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self
                .nodes
                .iter()
                .map(|n| n.children.capacity() * 8)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, u16)]) -> Vocab {
        let texts = tokens.iter().map(|t| t.0.to_string()).collect();
        let attrs = tokens.iter().map(|t| t.1).collect();
        Vocab::new(texts, attrs, vec![0.0; tokens.len()]).unwrap()
    }

    fn parts(v: &Vocab, text: &str, parse_special: bool) -> Vec<String> {
        let m = SpecialMatcher::new(v);
        let mut out = Vec::new();
        m.partition(v, text, parse_special, &mut out);
        out.iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r.clone()].to_string(),
                Fragment::Token(id) => format!("[{}]", v.text(*id)),
            })
            .collect()
    }

    #[test]
    fn control_tokens_only_with_parse_special() {
        let v = vocab(&[
            ("<|im_start|>", attr::CONTROL),
            ("<|im_end|>", attr::CONTROL),
            ("a", attr::NORMAL),
        ]);
        let text = "<|im_start|>user\nhi<|im_end|>";
        assert_eq!(
            parts(&v, text, true),
            ["[<|im_start|>]", "user\nhi", "[<|im_end|>]"]
        );
        assert_eq!(parts(&v, text, false), [text]);
    }

    #[test]
    fn user_defined_tokens_always_match() {
        let v = vocab(&[
            ("\n", attr::USER_DEFINED),
            ("  ", attr::USER_DEFINED),
            ("   ", attr::USER_DEFINED),
        ]);
        assert_eq!(
            parts(&v, "a\nb     c", false),
            ["a", "[\n]", "b", "[   ]", "[  ]", "c"]
        );
    }

    /// llama.cpp's algorithm, literally: for each candidate (longest first), cut every
    /// occurrence out of every remaining raw fragment, left to right.
    fn reference(v: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut ids: Vec<u32> = (0..v.len() as u32)
            .filter(|&id| v.has_attr(id, attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN))
            .collect();
        ids.sort_by_key(|&id| (std::cmp::Reverse(v.text(id).len()), id));
        let mut frags = vec![Fragment::Text(0..text.len())];
        for id in ids {
            if !parse_special && v.has_attr(id, attr::CONTROL | attr::UNKNOWN) {
                continue;
            }
            let tok = v.text(id);
            let mut next = Vec::new();
            for f in frags {
                let Fragment::Text(r) = f else {
                    next.push(f);
                    continue;
                };
                let mut pos = r.start;
                while let Some(k) = text[pos..r.end].find(tok) {
                    if k > 0 {
                        next.push(Fragment::Text(pos..pos + k));
                    }
                    next.push(Fragment::Token(id));
                    pos += k + tok.len();
                }
                if pos < r.end {
                    next.push(Fragment::Text(pos..r.end));
                }
            }
            frags = next;
        }
        frags
    }

    proptest::proptest! {
        #[test]
        fn matches_llama_cpp_order(text in "[abc ]{0,40}", parse_special: bool) {
            // Distinct lengths, overlapping in many ways; one control token.
            let v = vocab(&[
                ("b", attr::USER_DEFINED),
                ("ab", attr::USER_DEFINED),
                ("bab", attr::CONTROL),
                ("abab", attr::USER_DEFINED),
                ("aaaaa", attr::USER_DEFINED),
                ("  ", attr::USER_DEFINED),
                ("c", attr::NORMAL),
            ]);
            let m = SpecialMatcher::new(&v);
            let mut got = Vec::new();
            m.partition(&v, &text, parse_special, &mut got);
            proptest::prop_assert_eq!(got, reference(&v, &text, parse_special));
        }
    }

    #[test]
    fn long_whitespace_runs_stay_linear() {
        // Gemma-like: tokens of 2..=31 spaces. A million spaces must not materialise ~30
        // candidates per position.
        let tokens: Vec<String> = (2..=31).map(|n| " ".repeat(n)).collect();
        let spec: Vec<(&str, u16)> = tokens
            .iter()
            .map(|t| (t.as_str(), attr::USER_DEFINED))
            .collect();
        let v = vocab(&spec);
        let m = SpecialMatcher::new(&v);
        let text = " ".repeat(1_000_000);
        let mut out = Vec::new();
        m.partition(&v, &text, false, &mut out);
        // 32,258 runs of 31, then 2 spaces left.
        assert_eq!(out.len(), 1_000_000 / 31 + 1);
        assert_eq!(out.last(), Some(&Fragment::Token(v.lookup("  ").unwrap())));
    }

    #[test]
    fn longer_tokens_take_precedence_over_earlier_shorter_ones() {
        // llama.cpp processes "bcd" (longer) before "ab": in "abcd" it wins although "ab"
        // starts earlier.
        let v = vocab(&[("ab", attr::USER_DEFINED), ("bcd", attr::USER_DEFINED)]);
        assert_eq!(parts(&v, "abcd", false), ["a", "[bcd]"]);
        assert_eq!(parts(&v, "abab", false), ["[ab]", "[ab]"]);
    }
}
