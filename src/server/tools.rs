//! Tool calling in chat completions: `tools`, `tool_choice`, `parallel_tool_calls`, the
//! conversation's past calls and `tool` turns, checked (OpenAI-shaped 400s naming the field),
//! then turned into what the engine runs: the messages and tool list the chat template renders
//! (llama.cpp's generic rewriting where the template knows nothing of tools), the grammar that
//! constrains the calls, and the format the answer is parsed in.

use std::sync::Arc;

use serde_json::{json, Value};

use super::error::ApiError;
use crate::grammar::tools::ToolGrammar;
use crate::grammar::GrammarSpec;
use crate::tokenizer::toolcall::template::{generic_preamble, prepare, GenericAsk, ToolSupport};
use crate::tokenizer::toolcall::ToolFormat;
use crate::tokenizer::{ChatMessage, Tokenizer};

use super::api::Message;

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No tools offered: the model answers in text.
    None,
    /// The model may call tools.
    Auto,
    /// The model must call one or more tools.
    Required,
    /// The model must call this function (its index in the functions).
    Named(usize),
}

/// A request's tools, checked.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The `tools` list as the client sent it (what templates render).
    pub list: Value,
    /// Each function's name and parameter schema (an empty object schema where none was given).
    pub functions: Vec<(String, Value)>,
    pub choice: Choice,
    pub parallel: bool,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// A function name as OpenAI accepts them: 1 to 64 of `a-z A-Z 0-9 _ -` (kiln also takes `.`).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// Read `tools`, `tool_choice` and `parallel_tool_calls` (`None`: no tools).
pub fn read(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let Some(list) = tools.filter(|t| !t.is_null()) else {
        return match tool_choice {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s == "none" || s == "auto" => Ok(None),
            Some(_) => Err(bad(
                "tool_choice",
                "tool_choice needs `tools` (a list of functions)",
            )),
        };
    };
    let items = list.as_array().ok_or_else(|| {
        bad(
            "tools",
            "tools must be a list of {\"type\": \"function\", \"function\": {...}}",
        )
    })?;
    if items.is_empty() {
        return Err(bad(
            "tools",
            "tools must not be empty (leave it out for no tools)",
        ));
    }
    let mut functions: Vec<(String, Value)> = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        let obj = t
            .as_object()
            .ok_or_else(|| bad(&at(""), format!("{} must be an object", at(""))))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(
                    &at(".type"),
                    format!(
                        "{}: tools of type `{other}` are not supported (only `function`)",
                        at(".type")
                    ),
                ))
            }
            None => {
                return Err(bad(
                    &at(".type"),
                    format!("{} is required (`function`)", at(".type")),
                ))
            }
        }
        let f = obj
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                bad(
                    &at(".function"),
                    format!("{} must be an object with a `name`", at(".function")),
                )
            })?;
        let name = match f.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            Some(Value::String(n)) => {
                return Err(bad(
                    &at(".function.name"),
                    format!(
                        "{}: `{n}` is not a valid function name (1 to 64 letters, digits, `_`, `-`, `.`)",
                        at(".function.name")
                    ),
                ))
            }
            Some(_) => return Err(bad(&at(".function.name"), format!("{} must be a string", at(".function.name")))),
            None => return Err(bad(&at(".function.name"), format!("{}: a tool needs a name", at(".function.name")))),
        };
        if functions.iter().any(|(n, _)| *n == name) {
            return Err(bad(
                &at(".function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        if let Some(d) = f.get("description") {
            if !d.is_string() && !d.is_null() {
                return Err(bad(
                    &at(".function.description"),
                    format!("{} must be a string", at(".function.description")),
                ));
            }
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad(
                    &at(".function.parameters"),
                    format!(
                        "{} must be a JSON schema object",
                        at(".function.parameters")
                    ),
                ))
            }
        };
        if let Some(t) = params.get("type") {
            if t != "object" {
                return Err(bad(
                    &at(".function.parameters"),
                    format!(
                        "{}: the arguments must be an object (`\"type\": \"object\"`), not {t}",
                        at(".function.parameters")
                    ),
                ));
            }
        }
        // Each schema within the compiler's limits before the tool grammar embeds it.
        if let Err(e) = crate::grammar::limits::check_schema(&params) {
            let path = at(".function.parameters");
            return Err(super::structured::error(&path, &path, e));
        }
        functions.push((name, params));
    }
    let choice = match tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "tool_choice `{other}` is not one of none, auto, required (or a function)"
                    ),
                ))
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str).is_none_or(|t| t == "function"))
                .ok_or_else(|| {
                    bad("tool_choice", "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
                })?;
            let i = functions
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        format!("tool_choice names `{name}`, which is not among the tools"),
                    )
                })?;
            Choice::Named(i)
        }
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "tool_choice must be a string or an object",
            ))
        }
    };
    Ok(Some(Tools {
        list: list.clone(),
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// The request's messages as the template gets them: roles checked (`developer` is `system`),
/// assistant calls checked (their arguments made objects), `tool` turns with their call id.
pub fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(bad(
                    &format!("messages[{i}].role"),
                    format!(
                        "unsupported role `{other}` (system, developer, user, assistant, tool)"
                    ),
                ))
            }
        };
        let mut msg = ChatMessage::new(role, m.text()?);
        if let Some(calls) = &m.tool_calls {
            if role != "assistant" {
                return Err(bad(
                    &format!("messages[{i}].tool_calls"),
                    "only assistant messages have tool_calls",
                ));
            }
            let mut checked = Vec::with_capacity(calls.len());
            for (j, c) in calls.iter().enumerate() {
                let at = format!("messages[{i}].tool_calls[{j}]");
                let name = c.pointer("/function/name").and_then(Value::as_str);
                let args = c.pointer("/function/arguments");
                let kind_ok = c.get("type").is_none_or(|t| t == "function");
                match (name, args) {
                    (Some(n), Some(a)) if kind_ok && (a.is_string() || a.is_object()) => {
                        let mut call = json!({"type": "function", "function": {"name": n, "arguments": a}});
                        if let Some(id) = c.get("id").and_then(Value::as_str) {
                            call["id"] = json!(id);
                        }
                        checked.push(call);
                    }
                    _ => {
                        return Err(bad(
                            &at,
                            format!("{at} must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": ...}}}}"),
                        ))
                    }
                }
            }
            if !checked.is_empty() {
                msg.tool_calls = Some(checked);
            }
        }
        if role == "tool" {
            let id = m.tool_call_id.as_ref().ok_or_else(|| {
                bad(
                    &format!("messages[{i}].tool_call_id"),
                    "a tool message needs the `tool_call_id` it answers",
                )
            })?;
            msg.tool_call_id = Some(id.clone());
            msg.name = m.name.clone();
        }
        out.push(msg);
    }
    Ok(out)
}

