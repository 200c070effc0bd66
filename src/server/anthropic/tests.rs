use serde_json::json;

use super::answer::{Events, Folded, Step};
use super::*;

#[test]
fn messages_become_openai_messages() {
    let system = json!([{"type": "text", "text": "You are terse. "},
                        {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral"}}]);
    let msgs = vec![
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": "x"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {"zone": "CET"}}]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": [{"type": "text", "text": "14:"}, {"type": "text", "text": "05"}]},
            {"type": "text", "text": "Thanks."}]}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_3",
                                                 "name": "get_time", "input": {}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]}),
    ];
    let got = openai_messages(Some(&system), &msgs).unwrap();
    let want = vec![
        json!({"role": "system", "content": "You are terse. Answer in French."}),
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
               "tool_calls": [
                   {"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                   {"id": "toolu_2", "type": "function",
                    "function": {"name": "get_time", "arguments": "{\"zone\":\"CET\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}),
        json!({"role": "tool", "tool_call_id": "toolu_2", "content": "14:05"}),
        json!({"role": "user", "content": [{"type": "text", "text": "Thanks."}]}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_3", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "toolu_3", "content": ""}),
    ];
    assert_eq!(got, want);
    // No system prompt: none.
    let got = openai_messages(None, &msgs[..1]).unwrap();
    assert_eq!(got, want[1..2]);
}

#[test]
fn media_in_a_tool_result_becomes_a_placeholder() {
    let msgs = vec![
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "the chart: "},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
            {"type": "document", "source": {"type": "text", "data": "x"}}]}]}),
        // (An empty final assistant turn is no prefill, as Anthropic takes it.)
        json!({"role": "assistant", "content": []}),
    ];
    let got = openai_messages(None, &msgs).unwrap();
    assert_eq!(
        got,
        vec![json!({"role": "tool", "tool_call_id": "t", "content":
            "the chart: [image omitted: this model reads text only][document omitted: this model reads text only]"})]
    );
}

#[test]
fn max_tokens_and_stop_sequences_take_llama_servers_limits() {
    assert_eq!(max_tokens(None).unwrap(), None);
    assert_eq!(
        max_tokens(Some(&json!(1_000_000))).unwrap(),
        Some(1_000_000)
    );
    for bad in [json!(0), json!(-1), json!(2.5), json!("8")] {
        let e = max_tokens(Some(&bad)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{bad}");
    }
    let six: Vec<String> = (0..6).map(|i| format!("END{i}")).collect();
    assert_eq!(
        stop_sequences(Some(&json!(six))).unwrap(),
        Some(six.clone())
    );
    let e = stop_sequences(Some(&json!("END"))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stop_sequences"));
    // Applied as llama-server's: beyond the room the context leaves, cut to it; more than
    // OpenAI's 4 stops kept; too many refused under Anthropic's name.
    let gen = |max_tokens, stop: &[String]| {
        let c = Converted {
            chat: ChatRequest::from_json(&json!({"messages": [{"role": "user", "content": "x"}]}))
                .unwrap(),
            max_tokens,
            stop: Some(stop.to_vec()),
        };
        let mut g = c.chat.params.validate(100, 1024).unwrap();
        c.wide()
            .apply(&mut g, 1024)
            .map(|_| g)
            .map_err(anthropic_names)
    };
    let g = gen(Some(1_000_000), &six).unwrap();
    assert_eq!(g.max_new, 924);
    assert_eq!(g.stop, six);
    assert_eq!(gen(Some(7), &[]).unwrap().max_new, 7);
    let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
    let e = gen(None, &many).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stop_sequences"), "{}", e.message);
}

#[test]
fn unreadable_messages_are_refused_by_name() {
    let refused = |system: Option<Value>, msgs: Value, param: &str, needle: &str| {
        let msgs = msgs.as_array().unwrap().clone();
        let e = openai_messages(system.as_ref(), &msgs).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        assert!(e.message.contains(needle), "{}", e.message);
    };
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}});
    refused(
        None,
        json!([{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]),
        "messages[0].content[1]",
        "image blocks are not supported",
    );
    refused(
        None,
        json!([{"role": "system", "content": "x"}]),
        "messages[0].role",
        "`system`",
    );
    refused(
        None,
        json!([{"role": "user", "content": 3}]),
        "messages[0].content",
        "a string or a list",
    );
    refused(
        None,
        json!([{"role": "user", "content": [{"text": "no type"}]}]),
        "messages[0].content[0]",
        "needs a `type`",
    );
    refused(
        None,
        json!([{"role": "user", "content": [{"type": "text", "text": 1}]}]),
        "messages[0].content[0].text",
        "must be a string",
    );
    refused(
        None,
        json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
        "messages[0].content[0]",
        "a `tool_use` block belongs in an assistant message, not a user one",
    );
    refused(
        None,
        json!([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]),
        "messages[0].content[0]",
        "a `tool_result` block belongs in a user message",
    );
    refused(
        None,
        json!([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
        "messages[0].content[0].tool_use_id",
        "must be a string",
    );
    refused(
        None,
        json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                      "content": [{"type": "audio"}]}]}]),
        "messages[0].content[0].content[0]",
        "blocks of type `audio`",
    );
    refused(
        None,
        json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                  "input": "{\"x\": 1}"}]}]),
        "messages[0].content[0].input",
        "must be an object",
    );
    refused(
        None,
        json!([{"role": "user", "content": []}]),
        "messages[0].content",
        "at least one content block",
    );
    refused(
        None,
        json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": []},
               {"role": "user", "content": "b"}]),
        "messages[1].content",
        "at least one content block",
    );
    refused(
        Some(json!([{"type": "image"}])),
        json!([]),
        "system[0]",
        "image blocks",
    );
    refused(
        Some(json!(7)),
        json!([]),
        "system",
        "a string or a list of text blocks",
    );
}

