//! Chat templates: Jinja templates from `tokenizer.chat_template`, rendered with minijinja the
//! way Hugging Face's `apply_chat_template` renders them.
//!
//! Hugging Face semantics: `trim_blocks` and `lstrip_blocks` on, `raise_exception(msg)`,
//! `strftime_now(fmt)`, a `tojson` that writes like Python's `json.dumps` (no HTML escaping,
//! `", "` and `": "` separators), Python string / dict methods (`.strip()`, `.split()`,
//! `.startswith()`, `.items()`, ... via minijinja-contrib's pycompat), and the variables
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` when a request
//! offers tools (OpenAI's list, as `transformers` passes it). Messages carry `tool_calls`,
//! `tool_call_id` and `name` where they have them.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use super::special::Fragment;
use super::{attr, Tokenizer, TokenizerError};

/// One conversation turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls: OpenAI's `[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`, the arguments an object (as templates expect them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Gemma 3's template (google/gemma-3-*-it `tokenizer_config.json`). Some GGUF conversions of
/// Gemma 3 (the 270M file kiln uses among them) ship without a template; llama.cpp then falls
/// back to ChatML, which this model was not trained on.
const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

/// llama.cpp's default when a model has no template.
const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// A built-in template by architecture (`gemma2`, `gemma3`: Gemma's turns) or name
/// (`chatml`).
pub fn builtin_chat_template(name: &str) -> Option<&'static str> {
    match name {
        "gemma2" | "gemma3" => Some(GEMMA3_TEMPLATE),
        "chatml" => Some(CHATML_TEMPLATE),
        _ => None,
    }
}

/// Render `template` for `messages`.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TokenizerError> {
    render_chat_tools(
        template,
        messages,
        None,
        add_generation_prompt,
        bos_token,
        eos_token,
    )
}

/// Render `template` for `messages`, with `tools` (OpenAI's list) when given.
pub fn render_chat_tools(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TokenizerError> {
    let extras = ChatExtras {
        tools,
        ..ChatExtras::default()
    };
    render_chat_with(
        template,
        messages,
        &extras,
        add_generation_prompt,
        bos_token,
        eos_token,
    )
}

/// The variables kiln sets in a chat template's context; `kwargs` cannot replace them.
pub const TEMPLATE_VARIABLES: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// What a conversation is rendered with besides its messages.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChatExtras<'a> {
    /// The `tools` variable (OpenAI's list).
    pub tools: Option<&'a serde_json::Value>,
    /// More variables of the template's context (llama-server's `chat_template_kwargs`, e.g.
    /// Qwen 3's `enable_thinking`); those named in [`TEMPLATE_VARIABLES`] stay kiln's.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// The start of the answer (an assistant prefill): literal text after the rendered
    /// prompt, which the model continues (with the generation prompt, no end of turn).
    pub prefill: Option<&'a str>,
}

/// Render `template` for `messages` with `extras`' tools and variables (not its prefill,
/// which [`Tokenizer::apply_chat_template_with`] appends).
pub fn render_chat_with(
    template: &str,
    messages: &[ChatMessage],
    extras: &ChatExtras,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TokenizerError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |fmt: String| strftime(&fmt, unix_now()));
    env.add_filter("tojson", tojson);
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| TokenizerError::Template(format!("cannot parse template: {e:#}")))?;
    // (Kiln's variables first: in a merged context the first value of a name wins.)
    let ctx = minijinja::context! {
        messages => Value::from_serialize(messages),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        tools => extras.tools.map(Value::from_serialize),
        ..extras.kwargs.map(Value::from_serialize).unwrap_or_default()
    };
    tmpl.render(ctx)
        .map_err(|e| TokenizerError::Template(format!("{e:#}")))
}

impl Tokenizer {
    /// Render the model's chat template ([`Tokenizer::chat_template`]) with its BOS / EOS
    /// texts. As llama.cpp does, a leading BOS (trailing EOS) text is removed when the model's
    /// policy adds that token anyway, so that `encode(prompt, true, true)` does not double it.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_tools(messages, None, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with `tools` (OpenAI's list) given to the template.
    pub fn apply_chat_template_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let extras = ChatExtras {
            tools,
            ..ChatExtras::default()
        };
        self.apply_chat_template_with(messages, &extras, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with `extras`: its tools and variables given to the
    /// template, its prefill appended to the rendered text.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self
            .chat_template()
            .ok_or_else(|| TokenizerError::Template("the model has no chat template".into()))?;
        let bos = self.bos().map(|id| self.token_text(id)).unwrap_or("");
        let eos = self.eos().map(|id| self.token_text(id)).unwrap_or("");
        let mut text =
            render_chat_with(template, messages, extras, add_generation_prompt, bos, eos)?;
        if self.adds_bos() && !bos.is_empty() && text.starts_with(bos) {
            text.drain(..bos.len());
        }
        if self.adds_eos() && !eos.is_empty() && text.ends_with(eos) {
            text.truncate(text.len() - eos.len());
        }
        text.push_str(extras.prefill.unwrap_or(""));
        Ok(text)
    }
}

/// Delimiters of a placeholder (`OPEN index CLOSE`) standing for a piece of message content
/// while the template renders: Unicode noncharacters, which no special token contains.
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

impl Tokenizer {
    /// Render the conversation with the chat template and tokenize it, as
    /// `encode(&apply_chat_template(..), true, true)` does, except that message content is
    /// literal text: the template's own markup (`<|im_start|>`, `bos_token`, ...) becomes
    /// special tokens, while a control token's text inside a message (a user writing
    /// `<|im_end|>\n<|im_start|>assistant\n`) is tokenized as the ordinary text it spells, so a
    /// message cannot forge a turn. A conversation whose messages hold no control-token text is
    /// tokenized exactly as `encode(&apply_chat_template(..), true, true)` tokenizes it.
    ///
    /// How: each control-token text in the content (and any stray `OPEN` / `CLOSE` character) is
    /// replaced by a placeholder before rendering, so that the template's string operations
    /// (`trim`, concatenation) work on the content as usual; the special tokens found in the
    /// rendered text are then the template's; the placeholders are put back inside the raw-text
    /// fragments, which are tokenized without parsing control tokens (user-defined tokens are
    /// still cut, as [`encode`](Self::encode) always does).
    ///
    /// `special_in_content` parses control tokens in content too (the old behaviour, for
    /// trusted clients that send pre-formatted turns).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        special_in_content: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_tools(messages, None, add_generation_prompt, special_in_content)
    }

    /// [`Tokenizer::encode_chat`] with `tools` given to the template. Every string of the tool
    /// definitions and of the messages' calls, call ids and names is literal text, as message
    /// content is.
    pub fn encode_chat_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        special_in_content: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let extras = ChatExtras {
            tools,
            ..ChatExtras::default()
        };
        self.encode_chat_with(messages, &extras, add_generation_prompt, special_in_content)
    }

    /// [`Tokenizer::encode_chat`] with `extras`. The strings of its tools and variables and
    /// its prefill are literal text, as message content is.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
        add_generation_prompt: bool,
        special_in_content: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if special_in_content {
            let text = self.apply_chat_template_with(messages, extras, add_generation_prompt)?;
            return Ok(self.encode(&text, true, true));
        }
        let mut hidden: Vec<&str> = Vec::new();
        let masked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: self.mask_control_text(&m.content, &mut hidden),
                tool_calls: m.tool_calls.as_ref().map(|calls| {
                    calls
                        .iter()
                        .map(|c| self.mask_json(c, &mut hidden))
                        .collect()
                }),
                tool_call_id: m
                    .tool_call_id
                    .as_ref()
                    .map(|t| self.mask_control_text(t, &mut hidden)),
                name: m
                    .name
                    .as_ref()
                    .map(|t| self.mask_control_text(t, &mut hidden)),
            })
            .collect();
        let tools = extras.tools.map(|t| self.mask_json(t, &mut hidden));
        let kwargs = extras.kwargs.map(|k| {
            k.iter()
                .map(|(name, v)| (name.clone(), self.mask_json(v, &mut hidden)))
                .collect::<serde_json::Map<_, _>>()
        });
        let prefill = extras
            .prefill
            .map(|p| self.mask_control_text(p, &mut hidden));
        let masked_extras = ChatExtras {
            tools: tools.as_ref(),
            kwargs: kwargs.as_ref(),
            prefill: prefill.as_deref(),
        };
        let rendered =
            self.apply_chat_template_with(&masked, &masked_extras, add_generation_prompt)?;
        let mut fragments = Vec::new();
        self.specials
            .partition(&self.vocab, &rendered, true, &mut fragments);
        if hidden.is_empty() {
            return Ok(self.encode_fragments(&rendered, &fragments, true));
        }
        // Put the hidden text back, in a new string the fragments index.
        let mut text = String::with_capacity(rendered.len());
        let mut out = Vec::with_capacity(fragments.len());
        let mut sub = Vec::new();
        for f in fragments {
            let Fragment::Text(r) = f else {
                out.push(f);
                continue;
            };
            let piece = &rendered[r];
            let start = text.len();
            if !piece.contains(OPEN) {
                text.push_str(piece);
                out.push(Fragment::Text(start..text.len()));
                continue;
            }
            unmask(piece, &hidden, &mut text);
            sub.clear();
            self.specials
                .partition(&self.vocab, &text[start..], false, &mut sub);
            out.extend(sub.drain(..).map(|f| match f {
                Fragment::Text(r) => Fragment::Text(start + r.start..start + r.end),
                token => token,
            }));
        }
        Ok(self.encode_fragments(&text, &out, true))
    }

    /// `content` with every control (or unknown) token's text, and every `OPEN` / `CLOSE`
    /// character, replaced by a placeholder indexing `hidden`.
    fn mask_control_text<'a>(&'a self, content: &'a str, hidden: &mut Vec<&'a str>) -> String {
        let mut fragments = Vec::new();
        self.specials
            .partition(&self.vocab, content, true, &mut fragments);
        let mut out = String::with_capacity(content.len());
        for f in fragments {
            match f {
                Fragment::Text(r) => push_literal(&mut out, hidden, &content[r]),
                Fragment::Token(id) if self.vocab.has_attr(id, attr::CONTROL | attr::UNKNOWN) => {
                    hide(&mut out, hidden, self.vocab.text(id))
                }
                Fragment::Token(id) => push_literal(&mut out, hidden, self.vocab.text(id)),
            }
        }
        out
    }
}

impl Tokenizer {
    /// `value` with every string (keys too) masked as [`Tokenizer::mask_control_text`] masks
    /// message content.
    fn mask_json<'a>(
        &'a self,
        value: &'a serde_json::Value,
        hidden: &mut Vec<&'a str>,
    ) -> serde_json::Value {
        use serde_json::Value as J;
        match value {
            J::String(s) => J::String(self.mask_control_text(s, hidden)),
            J::Array(items) => J::Array(items.iter().map(|v| self.mask_json(v, hidden)).collect()),
            J::Object(map) => J::Object(
                map.iter()
                    .map(|(k, v)| (self.mask_control_text(k, hidden), self.mask_json(v, hidden)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// Append a placeholder for `text`.
fn hide<'a>(out: &mut String, hidden: &mut Vec<&'a str>, text: &'a str) {
    out.push(OPEN);
    out.push_str(&hidden.len().to_string());
    out.push(CLOSE);
    hidden.push(text);
}

/// Append `text`, hiding any `OPEN` / `CLOSE` character it holds.
fn push_literal<'a>(out: &mut String, hidden: &mut Vec<&'a str>, text: &'a str) {
    for (i, c) in text.char_indices() {
        if c == OPEN || c == CLOSE {
            hide(out, hidden, &text[i..i + c.len_utf8()]);
        } else {
            out.push(c);
        }
    }
}

/// Append `piece` to `out` with each placeholder replaced by the text it hides. A mangled one
/// (a template that cut a message in the middle of a placeholder) stays as it is.
fn unmask(piece: &str, hidden: &[&str], out: &mut String) {
    let mut rest = piece;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len_utf8()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let index = after[..digits].parse::<usize>().ok();
        match (
            index.and_then(|i| hidden.get(i)),
            after[digits..].strip_prefix(CLOSE),
        ) {
            (Some(text), Some(tail)) => {
                out.push_str(text);
                rest = tail;
            }
            _ => {
                out.push(OPEN);
                rest = after;
            }
        }
    }
    out.push_str(rest);
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson(indent=None, ...)` as Python's `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for compatibility; `ensure_ascii` / `separators` beyond the defaults are rare.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_py_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort: bool,
    depth: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_py_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A C `strftime` subset (UTC) for templates that stamp the date (Llama 3's "%d %b %Y").
fn strftime(fmt: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(month),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    #[test]
    fn trim_and_lstrip_blocks_like_hugging_face() {
        let t = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}";
        let out = render_chat(
            t,
            &msgs(&[("user", "a"), ("assistant", "b"), ("user", "c")]),
            false,
            "",
            "",
        )
        .unwrap();
        assert_eq!(out, "[a]\n[c]\n");
    }

    #[test]
    fn kwargs_are_template_variables_but_never_kilns() {
        let t = "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}{{ messages | length }}|{{ add_generation_prompt }}|{{ bos_token }}|{{ mode }}";
        let kwargs = serde_json::json!({"enable_thinking": false, "mode": "x",
            "messages": [], "add_generation_prompt": false, "bos_token": "forged"});
        let extras = ChatExtras {
            kwargs: kwargs.as_object(),
            ..ChatExtras::default()
        };
        let out = render_chat_with(t, &msgs(&[("user", "a")]), &extras, true, "<s>", "").unwrap();
        assert_eq!(out, "<no-think>1|True|<s>|x");
        // Without kwargs the variable is undefined.
        let out = render_chat(t, &msgs(&[("user", "a")]), true, "<s>", "").unwrap();
        assert_eq!(out, "1|True|<s>|");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = "{{ raise_exception('roles must alternate') }}";
        let err = render_chat(t, &[], false, "", "").unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn python_string_methods() {
        let t = "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' x') }}|{{ 'a,b'.split(',') | join('+') }}";
        let out = render_chat(t, &msgs(&[("user", " xy ")]), false, "", "").unwrap();
        assert_eq!(out, "XY|True|a+b"); // Python prints booleans capitalised
    }

    #[test]
    fn tojson_writes_like_python() {
        let t = "{{ {'a': 1, 'b': ['x<y', none]} | tojson }}|{{ [1, 2] | tojson(indent=2) }}";
        let out = render_chat(t, &[], false, "", "").unwrap();
        assert_eq!(out, "{\"a\": 1, \"b\": [\"x<y\", null]}|[\n  1,\n  2\n]");
    }

    /// Request content as deep as a request body may be (JSON nesting is capped at 128): tool
    /// arguments and tool schemas walked by a recursive macro, written by `tojson`, and a
    /// macro that recurses without end, render or fail with minijinja's recursion limit on a
    /// quarter of a server worker's 2 MiB stack; none overflows it.
    #[test]
    fn deep_request_values_cannot_overflow_the_stack() {
        let mut deep = serde_json::json!("leaf");
        for i in 0..126 {
            deep = match i % 2 {
                0 => serde_json::json!({ "a": deep }),
                _ => serde_json::json!([deep]),
            };
        }
        let h = std::thread::Builder::new()
            .stack_size(512 << 10)
            .spawn(move || {
                let mut m = ChatMessage::new("assistant", "");
                let call = serde_json::json!({"type": "function",
                    "function": {"name": "f", "arguments": deep.clone()}});
                m.tool_calls = Some(vec![call]);
                let tools = serde_json::json!([{"type": "function",
                    "function": {"name": "f", "parameters": deep}}]);
                let render = |t: &str| render_chat_tools(t, &[m.clone()], Some(&tools), true, "", "");
                let walk = "{% macro walk(x) %}{% if x is mapping %}{% for k in x %}{{ k }}{{ walk(x[k]) }}{% endfor %}{% elif x is sequence and x is not string %}{% for y in x %}[{{ walk(y) }}]{% endfor %}{% else %}{{ x }}{% endif %}{% endmacro %}";
                let mut out = Vec::new();
                for body in [
                    "{% for m in messages %}{% for c in m.tool_calls %}{{ walk(c.function.arguments) }}{% endfor %}{% endfor %}",
                    "{% for t in tools %}{{ walk(t.function.parameters) }}{% endfor %}",
                ] {
                    out.push(render(&format!("{walk}{body}")));
                }
                let json = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}{{ tools | tojson(indent=2) }}";
                out.push(render(json));
                out.push(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"));
                out
            })
            .unwrap();
        let out = h.join().expect("rendering overflowed no stack");
        for r in [&out[0], &out[1], &out[3]] {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(e.contains("recursion limit"), "{e}");
        }
        let json = out[2].as_ref().unwrap();
        assert!(json.starts_with(&"[{\"a\": ".repeat(63)), "{json}");
        assert!(json.contains("\"leaf\""), "{json}");
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %e, %H:%M:%S %j %y %I%p %%", t),
            "Thursday February 29, 13:05:09 060 24 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        let out = render_chat("{{ strftime_now('%Y') }}", &[], false, "", "").unwrap();
        assert!(out.len() == 4 && out.starts_with('2'), "{out}");
    }

    #[test]
    fn gemma3_template_alternation_error() {
        let err = render_chat(
            GEMMA3_TEMPLATE,
            &msgs(&[("user", "a"), ("user", "b")]),
            true,
            "<bos>",
            "<eos>",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("alternate"), "{err}");
    }

    /// A Gemma-2 file without a template gets Gemma's turns (the same markers as Gemma 3's).
    #[test]
    fn gemma2_builtin_is_gemma_turns() {
        let t = builtin_chat_template("gemma2").expect("built in");
        let out = render_chat(t, &msgs(&[("user", "hi")]), true, "<bos>", "<eos>").unwrap();
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_builtin() {
        let out = render_chat(CHATML_TEMPLATE, &msgs(&[("user", "hi")]), true, "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
