//! Harmony's tool calls (gpt-oss): a call is a message addressed to a function,
//!
//! ```text
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>
//! ```
//!
//! (the recipient stands after the channel or before it; `<|start|>assistant` is absent on
//! the answer's first message). The body up to `<|call|>` (or `<|end|>`, or the end of the
//! answer: `<|call|>` ends generation and is not in the text) is the call's arguments. Every
//! other message (analysis, final, commentary without a function recipient, a recipient that
//! is not `functions.*` such as a built-in `browser.search`) is content, markup included, as
//! the reasoning splitter passes it on.

use super::{Mode, ToolCallParser, ToolEvent};

/// The markup of harmony's messages: `<|start|>`, `<|channel|>`, `<|message|>`,
/// `<|constrain|>`, `<|end|>` and `<|call|>`.
pub(super) const MARKERS: [&str; 6] = [
    START,
    CHANNEL,
    MESSAGE,
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
];

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
/// What ends a call's body.
const BODY_ENDS: [&str; 3] = ["<|call|>", "<|end|>", "<|return|>"];
const RECIPIENT: &str = "to=functions.";
/// A header longer than this is not one.
const HEADER_MAX: usize = 256;

/// A message header at the start of `s`.
enum Header {
    /// Not a header (or one too long to be): `s[0]` is content.
    No,
    /// `s` is a header's beginning: wait for more text.
    Partial,
    /// A whole header of `len` bytes (through `<|message|>`), addressed to function `name`
    /// if it is a call.
    Whole { len: usize, call: Option<String> },
}

