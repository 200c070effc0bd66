//! The pre-tokenizer stages beyond the common scanners of `mod.rs`: qwen35's scanner
//! and the class-run regexes of deepseek-llm / deepseek-coder / gemma4, each reproducing what
//! llama.cpp's `unicode_regex_split` computes for the regex (a `std::wregex` over the text with
//! non-ASCII whitespace replaced by U+000B where the regex has no `\p{..}`, else a `std::regex`
//! over the text collapsed to one byte per Unicode category).

use super::{Emitter, Window, CR, LF};
use crate::tokenizer::unicode::{cpt_flags, CptFlags};
use crate::tokenizer::wordpiece::to_lower;

/// `\s` in both regex flavours: ASCII whitespace, and non-ASCII whitespace (collapsed or
/// replaced by U+000B).
#[inline]
fn is_space(c: u32) -> bool {
    cpt_flags(c).is_whitespace()
}

/// A non-ASCII whitespace codepoint: llama.cpp hands `std::wregex` U+000B in its place, so no
/// class of explicit ranges matches it.
#[inline]
fn replaced(c: u32) -> bool {
    c > 0x7F && cpt_flags(c).is_whitespace()
}

/// deepseek-llm's letter class (its regex's explicit ranges).
pub(super) fn ds_letter(c: u32) -> bool {
    !replaced(c)
        && matches!(c,
        0x0041..=0x005A | 0x0061..=0x007A | 0x00B5 | 0x00C0..=0x00D6 | 0x00D8..=0x00F6 |
        0x00F8..=0x01BA | 0x01BC..=0x01BF | 0x01C4..=0x0293 | 0x0295..=0x02AF | 0x0370..=0x0373
        | 0x0376 | 0x0377 | 0x037B..=0x037D | 0x037F | 0x0386 | 0x0388..=0x038A | 0x038C |
        0x038E..=0x03A1 | 0x03A3..=0x03F5 | 0x03F7..=0x0481 | 0x048A..=0x052F | 0x0531..=0x0556
        | 0x10A0..=0x10C5 | 0x13A0..=0x13F5 | 0x13F8..=0x13FD | 0x1C90..=0x1CBA |
        0x1CBD..=0x1CBF | 0x1D00..=0x1D2B | 0x1D6B..=0x1D77 | 0x1D79..=0x1D9A | 0x1E00..=0x1F15
        | 0x1F18..=0x1F1D | 0x1F20..=0x1F45 | 0x1F48..=0x1F4D | 0x1F50..=0x1F57 | 0x1F59 |
        0x1F5B | 0x1F5D | 0x1F5F..=0x1F7D | 0x1F80..=0x1FB4 | 0x1FB6..=0x1FBC | 0x1FBE |
        0x1FC2..=0x1FC4 | 0x1FC6..=0x1FCC | 0x1FD0..=0x1FD3 | 0x1FD6..=0x1FDB | 0x1FE0..=0x1FEC
        | 0x1FF2..=0x1FF4 | 0x1FF6..=0x1FFC | 0x2102 | 0x2107 | 0x210A..=0x2113 | 0x2115 |
        0x2119..=0x211D | 0x2124 | 0x2126 | 0x2128 | 0x212A..=0x212D | 0x212F..=0x2134 | 0x2139
        | 0x213C..=0x213F | 0x2145..=0x2149 | 0x214E | 0x2183 | 0x2184 | 0x2C00..=0x2C7B |
        0x2C7E..=0x2CE4 | 0x2CEB..=0x2CEE | 0x2CF2 | 0x2CF3 | 0xA640..=0xA66D | 0xA680..=0xA69B
        | 0xA722..=0xA76F | 0xA771..=0xA787 | 0xA78B..=0xA78E | 0xAB70..=0xABBF |
        0xFB00..=0xFB06 | 0xFB13..=0xFB17 | 0xFF21..=0xFF3A | 0xFF41..=0xFF5A |
        0x10400..=0x1044F | 0x104B0..=0x104D3 | 0x104D8..=0x104FB | 0x10C80..=0x10CB2 |
        0x10CC0..=0x10CF2 | 0x118A0..=0x118DF | 0x1E900..=0x1E943)
}

/// deepseek-llm's punctuation class `[!-/:-~！-／：-～‘-‟　-。]`.
pub(super) fn ds_punct(c: u32) -> bool {
    !replaced(c)
        && matches!(c,
            0x21..=0x2F | 0x3A..=0x7E | 0xFF01..=0xFF0F | 0xFF1A..=0xFF5E | 0x2018..=0x201F
            | 0x3000..=0x3002)
}

/// `[一-龥ࠀ-一가-퟿]` (its first two ranges, U+4E00..U+9FA5 and U+0800..U+4E00, join).
pub(super) fn ds_cjk(c: u32) -> bool {
    !replaced(c) && matches!(c, 0x0800..=0x9FA5 | 0xAC00..=0xD7FF)
}

/// `[一-龥぀-ゟ゠-ヿ]`.
pub(super) fn cjk_kana(c: u32) -> bool {
    !replaced(c) && matches!(c, 0x4E00..=0x9FA5 | 0x3040..=0x30FF)
}

