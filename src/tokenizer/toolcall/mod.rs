//! Tool calls in a model's answer: the syntax of each model family and an incremental parser
//! that turns generated text into content and calls as it streams.
//!
//! - [`ToolFormat`]: the families kiln runs, detected from the chat template's source as
//!   llama.cpp's common chat code detects them ([`ToolFormat::detect`]), and llama.cpp's generic
//!   JSON format for templates that know nothing of tools.
//! - [`ToolCallParser`]: fed the answer's text piece by piece, it reports [`ToolEvent`]s:
//!   content, a call's start (with its name) and fragments of its arguments (JSON text), in the
//!   order an OpenAI stream sends them. A call's JSON is read with [`json::parse_partial`], so
//!   its name goes out as soon as its string closes and its arguments as they grow. Text that
//!   turns out not to be a well-formed call (malformed JSON, an object that is not a call, an
//!   answer cut before its call is complete) is content; non-streamed answers are the parser fed
//!   the whole text at once, so they get exactly that.
//! - [`template`]: what a chat template can render (tools, calls, tool results), probed by
//!   rendering it, and the generic format's system preamble and message rewriting.

mod harmony;
pub mod json;
pub mod template;

use json::{parse_partial, Kind, Node};

/// A model family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes 2 Pro, Qwen 2.5 / 3: any text, then `<tool_call>\n{"name": .., "arguments": ..}\n
    /// </tool_call>`, once or more.
    Hermes,
    /// Llama 3.1 and later: the answer is `{"name": .., "parameters": ..}` (after an optional
    /// `<|python_tag|>`), possibly several separated by `;`.
    Llama3,
    /// Mistral (v3, Nemo): `[TOOL_CALLS][{"name": .., "arguments": ..}, ...]`.
    Mistral,
    /// llama.cpp's generic format, for templates without tool support: the answer is one JSON
    /// object, `{"tool_call": {"name", "arguments"}}`, `{"tool_calls": [..]}` or
    /// `{"response": "text"}`.
    Generic,
    /// OpenAI's harmony (gpt-oss): a call is a message to a function,
    /// `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
    /// ARGS<|call|>` (the recipient may also stand before `<|channel|>`).
    Harmony,
    /// No markers: the answer is a call object (`{"name", "arguments" | "parameters"}`, or
    /// OpenAI's `{"type": "function", "function": {..}}`) or a list of them.
    PlainJson,
}

impl ToolFormat {
    /// The native format of a chat template, from its source (llama.cpp's tests: harmony's
    /// `<|channel|>` with calls to `functions.*` for gpt-oss, `<tool_call>` for Hermes / Qwen, `[TOOL_CALLS]` for Mistral, the `ipython` role or `<|python_tag|>` for
    /// Llama 3.x). `None`: no format kiln recognizes.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<|channel|>") && template.contains("functions.") {
            Some(ToolFormat::Harmony)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|start_header_id|>ipython<|end_header_id|>")
            || template.contains("<|python_tag|>")
        {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
            ToolFormat::PlainJson => "json",
            ToolFormat::Harmony => "harmony",
        }
    }

    /// The markup of the format's calls that a vocabulary may hold as control tokens (the
    /// grammar then writes them as those tokens).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::Harmony => &harmony::MARKERS,
            _ => &[],
        }
    }

    /// The text that opens a call, for formats that have one anywhere in the answer.
    pub fn opener(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("<tool_call>"),
            ToolFormat::Mistral => Some("[TOOL_CALLS]"),
            _ => None,
        }
    }

    /// The text that closes a call (after its JSON).
    pub fn closer(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("</tool_call>"),
            _ => None,
        }
    }

    /// The key of a call's arguments in its JSON object.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// What the parser found, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text of the answer that is not a call.
    Content(String),
    /// Call number `index` (from 0, in this answer) begins; its name.
    Call { index: usize, name: String },
    /// More of call `index`'s arguments (the JSON text, or the text of a string-valued one).
    Args { index: usize, text: String },
}

/// Where the parser is in the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Nothing but whitespace yet (formats whose calls open the answer).
    Start,
    /// Content; an opener may follow.
    Text,
    /// A call's JSON from `json`, its markup from `opener` (the whitespace before an opener
    /// included: all of it is content if this is no call); `sure`: it is known to be a call
    /// region (after an explicit opener or a first key naming a call).
    Region {
        opener: usize,
        json: usize,
        sure: bool,
    },
    /// After a Hermes call's JSON (ending at `at`): whitespace, then the closer.
    Closing { at: usize },
    /// After a Llama-3 / plain call (ending at `at`): `;` or whitespace, maybe another call.
    Between { at: usize },
    /// Everything from `sent` on is content.
    ContentOnly,
    /// Harmony: inside call `index`'s arguments.
    Args { index: usize },
}

