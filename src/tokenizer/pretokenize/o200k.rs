//! The case-aware pre-tokenizers llama.cpp runs through `std::regex` on the collapsed text
//! (every non-ASCII codepoint replaced by one byte for its Unicode category):
//! - `gpt-4o` (o200k: GPT-4o, Phi-4-mini, gpt-oss, Llama 4) and `tekken` (Mistral Nemo):
//!   `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(contraction)?|
//!   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(contraction)?|\p{N}{1,3}|
//!   ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+` (tekken: no contractions, `\p{N}`);
//! - `deepseek-v3`'s third regex: `[ASCII punctuation][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?
//!   [\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//!
//! Each is matched as ECMAScript does (leftmost match, alternatives in order, greedy with
//! backtracking); text no alternative matches stays together as one piece, as between
//! `std::regex_iterator` matches. On the collapsed text every non-ASCII letter is both "not
//! a-z" and "not A-Z", every non-ASCII whitespace is `\s`, and the classes below say the same
//! on codepoints.

use super::{Emitter, APOSTROPHE, CR, LF, SPACE};
use crate::tokenizer::unicode::{cpt_flags, CptFlags};

/// The category a non-ASCII codepoint collapses to (`None`: whitespace, collapsed to `\v`).
#[inline]
fn collapsed(c: u32) -> Option<u16> {
    let f = cpt_flags(c);
    (!f.is_whitespace()).then(|| f.category())
}

#[inline]
fn is_l(c: u32) -> bool {
    if c < 128 {
        return (c as u8).is_ascii_alphabetic();
    }
    collapsed(c) == Some(CptFlags::LETTER)
}

#[inline]
fn is_n(c: u32) -> bool {
    if c < 128 {
        return (c as u8).is_ascii_digit();
    }
    collapsed(c) == Some(CptFlags::NUMBER)
}

#[inline]
fn is_m(c: u32) -> bool {
    c >= 128 && collapsed(c) == Some(CptFlags::ACCENT_MARK)
}

/// `[\p{P}\p{S}]`: all of ASCII's punctuation and symbols, or a non-ASCII one.
#[inline]
fn is_ps(c: u32) -> bool {
    if c < 128 {
        return (c as u8).is_ascii_punctuation();
    }
    matches!(
        collapsed(c),
        Some(CptFlags::PUNCTUATION) | Some(CptFlags::SYMBOL)
    )
}

#[inline]
fn is_s(c: u32) -> bool {
    cpt_flags(c).is_whitespace()
}

/// `\p{L}` and not `[a-z]`.
#[inline]
fn is_upper(c: u32) -> bool {
    is_l(c) && !(b'a' as u32..=b'z' as u32).contains(&c)
}

/// `\p{L}` and not `[A-Z]`.
#[inline]
fn is_lower(c: u32) -> bool {
    is_l(c) && !(b'A' as u32..=b'Z' as u32).contains(&c)
}

/// Which of the case-aware regexes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum CaseRegex {
    Gpt4o,
    Tekken,
}

/// Split with `regex`: matches and the text between them, each a piece.
pub(super) fn split_case(
    regex: CaseRegex,
    cpts: &[u32],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
) {
    split_matches(cpts, ini, end, out, |c, pos| match_case(regex, c, pos));
}

/// deepseek-v3's third regex, split as [`split_case`] does.
pub(super) fn split_deepseek3(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    split_matches(cpts, ini, end, out, match_deepseek3);
}

/// Split at the matches of `find` (the end of a match at `pos` of the text `c`, if one starts
/// there): each match and the text between them a piece.
fn split_matches(
    cpts: &[u32],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
    find: impl Fn(&[u32], usize) -> Option<usize>,
) {
    let c = &cpts[..end];
    let mut em = Emitter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        match find(c, pos) {
            Some(e) => {
                em.add(pos);
                em.add(e);
                pos = e;
            }
            None => pos += 1,
        }
    }
    em.add(end);
}

/// Length of the run of `class` from `p` (the text ends at `c.len()`).
#[inline]
fn run(c: &[u32], p: usize, class: fn(u32) -> bool) -> usize {
    c[p.min(c.len())..]
        .iter()
        .take_while(|&&x| class(x))
        .count()
}

#[inline]
fn at(c: &[u32], p: usize, class: fn(u32) -> bool) -> bool {
    c.get(p).is_some_and(|&x| class(x))
}

/// Where ` ?X` (`X` the class) starts its `X`s at `p`: after a space that one follows, at `p`
/// when one stands there, else `None`.
#[inline]
fn opt_space(c: &[u32], p: usize, class: fn(u32) -> bool) -> Option<usize> {
    if c[p] == SPACE && at(c, p + 1, class) {
        Some(p + 1)
    } else if class(c[p]) {
        Some(p)
    } else {
        None
    }
}

