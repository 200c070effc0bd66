//! llama.cpp's GBNF grammars, translated to the Lark dialect llguidance compiles.
//!
//! GBNF: rules `name ::= body`, where a body is a sequence of alternatives (`|`) of string
//! literals (`"..."` with `\n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH` escapes), character classes
//! (`[a-z]`, `[^"\\]`), `.` (any character), rule references, groups `( ... )` and the
//! repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`; `#` starts a comment; a rule
//! may span lines; `root` is where parsing starts.
//!
//! Each rule becomes one Lark rule on one line. Rule names are lowered (Lark reads capitalised
//! names as terminals) and kept unique; `root` becomes `start`. Literals become JSON-escaped
//! Lark strings, classes and `.` become `/.../` regexes with every non-alphanumeric character
//! written as `\x{..}`. Token references (`<[1000]>`, `<|tok|>`), which only recent llama.cpp
//! has, are refused by name.

use std::collections::{HashMap, HashSet};

use super::GrammarError;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Define,
    /// A string literal, decoded.
    Literal(String),
    /// A character class, as a Rust regex class (`[...]`).
    Class(String),
    Any,
    Open,
    Close,
    Bar,
    /// `*`, `+`, `?` or `{m,n}`, as written in Lark.
    Repeat(String),
}

fn err(line: usize, msg: impl Into<String>) -> GrammarError {
    GrammarError::Gbnf {
        line,
        msg: msg.into(),
    }
}

