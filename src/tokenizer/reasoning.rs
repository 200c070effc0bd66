//! Separating a thinking model's reasoning from its answer, on text pieces as they stream.
//!
//! Two styles, picked from the chat template as llama.cpp does:
//!
//! - [`ReasoningStyle::Think`] (qwen3, deepseek-r1, ...): the answer starts with
//!   `<think>...</think>`; what is inside is reasoning, what follows is content. The template
//!   may open `<think>` in the prompt itself ("thinking forced open"): then the answer starts
//!   inside the reasoning, and an answer that never closes it is all reasoning. Only a `<think>`
//!   at the start (after white space) opens reasoning; later ones are content. Reasoning is
//!   trimmed of white space at both ends, and the white space after `</think>` is dropped,
//!   as llama.cpp does.
//! - [`ReasoningStyle::Harmony`] (gpt-oss): the answer is a run of messages
//!   `<|channel|>NAME<|message|>BODY<|end|>`, each after the first headed by
//!   `<|start|>assistant`. The `analysis` channel is reasoning, `final` is content. Other
//!   channels (`commentary`, where harmony puts tool calls) are passed through as content
//!   whole, header and end marker included, so nothing is lost; their tool calls are not
//!   parsed here.
//!
//! The concatenation of every piece gives the same split whatever the pieces' boundaries.

/// How a model marks its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningStyle {
    /// No reasoning markup: everything is content.
    None,
    /// `<think>...</think>` before the answer.
    Think,
    /// OpenAI's harmony channels.
    Harmony,
}

impl ReasoningStyle {
    /// The style a chat template's text speaks.
    pub fn from_template(template: &str) -> ReasoningStyle {
        if template.contains("<|channel|>") {
            ReasoningStyle::Harmony
        } else if template.contains("<think>") || template.contains("</think>") {
            ReasoningStyle::Think
        } else {
            ReasoningStyle::None
        }
    }
}

/// Whether a rendered prompt leaves `<think>` open, so the answer starts inside the reasoning.
pub fn thinking_forced_open(style: ReasoningStyle, prompt: &str) -> bool {
    style == ReasoningStyle::Think && prompt.trim_end().ends_with(THINK_OPEN)
}

/// Text released by one step of a [`ReasoningSplitter`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const H_START: &str = "<|start|>";
const H_CHANNEL: &str = "<|channel|>";
const H_MESSAGE: &str = "<|message|>";
const H_ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
/// A harmony header longer than this is not one: it is passed through as content.
const H_HEADER_MAX: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Think: before anything but white space has been seen.
    ThinkStart,
    /// Think: inside the reasoning; `fresh` until its first non-space character.
    ThinkReasoning { fresh: bool },
    /// Think: after `</think>`, dropping white space until the content starts.
    ThinkAfter,
    /// Everything left is content.
    Content,
    /// Harmony: reading a message header.
    Header,
    /// Harmony: inside a message body.
    Body(Channel),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Channel {
    Reasoning,
    Content,
    /// Passed through with its markup.
    Raw,
}

/// Splits a streamed answer into reasoning and content. Text that may be the start of a
/// marker is held until the next piece (or [`ReasoningSplitter::finish`]) decides it.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    state: State,
    buf: String,
}

impl ReasoningSplitter {
    /// `forced_open`: the prompt left `<think>` open ([`thinking_forced_open`]).
    pub fn new(style: ReasoningStyle, forced_open: bool) -> ReasoningSplitter {
        let state = match style {
            ReasoningStyle::None => State::Content,
            ReasoningStyle::Think if forced_open => State::ThinkReasoning { fresh: true },
            ReasoningStyle::Think => State::ThinkStart,
            ReasoningStyle::Harmony => State::Header,
        };
        ReasoningSplitter {
            state,
            buf: String::new(),
        }
    }

    /// Add a piece of the answer; what it decides is appended to `out`.
    pub fn push(&mut self, piece: &str, out: &mut Split) {
        self.buf.push_str(piece);
        self.run(false, out);
    }

    /// End of the answer: release what is held.
    pub fn finish(&mut self, out: &mut Split) {
        self.run(true, out);
    }

    fn run(&mut self, end: bool, out: &mut Split) {
        loop {
            let progressed = match self.state {
                State::Content => {
                    out.content.push_str(&self.buf);
                    self.buf.clear();
                    false
                }
                State::ThinkStart => self.think_start(end),
                State::ThinkReasoning { fresh } => self.think_reasoning(fresh, end, out),
                State::ThinkAfter => {
                    let rest = self.buf.trim_start();
                    if rest.is_empty() {
                        self.buf.clear();
                        false
                    } else {
                        self.buf.drain(..self.buf.len() - rest.len());
                        self.state = State::Content;
                        true
                    }
                }
                State::Header => self.header(end, out),
                State::Body(ch) => self.body(ch, end, out),
            };
            if !progressed {
                return;
            }
        }
    }