/// Read a header at the start of `s`: `(<|start|>assistant)? (to=R)? <|channel|>C (to=R)?
/// ... <|message|>`.
fn header(s: &str) -> Header {
    let Some(at) = s.find(MESSAGE) else {
        // A prefix of a header, or of its first marker.
        let consistent = s.starts_with(START)
            || s.starts_with(CHANNEL)
            || START.starts_with(s)
            || CHANNEL.starts_with(s);
        return if consistent && s.len() <= HEADER_MAX {
            Header::Partial
        } else {
            Header::No
        };
    };
    if at > HEADER_MAX {
        return Header::No;
    }
    let head = &s[..at];
    let rest = match head.strip_prefix(START) {
        Some(r) => match r.strip_prefix("assistant") {
            Some(r) => r,
            None => return Header::No,
        },
        None => head,
    };
    if !rest.contains(CHANNEL) {
        return Header::No;
    }
    let call = rest.find(RECIPIENT).and_then(|i| {
        let name: String = rest[i + RECIPIENT.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        (!name.is_empty()).then_some(name)
    });
    Header::Whole {
        len: at + MESSAGE.len(),
        call,
    }
}

/// The first place in `s` where a message header may start.
fn next_header(s: &str) -> Option<usize> {
    [START, CHANNEL].iter().filter_map(|m| s.find(m)).min()
}

/// The length of `s` that cannot be the start of one of `markers`.
fn released(s: &str, markers: &[&str]) -> usize {
    s.char_indices()
        .map(|(i, _)| i)
        .find(|&i| markers.iter().any(|m| m.starts_with(&s[i..])))
        .unwrap_or(s.len())
}

impl ToolCallParser {
    pub(super) fn advance_harmony(&mut self, end: bool, out: &mut Vec<ToolEvent>) {
        loop {
            let progressed = match self.mode {
                Mode::Args { index } => self.harmony_args(index, end, out),
                _ => self.harmony_text(end, out),
            };
            if !progressed {
                return;
            }
        }
    }

    /// Content until a call's header.
    fn harmony_text(&mut self, end: bool, out: &mut Vec<ToolEvent>) -> bool {
        let mut from = self.sent;
        loop {
            let rest = &self.buf[from..];
            let Some(p) = next_header(rest) else {
                let keep = if end {
                    rest.len()
                } else {
                    released(rest, &[START, CHANNEL])
                };
                self.content(from + keep, out);
                return false;
            };
            let at = from + p;
            match header(&self.buf[at..]) {
                Header::Partial if !end => {
                    self.content(at, out);
                    return false;
                }
                Header::Whole {
                    len,
                    call: Some(name),
                } => {
                    self.content(at, out);
                    self.sent = at + len;
                    let index = self.base;
                    self.base += 1;
                    out.push(ToolEvent::Call { index, name });
                    self.mode = Mode::Args { index };
                    return true;
                }
                // Content: a message that is no call (its whole header), or no header.
                Header::Whole { len, call: None } => from = at + len,
                Header::Partial | Header::No => from = at + 1,
            }
        }
    }

    /// A call's arguments, until the body's end.
    fn harmony_args(&mut self, index: usize, end: bool, out: &mut Vec<ToolEvent>) -> bool {
        let rest = &self.buf[self.sent..];
        let found = BODY_ENDS
            .iter()
            .filter_map(|m| rest.find(m).map(|at| (at, m.len())))
            .min();
        let (upto, after) = match found {
            Some((at, len)) => (at, Some(at + len)),
            None if end => (rest.len(), None),
            None => (released(rest, &BODY_ENDS), None),
        };
        if upto > 0 {
            let text = rest[..upto].to_string();
            out.push(ToolEvent::Args { index, text });
        }
        match after {
            Some(n) => {
                self.sent += n;
                self.mode = Mode::Text;
                true
            }
            None => {
                self.sent += upto;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_complete, ToolCallParser, ToolEvent, ToolFormat};

    fn calls(text: &str) -> (Option<String>, Vec<(String, String)>) {
        parse_complete(ToolFormat::Harmony, text)
    }

    /// gpt-oss's template (its lines that write a past call) speaks harmony.
    #[test]
    fn the_gpt_oss_template_is_detected() {
        let tpl = r#"{%- for tool_call in message.tool_calls -%}
            {{- "<|start|>assistant to=" }}
            {{- "functions." + tool_call.name + "<|channel|>commentary " }}
            {{- (tool_call.content_type if tool_call.content_type is defined else "json") + "<|message|>" }}
            {{- tool_call.arguments|tojson }}
            {{- "<|call|>" }}{%- endfor -%}"#;
        assert_eq!(ToolFormat::detect(tpl), Some(ToolFormat::Harmony));
        assert_eq!(
            ToolFormat::detect("<|channel|>final<|message|>{{ content }}"),
            None
        );
    }

    #[test]
    fn a_call_after_the_channel_or_before_it() {
        let after = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        assert_eq!(
            calls(after),
            (
                None,
                vec![("get_weather".into(), "{\"city\":\"Paris\"}".into())]
            )
        );
        let before = "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\":1}<|call|>";
        assert_eq!(
            calls(before),
            (None, vec![("add".into(), "{\"a\":1}".into())])
        );
    }

    #[test]
    fn reasoning_and_other_messages_are_content() {
        let analysis = "<|channel|>analysis<|message|>Need weather.<|end|>";
        let call = "<|start|>assistant<|channel|>commentary to=functions.w <|constrain|>json<|message|>{}<|call|>";
        let (content, c) = calls(&format!("{analysis}{call}"));
        assert_eq!(content.as_deref(), Some(analysis));
        assert_eq!(c, vec![("w".into(), "{}".into())]);
        // A built-in tool's recipient is not a function call; a final answer is content.
        for text in [
            "<|channel|>commentary to=browser.search<|message|>{\"q\":1}<|call|>",
            "<|channel|>final<|message|>It is sunny.",
            "plain text <|channel|> in the middle",
            "<|start|>user<|message|>not ours",
        ] {
            assert_eq!(calls(text), (Some(text.to_string()), vec![]), "{text}");
        }
    }

    /// Fed a byte at a time (where char boundaries allow), the events add up to the same
    /// content and calls, and a call's name goes out before its arguments end.
    #[test]
    fn streamed_in_pieces_gives_the_same_calls() {
        let text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\"}<|call|>";
        let whole = calls(text);
        let mut p = ToolCallParser::new(ToolFormat::Harmony);
        let mut events = Vec::new();
        let mut named_at = None;
        for (i, ch) in text.char_indices() {
            p.push(&ch.to_string(), &mut events);
            if named_at.is_none() && events.iter().any(|e| matches!(e, ToolEvent::Call { .. })) {
                named_at = Some(i);
            }
        }
        p.finish(&mut events);
        assert!(named_at.is_some_and(|i| i < text.find("Zürich").unwrap()));
        let mut content = String::new();
        let mut got: Vec<(String, String)> = Vec::new();
        for e in events {
            match e {
                ToolEvent::Content(c) => content.push_str(&c),
                ToolEvent::Call { index, name } => {
                    assert_eq!(index, got.len());
                    got.push((name, String::new()));
                }
                ToolEvent::Args { index, text } => got[index].1.push_str(&text),
            }
        }
        assert_eq!((Some(content), got), whole);
        assert_eq!(p.calls(), 1);
    }

    #[test]
    fn a_header_cut_off_or_too_long_is_content() {
        let cut = "<|channel|>commentary to=functions.get";
        assert_eq!(calls(cut), (Some(cut.to_string()), vec![]));
        let long = format!("<|channel|>commentary {}<|message|>x", "y".repeat(300));
        assert_eq!(calls(&long), (Some(long.clone()), vec![]));
    }

    #[test]
    fn two_calls_in_one_answer_are_numbered() {
        let one = "<|channel|>commentary to=functions.a<|message|>{}<|call|>";
        let two =
            "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{\"x\":2}<|call|>";
        let (_, c) = calls(&format!("{one}{two}"));
        assert_eq!(
            c,
            vec![("a".into(), "{}".into()), ("b".into(), "{\"x\":2}".into())]
        );
    }
}