/// `\p{N}{1,3}` as `std::regex` splits with it: each run of (collapsed) numbers cut into
/// threes from the left, the text between runs kept whole.
pub(super) fn number_triples(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut em = Emitter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        if super::is_collapsed_number(cpts[pos]) {
            em.add(pos);
            let mut n = 0;
            while pos < end && n < 3 && super::is_collapsed_number(cpts[pos]) {
                pos += 1;
                n += 1;
            }
            em.add(pos);
        } else {
            pos += 1;
        }
    }
    em.add(end);
}

/// `\p{L}` on the collapsed text: ASCII letters, or a non-whitespace letter.
pub(super) fn collapsed_letter(c: u32) -> bool {
    if c < 128 {
        return (c as u8).is_ascii_alphabetic();
    }
    let f = cpt_flags(c);
    !f.is_whitespace() && f.category() == CptFlags::LETTER
}

/// `\p{P}` on the collapsed text: llama.cpp's ASCII punctuation list, or a non-whitespace
/// punctuation codepoint.
pub(super) fn collapsed_punct(c: u32) -> bool {
    if c < 128 {
        return b"!\"#%&'()*,-./:;?@[\\]_{}".contains(&(c as u8));
    }
    let f = cpt_flags(c);
    !f.is_whitespace() && f.category() == CptFlags::PUNCTUATION
}

/// `\s?[class]+`: leftmost matches, each with the whitespace just before it; the gaps between
/// matches are pieces too.
pub(super) fn space_then_runs(
    cpts: &[u32],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
    class: fn(u32) -> bool,
) {
    let mut em = Emitter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        let start = pos;
        let mut p = if is_space(cpts[pos]) && pos + 1 < end && class(cpts[pos + 1]) {
            pos + 1
        } else if class(cpts[pos]) {
            pos
        } else {
            pos += 1;
            continue;
        };
        while p < end && class(cpts[p]) {
            p += 1;
        }
        em.add(start);
        em.add(p);
        pos = p;
    }
    em.add(end);
}

/// `\s+$`: the whitespace ending the piece is a piece of its own.
pub(super) fn trailing_space(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut q = end;
    while q > ini && is_space(cpts[q - 1]) {
        q -= 1;
    }
    let mut em = Emitter { prev_end: ini, out };
    em.add(q);
    em.add(end);
}

/// `[^\n]+|[\n]+` (llama.cpp's `unicode_regex_split_custom_newlines`).
pub(super) fn newline_runs(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut pos = ini;
    while pos < end {
        let nl = cpts[pos] == LF;
        let start = pos;
        while pos < end && (cpts[pos] == LF) == nl {
            pos += 1;
        }
        out.push(pos - start);
    }
}

/// Port of `unicode_regex_split_custom_qwen35`.
pub(super) fn scan_qwen35(cpts: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let w = Window { cpts, ini, end };
    let mark = |f: CptFlags| f.category() == CptFlags::ACCENT_MARK;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d), then:
    w.scan(out, to_lower, |em, mut pos, cpt, flags| {
        // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
        if !(cpt == CR || cpt == LF || flags.is_number()) {
            let f1 = w.flags(pos + 1);
            if flags.is_letter() || mark(flags) || mark(f1) || f1.is_letter() {
                pos += 1;
                while w.flags(pos).is_letter() || mark(w.flags(pos)) {
                    pos += 1;
                }
                em.add(pos);
                return pos;
            }
        }

        // \p{N}
        if flags.is_number() {
            pos += 1;
            em.add(pos);
            return pos;
        }

        // <space>?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
        let flags2 = w.flags_past_space(pos);
        let other = |f: CptFlags| {
            !(f.is_whitespace() || f.is_letter() || mark(f) || f.is_number()) && f.any()
        };
        pos = if other(flags2) && flags.any() {
            w.line_breaks(w.space_then_run(pos, cpt, other))
        } else {
            // \s*[\r\n]+|\s+(?!\S)|\s+, or one codepoint
            w.whitespace_tail(pos, true)
        };
        em.add(pos);
        pos
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::words;

    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        // U+0301 (combining acute) continues the word; qwen2 would split it off.
        assert_eq!(
            words("qwen35", "cafe\u{301} 12"),
            ["cafe\u{301}", " ", "1", "2"]
        );
        assert_eq!(words("qwen2", "cafe\u{301}"), ["cafe", "\u{301}"]);
        assert_eq!(words("qwen35", "it's OK!\n"), ["it", "'s", " OK", "!\n"]);
    }

    #[test]
    fn deepseek_llm_classes() {
        assert_eq!(
            words("deepseek-llm", "Hello, world!\n123 日本  "),
            ["Hello", ",", " world", "!", "\n", "123", " ", "日本", "  "]
        );
    }

    #[test]
    fn deepseek_coder_classes() {
        assert_eq!(
            words("deepseek-coder", "x = 42;\n"),
            ["x", " = ", "4", "2", ";", "\n"]
        );
    }

    #[test]
    fn falcon_isolates_backticks() {
        assert_eq!(words("falcon", "a`b"), ["a", "`", "b"]);
    }

    #[test]
    fn gemma4_splits_only_at_newlines() {
        assert_eq!(words("gemma4", "a b\n\nc"), ["a b", "\n\n", "c"]);
    }
}