/// Translate a GBNF grammar to Lark.
pub fn gbnf_to_lark(src: &str) -> Result<String, GrammarError> {
    let toks = lex(src)?;
    // Split into rules: a rule starts at an identifier followed by `::=`.
    let mut rules: Vec<(String, usize, Vec<Tok>)> = Vec::new();
    let mut defined: HashSet<&str> = HashSet::new();
    let mut i = 0;
    while i < toks.len() {
        let (line, t) = &toks[i];
        let starts_rule =
            matches!(t, Tok::Ident(_)) && matches!(toks.get(i + 1), Some((_, Tok::Define)));
        if starts_rule {
            let Tok::Ident(name) = t else { unreachable!() };
            if !defined.insert(name.as_str()) {
                return Err(err(*line, format!("rule `{name}` is defined twice")));
            }
            rules.push((name.clone(), *line, Vec::new()));
            i += 2;
            continue;
        }
        match rules.last_mut() {
            Some((_, _, body)) => body.push(t.clone()),
            None => return Err(err(*line, "expected a rule (`name ::= ...`)")),
        }
        i += 1;
    }
    if rules.is_empty() {
        return Err(err(1, "the grammar has no rules"));
    }
    if !defined.contains("root") {
        return Err(err(1, "the grammar has no `root` rule"));
    }

    // Lark names: lower case, unique, `root` → `start`.
    let mut names: HashMap<&str, String> = HashMap::new();
    let mut taken: HashSet<String> = HashSet::from(["start".to_string()]);
    for (n, _, _) in &rules {
        let lark = if n == "root" {
            "start".to_string()
        } else {
            let base = n.to_ascii_lowercase().replace('-', "_");
            let mut cand = base.clone();
            let mut k = 1;
            while taken.contains(&cand) {
                cand = format!("{base}_{k}");
                k += 1;
            }
            cand
        };
        taken.insert(lark.clone());
        names.insert(n, lark);
    }

    let mut out = String::new();
    for (name, line, body) in &rules {
        if body.is_empty() {
            return Err(err(*line, format!("rule `{name}` has an empty body")));
        }
        out.push_str(&names[name.as_str()]);
        out.push(':');
        let mut depth = 0usize;
        let mut prev_can_repeat = false;
        for t in body {
            out.push(' ');
            match t {
                Tok::Ident(r) => match names.get(r.as_str()) {
                    Some(l) => out.push_str(l),
                    None => return Err(err(*line, format!("rule `{r}` is not defined"))),
                },
                Tok::Literal(s) => {
                    if s.is_empty() {
                        out.push_str("\"\"");
                    } else {
                        out.push_str(&serde_json::to_string(s).expect("a string serializes"));
                    }
                }
                Tok::Class(c) => {
                    out.push('/');
                    out.push_str(c);
                    out.push('/');
                }
                Tok::Any => out.push_str("/(?s:.)/"),
                Tok::Open => {
                    depth += 1;
                    out.push('(');
                }
                Tok::Close => {
                    depth = depth
                        .checked_sub(1)
                        .ok_or_else(|| err(*line, "`)` without `(`"))?;
                    out.push(')');
                }
                Tok::Bar => out.push('|'),
                Tok::Repeat(r) => {
                    if !prev_can_repeat {
                        return Err(err(*line, format!("`{r}` follows nothing to repeat")));
                    }
                    out.pop();
                    out.push_str(r);
                }
                Tok::Define => unreachable!("split off above"),
            }
            prev_can_repeat = !matches!(t, Tok::Open | Tok::Bar | Tok::Repeat(_));
        }
        if depth != 0 {
            return Err(err(*line, format!("unclosed `(` in rule `{name}`")));
        }
        out.push('\n');
    }
    Ok(out)
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, GrammarError> {
    let cs: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < cs.len() {
        let c = cs[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < cs.len() && cs[i] != '\n' {
                    i += 1;
                }
            }
            ':' if cs[i..].starts_with(&[':', ':', '=']) => {
                out.push((line, Tok::Define));
                i += 3;
            }
            '"' => {
                i += 1;
                let mut s = String::new();
                loop {
                    match cs.get(i) {
                        None | Some('\n') => return Err(err(line, "unterminated string literal")),
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some('\\') => {
                            let (ch, n) = escape(&cs[i..], line)?;
                            s.push(ch);
                            i += n;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                out.push((line, Tok::Literal(s)));
            }
            '[' => {
                i += 1;
                let mut class = String::from("[");
                if cs.get(i) == Some(&'^') {
                    class.push('^');
                    i += 1;
                }
                let mut empty = true;
                loop {
                    let ch = match cs.get(i) {
                        None | Some('\n') => return Err(err(line, "unterminated character class")),
                        Some(']') => {
                            i += 1;
                            break;
                        }
                        Some('\\') => {
                            let (ch, n) = escape(&cs[i..], line)?;
                            i += n;
                            ch
                        }
                        Some(&ch) => {
                            i += 1;
                            ch
                        }
                    };
                    empty = false;
                    push_class_char(&mut class, ch);
                    // A range `a-z` (a `-` before `]` is literal).
                    if cs.get(i) == Some(&'-') && cs.get(i + 1).is_some_and(|&n| n != ']') {
                        i += 1;
                        let hi = match cs.get(i) {
                            Some('\\') => {
                                let (h, n) = escape(&cs[i..], line)?;
                                i += n;
                                h
                            }
                            Some(&h) if h != '\n' => {
                                i += 1;
                                h
                            }
                            _ => return Err(err(line, "unterminated character class")),
                        };
                        if hi < ch {
                            return Err(err(line, format!("bad range {ch:?}-{hi:?} in a class")));
                        }
                        class.push('-');
                        push_class_char(&mut class, hi);
                    }
                }
                if empty {
                    return Err(err(line, "empty character class `[]`"));
                }
                class.push(']');
                out.push((line, Tok::Class(class)));
            }
            '.' => {
                out.push((line, Tok::Any));
                i += 1;
            }
            '(' => {
                out.push((line, Tok::Open));
                i += 1;
            }
            ')' => {
                out.push((line, Tok::Close));
                i += 1;
            }
            '|' => {
                out.push((line, Tok::Bar));
                i += 1;
            }
            '*' | '+' | '?' => {
                out.push((line, Tok::Repeat(c.to_string())));
                i += 1;
            }
            '{' => {
                let end = cs[i..]
                    .iter()
                    .position(|&x| x == '}')
                    .ok_or_else(|| err(line, "unterminated `{`"))?;
                let inner: String = cs[i + 1..i + end].iter().collect();
                out.push((line, Tok::Repeat(repeat(&inner, line)?)));
                i += end + 1;
            }
            '<' | '!' => {
                return Err(err(
                    line,
                    "token references (`<[id]>`, `<|token|>`, `!<...>`) are not supported",
                ))
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < cs.len()
                    && (cs[i].is_ascii_alphanumeric() || cs[i] == '-' || cs[i] == '_')
                {
                    i += 1;
                }
                out.push((line, Tok::Ident(cs[start..i].iter().collect())));
            }
            c => return Err(err(line, format!("unexpected character {c:?}"))),
        }
    }
    Ok(out)
}

/// `{m}`, `{m,}`, `{m,n}`, `{,n}` → the same in Lark (`{0,n}` for `{,n}`).
fn repeat(inner: &str, line: usize) -> Result<String, GrammarError> {
    let num = |s: &str| -> Result<Option<u32>, GrammarError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse::<u32>()
            .map(Some)
            .map_err(|_| err(line, format!("bad repetition `{{{inner}}}`")))
    };
    let (lo, hi) = match inner.split_once(',') {
        None => {
            let n = num(inner)?.ok_or_else(|| err(line, "empty repetition `{}`"))?;
            return Ok(format!("{{{n}}}"));
        }
        Some((a, b)) => (num(a)?.unwrap_or(0), num(b)?),
    };
    match hi {
        Some(h) if h < lo => Err(err(line, format!("bad repetition `{{{inner}}}`"))),
        Some(h) => Ok(format!("{{{lo},{h}}}")),
        None => Ok(format!("{{{lo},}}")),
    }
}

/// A backslash escape at `cs[0] == '\\'`: the character and how many chars it spans.
fn escape(cs: &[char], line: usize) -> Result<(char, usize), GrammarError> {
    let hex = |n: usize| -> Result<(char, usize), GrammarError> {
        let digits: String = cs.iter().skip(2).take(n).collect();
        if digits.len() != n {
            return Err(err(line, "truncated escape"));
        }
        let v = u32::from_str_radix(&digits, 16)
            .map_err(|_| err(line, format!("bad escape `\\{}{digits}`", cs[1])))?;
        let ch =
            char::from_u32(v).ok_or_else(|| err(line, format!("U+{v:X} is not a character")))?;
        Ok((ch, 2 + n))
    };
    match cs.get(1) {
        Some('n') => Ok(('\n', 2)),
        Some('t') => Ok(('\t', 2)),
        Some('r') => Ok(('\r', 2)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '/')) => Ok((c, 2)),
        Some(c) => Err(err(line, format!("unknown escape `\\{c}`"))),
        None => Err(err(line, "truncated escape")),
    }
}

fn push_class_char(class: &mut String, ch: char) {
    if ch.is_ascii_alphanumeric() {
        class.push(ch);
    } else {
        class.push_str(&format!("\\x{{{:X}}}", ch as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_the_constructs() {
        let g = r#"
# a comment
root   ::= "{" ws item ("," ws item)* "}"   # trailing comment
item ::= [a-z_]+ | Num | "\"q\"\n"
Num ::= "-"? [0-9]{1,3} ( "." [0-9]{2,} )? .
ws ::= [ \t]{,4}
"#;
        let lark = gbnf_to_lark(g).unwrap();
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(
            lines,
            vec![
                r#"start: "{" ws item ( "," ws item )* "}""#,
                r#"item: /[a-z\x{5F}]/+ | num | "\"q\"\n""#,
                r#"num: "-"? /[0-9]/{1,3} ( "." /[0-9]/{2,} )? /(?s:.)/"#,
                r#"ws: /[\x{20}\x{9}]/{0,4}"#,
            ]
        );
    }

    #[test]
    fn multi_line_rules_and_negated_classes() {
        let g = "root ::= x\n  | \"b\"\nx ::= [^\"\\\\\\x7F]*";
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(lark, "start: x | \"b\"\nx: /[^\\x{22}\\x{5C}\\x{7F}]/*\n");
    }

    #[test]
    fn names_are_lowered_and_unique() {
        let lark =
            gbnf_to_lark("root ::= A a start\nA ::= \"1\"\na ::= \"2\"\nstart ::= \"3\"").unwrap();
        assert_eq!(
            lark,
            "start: a a_1 start_1\na: \"1\"\na_1: \"2\"\nstart_1: \"3\"\n"
        );
    }

    #[test]
    fn errors_name_the_line_and_problem() {
        let e = |g: &str| gbnf_to_lark(g).unwrap_err().to_string();
        assert!(e("item ::= \"a\"").contains("no `root` rule"));
        assert!(e("root ::= \"a\nb\"").contains("line 1: unterminated string"));
        assert!(e("root ::= x").contains("rule `x` is not defined"));
        assert!(
            e("root ::= \"a\"\nroot ::= \"b\"").contains("line 2: rule `root` is defined twice")
        );
        assert!(e("root ::= ( \"a\"").contains("unclosed `(`"));
        assert!(e("root ::= * \"a\"").contains("follows nothing"));
        assert!(e("root ::= <[1000]>").contains("token references"));
        assert!(e("root ::= [z-a]").contains("bad range"));
        assert!(e("root ::= \"a\"{3,1}").contains("bad repetition"));
        assert!(e("root ::= \"\\q\"").contains("unknown escape"));
        assert!(e("\"a\"").contains("expected a rule"));
    }
}