/// What a chat request runs with tools in play.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The messages to render.
    pub messages: Vec<ChatMessage>,
    /// The `tools` variable of the template.
    pub template_tools: Option<Value>,
    /// The grammar of the answer (`None`: unconstrained).
    pub grammar: Option<GrammarSpec>,
    /// Parse the answer in this format (`None`: `tool_choice: "none"`, plain text).
    pub format: Option<ToolFormat>,
}

/// Plan a chat request: `tools` (if any), for a template with `support`.
pub fn plan(
    messages: Vec<ChatMessage>,
    tools: Option<&Tools>,
    support: &ToolSupport,
    tok: &Tokenizer,
) -> ToolPlan {
    let active = tools.filter(|t| t.choice != Choice::None);
    let parallel = tools.is_none_or(|t| t.parallel);
    let Some(t) = active else {
        // No tools offered; past calls and results are still rendered.
        return ToolPlan {
            messages: prepare(&messages, support, None, parallel),
            template_tools: None,
            grammar: None,
            format: None,
        };
    };
    let format = support.format();
    let required = matches!(t.choice, Choice::Required | Choice::Named(_));
    let functions: Vec<(String, Value)> = match t.choice {
        Choice::Named(i) => vec![t.functions[i].clone()],
        _ => t.functions.clone(),
    };
    let preamble = (format == ToolFormat::Generic).then(|| {
        generic_preamble(
            &t.list,
            !support.tools,
            GenericAsk {
                parallel: t.parallel,
                required,
            },
        )
    });
    let control = format
        .markers()
        .iter()
        .filter_map(|&m| Some((m, tok.token_id(m).filter(|&id| tok.is_control(id))?)))
        .collect();
    let grammar = ToolGrammar {
        format,
        functions: &functions,
        required,
        parallel: t.parallel,
        control,
    };
    // Harmony's free answer is its own markup, which no text grammar leaves free: with `auto`
    // its calls are parsed, unconstrained ([`ToolGrammar`]).
    let constrained = required || format != ToolFormat::Harmony;
    ToolPlan {
        messages: prepare(&messages, support, preamble.as_deref(), t.parallel),
        template_tools: support.tools.then(|| t.list.clone()),
        grammar: constrained.then(|| grammar.spec()),
        format: Some(format),
    }
}

/// A tool grammar that did not compile (`e`, on `tools`): name the function whose parameter
/// schema fails on its own (the search, one compile thread, through the server's
/// [`super::structured::CompileGate`]).
pub(crate) async fn locate(e: ApiError, tools: &Tools, st: &super::AppState) -> ApiError {
    let (cell, tok) = (Arc::clone(&st.grammar), Arc::clone(&st.tokenizer));
    let schemas: Vec<Value> = tools.functions.iter().map(|(_, p)| p.clone()).collect();
    let found = st.compiles.run(move || {
        let engine = crate::grammar::GrammarEngine::shared(&cell, &tok).ok()?;
        schemas.into_iter().enumerate().find_map(|(i, params)| {
            let spec = GrammarSpec::JsonSchema(params);
            engine.compile(&spec).err().map(|err| (i, err))
        })
    });
    match found.await {
        Ok(Some((i, err))) => {
            let at = format!("tools[{i}].function.parameters");
            ApiError::invalid_param(&at, format!("{at}: {err}"))
        }
        _ => e,
    }
}