#[test]
fn claude_codes_billing_stamp_is_steadied() {
    let steady = |s: &str| {
        let mut s = s.to_owned();
        steady_billing_header(&mut s);
        s
    };
    let head = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=";
    assert_eq!(
        steady(&format!("{head}a5145;You are Claude Code.")),
        format!("{head}fffff;You are Claude Code.")
    );
    // Anything else stays as it is.
    for s in [
        "You are Claude Code. cch=a5145;",
        &format!("{head}a514;x"),
        &format!("{head}a5145"),
        &format!("{head}é5145;x"),
    ] {
        assert_eq!(steady(s), s);
    }
}

#[test]
fn tools_and_choices_become_openai_ones() {
    let tools = vec![
        json!({"name": "get_weather", "description": "Weather", "input_schema":
               {"type": "object", "properties": {"city": {"type": "string"}}}}),
        json!({"name": "noop", "type": "custom"}),
    ];
    assert_eq!(
        openai_tools(&tools).unwrap(),
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}),
        ]
    );
    let e =
        openai_tools(&[json!({"type": "web_search_20250305", "name": "web_search"})]).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0]"));
    assert!(e.message.contains("server tools"), "{}", e.message);
    let e = openai_tools(&[json!({"description": "no name"})]).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].name"));

    let choice = |v: Value| openai_tool_choice(&v).unwrap();
    assert_eq!(choice(json!({"type": "auto"})), (json!("auto"), None));
    assert_eq!(
        choice(json!({"type": "any", "disable_parallel_tool_use": true})),
        (json!("required"), Some(false))
    );
    assert_eq!(choice(json!({"type": "none"})), (json!("none"), None));
    assert_eq!(
        choice(json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": false})),
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            Some(true)
        )
    );
    for bad in [
        json!("auto"),
        json!({"type": "required"}),
        json!({"type": "tool"}),
    ] {
        let e = openai_tool_choice(&bad).unwrap_err();
        assert!(
            e.param.as_deref().unwrap().starts_with("tool_choice"),
            "{bad}"
        );
    }
}

#[test]
fn errors_take_anthropics_shape() {
    let body = |s: u16| error_body(StatusCode::from_u16(s).unwrap(), "m");
    assert_eq!(
        body(400),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "m"}})
    );
    let kinds = [
        (401, "authentication_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
    ];
    for (s, kind) in kinds {
        assert_eq!(body(s)["error"]["type"], kind, "{s}");
    }
}

/// The steps of an answer with text, a call and a stop.
fn steps() -> Vec<Step> {
    vec![
        Step::Text,
        Step::More("Let me ".into()),
        Step::More("look.".into()),
        Step::Close,
        Step::Tool {
            id: "call_1".into(),
            name: "get_weather".into(),
        },
        Step::More("{\"city\": ".into()),
        Step::More("\"Paris\"}".into()),
        Step::Close,
        Step::End {
            stop_reason: "tool_use",
            stop_sequence: None,
            output_tokens: 17,
        },
    ]
}

