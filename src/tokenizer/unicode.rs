//! Codepoint classification (letter / number / whitespace / ...) and the GPT-2 byte-to-unicode
//! mapping, exactly as the reference tokenizer (llama.cpp's `unicode.cpp`) defines them.

use super::unicode_data::{CATEGORY_RANGES, WHITESPACE};

/// Category and whitespace bits of one codepoint, laid out like llama.cpp's `unicode_cpt_flags`.
/// `0` means "out of range" (past the end of the text being split).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CptFlags(pub u16);

/// `fn $name(self) -> bool`: whether the flag `$flag` is set, for each pair.
macro_rules! flag_tests {
    ($($name:ident: $flag:ident),*) => {$(
        #[inline]
        pub fn $name(self) -> bool {
            self.0 & Self::$flag != 0
        }
    )*};
}

#[allow(dead_code)] // the full bit set, documented; not every bit is tested
impl CptFlags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100;

    flag_tests!(
        is_letter: LETTER,
        is_number: NUMBER,
        is_whitespace: WHITESPACE,
        is_punctuation: PUNCTUATION
    );
    /// Any bit set: every codepoint inside the text has at least one.
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

/// Flags of the ASCII range, computed once at compile time from the same table.
static ASCII_FLAGS: [CptFlags; 128] = {
    let mut out = [CptFlags(0); 128];
    let mut c = 0;
    while c < 128 {
        out[c] = CptFlags(lookup_category(c as u32) as u16 | ascii_ws(c as u32));
        c += 1;
    }
    out
};

const fn ascii_ws(c: u32) -> u16 {
    match c {
        0x09..=0x0D | 0x20 => CptFlags::WHITESPACE,
        _ => 0,
    }
}

/// Binary search for the range holding `cpt` (the table's first entry starts at 0).
const fn lookup_category(cpt: u32) -> u8 {
    let (mut lo, mut hi) = (0usize, CATEGORY_RANGES.len());
    // Invariant: CATEGORY_RANGES[lo].0 <= cpt < CATEGORY_RANGES[hi].0 (hi == len means +inf).
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if CATEGORY_RANGES[mid].0 <= cpt {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    CATEGORY_RANGES[lo].1
}

/// The flags of one codepoint.
#[inline]
pub(crate) fn cpt_flags(cpt: u32) -> CptFlags {
    if cpt < 128 {
        return ASCII_FLAGS[cpt as usize];
    }
    if cpt >= 0x110000 {
        // llama.cpp: codepoints past the table are "undefined".
        return CptFlags(CptFlags::UNDEFINED);
    }
    let ws = if WHITESPACE.binary_search(&cpt).is_ok() {
        CptFlags::WHITESPACE
    } else {
        0
    };
    CptFlags(lookup_category(cpt) as u16 | ws)
}

/// GPT-2's reversible byte -> printable codepoint mapping: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order.
pub(crate) const fn byte_to_unicode_table() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        let cp = if printable {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        out[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    out
}

pub(crate) static BYTE_TO_UNICODE: [char; 256] = byte_to_unicode_table();

/// The inverse of [`BYTE_TO_UNICODE`], indexed by codepoint (all images are below U+0144).
static UNICODE_TO_BYTE: [i16; 0x144] = {
    let mut out = [-1i16; 0x144];
    let table = byte_to_unicode_table();
    let mut b = 0;
    while b < 256 {
        out[table[b] as usize] = b as i16;
        b += 1;
    }
    out
};

/// The byte whose image is `c`, or `None` for codepoints that are not a byte's image.
#[inline]
pub(crate) fn unicode_to_byte(c: char) -> Option<u8> {
    match UNICODE_TO_BYTE.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted() {
        assert!(CATEGORY_RANGES.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(WHITESPACE.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(CATEGORY_RANGES[0].0, 0);
    }

    #[test]
    fn categories_of_known_codepoints() {
        assert!(cpt_flags('a' as u32).is_letter());
        assert!(cpt_flags('Z' as u32).is_letter());
        assert!(cpt_flags('7' as u32).is_number());
        assert!(cpt_flags(' ' as u32).is_whitespace());
        assert!(cpt_flags('\n' as u32).is_whitespace());
        assert!(cpt_flags('!' as u32).is_punctuation());
        assert!(cpt_flags('é' as u32).is_letter());
        assert!(cpt_flags('日' as u32).is_letter());
        assert!(cpt_flags('²' as u32).is_number());
        assert!(cpt_flags('\u{3000}' as u32).is_whitespace());
        assert!(cpt_flags('\u{00A0}' as u32).is_whitespace());
        assert_eq!(cpt_flags('+' as u32).category(), CptFlags::SYMBOL);
        assert_eq!(cpt_flags('😀' as u32).category(), CptFlags::SYMBOL);
        assert_eq!(
            cpt_flags('\u{0301}' as u32).category(),
            CptFlags::ACCENT_MARK
        );
    }

    #[test]
    fn byte_mapping_round_trips() {
        assert_eq!(BYTE_TO_UNICODE[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_UNICODE[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_UNICODE[0], 'Ā');
        assert_eq!(BYTE_TO_UNICODE[b'a' as usize], 'a');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_UNICODE[b as usize];
            assert!(seen.insert(c));
            assert_eq!(unicode_to_byte(c), Some(b));
        }
        assert_eq!(unicode_to_byte('日'), None);
    }
}