/// Progress of one call of the current region.
#[derive(Debug, Clone, Default)]
struct Sent {
    header: bool,
    /// Bytes of the arguments' text already sent.
    args: usize,
}

/// The incremental parser of one answer.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolFormat,
    buf: String,
    /// Bytes of `buf` settled (sent as content, or consumed as markup / calls).
    sent: usize,
    mode: Mode,
    /// Calls of earlier regions.
    base: usize,
    /// The calls of the current region.
    region: Vec<Sent>,
    /// Bytes of a generic `response` string already sent.
    response: usize,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> ToolCallParser {
        let mode = match format {
            ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::Harmony => Mode::Text,
            _ => Mode::Start,
        };
        ToolCallParser {
            format,
            buf: String::new(),
            sent: 0,
            mode,
            base: 0,
            region: Vec::new(),
            response: 0,
        }
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.base + self.region.iter().filter(|c| c.header).count()
    }

    /// More of the answer.
    pub fn push(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        self.buf.push_str(text);
        self.advance(false, out);
    }

    /// The answer is complete: settle what was held back.
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        self.advance(true, out);
    }

    fn content(&mut self, to: usize, out: &mut Vec<ToolEvent>) {
        if to > self.sent {
            let piece = &self.buf[self.sent..to];
            match out.last_mut() {
                Some(ToolEvent::Content(c)) => c.push_str(piece),
                _ => out.push(ToolEvent::Content(piece.to_string())),
            }
            self.sent = to;
        }
    }

    /// Everything from `from` on is content.
    fn give_up(&mut self, from: usize, out: &mut Vec<ToolEvent>) {
        self.sent = from;
        self.end_region();
        self.mode = Mode::ContentOnly;
        let end = self.buf.len();
        self.content(end, out);
    }

    fn end_region(&mut self) {
        self.base += self.region.iter().filter(|c| c.header).count();
        self.region.clear();
        self.response = 0;
    }

    fn advance(&mut self, end: bool, out: &mut Vec<ToolEvent>) {
        if self.format == ToolFormat::Harmony {
            return self.advance_harmony(end, out);
        }
        loop {
            let before = (self.mode, self.sent);
            match self.mode {
                Mode::Start => self.start(end, out),
                Mode::Text => self.text(end, out),
                Mode::Region { opener, json, sure } => self.region(opener, json, sure, end, out),
                Mode::Closing { at } => self.closing(at, end),
                Mode::Between { at } => self.between(at, end, out),
                Mode::ContentOnly => {
                    let n = self.buf.len();
                    self.content(n, out);
                }
                // (Only harmony reads arguments this way.)
                Mode::Args { .. } => return self.advance_harmony(end, out),
            }
            if (self.mode, self.sent) == before {
                return;
            }
        }
    }

    fn start(&mut self, end: bool, out: &mut Vec<ToolEvent>) {
        let rest = &self.buf[self.sent..];
        let trimmed = rest.trim_start();
        if trimmed.is_empty() {
            if end {
                let n = self.buf.len();
                self.content(n, out);
            }
            return;
        }
        let at = self.buf.len() - trimmed.len();
        const TAG: &str = "<|python_tag|>";
        let json = match (self.format, trimmed.as_bytes()[0]) {
            (ToolFormat::Llama3, _) if trimmed.starts_with(TAG) => Some(at + TAG.len()),
            (ToolFormat::Llama3, _) if TAG.starts_with(trimmed) && !end => return,
            (ToolFormat::Llama3, b'{') | (ToolFormat::Generic, b'{') => Some(at),
            (ToolFormat::PlainJson, b'{' | b'[') => Some(at),
            _ => None,
        };
        match json {
            Some(json) => {
                self.mode = Mode::Region {
                    opener: self.sent,
                    json,
                    sure: false,
                }
            }
            None => self.mode = Mode::ContentOnly,
        }
    }

    fn text(&mut self, end: bool, out: &mut Vec<ToolEvent>) {
        let opener = self.format.opener().unwrap_or("\u{0}");
        let rest = &self.buf[self.sent..];
        if let Some(p) = rest.find(opener) {
            let at = self.sent + p;
            // Whitespace between content and a call is markup.
            let content_end = self.sent + rest[..p].trim_end().len();
            self.content(content_end, out);
            self.sent = at + opener.len();
            self.mode = Mode::Region {
                opener: content_end,
                json: at + opener.len(),
                sure: true,
            };
            return;
        }
        if end {
            let n = self.buf.len();
            self.content(n, out);
            return;
        }
        // Hold back a tail that may grow into the opener, and the whitespace before it.
        let mut keep = 0;
        for (i, _) in opener.char_indices().skip(1) {
            if rest.ends_with(&opener[..i]) {
                keep = keep.max(i);
            }
        }
        let before = &rest[..rest.len() - keep];
        keep += before.len() - before.trim_end().len();
        let to = self.buf.len() - keep;
        self.content(to, out);
    }

    fn region(
        &mut self,
        opener: usize,
        json: usize,
        sure: bool,
        end: bool,
        out: &mut Vec<ToolEvent>,
    ) {
        let parsed = parse_partial(&self.buf, json);
        let node = match parsed {
            Ok(Some(n)) => n,
            Ok(None) => {
                if end {
                    self.give_up(opener, out);
                }
                return;
            }
            Err(e) => return self.fail(opener, e.at, out),
        };
        let calls = match self.view(&node) {
            View::Wait => {
                if end {
                    self.give_up(opener, out);
                }
                return;
            }
            View::NotCalls => return self.fail(opener, node.end, out),
            View::Response(v) => {
                self.send_response(v, out);
                // (cut short, what was decoded is the content)
                if node.complete {
                    self.finish_region(node.end);
                }
                return;
            }
            View::Calls(c) => c,
        };
        if !sure {
            self.mode = Mode::Region {
                opener,
                json,
                sure: true,
            };
        }
        for (i, call) in calls.iter().enumerate() {
            if self.region.len() <= i {
                self.region.push(Sent::default());
            }
            let index = self.base + i;
            let state = &mut self.region[i];
            if !state.header {
                match call.name {
                    Some((name, true)) => {
                        out.push(ToolEvent::Call {
                            index,
                            name: name.to_string(),
                        });
                        state.header = true;
                    }
                    // Names go out in order, each whole.
                    _ => break,
                }
            }
            let args = match call.args {
                Some(a) => match &a.kind {
                    Kind::Str(s) => s.as_str(),
                    _ => &self.buf[a.start..a.end],
                },
                None if call.complete => "{}",
                None => "",
            };
            if args.len() > state.args {
                out.push(ToolEvent::Args {
                    index,
                    text: args[state.args..].to_string(),
                });
                state.args = args.len();
            }
            if !call.complete {
                break;
            }
        }
        if node.complete {
            self.finish_region(node.end);
        } else if end {
            if self.region.iter().any(|c| c.header) {
                // Cut short (the token limit): the calls begun stay as they are.
                self.sent = self.buf.len();
                self.end_region();
                self.mode = Mode::ContentOnly;
            } else {
                self.give_up(opener, out);
            }
        }
    }

    /// The region from `opener` is not calls after all (found at `at`): all of it is content,
    /// or, if part of it already went out as calls, what follows `at`.
    fn fail(&mut self, opener: usize, at: usize, out: &mut Vec<ToolEvent>) {
        let sent_any = self.region.iter().any(|c| c.header) || self.response > 0;
        self.give_up(if sent_any { at } else { opener }, out);
    }

    /// The region's JSON ends at `at`.
    fn finish_region(&mut self, at: usize) {
        self.end_region();
        self.sent = at;
        self.mode = match self.format {
            ToolFormat::Hermes => Mode::Closing { at },
            ToolFormat::Llama3 | ToolFormat::PlainJson | ToolFormat::Generic => {
                Mode::Between { at }
            }
            ToolFormat::Mistral | ToolFormat::Harmony => Mode::Text,
        };
    }

    fn closing(&mut self, at: usize, end: bool) {
        let closer = self.format.closer().unwrap_or("");
        let rest = &self.buf[at..];
        let t = rest.trim_start();
        let p = at + rest.len() - t.len();
        if let Some(after) = t.strip_prefix(closer) {
            self.sent = self.buf.len() - after.len();
            self.mode = Mode::Text;
        } else if (t.is_empty() || closer.starts_with(t)) && !end {
            // Wait for the closer.
        } else {
            // No closer: lenient, what follows is text.
            self.sent = p;
            self.mode = Mode::Text;
        }
    }

    fn between(&mut self, at: usize, end: bool, out: &mut Vec<ToolEvent>) {
        let rest = &self.buf[at..];
        let t = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if t.is_empty() {
            if end {
                self.sent = self.buf.len();
            }
            return;
        }
        let p = self.buf.len() - t.len();
        self.sent = p;
        if t.starts_with('{') {
            self.mode = Mode::Region {
                opener: p,
                json: p,
                sure: true,
            };
        } else {
            self.mode = Mode::ContentOnly;
            let n = self.buf.len();
            self.content(n, out);
        }
    }

    fn send_response(&mut self, v: &Node, out: &mut Vec<ToolEvent>) {
        let text = match &v.kind {
            Kind::Str(s) => s.as_str(),
            _ if v.complete => &self.buf[v.start..v.end],
            _ => "",
        };
        if text.len() > self.response {
            let piece = &text[self.response..];
            match out.last_mut() {
                Some(ToolEvent::Content(c)) => c.push_str(piece),
                _ => out.push(ToolEvent::Content(piece.to_string())),
            }
            self.response = text.len();
        }
    }

    /// How a parsed region reads in this format.
    fn view<'n>(&self, node: &'n Node) -> View<'n> {
        match self.format {
            ToolFormat::Generic => match node.first_key() {
                None if node.complete => View::NotCalls,
                None => View::Wait,
                Some("response") => match node.get("response") {
                    Some(v) => View::Response(v),
                    None => View::Wait,
                },
                Some("tool_call") => match node.get("tool_call") {
                    Some(c) => one_call(c, self.format),
                    None => View::Wait,
                },
                Some("tool_calls") => match node.get("tool_calls") {
                    Some(list) => call_list(list, self.format),
                    None => View::Wait,
                },
                Some(_) => View::NotCalls,
            },
            ToolFormat::Mistral | ToolFormat::PlainJson => match node.kind {
                Kind::Array(_) => call_list(node, self.format),
                _ => one_call(node, self.format),
            },
            ToolFormat::Hermes | ToolFormat::Llama3 => one_call(node, self.format),
            // (Harmony's calls are read from their headers, not from JSON.)
            ToolFormat::Harmony => View::NotCalls,
        }
    }
}