#[test]
fn steps_fold_into_a_message() {
    let mut message = json!({"content": [], "usage": {"input_tokens": 5, "output_tokens": 0}});
    let mut f = Folded::new();
    for s in steps() {
        f.step(s, &mut message, "raw");
    }
    assert_eq!(
        message,
        json!({
        "content": [{"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 17}})
    );
    // A call cut short: the answer's text instead.
    let mut message = json!({"usage": {}});
    let mut f = Folded::new();
    let mut cut = steps();
    cut[6] = Step::More("\"Par".into());
    cut[8] = Step::End {
        stop_reason: "max_tokens",
        stop_sequence: None,
        output_tokens: 9,
    };
    for s in cut {
        f.step(s, &mut message, "the raw answer");
    }
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "the raw answer"}])
    );
    assert_eq!(message["stop_reason"], "max_tokens");

    // A broken call after a complete one: only its own block goes.
    let mut message = json!({"usage": {}});
    let mut f = Folded::new();
    let mut two = steps();
    let end = two.pop().unwrap();
    two.extend([
        Step::Tool {
            id: "call_2".into(),
            name: "get_time".into(),
        },
        Step::More("[\"CET\"]".into()),
        Step::Close,
        end,
    ]);
    for s in two {
        f.step(s, &mut message, "the raw answer");
    }
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Let me look."},
               {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}])
    );
}

#[test]
fn steps_stream_as_named_events() {
    let mut ev = Events::new();
    let got: Vec<(&str, Value)> = steps().into_iter().flat_map(|s| ev.of(s)).collect();
    let want = vec![
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "Let me "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "look."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 17}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    assert_eq!(got, want);
    let e = Events::new().of(Step::Error("refused".into()));
    assert_eq!(
        e,
        vec![(
            "error",
            json!({"type": "error", "error":
        {"type": "invalid_request_error", "message": "refused"}})
        )]
    );
}

#[test]
fn thinking_steps_fold_and_stream_as_thinking_blocks() {
    let steps = || {
        vec![
            Step::Thinking,
            Step::More("plan ".into()),
            Step::More("it".into()),
            Step::Close,
            Step::Text,
            Step::More("The answer.".into()),
            Step::Close,
            Step::End {
                stop_reason: "end_turn",
                stop_sequence: None,
                output_tokens: 6,
            },
        ]
    };
    let mut message = json!({"usage": {}});
    let mut f = Folded::new();
    for s in steps() {
        f.step(s, &mut message, "raw");
    }
    assert_eq!(
        message["content"],
        json!([{"type": "thinking", "thinking": "plan it", "signature": ""},
               {"type": "text", "text": "The answer."}])
    );
    let mut ev = Events::new();
    let got: Vec<(&str, Value)> = steps().into_iter().flat_map(|s| ev.of(s)).collect();
    assert_eq!(
        got[0].1,
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
    );
    assert_eq!(
        got[1].1,
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "thinking_delta", "thinking": "plan "}})
    );
    assert_eq!(
        got[5].1,
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "text_delta", "text": "The answer."}})
    );
}

#[test]
fn thinking_is_enabled_with_a_budget_below_max_tokens() {
    assert_eq!(thinking(None, Some(10)).unwrap(), None);
    let on = json!({"type": "enabled", "budget_tokens": 1024});
    assert_eq!(thinking(Some(&on), Some(2048)).unwrap(), Some(true));
    assert_eq!(thinking(Some(&on), None).unwrap(), Some(true));
    let off = json!({"type": "disabled"});
    assert_eq!(thinking(Some(&off), Some(10)).unwrap(), Some(false));
    for (bad, param) in [
        (
            json!({"type": "enabled", "budget_tokens": 1024}),
            "thinking.budget_tokens",
        ),
        (json!({"type": "enabled"}), "thinking.budget_tokens"),
        (
            json!({"type": "enabled", "budget_tokens": 0}),
            "thinking.budget_tokens",
        ),
        (json!({"type": "sometimes"}), "thinking.type"),
        (json!("on"), "thinking.type"),
    ] {
        let e = thinking(Some(&bad), Some(1024)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{bad}: {}", e.message);
    }
}

#[test]
fn shared_errors_name_anthropics_fields() {
    let renamed = |param: &str, message: &str| {
        let e = anthropic_names(ApiError::invalid_param(param, message));
        (e.param.unwrap(), e.message)
    };
    assert_eq!(
        renamed("stop", "stop takes up to 64 sequences"),
        (
            "stop_sequences".into(),
            "stop_sequences takes up to 64 sequences".into()
        )
    );
    assert_eq!(
        renamed(
            "tools[1].function.parameters",
            "tools[1].function.parameters: not a schema"
        ),
        (
            "tools[1].input_schema".into(),
            "tools[1].input_schema: not a schema".into()
        )
    );
    assert_eq!(
        renamed("tools[0].function.name", "two tools are named `f`").0,
        "tools[0].name"
    );
    assert_eq!(
        renamed("parallel_tool_calls", "parallel_tool_calls needs tools").1,
        "tool_choice.disable_parallel_tool_use needs tools"
    );
    assert_eq!(renamed("max_tokens", "m").0, "max_tokens");
}
