//! Anthropic's Messages API on `kiln serve` (SmolLM2): `/v1/messages` gives the text of
//! `/v1/chat/completions` for the same conversation, whole and as Anthropic's named events,
//! with its stop reasons and token counts; tool calls (a Hermes template, as in
//! tests/server_tools.rs) come back as `tool_use` blocks with input objects and go back in as
//! `tool_result` blocks; `/v1/messages/count_tokens` counts the prompt; errors take
//! Anthropic's shape, and `x-api-key` carries the API key.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::path::PathBuf;

use harness::{Answer, Server};
use serde_json::{json, Value};

const KEY: &str = "x-api-key: anthropic-test-key";

fn post(s: &Server, path: &str, headers: &[&str], body: &Value) -> Answer {
    s.request("POST", path, headers, &body.to_string())
}

fn message(s: &Server, body: &Value) -> Value {
    let a = post(s, "/v1/messages", &[KEY], body);
    assert_eq!(a.status, 200, "{body}: {}", a.text());
    let m = a.json();
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant")),
        "{m}"
    );
    assert!(
        m["id"].as_str().is_some_and(|i| i.starts_with("msg_")),
        "{m}"
    );
    m
}

/// A message's text blocks joined.
fn text_of(m: &Value) -> String {
    let blocks = m["content"].as_array().unwrap_or_else(|| panic!("{m}"));
    blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

/// The named events of a streamed message, `(event, data)`: each `event:` line's name is its
/// data's `type`.
fn events(a: &Answer) -> Vec<(String, Value)> {
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let text = a.text();
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_owned());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{d:?}: {e}"));
            let n = name
                .take()
                .unwrap_or_else(|| panic!("data without an event: {d}"));
            assert_eq!(v["type"], json!(n), "{v}");
            out.push((n, v));
        }
    }
    out
}

/// A streamed message folded back: the message of `message_start` with the blocks of the
/// deltas (a tool's input parsed from its JSON pieces) and `message_delta`'s reason and usage.
fn fold(ev: &[(String, Value)]) -> Value {
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    let mut m = ev[0].1["message"].clone();
    assert_eq!(m["content"], json!([]));
    assert_eq!(m["stop_reason"], Value::Null);
    let mut blocks: Vec<Value> = Vec::new();
    let mut args = String::new();
    let mut open = None;
    for (n, v) in &ev[2..ev.len() - 2] {
        let i = v["index"].as_u64().unwrap() as usize;
        match n.as_str() {
            "content_block_start" => {
                assert_eq!((open, i), (None, blocks.len()), "{v}");
                open = Some(i);
                blocks.push(v["content_block"].clone());
            }
            "content_block_delta" => {
                assert_eq!(open, Some(i), "{v}");
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = blocks[i]["text"].as_str().unwrap().to_owned();
                        blocks[i]["text"] = json!(t + d["text"].as_str().unwrap());
                    }
                    "input_json_delta" => args.push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(i), "{v}");
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] = serde_json::from_str(&std::mem::take(&mut args)).unwrap();
                }
            }
            other => panic!("event {other}: {v}"),
        }
    }
    assert_eq!(open, None);
    let delta = &ev[ev.len() - 2].1;
    m["content"] = json!(blocks);
    m["stop_reason"] = delta["delta"]["stop_reason"].clone();
    m["stop_sequence"] = delta["delta"]["stop_sequence"].clone();
    m["usage"]["output_tokens"] = delta["usage"]["output_tokens"].clone();
    m
}

/// The error of an answer: its status and Anthropic's `{"type": "error", "error": {...}}`.
fn error(a: &Answer, status: u16, kind: &str, needle: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    let e = a.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], kind, "{e}");
    let msg = e["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{e}"));
    assert!(msg.contains(needle), "{msg}");
}