/// One call as parsed so far.
struct CallView<'n> {
    /// The name and whether its string is closed.
    name: Option<(&'n str, bool)>,
    args: Option<&'n Node>,
    /// The call's object is closed.
    complete: bool,
}

enum View<'n> {
    /// Not enough text to tell.
    Wait,
    /// Not a call (the answer is content).
    NotCalls,
    Calls(Vec<CallView<'n>>),
    /// A generic `response`.
    Response(&'n Node),
}

/// Keys a call object may begin with.
const CALL_KEYS: [&str; 6] = ["name", "arguments", "parameters", "function", "type", "id"];

fn call_view<'n>(node: &'n Node, format: ToolFormat) -> Option<CallView<'n>> {
    let Kind::Object(_) = node.kind else {
        return None;
    };
    if let Some(f) = node
        .get("function")
        .filter(|f| matches!(f.kind, Kind::Object(_)))
    {
        // OpenAI's own shape: {"type": "function", "function": {"name", "arguments"}}.
        let mut v = call_view(f, format)?;
        v.complete = node.complete;
        return Some(v);
    }
    let name = node
        .get("name")
        .and_then(|n| n.as_str().map(|s| (s, n.complete)));
    let args = node
        .get(format.arguments_key())
        .or_else(|| node.get("arguments"))
        .or_else(|| node.get("parameters"));
    Some(CallView {
        name,
        args,
        complete: node.complete,
    })
}