    fn think_start(&mut self, end: bool) -> bool {
        let rest = self.buf.trim_start();
        if let Some(after) = rest.strip_prefix(THINK_OPEN) {
            let skip = self.buf.len() - after.len();
            self.buf.drain(..skip);
            self.state = State::ThinkReasoning { fresh: true };
            return true;
        }
        if !end && THINK_OPEN.starts_with(rest) {
            return false; // undecided (white space or a part of `<think>`)
        }
        self.state = State::Content;
        true
    }

    fn think_reasoning(&mut self, fresh: bool, end: bool, out: &mut Split) -> bool {
        if fresh {
            let rest = self.buf.trim_start();
            if rest.is_empty() {
                self.buf.clear();
                return false;
            }
            self.buf.drain(..self.buf.len() - rest.len());
            self.state = State::ThinkReasoning { fresh: false };
        }
        if let Some(at) = self.buf.find(THINK_CLOSE) {
            out.reasoning.push_str(self.buf[..at].trim_end());
            self.buf.drain(..at + THINK_CLOSE.len());
            self.state = State::ThinkAfter;
            return true;
        }
        if end {
            // Never closed: all of it was reasoning.
            out.reasoning.push_str(self.buf.trim_end());
            self.buf.clear();
            return false;
        }
        // Hold trailing white space and a part of `</think>` after it.
        let keep = held_tail(&self.buf, &[THINK_CLOSE], true);
        out.reasoning.push_str(&self.buf[..keep]);
        self.buf.drain(..keep);
        false
    }

    fn header(&mut self, end: bool, out: &mut Split) -> bool {
        let consistent = |s: &str| {
            let s = s.strip_prefix(H_START).unwrap_or(s);
            let s = s.strip_prefix("assistant").unwrap_or(s);
            s.starts_with(H_CHANNEL)
                || H_CHANNEL.starts_with(s)
                || (H_START.starts_with(s) || "assistant".starts_with(s))
        };
        if let Some(at) = self.buf.find(H_MESSAGE) {
            let header_len = at + H_MESSAGE.len();
            if consistent(&self.buf[..at]) && at <= H_HEADER_MAX {
                let header = &self.buf[..at];
                let channel = header
                    .find(H_CHANNEL)
                    .map(|i| &header[i + H_CHANNEL.len()..])
                    .map(|c| c.split([' ', '<']).next().unwrap_or(""))
                    .unwrap_or("");
                let ch = match channel {
                    "analysis" => Channel::Reasoning,
                    "final" => Channel::Content,
                    _ => Channel::Raw,
                };
                if ch == Channel::Raw {
                    out.content.push_str(&self.buf[..header_len]);
                }
                self.buf.drain(..header_len);
                self.state = State::Body(ch);
                return true;
            }
        } else if !end && consistent(&self.buf) && self.buf.len() <= H_HEADER_MAX {
            return false; // still reading a header
        }
        if self.buf.is_empty() {
            return false;
        }
        // Not a harmony header: the rest is content as it is.
        self.state = State::Body(Channel::Raw);
        true
    }

    fn body(&mut self, ch: Channel, end: bool, out: &mut Split) -> bool {
        let found = H_ENDS
            .iter()
            .filter_map(|m| self.buf.find(m).map(|at| (at, m.len())))
            .min();
        let sink = |out: &mut Split, s: &str| match ch {
            Channel::Reasoning => out.reasoning.push_str(s),
            Channel::Content | Channel::Raw => out.content.push_str(s),
        };
        if let Some((at, len)) = found {
            let upto = if ch == Channel::Raw { at + len } else { at };
            sink(out, &self.buf[..upto]);
            self.buf.drain(..at + len);
            self.state = State::Header;
            return true;
        }
        let keep = if end {
            self.buf.len()
        } else {
            held_tail(&self.buf, &H_ENDS, false)
        };
        sink(out, &self.buf[..keep]);
        self.buf.drain(..keep);
        false
    }
}