/// `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?` at `p`: where it ends.
fn contraction(c: &[u32], p: usize) -> usize {
    if c.get(p) != Some(&APOSTROPHE) {
        return p;
    }
    let lo = |i: usize| {
        c.get(i).map(|&x| {
            if x < 128 {
                (x as u8).to_ascii_lowercase()
            } else {
                0
            }
        })
    };
    match (lo(p + 1), lo(p + 2)) {
        (Some(b's' | b't' | b'm' | b'd'), _) => p + 2,
        (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => p + 3,
        _ => p,
    }
}

/// The whitespace alternatives `\s*[\r\n]+|\s+(?!\S)|\s+` at `p`.
fn match_space(c: &[u32], p: usize) -> Option<usize> {
    let w = run(c, p, is_s);
    if w == 0 {
        return None;
    }
    // \s*[\r\n]+: up to the last line break of the run.
    if let Some(last) = c[p..p + w].iter().rposition(|&x| x == CR || x == LF) {
        return Some(p + last + 1);
    }
    // \s+(?!\S): all of it at the end of the text, else all but the last.
    if p + w == c.len() || w == 1 {
        // (w == 1 before a non-space: \s+(?!\S) fails, \s+ takes it.)
        return Some(p + w);
    }
    Some(p + w - 1)
}

fn match_case(regex: CaseRegex, c: &[u32], p: usize) -> Option<usize> {
    let contractions = regex == CaseRegex::Gpt4o;
    let pre = |x: u32| x != CR && x != LF && !is_l(x) && !is_n(x);
    // [^\r\n\p{L}\p{N}]? then the letters; without the optional character the letters
    // cannot start at p (it is no letter), so only the greedy choice can match.
    let q = if pre(c[p]) { p + 1 } else { p };
    let u = run(c, q, is_upper);
    // Alternative 1: U* L+ (U* gives back characters until L+ can start).
    for k in (0..=u).rev() {
        if at(c, q + k, is_lower) {
            let e = q + k + run(c, q + k, is_lower);
            return Some(if contractions { contraction(c, e) } else { e });
        }
    }
    // Alternative 2: U+ L* (no L follows here, or alternative 1 would have matched).
    if u > 0 {
        let e = q + u;
        return Some(if contractions { contraction(c, e) } else { e });
    }
    // \p{N}{1,3} (gpt-4o) or \p{N} (tekken).
    let n = run(c, p, is_n);
    if n > 0 {
        return Some(p + n.min(if contractions { 3 } else { 1 }));
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    let other = |x: u32| !is_s(x) && !is_l(x) && !is_n(x);
    let o = opt_space(c, p, other);
    if let Some(o) = o {
        let mut e = o;
        while e < c.len() && other(c[e]) {
            e += 1;
        }
        while e < c.len() && matches!(c[e], CR | LF | 0x2F) {
            e += 1;
        }
        return Some(e);
    }
    match_space(c, p)
}

fn match_deepseek3(c: &[u32], p: usize) -> Option<usize> {
    // [ASCII punctuation][A-Za-z]+
    if c[p] < 128 && (c[p] as u8).is_ascii_punctuation() {
        let r = run(c, p + 1, |x| x < 128 && (x as u8).is_ascii_alphabetic());
        if r > 0 {
            return Some(p + 1 + r);
        }
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    let lm = |x: u32| is_l(x) || is_m(x);
    let pre = |x: u32| x != CR && x != LF && !is_l(x) && !is_ps(x);
    if pre(c[p]) && at(c, p + 1, lm) {
        return Some(p + 1 + run(c, p + 1, lm));
    }
    if lm(c[p]) {
        return Some(p + run(c, p, lm));
    }
    // ` ?[\p{P}\p{S}]+[\r\n]*`
    let o = opt_space(c, p, is_ps);
    if let Some(o) = o {
        let mut e = o + run(c, o, is_ps);
        while e < c.len() && matches!(c[e], CR | LF) {
            e += 1;
        }
        return Some(e);
    }
    match_space(c, p)
}

#[cfg(test)]
mod tests {
    use super::super::tests::words;

    #[test]
    fn gpt4o_splits_camel_case_and_keeps_contractions() {
        assert_eq!(
            words("gpt-4o", "HelloWorld it's 12345 URLs\n\n  x"),
            ["Hello", "World", " it's", " ", "123", "45", " URLs", "\n\n", " ", " x"]
        );
        assert_eq!(words("gpt-4o", "a/b//\n"), ["a", "/b", "//\n"]);
    }

    #[test]
    fn tekken_has_single_digits_and_no_contractions() {
        assert_eq!(
            words("tekken", "HelloWorld it's 123"),
            ["Hello", "World", " it", "'s", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn deepseek3_groups() {
        assert_eq!(
            words("deepseek-v3", "x.foo 12345 日本語カナ!!\n"),
            ["x", ".foo", " ", "123", "45", " ", "日本語カナ", "!!\n"]
        );
    }
}
