use super::template::{compact, generic_preamble, prepare, GenericAsk, ToolSupport};
use super::*;
use crate::tokenizer::ChatMessage;
use serde_json::json;

/// Feed `text` in pieces of `step` characters; the events merged (adjacent content joined,
/// argument fragments joined per call) and the content / calls.
fn run(
    format: ToolFormat,
    text: &str,
    step: usize,
) -> (Vec<ToolEvent>, String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(format);
    let mut events = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(step.max(1)) {
        let s: String = piece.iter().collect();
        p.push(&s, &mut events);
    }
    p.finish(&mut events);
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in &events {
        match e {
            ToolEvent::Content(c) => content.push_str(c),
            ToolEvent::Call { index, name } => {
                assert_eq!(*index, calls.len(), "calls begin in order: {events:?}");
                calls.push((name.clone(), String::new()));
            }
            ToolEvent::Args { index, text } => {
                assert!(
                    *index < calls.len(),
                    "arguments after their call's name: {events:?}"
                );
                assert_eq!(
                    *index + 1,
                    calls.len(),
                    "arguments of the latest call: {events:?}"
                );
                calls[*index].1.push_str(text);
            }
        }
    }
    (events, content, calls)
}

/// Whole, then one character at a time and in pieces of 3: the same content and calls.
fn check(format: ToolFormat, text: &str, content: &str, calls: &[(&str, &str)]) {
    for step in [usize::MAX, 1, 3] {
        let (events, c, k) = run(format, text, step);
        assert_eq!(
            c, content,
            "{format:?} step {step}: content of {text:?}: {events:?}"
        );
        let want: Vec<(String, String)> = calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        assert_eq!(
            k, want,
            "{format:?} step {step}: calls of {text:?}: {events:?}"
        );
    }
    let (c, k) = parse_complete(format, text);
    let want = if content.trim().is_empty() {
        ""
    } else {
        content
    };
    assert_eq!(c.as_deref().unwrap_or(""), want);
    assert_eq!(k.len(), calls.len());
}

#[test]
fn detects_formats_from_templates() {
    let qwen = r#"{%- if tools %}{{- '<|im_start|>system\n' }}# Tools ... <tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools> ... <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>{% endif %}"#;
    assert_eq!(ToolFormat::detect(qwen), Some(ToolFormat::Hermes));
    let llama = "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}{{- '<|python_tag|>' }}";
    assert_eq!(ToolFormat::detect(llama), Some(ToolFormat::Llama3));
    let mistral = "{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}";
    assert_eq!(ToolFormat::detect(mistral), Some(ToolFormat::Mistral));
    let chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    assert_eq!(ToolFormat::detect(chatml), None);
}