/// An id for a call of `format`: Mistral's templates want 9 letters and digits, others take
/// OpenAI's `call_` and 24.
pub fn call_id(format: ToolFormat, rng: &mut crate::sampler::Rng) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let (prefix, n) = match format {
        ToolFormat::Mistral => ("", 9),
        _ => ("call_", 24),
    };
    let mut id = String::with_capacity(prefix.len() + n);
    id.push_str(prefix);
    for _ in 0..n {
        id.push(ALNUM[(rng.next_u64() % ALNUM.len() as u64) as usize] as char);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(v: Value) -> Value {
        v
    }

    fn read_err(t: Value, choice: Option<Value>) -> ApiError {
        read(Some(&t), choice.as_ref(), None).unwrap_err()
    }

    #[test]
    fn deep_parameter_schemas_are_refused_by_path() {
        let mut defs = serde_json::Map::new();
        for i in 0..300 {
            defs.insert(
                format!("a{i}"),
                json!({"$ref": format!("#/$defs/a{}", i + 1)}),
            );
        }
        defs.insert("a300".into(), json!({"type": "string"}));
        let params =
            json!({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/a0"}}});
        let e = read_err(
            json!([{"type": "function", "function": {"name": "f", "parameters": params}}]),
            None,
        );
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
        assert!(e.message.contains("deeper than 256"), "{}", e.message);
    }

    #[test]
    fn reads_tools_and_choices() {
        let list = tools(json!([
            {"type": "function", "function": {"name": "get_weather", "description": "d",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "now"}}
        ]));
        let t = read(Some(&list), None, None).unwrap().unwrap();
        assert_eq!(t.choice, Choice::Auto);
        assert!(t.parallel);
        assert_eq!(
            t.functions[1],
            (
                "now".to_string(),
                json!({"type": "object", "properties": {}})
            )
        );
        for (c, want) in [
            (json!("none"), Choice::None),
            (json!("required"), Choice::Required),
            (
                json!({"type": "function", "function": {"name": "now"}}),
                Choice::Named(1),
            ),
        ] {
            assert_eq!(
                read(Some(&list), Some(&c), Some(false))
                    .unwrap()
                    .unwrap()
                    .choice,
                want
            );
        }
        assert!(read(None, Some(&json!("auto")), None).unwrap().is_none());
        assert!(read(None, None, None).unwrap().is_none());
    }

    #[test]
    fn bad_tools_name_the_problem() {
        let f = |v: Value| json!([{"type": "function", "function": v}]);
        let e = read_err(f(json!({"parameters": {"type": "object"}})), None);
        assert_eq!(e.param.as_deref(), Some("tools[0].function.name"));
        assert!(e.message.contains("needs a name"), "{}", e.message);
        let e = read_err(f(json!({"name": "a b"})), None);
        assert!(
            e.message.contains("not a valid function name"),
            "{}",
            e.message
        );
        let e = read_err(f(json!({"name": "f", "parameters": "string"})), None);
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
        assert!(e.message.contains("JSON schema object"), "{}", e.message);
        let e = read_err(
            f(json!({"name": "f", "parameters": {"type": "array"}})),
            None,
        );
        assert!(e.message.contains("must be an object"), "{}", e.message);
        let e = read_err(json!([{"type": "retrieval"}]), None);
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = read_err(json!([]), None);
        assert!(e.message.contains("must not be empty"), "{}", e.message);
        let e = read_err(json!({"name": "f"}), None);
        assert_eq!(e.param.as_deref(), Some("tools"));
        let two = json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]);
        assert!(read_err(two, None).message.contains("two tools"));
        let one = f(json!({"name": "f"}));
        let e = read_err(
            one.clone(),
            Some(json!({"type": "function", "function": {"name": "g"}})),
        );
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains("`g`"), "{}", e.message);
        let e = read_err(one.clone(), Some(json!("always")));
        assert!(e.message.contains("`always`"), "{}", e.message);
        let e = read(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn messages_with_calls_and_results() {
        let msgs: Vec<Message> = serde_json::from_value(json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]))
        .unwrap();
        let out = chat_messages(&msgs).unwrap();
        assert_eq!(out[0].role, "system");
        assert_eq!(out[2].content, "");
        assert_eq!(out[2].tool_calls.as_ref().unwrap()[0]["id"], "call_1");
        assert_eq!(out[3].tool_call_id.as_deref(), Some("call_1"));
        let bad_msgs = |v: Value| {
            chat_messages(&serde_json::from_value::<Vec<Message>>(v).unwrap()).unwrap_err()
        };
        let e = bad_msgs(json!([{"role": "tool", "content": "x"}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
        let e = bad_msgs(
            json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
        );
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls[0]"));
        let e = bad_msgs(json!([{"role": "user", "content": "x", "tool_calls": []}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls"));
        let e = bad_msgs(json!([{"role": "wizard", "content": "x"}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn call_ids() {
        let mut rng = crate::sampler::Rng::new(1);
        let id = call_id(ToolFormat::Hermes, &mut rng);
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        let id = call_id(ToolFormat::Mistral, &mut rng);
        assert!(
            id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
            "{id}"
        );
    }
}