#[test]
fn messages_answer_as_anthropic_does() {
    let model = common::real_model("smollm2");
    let s = Server::start(
        &model,
        &[
            "-P",
            "2",
            "--api-key",
            "anthropic-test-key",
            "--alias",
            "smol",
            "--strict-model",
        ],
    );
    let system = "You are a helpful assistant who answers briefly.";
    let ask = "Name three colors of the rainbow.";
    let body = json!({"model": "smol", "max_tokens": 40, "temperature": 0,
                      "system": [{"type": "text", "text": system}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": ask}]}]});

    // Whole: the chat route's text, reason and counts.
    let m = message(&s, &body);
    let openai = json!({"model": "smol", "max_tokens": 40, "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": ask}]});
    let a = s.request(
        "POST",
        "/v1/chat/completions",
        &["Authorization: Bearer anthropic-test-key"],
        &openai.to_string(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let c = a.json();
    let text = c["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!text.trim().is_empty());
    assert_eq!(text_of(&m), text, "{m}");
    assert_eq!(m["model"], "smol");
    let reason = match c["choices"][0]["finish_reason"].as_str().unwrap() {
        "length" => "max_tokens",
        "stop" => "end_turn",
        r => panic!("{r}"),
    };
    assert_eq!(
        (m["stop_reason"].as_str(), &m["stop_sequence"]),
        (Some(reason), &Value::Null),
        "{m}"
    );
    assert_eq!(
        m["usage"]["input_tokens"], c["usage"]["prompt_tokens"],
        "{m}"
    );
    assert_eq!(
        m["usage"]["output_tokens"], c["usage"]["completion_tokens"],
        "{m}"
    );

    // Streamed: the same message.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&s, "/v1/messages", &[KEY], &streamed));
    let mut folded = fold(&ev);
    assert_eq!(
        ev[0].1["message"]["usage"]["input_tokens"],
        m["usage"]["input_tokens"]
    );
    folded["id"] = m["id"].clone();
    assert_eq!(folded, m);

    // A stop sequence: the text before it, the sequence named.
    let words: Vec<&str> = text.split_whitespace().collect();
    let stop = words
        .iter()
        .skip(1)
        .find(|w| w.len() >= 3)
        .copied()
        .unwrap_or_else(|| panic!("{text:?}"));
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!(["zzzz-never", stop]);
    let m = message(&s, &stopped);
    assert_eq!(text_of(&m), text[..text.find(stop).unwrap()], "{m}");
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop))
    );
    stopped["stream"] = json!(true);
    let mut folded = fold(&events(&post(&s, "/v1/messages", &[KEY], &stopped)));
    folded["id"] = m["id"].clone();
    assert_eq!(folded, m);

    // The cap: max_tokens.
    let mut short = body.clone();
    short["max_tokens"] = json!(3);
    let m = message(&s, &short);
    assert_eq!(
        (
            m["stop_reason"].as_str(),
            m["usage"]["output_tokens"].as_u64()
        ),
        (Some("max_tokens"), Some(3))
    );

    // Under llama-server's limits, not OpenAI's: a max_tokens beyond the context is cut to the
    // room left (the same answer as without), and more than 4 stop sequences are taken.
    let mut wide = body.clone();
    wide["max_tokens"] = json!(1_000_000);
    wide["stop_sequences"] = json!(["<a>", "<b>", "<c>", "<d>", "<e>", "<f>"]);
    let w = message(&s, &wide);
    let mut unbounded = body.clone();
    unbounded.as_object_mut().unwrap().remove("max_tokens");
    let u = message(&s, &unbounded);
    assert_eq!(text_of(&w), text_of(&u));
    assert_eq!(w["stop_reason"], u["stop_reason"], "{w}");

    // count_tokens: the prompt's tokens (no max_tokens needed).
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let a = post(&s, "/v1/messages/count_tokens", &[KEY], &count);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.json(),
        json!({"input_tokens": c["usage"]["prompt_tokens"]})
    );

    // The key: as x-api-key or a bearer token, on every keyed route; none is Anthropic's 401.
    error(
        &post(&s, "/v1/messages", &[], &body),
        401,
        "authentication_error",
        "",
    );
    error(
        &post(&s, "/v1/messages", &["x-api-key: wrong"], &body),
        401,
        "authentication_error",
        "",
    );
    let a = post(
        &s,
        "/v1/messages",
        &["Authorization: Bearer anthropic-test-key"],
        &short,
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let a = s.request("POST", "/v1/chat/completions", &[KEY], &openai.to_string());
    assert_eq!(a.status, 200, "{}", a.text());

    // Refusals, in Anthropic's shape, naming what is wrong.
    let mut wrong = body.clone();
    wrong["model"] = json!("claude-sonnet-4-5");
    error(
        &post(&s, "/v1/messages", &[KEY], &wrong),
        404,
        "not_found_error",
        "claude-sonnet-4-5",
    );
    let mut image = body.clone();
    image["messages"][0]["content"] =
        json!([{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]);
    error(
        &post(&s, "/v1/messages", &[KEY], &image),
        400,
        "invalid_request_error",
        "messages[0].content[0]",
    );
    let mut bad_stop = body.clone();
    bad_stop["stop_sequences"] = json!(7);
    error(
        &post(&s, "/v1/messages", &[KEY], &bad_stop),
        400,
        "invalid_request_error",
        "stop_sequences",
    );
    let mut empty = body.clone();
    empty["messages"] = json!([{"role": "user", "content": []}]);
    error(
        &post(&s, "/v1/messages", &[KEY], &empty),
        400,
        "invalid_request_error",
        "messages[0].content",
    );
    let mut text_input = body.clone();
    text_input["messages"] = json!([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "y"}]}]);
    error(
        &post(&s, "/v1/messages", &[KEY], &text_input),
        400,
        "invalid_request_error",
        "messages[1].content[0].input",
    );
    let mut none = body.clone();
    none["messages"] = json!([]);
    error(
        &post(&s, "/v1/messages", &[KEY], &none),
        400,
        "invalid_request_error",
        "messages",
    );
    error(
        &s.request("POST", "/v1/messages", &[KEY], "{\"model\": "),
        400,
        "invalid_request_error",
        "",
    );
    error(
        &s.request("GET", "/v1/messages", &[KEY], ""),
        405,
        "invalid_request_error",
        "GET",
    );
    let mut long = body.clone();
    long["messages"][0]["content"] = json!("word ".repeat(5000));
    error(
        &post(&s, "/v1/messages", &[KEY], &long),
        400,
        "invalid_request_error",
        "context",
    );
}