#[test]
fn hermes_calls_and_content() {
    let h = ToolFormat::Hermes;
    check(h, "Hello there!", "Hello there!", &[]);
    check(
        h,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "",
        &[("get_weather", r#"{"city": "Paris"}"#)],
    );
    check(
        h,
        "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>",
        "Let me look.",
        &[("a", "{}"), ("b", r#"{"x": [1, {"y": "}"}]}"#)],
    );
    // Arguments before the name (Hermes 2 Pro's order): held until the name is known.
    check(
        h,
        "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"search\"}</tool_call>",
        "",
        &[("search", r#"{"q": 1}"#)],
    );
    // Arguments given as a JSON string, and a call without arguments.
    check(
        h,
        "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
        "",
        &[("f", r#"{"a": 1}"#), ("g", "{}")],
    );
    // A missing closer is forgiven; text after a call is content.
    check(
        h,
        "<tool_call>{\"name\": \"f\", \"arguments\": {}} done",
        "done",
        &[("f", "{}")],
    );
    // Text that only looks like the opener's beginning.
    check(h, "a <tool and <tool_ca", "a <tool and <tool_ca", &[]);
}

#[test]
fn hermes_malformed_and_partial_output_is_content() {
    let h = ToolFormat::Hermes;
    for bad in [
        "<tool_call>\n{name: \"f\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1,}}\n</tool_call>",
        "<tool_call>\n[1, 2]\n</tool_call>",
        "<tool_call>\n{\"city\": \"Paris\"}\n</tool_call>",
        "<tool_call>\n\"just a string\"",
        "<tool_call>\n{}</tool_call>",
    ] {
        let (events, content, calls) = run(h, bad, usize::MAX);
        assert!(calls.is_empty(), "{bad:?}: {events:?}");
        assert_eq!(content, bad, "{bad:?}");
    }
    // Cut before the name is complete: content. Cut after: the call, with what it has.
    let cut = "Sure. <tool_call>\n{\"name\": \"get_wea";
    let (_, content, calls) = run(h, cut, 1);
    assert!(calls.is_empty());
    assert_eq!(content, cut);
    let (_, content, calls) = run(
        h,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,",
        2,
    );
    assert_eq!(content, "");
    assert_eq!(calls, vec![("f".to_string(), "{\"a\": [1,".to_string())]);
    // Only the opener: content.
    let (_, content, calls) = run(h, "<tool_call>", 1);
    assert!(calls.is_empty());
    assert_eq!(content, "<tool_call>");
}

#[test]
fn names_go_out_before_arguments_and_arguments_as_they_grow() {
    let mut p = ToolCallParser::new(ToolFormat::Hermes);
    let mut ev = Vec::new();
    p.push("<tool_call>\n{\"name\": \"get_", &mut ev);
    assert!(ev.is_empty(), "{ev:?}");
    p.push("weather\", \"arguments\": {\"ci", &mut ev);
    assert_eq!(
        ev,
        vec![
            ToolEvent::Call {
                index: 0,
                name: "get_weather".into()
            },
            ToolEvent::Args {
                index: 0,
                text: "{\"ci".into()
            }
        ]
    );
    ev.clear();
    p.push("ty\": \"Paris\"}}\n</tool", &mut ev);
    assert_eq!(
        ev,
        vec![ToolEvent::Args {
            index: 0,
            text: "ty\": \"Paris\"}".into()
        }]
    );
    ev.clear();
    p.push("_call>", &mut ev);
    p.finish(&mut ev);
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(p.calls(), 1);
}

#[test]
fn llama3_calls() {
    let l = ToolFormat::Llama3;
    check(
        l,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        "",
        &[("get_weather", r#"{"city": "Rome"}"#)],
    );
    check(
        l,
        "<|python_tag|>{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"n\": 2}}",
        "",
        &[("f", "{}"), ("g", r#"{"n": 2}"#)],
    );
    check(
        l,
        "The answer is {\"a\": 1}.",
        "The answer is {\"a\": 1}.",
        &[],
    );
    check(l, "{\"answer\": 42}", "{\"answer\": 42}", &[]);
    check(
        l,
        "  {\"name\": \"f\", \"parameters\": {}} and more",
        "and more",
        &[("f", "{}")],
    );
    check(l, "<|python", "<|python", &[]);
}

#[test]
fn mistral_calls() {
    let m = ToolFormat::Mistral;
    check(
        m,
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}, {\"name\": \"b\", \"arguments\": {}}]",
        "",
        &[("a", r#"{"x": 1}"#), ("b", "{}")],
    );
    check(
        m,
        "I will call. [TOOL_CALLS][{\"name\": \"a\"}]",
        "I will call.",
        &[("a", "{}")],
    );
    check(m, "[TOOL_CALLS][]", "[TOOL_CALLS][]", &[]);
    check(
        m,
        "[TOOL_CALLS][{\"x\": 1}]",
        "[TOOL_CALLS][{\"x\": 1}]",
        &[],
    );
}

#[test]
fn generic_answers() {
    let g = ToolFormat::Generic;
    check(
        g,
        "{\"response\": \"Hi \\\"you\\\"\\n\\u00e9\"}",
        "Hi \"you\"\né",
        &[],
    );
    check(
        g,
        "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}}",
        "",
        &[("f", r#"{"a": "b"}"#)],
    );
    check(
        g,
        "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"k\": null}}]}",
        "",
        &[("f", "{}"), ("g", r#"{"k": null}"#)],
    );
    // Not the generic shape, or not JSON: the text as it is.
    check(g, "Plain words.", "Plain words.", &[]);
    check(g, "{\"other\": 1}", "{\"other\": 1}", &[]);
    check(g, "{\"response\": 12}", "12", &[]);
    // A response cut short keeps what was decoded; a cut call without a name is content.
    let (_, content, calls) = run(g, "{\"response\": \"Hello wor", 1);
    assert_eq!((content.as_str(), calls.len()), ("Hello wor", 0));
    let (_, content, calls) = run(g, "{\"tool_call\": {\"na", 1);
    assert_eq!(
        (content.as_str(), calls.len()),
        ("{\"tool_call\": {\"na", 0)
    );
    // Streams the response as it is decoded.
    let mut p = ToolCallParser::new(g);
    let mut ev = Vec::new();
    p.push("{\"response\": \"He", &mut ev);
    assert_eq!(ev, vec![ToolEvent::Content("He".into())]);
}

#[test]
fn plain_json_calls() {
    let j = ToolFormat::PlainJson;
    check(
        j,
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        "",
        &[("f", r#"{"a": 1}"#)],
    );
    check(
        j,
        "[{\"name\": \"f\", \"parameters\": {}}, {\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"{}\"}}]",
        "",
        &[("f", "{}"), ("g", "{}")],
    );
    check(j, "[1, 2]", "[1, 2]", &[]);
    check(j, "no json", "no json", &[]);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    /// Any text, in any pieces, in every format: no panic, and the same content and calls as
    /// the text given whole when nothing went out as a call before an error.
    #[test]
    fn arbitrary_output_never_panics(s in "(<tool_call>|</tool_call>|\\[TOOL_CALLS\\]|[{}\\[\\]\":, ]|name|arguments|response|tool_calls|[a-z]|\\\\){0,40}", step in 1usize..6) {
        for f in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Generic, ToolFormat::PlainJson] {
            let (_, c1, k1) = run(f, &s, usize::MAX);
            let (_, c2, k2) = run(f, &s, step);
            if k1.is_empty() && k2.is_empty() {
                proptest::prop_assert_eq!(c1, c2);
            }
        }
    }
}

#[test]
fn generic_prompt_and_rewriting() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let p = generic_preamble(
        &tools,
        true,
        GenericAsk {
            parallel: false,
            required: false,
        },
    );
    assert!(
        p.starts_with("Respond in JSON format, either with `tool_call`"),
        "{p}"
    );
    assert!(p.contains("\"name\": \"get_weather\""), "{p}");
    assert!(
        p.contains(r#"{"tool_call": {"name": "tool_name", "arguments": {"arg1": "some_value"}}}"#),
        "{p}"
    );
    assert!(p.contains(r#"{"response": "some text"}"#), "{p}");
    let p = generic_preamble(
        &tools,
        false,
        GenericAsk {
            parallel: true,
            required: true,
        },
    );
    assert_eq!(
        p,
        "Respond in JSON format with `tool_calls` (a request to call tools)."
    );

    let no_tools = ToolSupport {
        tools: false,
        calls: false,
        results: false,
        native: None,
    };
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}});
    let msgs = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather?"),
        ChatMessage {
            tool_calls: Some(vec![call.clone()]),
            ..ChatMessage::new("assistant", "")
        },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::new("tool", "sunny")
        },
        ChatMessage {
            tool_call_id: Some("call_2".into()),
            name: Some("other".into()),
            ..ChatMessage::new("tool", "rain")
        },
    ];
    let out = prepare(&msgs, &no_tools, Some("PRE"), false);
    let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(out[0].content, "Be brief.\n\nPRE");
    assert_eq!(
        out[2].content,
        r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}"#
    );
    assert!(out[2].tool_calls.is_none());
    assert_eq!(
        out[3].content,
        "{\"tool_response\": {\"tool\": \"get_weather\", \"content\": \"sunny\", \"tool_call_id\": \"call_1\"}}\n{\"tool_response\": {\"tool\": \"other\", \"content\": \"rain\", \"tool_call_id\": \"call_2\"}}"
    );
    // A template that renders calls and results gets them, arguments as an object.
    let native = ToolSupport {
        tools: true,
        calls: true,
        results: true,
        native: Some(ToolFormat::Hermes),
    };
    let out = prepare(&msgs[1..], &native, None, true);
    assert_eq!(out.len(), 4);
    assert_eq!(
        out[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"],
        json!({"city": "Paris"})
    );
    assert_eq!(out[2].role, "tool");
    // No system message: the preamble becomes one.
    let out = prepare(&msgs[1..2], &no_tools, Some("PRE"), true);
    assert_eq!(
        (out[0].role.as_str(), out[0].content.as_str()),
        ("system", "PRE")
    );
    assert_eq!(
        compact(&json!({"a": [1, {"b": null}]})),
        r#"{"a": [1, {"b": null}]}"#
    );
}