fn one_call(node: &Node, format: ToolFormat) -> View<'_> {
    match node.first_key() {
        None if !node.complete && matches!(node.kind, Kind::Object(_)) => return View::Wait,
        Some(k) if !CALL_KEYS.contains(&k) => return View::NotCalls,
        _ => {}
    }
    match call_view(node, format) {
        Some(v) if v.complete && v.name.is_none() => View::NotCalls,
        Some(v) => View::Calls(vec![v]),
        None => View::NotCalls,
    }
}

fn call_list(node: &Node, format: ToolFormat) -> View<'_> {
    let Kind::Array(items) = &node.kind else {
        return View::NotCalls;
    };
    if items.is_empty() {
        return if node.complete {
            View::NotCalls
        } else {
            View::Wait
        };
    }
    let mut calls = Vec::with_capacity(items.len());
    for item in items {
        match one_call(item, format) {
            View::Calls(mut c) => calls.append(&mut c),
            View::Wait => break,
            _ => return View::NotCalls,
        }
    }
    if calls.is_empty() {
        View::Wait
    } else {
        View::Calls(calls)
    }
}

/// The whole answer at once: its content (`None` if only whitespace) and its calls as
/// `(name, arguments)`.
pub fn parse_complete(format: ToolFormat, text: &str) -> (Option<String>, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(format);
    let mut events = Vec::new();
    p.push(text, &mut events);
    p.finish(&mut events);
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(c) => content.push_str(&c),
            ToolEvent::Call { name, .. } => calls.push((name, String::new())),
            ToolEvent::Args { index, text } => {
                if let Some(c) = calls.get_mut(index) {
                    c.1.push_str(&text);
                }
            }
        }
    }
    let content = (!content.trim().is_empty()).then_some(content);
    (content, calls)
}

#[cfg(test)]
mod tests;