fn hermes_template() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/server/hermes_template.jinja")
}

#[test]
fn tools_go_out_as_tool_use_and_back_as_tool_result() {
    let model = common::real_model("smollm2");
    let tpl = hermes_template();
    let s = Server::start(
        &model,
        &["-P", "2", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let tools = json!([
        {"name": "get_weather", "description": "Get the current weather in a city",
         "input_schema": {"type": "object", "properties": {
             "city": {"type": "string", "maxLength": 24},
             "unit": {"enum": ["celsius", "fahrenheit"]}},
             "required": ["city", "unit"], "additionalProperties": false}},
        {"name": "get_time", "description": "Get the local time in a time zone",
         "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
             "required": ["zone"], "additionalProperties": false}}
    ]);
    let ask = json!({"role": "user", "content": "What is the weather like in Paris today?"});
    let body = json!({"max_tokens": 96, "temperature": 0, "tools": tools,
                      "tool_choice": {"type": "any"}, "messages": [ask]});

    // Any tool: calls as tool_use blocks, their inputs objects that follow the schemas.
    let m = message(&s, &body);
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let calls: Vec<Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .cloned()
        .collect();
    assert!(!calls.is_empty(), "{m}");
    for c in &calls {
        assert!(c["id"].as_str().is_some_and(|i| !i.is_empty()), "{c}");
        let input = c["input"].as_object().unwrap_or_else(|| panic!("{c}"));
        match c["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(["celsius", "fahrenheit"].contains(&input["unit"].as_str().unwrap()))
            }
            "get_time" => assert!(input["zone"].is_string()),
            n => panic!("{n}"),
        }
    }
    // The same as the chat route's calls.
    let openai = json!({"max_tokens": 96, "temperature": 0, "tool_choice": "required", "messages": [ask],
        "tools": tools.as_array().unwrap().iter().map(|t| json!({"type": "function", "function":
            {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}))
            .collect::<Vec<_>>()});
    let a = s.request("POST", "/v1/chat/completions", &[], &openai.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    let c = a.json();
    let oc: Vec<(Value, Value)> = c["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["function"]["name"].clone(),
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    let ac: Vec<(Value, Value)> = calls
        .iter()
        .map(|c| (c["name"].clone(), c["input"].clone()))
        .collect();
    assert_eq!(ac, oc);

    // Streamed: the same blocks, the inputs in JSON pieces.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let folded = fold(&events(&post(&s, "/v1/messages", &[], &streamed)));
    let strip = |m: &Value| -> Vec<Value> {
        m["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let mut b = b.clone();
                b.as_object_mut().unwrap().remove("id");
                b
            })
            .collect()
    };
    assert_eq!(strip(&folded), strip(&m));
    assert_eq!(
        (&folded["stop_reason"], &folded["usage"]),
        (&m["stop_reason"], &m["usage"])
    );

    // A named tool.
    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "tool", "name": "get_time"});
    let m2 = message(&s, &named);
    let names: Vec<&str> = m2["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| *n == "get_time"),
        "{m2}"
    );

    // The next turn: the calls and their results go back in; the model answers in text.
    let results: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"type": "tool_result",
        "tool_use_id": c["id"], "content": [{"type": "text", "text": "18 degrees, sunny"}]})
        })
        .collect();
    let mut next = body.clone();
    next["tool_choice"] = json!({"type": "none"});
    next["messages"] = json!([ask, {"role": "assistant", "content": m["content"]},
                              {"role": "user", "content": results}]);
    let m3 = message(&s, &next);
    assert!(!text_of(&m3).trim().is_empty(), "{m3}");
    assert!(
        m3["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] == "text"),
        "{m3}"
    );
    assert_ne!(m3["stop_reason"], "tool_use");
    // count_tokens counts the calls and their results too.
    let count = |b: &Value| {
        let a = post(&s, "/v1/messages/count_tokens", &[], b);
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["input_tokens"].as_u64().unwrap()
    };
    assert_eq!(count(&next), m3["usage"]["input_tokens"].as_u64().unwrap());
    let mut first = next.clone();
    first["messages"] = json!([ask]);
    assert!(count(&next) > count(&first));

    // A stop sequence met inside a call: `stop_sequence`, and the cut call is no call.
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!(["\"arguments\""]);
    let m4 = message(&s, &stopped);
    assert_eq!(
        (m4["stop_reason"].as_str(), m4["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("\"arguments\"")),
        "{m4}"
    );
    assert!(
        m4["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] == "text"),
        "{m4}"
    );

    // Server tools are refused by name.
    let mut server_tool = body.clone();
    server_tool["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    error(
        &post(&s, "/v1/messages", &[], &server_tool),
        400,
        "invalid_request_error",
        "tools[0]",
    );
}

/// A final assistant message with text is the start of the answer, continued, not answered
/// anew: the prompt is the conversation before it with the generation prompt, then its text
/// (no end of turn), as llama-server and Anthropic render it; the answer is the rest. Also: a
/// `tool_result` holding an image reads as a placeholder, and a `tool_use` input that is no
/// object is refused by name.
#[test]
fn an_assistant_prefill_is_continued() {
    let model = common::real_model("smollm2");
    let s = Server::start(&model, &[]);
    let ask = json!({"role": "user", "content": "Name three colours."});
    let prefill = "Red,";
    // The reference: the rendered question, the prefill's text after it, completed.
    let a = post(&s, "/apply-template", &[], &json!({"messages": [ask]}));
    let rendered = a.json()["prompt"].as_str().unwrap().to_owned();
    let a = post(
        &s,
        "/tokenize",
        &[],
        &json!({"content": rendered + prefill, "add_special": true, "parse_special": true}),
    );
    let tokens = a.json()["tokens"].clone();
    let a = post(
        &s,
        "/v1/completions",
        &[],
        &json!({"prompt": tokens, "max_tokens": 10, "temperature": 0}),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let want = a.json();

    let body = json!({"max_tokens": 10, "temperature": 0,
        "messages": [ask, {"role": "assistant", "content": prefill}]});
    let m = message(&s, &body);
    assert_eq!(
        text_of(&m),
        want["choices"][0]["text"].as_str().unwrap(),
        "{m}"
    );
    assert_eq!(m["usage"]["input_tokens"], want["usage"]["prompt_tokens"]);
    // (The same as blocks; count_tokens counts the same prompt.)
    let mut blocks = body.clone();
    blocks["messages"][1]["content"] = json!([{"type": "text", "text": prefill}]);
    assert_eq!(text_of(&message(&s, &blocks)), text_of(&m));
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let a = post(&s, "/v1/messages/count_tokens", &[], &count);
    assert_eq!(a.json()["input_tokens"], want["usage"]["prompt_tokens"]);

    // An image in a tool result: its placeholder, as if written out.
    let turn = |result: Value| {
        json!({"messages": [ask,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}]})
    };
    let image = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]);
    let written = json!([{"type": "text", "text": "[image omitted: this model reads text only]"}]);
    let count = |b: &Value| {
        let a = post(&s, "/v1/messages/count_tokens", &[], b);
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["input_tokens"].clone()
    };
    assert_eq!(count(&turn(image)), count(&turn(written)));
    // A tool_use input that is no object: refused, naming it.
    let mut bad = turn(json!("ok"));
    bad["messages"][1]["content"][0]["input"] = json!("{\"city\": \"Paris\"}");
    bad["max_tokens"] = json!(4);
    error(
        &post(&s, "/v1/messages", &[], &bad),
        400,
        "invalid_request_error",
        "messages[1].content[0].input",
    );
}
