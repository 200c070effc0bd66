//! A JSON reader for text that is still being generated: it parses a prefix of a JSON value
//! into nodes with their byte spans, marking which are complete, so that a tool call's name can
//! be sent as soon as its string is closed and its arguments as they grow.
//!
//! Strict JSON (RFC 8259) otherwise: anything that cannot be the beginning of a JSON value is an
//! error at a byte offset. Depth is limited ([`MAX_DEPTH`]), so hostile output cannot exhaust
//! the stack.

/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 128;

/// A parsed (possibly partial) value: its bytes are `text[start..end]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub start: usize,
    pub end: usize,
    /// The value is closed (a string's closing quote seen, a number followed by a delimiter).
    pub complete: bool,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// The members whose key is complete, in order (the value is `None` until it begins).
    Object(Vec<(String, Option<Node>)>),
    Array(Vec<Node>),
    /// The decoded characters so far (an escape is decoded once complete).
    Str(String),
    /// A number, `true`, `false` or `null`.
    Scalar,
}

impl Node {
    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.kind {
            Kind::Object(m) => m
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.as_ref()),
            _ => None,
        }
    }

    /// The first key of an object (once complete).
    pub fn first_key(&self) -> Option<&str> {
        match &self.kind {
            Kind::Object(m) => m.first().map(|(k, _)| k.as_str()),
            _ => None,
        }
    }

    /// The decoded string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Why the text is not (the beginning of) JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not JSON at byte {at}: {what}")]
pub struct JsonError {
    pub at: usize,
    pub what: &'static str,
}

/// Parse the value starting at `text[start..]` (after optional whitespace). `Ok(None)`: only
/// whitespace so far. The node's `end` is where the value's bytes end (or the text, if open).
pub fn parse_partial(text: &str, start: usize) -> Result<Option<Node>, JsonError> {
    let mut p = Parser {
        b: text.as_bytes(),
        text,
        i: start,
    };
    p.ws();
    if p.i >= p.b.len() {
        return Ok(None);
    }
    p.value(0).map(Some)
}

