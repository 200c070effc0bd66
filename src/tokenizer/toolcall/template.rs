//! Tools and chat templates: what a template renders, and, for what it does not, the rewriting
//! llama.cpp applies (minja's polyfills and the generic format's system preamble).
//!
//! [`ToolSupport::probe`] renders the template with a probe tool, a probe call and a probe tool
//! result (as minja's capability detection does) and looks for them in the output. A template
//! that renders tools and whose source names a known syntax gets that format; any other gets
//! llama.cpp's generic one: the system message describes the functions and asks for a JSON
//! answer ([`generic_preamble`]). Calls and tool results a template cannot render are rewritten
//! as JSON text: an assistant turn `{"tool_calls": [..]}` (or `{"tool_call": ..}`) and a user
//! turn `{"tool_response": {"tool", "content", "tool_call_id"}}` ([`prepare`]).

use serde_json::{json, Value};

use super::ToolFormat;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// What a chat template renders of tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// The `tools` variable (function definitions).
    pub tools: bool,
    /// Assistant turns' `tool_calls`.
    pub calls: bool,
    /// `tool` turns.
    pub results: bool,
    /// The syntax its source names, if kiln knows it.
    pub native: Option<ToolFormat>,
}

const PROBE_TOOL: &str = "kiln_probe_function";
const PROBE_CALL: &str = "kiln_probe_call";
const PROBE_ARG: &str = "kiln_probe_argument";
const PROBE_RESULT: &str = "kiln_probe_result";

