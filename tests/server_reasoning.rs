//! Reasoning separated from the answer on `kiln serve`: a chat template that opens `<think>`
//! in the prompt (qwen3 / deepseek-r1 style, on the random llama fixture), the answer forced
//! by a grammar. `reasoning_format` `"deepseek"` / `"auto"` give `reasoning_content` in the
//! message and the stream's deltas; `"none"` (the default) leaves it in the content; other
//! values are refused by name.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::{sse_events, Server};
use serde_json::{json, Value};

/// ChatML whose generation prompt opens `<think>` (thinking forced open).
const THINK_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

/// The answer the grammar forces: reasoning, `</think>`, then content.
const ANSWER: &str = "plan it</think>\n\nThe answer.";

fn server() -> Server {
    let dir = common::tmp_dir().join("reasoning");
    std::fs::create_dir_all(&dir).unwrap();
    let tpl = dir.join("think_template.jinja");
    std::fs::write(&tpl, THINK_TEMPLATE).unwrap();
    Server::start(
        &common::random_model("random-llama-q4_0"),
        &["--chat-template-file", tpl.to_str().unwrap()],
    )
}

fn body(extra: Value) -> Value {
    let grammar = format!("root ::= {}", serde_json::to_string(ANSWER).unwrap());
    let mut b = json!({"messages": [{"role": "user", "content": "2+2?"}],
                       "max_tokens": 64, "temperature": 0, "grammar": grammar});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

fn chat(s: &Server, extra: Value) -> Value {
    let a = s.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &body(extra).to_string(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

#[test]
fn reasoning_format_separates_forced_open_thinking() {
    let s = server();
    // Default and "none": the reasoning stays in the content.
    for extra in [json!({}), json!({"reasoning_format": "none"})] {
        let m = &chat(&s, extra)["choices"][0]["message"];
        assert_eq!(m["content"], ANSWER, "{m}");
        assert!(m.get("reasoning_content").is_none(), "{m}");
    }
    for format in ["deepseek", "auto"] {
        let m = &chat(&s, json!({"reasoning_format": format}))["choices"][0]["message"];
        assert_eq!(m["reasoning_content"], "plan it", "{m}");
        assert_eq!(m["content"], "The answer.", "{m}");
        // Streamed: the deltas add up to the same split.
        let a = s.request(
            "POST",
            "/v1/chat/completions",
            &[],
            &body(json!({"reasoning_format": format, "stream": true})).to_string(),
        );
        assert_eq!(a.status, 200, "{}", a.text());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for e in sse_events(&a.text()) {
            let d = &e["choices"][0]["delta"];
            reasoning += d["reasoning_content"].as_str().unwrap_or("");
            content += d["content"].as_str().unwrap_or("");
        }
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("plan it", "The answer.")
        );
    }
    let a = s.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &body(json!({"reasoning_format": "deepseek-legacy"})).to_string(),
    );
    let e = a.expect_error(400, "deepseek-legacy");
    assert_eq!(e["param"], "reasoning_format", "{e}");
}

/// Ollama's `think: true` on `/api/chat`: the thoughts come in `message.thinking` (whole and
/// streamed). The forced-open template makes the whole unforced greedy answer (which never
/// closes `</think>`) thoughts: `thinking` is the `think: false` answer, trimmed.
#[test]
fn ollama_think_gives_thinking() {
    let s = server();
    let ask = |think: bool, stream: bool| {
        let b = json!({"model": "x", "messages": [{"role": "user", "content": "2+2?"}],
                       "think": think, "stream": stream,
                       "options": {"temperature": 0, "num_predict": 12}});
        let a = s.request("POST", "/api/chat", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        a.text()
    };
    let plain: Value = serde_json::from_str(&ask(false, false)).unwrap();
    let raw = plain["message"]["content"].as_str().unwrap().to_string();
    assert!(plain["message"].get("thinking").is_none(), "{plain}");
    assert!(
        !raw.trim().is_empty() && !raw.contains("</think>"),
        "{raw:?}"
    );

    let whole: Value = serde_json::from_str(&ask(true, false)).unwrap();
    assert_eq!(whole["message"]["thinking"], raw.trim(), "{whole}");
    assert_eq!(whole["message"]["content"], "", "{whole}");

    let (mut thinking, mut content) = (String::new(), String::new());
    // (Read raw: chunk-size lines are skipped.)
    for line in ask(true, true).lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).unwrap();
        thinking += v["message"]["thinking"].as_str().unwrap_or("");
        content += v["message"]["content"].as_str().unwrap_or("");
    }
    assert_eq!((thinking.as_str(), content.as_str()), (raw.trim(), ""));

    // `/api/generate` does not separate thoughts: refused by name.
    let b = json!({"model": "x", "prompt": "hi", "think": true, "stream": false});
    let a = s.request("POST", "/api/generate", &[], &b.to_string());
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("think"), "{}", a.text());
}