struct Parser<'a> {
    b: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err(&self, what: &'static str) -> JsonError {
        JsonError { at: self.i, what }
    }

    fn at_end(&self) -> bool {
        self.i >= self.b.len()
    }

    fn value(&mut self, depth: usize) -> Result<Node, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        let start = self.i;
        match self.b[self.i] {
            b'{' => self.container(start, depth, true),
            b'[' => self.container(start, depth, false),
            b'"' => {
                let (s, complete) = self.string()?;
                Ok(Node {
                    start,
                    end: self.i,
                    complete,
                    kind: Kind::Str(s),
                })
            }
            b't' | b'f' | b'n' => self.literal(start),
            b'-' | b'0'..=b'9' => self.number(start),
            _ => Err(self.err("a value was expected")),
        }
    }

    /// An object (`object`) or an array from its opening bracket.
    fn container(&mut self, start: usize, depth: usize, object: bool) -> Result<Node, JsonError> {
        let close = if object { b'}' } else { b']' };
        let (mut members, mut items) = (Vec::new(), Vec::new());
        let node = |p: &Self, members: Vec<(String, Option<Node>)>, items, complete| Node {
            start,
            end: p.i,
            complete,
            kind: if object {
                Kind::Object(members)
            } else {
                Kind::Array(items)
            },
        };
        self.i += 1;
        loop {
            self.ws();
            if self.at_end() {
                return Ok(node(self, members, items, false));
            }
            if self.b[self.i] == close && members.is_empty() && items.is_empty() {
                self.i += 1;
                return Ok(node(self, members, items, true));
            }
            if object {
                if self.b[self.i] != b'"' {
                    return Err(self.err("a key was expected"));
                }
                let (key, complete) = self.string()?;
                if !complete {
                    return Ok(node(self, members, items, false));
                }
                self.ws();
                if !self.at_end() && self.b[self.i] != b':' {
                    return Err(self.err("`:` was expected"));
                }
                self.i = (self.i + 1).min(self.b.len());
                self.ws();
                if self.at_end() {
                    members.push((key, None));
                    return Ok(node(self, members, items, false));
                }
                let v = self.value(depth + 1)?;
                let done = v.complete;
                members.push((key, Some(v)));
                if !done {
                    return Ok(node(self, members, items, false));
                }
            } else {
                let v = self.value(depth + 1)?;
                let done = v.complete;
                items.push(v);
                if !done {
                    return Ok(node(self, members, items, false));
                }
            }
            self.ws();
            if self.at_end() {
                return Ok(node(self, members, items, false));
            }
            match self.b[self.i] {
                b',' => self.i += 1,
                c if c == close => {
                    self.i += 1;
                    return Ok(node(self, members, items, true));
                }
                _ if object => return Err(self.err("`,` or `}` was expected")),
                _ => return Err(self.err("`,` or `]` was expected")),
            }
        }
    }

    /// A string from its opening quote: the decoded text so far and whether it closed.
    fn string(&mut self) -> Result<(String, bool), JsonError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let Some(rel) = self.b[self.i..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
            else {
                out.push_str(&self.text[self.i..]);
                self.i = self.b.len();
                return Ok((out, false));
            };
            out.push_str(&self.text[self.i..self.i + rel]);
            self.i += rel;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok((out, true));
                }
                b'\\' => match self.escape()? {
                    Some(c) => out.push(c),
                    None => {
                        // An escape cut by the end of the text: decoded once complete.
                        self.i = self.b.len();
                        return Ok((out, false));
                    }
                },
                _ => return Err(self.err("a control character inside a string")),
            }
        }
    }

    /// A backslash escape at `i`: the character, or `None` if the text ends inside it.
    fn escape(&mut self) -> Result<Option<char>, JsonError> {
        let rest = &self.b[self.i + 1..];
        let Some(&c) = rest.first() else {
            return Ok(None);
        };
        let simple = match c {
            b'"' => Some('"'),
            b'\\' => Some('\\'),
            b'/' => Some('/'),
            b'b' => Some('\u{8}'),
            b'f' => Some('\u{c}'),
            b'n' => Some('\n'),
            b'r' => Some('\r'),
            b't' => Some('\t'),
            b'u' => None,
            _ => {
                self.i += 1;
                return Err(self.err("an unknown escape"));
            }
        };
        if let Some(ch) = simple {
            self.i += 2;
            return Ok(Some(ch));
        }
        let Some(hi) = self.hex4(self.i + 2)? else {
            return Ok(None);
        };
        if (0xD800..0xDC00).contains(&hi) {
            // A high surrogate: its low half must follow as `\uXXXX`.
            let j = self.i + 6;
            let tail = &self.b[j.min(self.b.len())..];
            if tail.len() < 2 {
                if tail.is_empty() || tail[0] == b'\\' {
                    return Ok(None);
                }
                self.i = j;
                return Err(self.err("a lone surrogate escape"));
            }
            if tail[0] != b'\\' || tail[1] != b'u' {
                self.i = j;
                return Err(self.err("a lone surrogate escape"));
            }
            let Some(lo) = self.hex4(j + 2)? else {
                return Ok(None);
            };
            if !(0xDC00..0xE000).contains(&lo) {
                self.i = j;
                return Err(self.err("a lone surrogate escape"));
            }
            self.i = j + 6;
            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
            return Ok(char::from_u32(c));
        }
        if (0xDC00..0xE000).contains(&hi) {
            return Err(self.err("a lone surrogate escape"));
        }
        self.i += 6;
        Ok(char::from_u32(hi))
    }

    /// Four hex digits at `at`: the value, or `None` if the text ends first.
    fn hex4(&mut self, at: usize) -> Result<Option<u32>, JsonError> {
        let mut v = 0u32;
        for k in 0..4 {
            let Some(&c) = self.b.get(at + k) else {
                return Ok(None);
            };
            let d = (c as char).to_digit(16).ok_or(JsonError {
                at: at + k,
                what: "a hex digit was expected",
            })?;
            v = v * 16 + d;
        }
        Ok(Some(v))
    }

    fn literal(&mut self, start: usize) -> Result<Node, JsonError> {
        let word: &[u8] = match self.b[start] {
            b't' => b"true",
            b'f' => b"false",
            _ => b"null",
        };
        let have = &self.b[start..(start + word.len()).min(self.b.len())];
        if !word.starts_with(have) {
            self.i = start + have.iter().zip(word).take_while(|(a, b)| a == b).count();
            return Err(self.err("true, false or null was expected"));
        }
        self.i = start + have.len();
        // A literal is complete once spelled out (no longer word can follow in JSON).
        Ok(Node {
            start,
            end: self.i,
            complete: have.len() == word.len(),
            kind: Kind::Scalar,
        })
    }

    fn number(&mut self, start: usize) -> Result<Node, JsonError> {
        // -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?, checked as far as it goes.
        let b = self.b;
        let run = |i: &mut usize| {
            let s = *i;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
            *i - s
        };
        let mut i = start + usize::from(b[start] == b'-');
        // The text ends inside the number (it may still grow).
        let mut open = i == b.len();
        if !open {
            if b[i] == b'0' {
                i += 1;
            } else if run(&mut i) == 0 {
                self.i = i;
                return Err(self.err("a digit was expected"));
            }
        }
        for (marks, signed) in [(&b"."[..], false), (&b"eE"[..], true)] {
            if open || i >= b.len() || !marks.contains(&b[i]) {
                continue;
            }
            i += 1;
            if signed && i < b.len() && (b[i] == b'+' || b[i] == b'-') {
                i += 1;
            }
            if run(&mut i) == 0 {
                if i < b.len() {
                    self.i = i;
                    return Err(self.err("a digit was expected"));
                }
                open = true;
            }
        }
        self.i = i;
        Ok(Node {
            start,
            end: i,
            complete: !open && i < b.len(),
            kind: Kind::Scalar,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Node {
        parse_partial(t, 0).unwrap().unwrap()
    }

    #[test]
    fn complete_values_agree_with_serde() {
        for t in [
            r#"{"name": "f", "arguments": {"a": [1, 2.5e-3, true, null], "b": "x\"y\u00e9\ud83d\ude00"}}"#,
            r#"[{"a":{}},[],"",-0.5,0,false]"#,
            r#""\n\t\\\/\b\f\r""#,
        ] {
            let n = parse(t);
            assert!(n.complete, "{t}");
            assert_eq!(n.end, t.len());
            let v: serde_json::Value = serde_json::from_str(t).unwrap();
            if let serde_json::Value::String(s) = &v {
                assert_eq!(n.as_str(), Some(s.as_str()));
            }
        }
        let n = parse(r#"{"b": "x\"y\u00e9\ud83d\ude00"}"#);
        assert_eq!(n.get("b").unwrap().as_str(), Some("x\"yé😀"));
    }

    #[test]
    fn every_prefix_parses_and_nothing_closes_early() {
        let t = r#"{"name": "get_weather", "arguments": {"city": "Par\u00eds", "days": [1, 23], "ok": true}}"#;
        for cut in 0..t.len() {
            let prefix = &t[..cut];
            match parse_partial(prefix, 0) {
                Ok(Some(n)) => assert!(!n.complete, "{prefix:?} closed early"),
                Ok(None) => assert!(prefix.trim().is_empty()),
                Err(e) => panic!("{prefix:?}: {e}"),
            }
        }
        let n = parse(&t[..t.find("\"arguments").unwrap()]);
        assert_eq!(n.get("name").unwrap().as_str(), Some("get_weather"));
        assert!(n.get("name").unwrap().complete);
        // A key is reported once closed; its value once started.
        let n = parse(r#"{"name": "get_w"#);
        let name = n.get("name").unwrap();
        assert_eq!((name.as_str(), name.complete), (Some("get_w"), false));
        let n = parse(r#"{"name""#);
        assert_eq!(n.first_key(), Some("name"));
        assert!(n.get("name").is_none());
        // Numbers at the end of the text may grow; escapes wait for their last digit.
        assert!(!parse("12").complete);
        assert!(parse("12 ").complete);
        assert_eq!(parse(r#""a\u00"#).as_str(), Some("a"));
        assert_eq!(parse(r#""a\ud83d\ude"#).as_str(), Some("a"));
        assert_eq!(parse(r#""a\"#).as_str(), Some("a"));
    }

    #[test]
    fn malformed_text_is_an_error_not_a_panic() {
        for t in [
            "{name: 1}",
            r#"{"a" 1}"#,
            r#"{"a": 1 "b": 2}"#,
            "[1 2]",
            "tru e",
            "nul!",
            "[01]",
            "-x",
            "1.e5",
            r#""\x""#,
            r#""\u12g4""#,
            r#""\udc00""#,
            r#""\ud83dx""#,
            "\"a\nb\"",
            "}",
            "[1,]",
        ] {
            assert!(parse_partial(t, 0).is_err(), "{t:?} accepted");
        }
        let deep = "[".repeat(MAX_DEPTH + 2);
        assert!(parse_partial(&deep, 0).is_err());
        assert!(parse_partial(&"[".repeat(MAX_DEPTH), 0).is_ok());
        assert_eq!(parse_partial("  \n", 0), Ok(None));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,64}", cut in 0usize..64) {
            let _ = parse_partial(&s, 0);
            let c = s.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(s.len());
            let _ = parse_partial(&s[..c], 0);
        }
    }
}
