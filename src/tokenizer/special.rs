//! Splitting text around special tokens before the model tokenizer runs:
//! llama.cpp's `tokenizer_st_partition`.
//!
//! Candidates are the control, user-defined and unknown tokens. llama.cpp takes them longest
//! text first and, for each, cuts every occurrence out of the remaining raw-text fragments
//! (leftmost first, non-overlapping). User-defined tokens are always cut; control and unknown
//! ones only when `parse_special` is set.
//!
//! Instead of one `find` pass per candidate (Gemma has ~6,400), we find every occurrence of
//! every candidate with one trie walk per position, then replay llama.cpp's order on that
//! small list: an occurrence is accepted if it overlaps nothing accepted before it.

use std::collections::BTreeMap;
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
    /// `(token id, priority)` if a candidate's text ends here; lower priority goes first.
    token: Option<(u32, u32)>,
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
        for (priority, &id) in ids.iter().enumerate() {
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
            nodes[at].token = Some((id, priority as u32));
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
        // Every occurrence of every eligible candidate: (priority, start, end, id).
        let mut found: Vec<(u32, usize, usize, u32)> = Vec::new();
        for start in 0..bytes.len() {
            if !self.first_byte[bytes[start] as usize] {
                continue;
            }
            let mut at = 0usize;
            for (k, &b) in bytes[start..].iter().enumerate() {
                match self.nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => at = self.nodes[at].children[i].1 as usize,
                    Err(_) => break,
                }
                if let Some((id, priority)) = self.nodes[at].token {
                    let skip = !parse_special && vocab.has_attr(id, attr::CONTROL | attr::UNKNOWN);
                    if !skip {
                        found.push((priority, start, start + k + 1, id));
                    }
                }
            }
        }

        // Replay: candidates in priority order, each one's occurrences left to right.
        found.sort_unstable();
        let mut accepted: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for &(_, start, end, id) in &found {
            let overlaps = accepted
                .range(..end)
                .next_back()
                .is_some_and(|(_, &(prev_end, _))| prev_end > start);
            if !overlaps {
                accepted.insert(start, (end, id));
            }
        }

        let mut pos = 0;
        for (start, (end, id)) in accepted {
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

    #[test]
    fn longer_tokens_take_precedence_over_earlier_shorter_ones() {
        // llama.cpp processes "bcd" (longer) before "ab": in "abcd" it wins although "ab"
        // starts earlier.
        let v = vocab(&[("ab", attr::USER_DEFINED), ("bcd", attr::USER_DEFINED)]);
        assert_eq!(parts(&v, "abcd", false), ["a", "[bcd]"]);
        assert_eq!(parts(&v, "abab", false), ["[ab]", "[ab]"]);
    }
}