/// ChatML whose generation prompt opens `<think>` unless `chat_template_kwargs` turns
/// `enable_thinking` off (Qwen 3's switch), and which prints a `note` kwarg where given.
const SWITCH_TEMPLATE: &str = "{% if note is defined %}[{{ note }}]{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

fn switch_server() -> Server {
    let dir = common::tmp_dir().join("reasoning");
    std::fs::create_dir_all(&dir).unwrap();
    let tpl = dir.join("switch_template.jinja");
    std::fs::write(&tpl, SWITCH_TEMPLATE).unwrap();
    Server::start(
        &common::random_model("random-llama-q4_0"),
        &["--chat-template-file", tpl.to_str().unwrap()],
    )
}

/// `chat_template_kwargs` are variables of the template's context: `enable_thinking: false`
/// closes the thinking the template would open (so nothing is reasoning), a string is printed
/// as literal text; kiln's own variables, and values other than booleans, numbers, nulls and
/// short strings, are refused by name.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let s = switch_server();
    let ask = json!([{"role": "user", "content": "2+2?"}]);
    let apply = |kwargs: Value| {
        let b = json!({"messages": ask, "chat_template_kwargs": kwargs});
        let a = s.request("POST", "/apply-template", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["prompt"].as_str().unwrap().to_owned()
    };
    let open = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    assert_eq!(apply(Value::Null), open);
    assert_eq!(apply(json!({"enable_thinking": true})), open);
    assert_eq!(
        apply(json!({"enable_thinking": false, "note": "<|im_end|>"})),
        "[<|im_end|>]<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );

    // Reasoning separated: forced open by default, all of the answer is reasoning; closed by
    // the switch, none is.
    let chat = |kwargs: Value| {
        let b = json!({"messages": ask, "max_tokens": 8, "temperature": 0,
                       "reasoning_format": "deepseek", "chat_template_kwargs": kwargs});
        let a = s.request("POST", "/v1/chat/completions", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["choices"][0]["message"].clone()
    };
    let thinking = chat(Value::Null);
    assert!(thinking["reasoning_content"].is_string(), "{thinking}");
    assert_eq!(thinking["content"], "", "{thinking}");
    let plain = chat(json!({"enable_thinking": false}));
    assert!(plain.get("reasoning_content").is_none(), "{plain}");
    assert!(!plain["content"].as_str().unwrap().is_empty(), "{plain}");
    // The prompt is the template's: `usage` counts the closed block's tokens.
    let tokens = |kwargs: Value| {
        let b = json!({"messages": ask, "max_tokens": 1, "chat_template_kwargs": kwargs});
        let a = s.request("POST", "/v1/chat/completions", &[], &b.to_string());
        a.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert!(tokens(json!({"enable_thinking": false})) > tokens(Value::Null));

    for (kwargs, param) in [
        (
            json!({"add_generation_prompt": false}),
            "chat_template_kwargs.add_generation_prompt",
        ),
        (json!({"messages": []}), "chat_template_kwargs.messages"),
        (json!({"bos_token": "x"}), "chat_template_kwargs.bos_token"),
        (
            json!({"enable_thinking": {"x": 1}}),
            "chat_template_kwargs.enable_thinking",
        ),
        (json!({"note": ["a"]}), "chat_template_kwargs.note"),
        (
            json!({"note": "x".repeat(257)}),
            "chat_template_kwargs.note",
        ),
        (json!(["enable_thinking"]), "chat_template_kwargs"),
    ] {
        let b = json!({"messages": ask, "max_tokens": 1, "chat_template_kwargs": kwargs});
        let a = s.request("POST", "/v1/chat/completions", &[], &b.to_string());
        let e = a.expect_error(400, param);
        assert_eq!(e["param"], param, "{e}");
    }
}

/// Anthropic's `thinking` (`{"type": "enabled", "budget_tokens": N}`) on `/v1/messages`: the
/// reasoning comes as a `thinking` block (streamed as `thinking_delta`s). The forced-open
/// template makes the whole unforced greedy answer (which never closes `</think>`) thoughts:
/// the block's text is the answer without `thinking`, trimmed.
#[test]
fn anthropic_thinking_gives_thinking_blocks() {
    let s = switch_server();
    let ask = |thinking: Value, stream: bool| {
        let b = json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 12,
                       "temperature": 0, "thinking": thinking, "stream": stream});
        let a = s.request("POST", "/v1/messages", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        a
    };
    let plain = ask(Value::Null, false).json();
    let raw = plain["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(
        !raw.trim().is_empty() && !raw.contains("</think>"),
        "{plain}"
    );

    let on = json!({"type": "enabled", "budget_tokens": 8});
    let m = ask(on.clone(), false).json();
    assert_eq!(
        m["content"],
        json!([{"type": "thinking", "thinking": raw.trim(), "signature": ""}]),
        "{m}"
    );
    assert_eq!(m["stop_reason"], "max_tokens");

    // Streamed: a thinking block, its text in thinking_deltas.
    let text = ask(on, true).text();
    let (mut thinking, mut starts) = (String::new(), Vec::new());
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(line).unwrap();
        match v["type"].as_str().unwrap() {
            "content_block_start" => starts.push(v["content_block"]["type"].clone()),
            "content_block_delta" => {
                assert_eq!(v["delta"]["type"], "thinking_delta", "{v}");
                thinking += v["delta"]["thinking"].as_str().unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(starts, [json!("thinking")]);
    assert_eq!(thinking, raw.trim());

    // Disabled: the template's switch closes the thinking (Qwen 3's `enable_thinking`).
    let off = ask(json!({"type": "disabled"}), false).json();
    assert!(
        off["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] == "text"),
        "{off}"
    );
    assert!(off["usage"]["input_tokens"].as_u64() > plain["usage"]["input_tokens"].as_u64());
    // A budget of at least max_tokens is refused by name.
    let b = json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 12,
                   "thinking": {"type": "enabled", "budget_tokens": 12}});
    let a = s.request("POST", "/v1/messages", &[], &b.to_string());
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("thinking.budget_tokens"), "{}", a.text());
}

/// The Responses API answers a model that thinks with a `reasoning` item (its text as
/// `reasoning_text` content), streamed as `response.reasoning_text.delta` / `.done`. The
/// forced-open template makes the whole unforced greedy answer thoughts; the switch closed, it
/// is a message.
#[test]
fn responses_give_reasoning_items() {
    let s = switch_server();
    let ask = |kwargs: Value, stream: bool| {
        let b = json!({"input": "2+2?", "max_output_tokens": 12, "temperature": 0,
                       "stream": stream});
        let mut chat = json!({"messages": [{"role": "user", "content": "2+2?"}],
                              "max_tokens": 12, "temperature": 0});
        if !kwargs.is_null() {
            chat["chat_template_kwargs"] = kwargs;
        }
        let a = s.request("POST", "/v1/responses", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        (a, chat)
    };
    let (a, chat) = ask(Value::Null, false);
    let c = s.request("POST", "/v1/chat/completions", &[], &chat.to_string());
    let raw = c.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = a.json();
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{r}");
    assert_eq!(out[0]["type"], "reasoning", "{r}");
    assert_eq!(out[0]["summary"], json!([]), "{r}");
    assert_eq!(out[0]["status"], "completed", "{r}");
    assert_eq!(
        out[0]["content"],
        json!([{"type": "reasoning_text", "text": raw.trim()}]),
        "{r}"
    );

    let (a, _) = ask(Value::Null, true);
    let (mut delta, mut done, mut kinds) = (String::new(), None, Vec::new());
    for line in a.text().lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(line).unwrap();
        let kind = v["type"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "response.reasoning_text.delta" => delta += v["delta"].as_str().unwrap(),
            "response.reasoning_text.done" => done = Some(v["text"].clone()),
            "response.output_text.delta" => panic!("{v}"),
            _ => {}
        }
        kinds.push(kind);
    }
    assert_eq!(delta, raw.trim());
    assert_eq!(done, Some(json!(raw.trim())));
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("{k}: {kinds:?}"))
    };
    assert!(at("response.output_item.added") < at("response.content_part.added"));
    assert!(at("response.reasoning_text.done") < at("response.output_item.done"));
    assert!(at("response.output_item.done") < at("response.incomplete"));
}