/// The length of `s` that can be released: the rest may be the start of one of `markers`
/// (with `spaces`, after white space, which is held too).
fn held_tail(s: &str, markers: &[&str], spaces: bool) -> usize {
    let mut cut = s.len();
    // The longest suffix that is a proper prefix of a marker.
    for (i, _) in s.char_indices() {
        let tail = &s[i..];
        if markers.iter().any(|m| m.starts_with(tail)) {
            cut = i;
            break;
        }
    }
    if spaces {
        let head = s[..cut].trim_end();
        cut = head.len();
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_whole(style: ReasoningStyle, forced: bool, text: &str) -> Split {
        let mut s = ReasoningSplitter::new(style, forced);
        let mut out = Split::default();
        s.push(text, &mut out);
        s.finish(&mut out);
        out
    }

    /// The text cut at every character boundary, one and two cuts, and one character a piece,
    /// gives the same split as the whole.
    fn check(style: ReasoningStyle, forced: bool, text: &str, reasoning: &str, content: &str) {
        let whole = split_whole(style, forced, text);
        assert_eq!(
            (whole.reasoning.as_str(), whole.content.as_str()),
            (reasoning, content),
            "{text:?}"
        );
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let mut cuts: Vec<Vec<usize>> = bounds.iter().map(|&i| vec![i]).collect();
        for &i in &bounds {
            for &j in bounds.iter().filter(|&&j| j >= i) {
                cuts.push(vec![i, j]);
            }
        }
        cuts.push(bounds.clone());
        for cut in cuts {
            let mut s = ReasoningSplitter::new(style, forced);
            let mut out = Split::default();
            let mut from = 0;
            for &c in &cut {
                let mut step = Split::default();
                s.push(&text[from..c], &mut step);
                out.reasoning.push_str(&step.reasoning);
                out.content.push_str(&step.content);
                from = c;
            }
            s.push(&text[from..], &mut out);
            s.finish(&mut out);
            assert_eq!(out, whole, "{text:?} cut at {cut:?}");
        }
    }

    #[test]
    fn style_from_template() {
        assert_eq!(
            ReasoningStyle::from_template("{{ '<|start|>assistant<|channel|>final' }}"),
            ReasoningStyle::Harmony
        );
        assert_eq!(
            ReasoningStyle::from_template("{% if x %}<think>\n{% endif %}"),
            ReasoningStyle::Think
        );
        assert_eq!(
            ReasoningStyle::from_template("{{ content.split('</think>')[-1] }}"),
            ReasoningStyle::Think
        );
        assert_eq!(
            ReasoningStyle::from_template("<|im_start|>"),
            ReasoningStyle::None
        );
        assert!(thinking_forced_open(
            ReasoningStyle::Think,
            "<｜Assistant｜><think>\n"
        ));
        assert!(!thinking_forced_open(
            ReasoningStyle::Think,
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!thinking_forced_open(ReasoningStyle::None, "<think>"));
    }

    #[test]
    fn think_tags() {
        use ReasoningStyle::Think;
        check(
            Think,
            false,
            "<think>\nhmm, 2+2 é\n</think>\n\nIt is 4.",
            "hmm, 2+2 é",
            "It is 4.",
        );
        check(Think, false, "  <think>a < b</think>ok", "a < b", "ok");
        check(Think, false, "<think></think>\n\nok", "", "ok");
        check(
            Think,
            false,
            "Plain answer <think>x</think>",
            "",
            "Plain answer <think>x</think>",
        );
        check(Think, false, " <thin", "", " <thin");
        check(Think, false, "", "", "");
        check(
            Think,
            false,
            "<think>still thinking  ",
            "still thinking",
            "",
        );
        check(Think, false, "<think>a</think>b</think>", "a", "b</think>");
        check(
            Think,
            false,
            "<think>x </thinking> y</think> z",
            "x </thinking> y",
            "z",
        );
    }

    #[test]
    fn think_forced_open() {
        use ReasoningStyle::Think;
        check(
            Think,
            true,
            "\nstep 1\n</think>\n\nanswer",
            "step 1",
            "answer",
        );
        check(Think, true, "never closed <", "never closed <", "");
        check(Think, true, "</think>answer", "", "answer");
        check(Think, true, "<think>odd</think>a", "<think>odd", "a");
    }

    #[test]
    fn harmony_channels() {
        use ReasoningStyle::Harmony;
        check(
            Harmony,
            false,
            "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4 é",
            "User asks 2+2.",
            "4 é",
        );
        check(
            Harmony,
            false,
            "<|channel|>final<|message|>just this<|return|>",
            "",
            "just this",
        );
        check(
            Harmony,
            false,
            "<|channel|>analysis<|message|>cut off",
            "cut off",
            "",
        );
        // Tool calls (commentary) are passed through whole.
        let call =
            "<|channel|>commentary to=functions.get<|constrain|>json<|message|>{\"a\":1}<|call|>";
        check(
            Harmony,
            false,
            &format!("<|channel|>analysis<|message|>need a tool<|end|><|start|>assistant{call}"),
            "need a tool",
            &format!("<|start|>assistant{call}"),
        );
        // Text that is not harmony is content as it is.
        check(
            Harmony,
            false,
            "Hello <|end|> there",
            "",
            "Hello <|end|> there",
        );
        check(Harmony, false, "<|chan", "", "<|chan");
        check(
            Harmony,
            false,
            "<|channel|>analysis",
            "",
            "<|channel|>analysis",
        );
    }

    #[test]
    fn none_is_content() {
        check(
            ReasoningStyle::None,
            false,
            "<think>x</think>y",
            "",
            "<think>x</think>y",
        );
    }
}
