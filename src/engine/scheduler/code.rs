//! llama-server's early ends for code completion (`n_indent`, `t_max_predict_ms`): an editor
//! asks for the rest of a block, and soon.

use std::time::{Duration, Instant};

/// When a code completion ends before its token limit (both `Length`, llama-server's `limit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStops {
    /// A line after the first newline that starts with fewer spaces and tabs than this (an
    /// empty line too) ends the text before its first other character: the block is done
    /// (0: never).
    pub n_indent: usize,
    /// Once this much time has passed since the first token, the text ends at the next token
    /// with a newline after the first newline (that token kept: the text ends at a line's end).
    pub t_max_predict: Option<Duration>,
}

/// A sequence's text so far, against its [`CodeStops`].
#[derive(Debug, Default)]
pub(super) struct CodeWatch {
    stops: CodeStops,
    /// A newline was generated.
    newline: bool,
    /// The last text followed did hold a newline, after an earlier one.
    line_end: bool,
    /// The current line's indentation, while it holds only spaces and tabs (and a newline
    /// came before it).
    indent: Option<usize>,
    /// When the first token was generated.
    first: Option<Instant>,
}

impl CodeWatch {
    pub fn new(stops: CodeStops) -> CodeWatch {
        CodeWatch {
            stops,
            ..CodeWatch::default()
        }
    }

    /// Follow the emitted `text`: the length of it to keep where a line starts too shallow.
    pub fn cut(&mut self, text: &str) -> Option<usize> {
        let nl = text.contains('\n');
        self.line_end = nl && self.newline;
        self.newline |= nl;
        if self.stops.n_indent == 0 {
            return None;
        }
        for (i, c) in text.char_indices() {
            match (c, self.indent) {
                (' ' | '\t', Some(n)) => self.indent = Some(n + 1),
                (_, Some(n)) if n < self.stops.n_indent => return Some(i),
                _ => self.indent = None,
            }
            if c == '\n' {
                self.indent = Some(0);
            }
        }
        None
    }

    /// Whether the time limit has passed (counting from the first call: the first token) and
    /// the last text followed ended a line after the first.
    pub fn timed_out(&mut self) -> bool {
        let Some(limit) = self.stops.t_max_predict else {
            return false;
        };
        let now = Instant::now();
        let first = *self.first.get_or_insert(now);
        self.line_end && now - first > limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text `pieces` keep, emitted one after another.
    fn kept(n_indent: usize, pieces: &[&str]) -> String {
        let mut w = CodeWatch::new(CodeStops {
            n_indent,
            t_max_predict: None,
        });
        let mut out = String::new();
        for p in pieces {
            match w.cut(p) {
                Some(n) => return out + &p[..n],
                None => out.push_str(p),
            }
        }
        out
    }

    #[test]
    fn a_shallow_line_ends_the_block() {
        let body = [
            "x = 1",
            "\n    y",
            " = 2\n",
            "    return y\n",
            "\n",
            "def g():\n",
        ];
        // (The first line is the cursor's: never cut. An empty line is a shallow one, cut
        // before its newline, as llama-server cuts it.)
        assert_eq!(kept(4, &body), "x = 1\n    y = 2\n    return y\n");
        assert_eq!(kept(5, &body), "x = 1\n    ");
        assert_eq!(kept(0, &body), body.concat());
        assert_eq!(kept(4, &["  a\n\t\t\t\tb\n  c"]), "  a\n\t\t\t\tb\n  ");
        assert_eq!(kept(2, &["a\n", " ", " ", "é\n", " ", "ü"]), "a\n  é\n ");
        assert_eq!(kept(1, &["if x:\n"]), "if x:\n");
    }

    #[test]
    fn the_time_limit_counts_after_a_newline() {
        let mut w = CodeWatch::new(CodeStops {
            n_indent: 0,
            t_max_predict: Some(Duration::from_millis(20)),
        });
        assert!(!w.timed_out());
        assert_eq!(w.cut("abc"), None);
        std::thread::sleep(Duration::from_millis(30));
        assert!(!w.timed_out(), "no newline yet");
        assert_eq!(w.cut("d\ne"), None);
        assert!(!w.timed_out(), "the first newline");
        assert_eq!(w.cut("f"), None);
        assert!(!w.timed_out(), "not at a line's end");
        assert_eq!(w.cut("g\n"), None);
        assert!(w.timed_out());
        let mut never = CodeWatch::new(CodeStops::default());
        never.cut("\n");
        assert!(!never.timed_out());
    }
}