impl ToolSupport {
    /// Render the tokenizer's template with probes (a template that fails on them does not
    /// support them).
    pub fn probe(tok: &Tokenizer) -> ToolSupport {
        let Some(src) = tok.chat_template() else {
            return ToolSupport {
                tools: false,
                calls: false,
                results: false,
                native: None,
            };
        };
        let renders = |msgs: &[ChatMessage], tools: Option<&Value>, probe: &str| {
            tok.apply_chat_template_tools(msgs, tools, false)
                .is_ok_and(|t| t.contains(probe))
        };
        let user = ChatMessage::new("user", "Hello");
        let tools = json!([{"type": "function", "function": {
            "name": PROBE_TOOL, "description": "a probe",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]);
        let call = ChatMessage {
            tool_calls: Some(vec![json!({"id": "call00001", "type": "function",
                "function": {"name": PROBE_CALL, "arguments": {"x": PROBE_ARG}}})]),
            ..ChatMessage::new("assistant", "")
        };
        let result = ChatMessage {
            tool_call_id: Some("call00001".into()),
            name: Some(PROBE_CALL.into()),
            ..ChatMessage::new("tool", PROBE_RESULT)
        };
        let supports_tools = renders(std::slice::from_ref(&user), Some(&tools), PROBE_TOOL);
        ToolSupport {
            tools: supports_tools,
            calls: renders(&[user.clone(), call.clone()], Some(&tools), PROBE_CALL),
            results: renders(
                &[
                    user.clone(),
                    call,
                    result,
                    ChatMessage::new("user", "Thanks"),
                ],
                Some(&tools),
                PROBE_RESULT,
            ),
            native: if supports_tools {
                ToolFormat::detect(src)
            } else {
                None
            },
        }
    }

    /// The format the model answers in: its native one, else the generic one.
    pub fn format(&self) -> ToolFormat {
        self.native.unwrap_or(ToolFormat::Generic)
    }
}

/// How the generic format asks for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenericAsk {
    /// `{"tool_calls": [..]}` (several calls) rather than `{"tool_call": {..}}`.
    pub parallel: bool,
    /// A call is required (no `response`).
    pub required: bool,
}

/// One call as the generic format writes it.
fn generic_call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// The generic answer holding `calls`.
fn generic_calls(calls: Vec<Value>, parallel: bool) -> Value {
    if parallel || calls.len() != 1 {
        json!({ "tool_calls": calls })
    } else {
        json!({ "tool_call": calls.into_iter().next() })
    }
}

/// JSON written as Python's `json.dumps` writes it (`", "`, `": "`), the layout the grammar
/// gives the model's own answers.
pub fn compact(v: &Value) -> String {
    let mut out = String::new();
    write_compact(v, &mut out);
    out
}

fn write_compact(v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_compact(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_compact(item, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The generic format's system text: the functions (unless the template renders them itself),
/// an example answer, and the JSON to answer with.
pub fn generic_preamble(tools: &Value, describe_tools: bool, ask: GenericAsk) -> String {
    let key = if ask.parallel {
        "tool_calls"
    } else {
        "tool_call"
    };
    let mut text = if ask.required {
        format!("Respond in JSON format with `{key}` (a request to call tools).")
    } else {
        format!(
            "Respond in JSON format, either with `{key}` (a request to call tools) or with \
             `response` reply to the user's request."
        )
    };
    if describe_tools {
        let list = serde_json::to_string_pretty(tools).unwrap_or_else(|_| tools.to_string());
        let example = generic_calls(
            vec![generic_call("tool_name", json!({"arg1": "some_value"}))],
            ask.parallel,
        );
        text.push_str(&format!(
            "\n\nYou can call any of the following tools to satisfy the user's requests: {list}\
             \n\nExample tool call syntax:\n\n{}",
            compact(&example)
        ));
        if !ask.required {
            text.push_str(&format!(
                "\n\nExample reply to the user:\n\n{}",
                compact(&json!({"response": "some text"}))
            ));
        }
    }
    text
}

/// A call's arguments as templates expect them: an object where the client sent a JSON text
/// (OpenAI's `arguments` string), as llama.cpp passes them.
pub fn arguments_object(arguments: &Value) -> Value {
    match arguments {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => arguments.clone(),
        },
        other => other.clone(),
    }
}

/// `messages` rewritten for a template with `support`: a system `preamble` added (to the
/// first system message, or as one), and calls and tool results the template cannot render
/// written as JSON text (consecutive results in one user turn, so that templates requiring
/// alternating roles accept them). `parallel`: how past calls are written in the generic form.
pub fn prepare(
    messages: &[ChatMessage],
    support: &ToolSupport,
    preamble: Option<&str>,
    parallel: bool,
) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if let Some(p) = preamble {
        match messages.first() {
            Some(m) if m.role == "system" => {}
            _ => out.push(ChatMessage::new("system", p)),
        }
    }
    // Names of earlier calls by id, for tool results that do not name their function.
    let mut names: Vec<(String, String)> = Vec::new();
    let mut merging = false;
    for (i, m) in messages.iter().enumerate() {
        let mut m = m.clone();
        if i == 0 && m.role == "system" {
            if let Some(p) = preamble {
                m.content = if m.content.is_empty() {
                    p.to_string()
                } else {
                    format!("{}\n\n{p}", m.content)
                };
            }
        }
        if let Some(calls) = m.tool_calls.take() {
            let calls: Vec<Value> = calls
                .into_iter()
                .map(|mut c| {
                    if let Some(f) = c.get_mut("function") {
                        if let Some(a) = f.get("arguments") {
                            let obj = arguments_object(a);
                            f["arguments"] = obj;
                        }
                    }
                    if let (Some(id), Some(name)) = (
                        c.get("id").and_then(Value::as_str),
                        c.pointer("/function/name").and_then(Value::as_str),
                    ) {
                        names.push((id.to_string(), name.to_string()));
                    }
                    c
                })
                .collect();
            if support.calls {
                m.tool_calls = Some(calls);
            } else {
                let generic: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        generic_call(
                            c.pointer("/function/name")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                            c.pointer("/function/arguments")
                                .cloned()
                                .unwrap_or(json!({})),
                        )
                    })
                    .collect();
                let mut obj = generic_calls(generic, parallel);
                if !m.content.trim().is_empty() {
                    obj["content"] = Value::String(m.content.clone());
                }
                m.content = compact(&obj);
            }
        }
        if m.role == "tool" && !support.results {
            let name = m.name.clone().or_else(|| {
                let id = m.tool_call_id.as_deref()?;
                names.iter().find(|(i, _)| i == id).map(|(_, n)| n.clone())
            });
            let mut resp = serde_json::Map::new();
            if let Some(n) = name {
                resp.insert("tool".into(), Value::String(n));
            }
            resp.insert("content".into(), Value::String(m.content.clone()));
            if let Some(id) = &m.tool_call_id {
                resp.insert("tool_call_id".into(), Value::String(id.clone()));
            }
            let text = compact(&json!({ "tool_response": resp }));
            if merging {
                if let Some(prev) = out.last_mut() {
                    prev.content.push('\n');
                    prev.content.push_str(&text);
                    continue;
                }
            }
            out.push(ChatMessage::new("user", text));
            merging = true;
            continue;
        }
        merging = false;
        out.push(m);
    }
    out
}
