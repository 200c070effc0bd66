//! OpenAI's Responses API on `kiln serve` (SmolLM2): `/v1/responses` gives the text of
//! `/v1/chat/completions` for the same conversation, whole and as its typed events (each with
//! its sequence number); function calls (a Hermes template, as in tests/server_anthropic.rs)
//! come back as `function_call` items and go back in as `function_call_output` items;
//! `previous_response_id` continues a stored response of the same API key only; `store: false`
//! keeps none; malformed requests are 400s in OpenAI's error shape naming the field. The
//! official `openai` Python client drives it too (tests/server/responses_suite.py:
//! `responses.create`, `responses.stream`, a two-turn function-calling loop).

mod common;
#[path = "server/harness.rs"]
mod harness;
#[path = "server/pyenv.rs"]
mod pyenv;

use std::path::PathBuf;

use harness::{Answer, Server};
use serde_json::{json, Value};

const KEY_A: &str = "Authorization: Bearer key-a";
const KEY_B: &str = "Authorization: Bearer key-b";

fn post(s: &Server, path: &str, headers: &[&str], body: &Value) -> Answer {
    s.request("POST", path, headers, &body.to_string())
}

fn response(s: &Server, headers: &[&str], body: &Value) -> Value {
    let a = post(s, "/v1/responses", headers, body);
    assert_eq!(a.status, 200, "{body}: {}", a.text());
    let r = a.json();
    assert_eq!(r["object"], "response", "{r}");
    assert!(
        r["id"].as_str().is_some_and(|i| i.starts_with("resp_")),
        "{r}"
    );
    r
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_owned())
        .collect()
}

fn chat_text(s: &Server, headers: &[&str], body: &Value) -> (String, Value) {
    let a = post(s, "/v1/chat/completions", headers, body);
    assert_eq!(a.status, 200, "{}", a.text());
    let c = a.json();
    let text = c["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    (text, c)
}

/// The typed events of a streamed response: each `event:` line's name is its data's `type`,
/// and the sequence numbers count from 0.
fn events(a: &Answer) -> Vec<Value> {
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let mut out: Vec<Value> = Vec::new();
    let mut name = None;
    for line in a.text().lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_owned());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{d:?}: {e}"));
            assert_eq!(v["type"], json!(name.take().unwrap()), "{v}");
            assert_eq!(v["sequence_number"], json!(out.len()), "{v}");
            out.push(v);
        }
    }
    out
}

fn kinds(ev: &[Value]) -> Vec<&str> {
    ev.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn error_param(a: &Answer) -> String {
    assert_eq!(a.status, 400, "{}", a.text());
    let e = a.json();
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    e["error"]["param"]
        .as_str()
        .unwrap_or_else(|| panic!("{e}"))
        .to_owned()
}

#[test]
fn responses_answer_as_the_chat_route_does_and_continue_stored_ones() {
    let model = common::real_model("smollm2");
    let s = Server::start(&model, &["-P", "2", "--api-key", "key-a,key-b"]);
    let system = "You are a helpful assistant who answers briefly.";
    let ask = "Name three colors of the rainbow.";
    let body = json!({"model": "smollm2", "instructions": system, "input": ask,
                      "max_output_tokens": 40, "temperature": 0});

    // Whole: the chat route's text and counts.
    let r = response(&s, &[KEY_A], &body);
    let chat = json!({"max_tokens": 40, "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": ask}]});
    let (text, c) = chat_text(&s, &[KEY_A], &chat);
    assert!(!text.trim().is_empty());
    assert_eq!(output_text(&r), text, "{r}");
    let status = match c["choices"][0]["finish_reason"].as_str().unwrap() {
        "length" => "incomplete",
        _ => "completed",
    };
    assert_eq!(r["status"], status, "{r}");
    assert_eq!(
        r["usage"]["input_tokens"], c["usage"]["prompt_tokens"],
        "{r}"
    );
    assert_eq!(
        r["usage"]["output_tokens"], c["usage"]["completion_tokens"],
        "{r}"
    );
    assert_eq!(r["instructions"], system);

    // Streamed: the same text, in the typed events' order.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&s, "/v1/responses", &[KEY_A], &streamed));
    let k = kinds(&ev);
    assert_eq!(
        k[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ],
        "{k:?}"
    );
    let last = k.len() - 1;
    assert_eq!(
        k[last - 3..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            if status == "completed" {
                "response.completed"
            } else {
                "response.incomplete"
            }
        ],
        "{k:?}"
    );
    let deltas: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    assert_eq!(ev[last - 3]["text"], json!(text));
    assert_eq!(output_text(&ev[last]["response"]), text);
    assert_eq!(ev[0]["response"]["status"], "in_progress");

    // Continued: the stored conversation goes first (the chat route's text for the same
    // conversation), for the key that stored it only.
    let next = "And two more?";
    let body2 = json!({"previous_response_id": r["id"], "input": next,
                       "max_output_tokens": 24, "temperature": 0});
    let r2 = response(&s, &[KEY_A], &body2);
    let chat2 = json!({"max_tokens": 24, "temperature": 0, "messages": [
        {"role": "user", "content": ask}, {"role": "assistant", "content": text},
        {"role": "user", "content": next}]});
    let (text2, _) = chat_text(&s, &[KEY_A], &chat2);
    assert_eq!(output_text(&r2), text2, "{r2}");
    assert_eq!(r2["previous_response_id"], r["id"]);
    let a = post(&s, "/v1/responses", &[KEY_B], &body2);
    assert_eq!(error_param(&a), "previous_response_id");

    // `store: false`: nothing to continue.
    let mut unstored = body.clone();
    unstored["store"] = json!(false);
    let r3 = response(&s, &[KEY_A], &unstored);
    let a = post(
        &s,
        "/v1/responses",
        &[KEY_A],
        &json!({"previous_response_id": r3["id"], "input": "x"}),
    );
    assert_eq!(error_param(&a), "previous_response_id");

    // GET gives a stored response as it was answered, to its own key only; DELETE forgets
    // it; unknown ids are 404s.
    let path = format!("/v1/responses/{}", r2["id"].as_str().unwrap());
    let got = s.request("GET", &path, &[KEY_A], "");
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json(), r2);
    assert_eq!(s.request("GET", &path, &[KEY_B], "").status, 404);
    let r3_path = format!("/v1/responses/{}", r3["id"].as_str().unwrap());
    let a = s.request("GET", &r3_path, &[KEY_A], "");
    let e = a.expect_error(404, "an unstored response");
    assert_eq!(e["param"], "response_id", "{e}");
    assert_eq!(s.request("DELETE", &path, &[KEY_B], "").status, 404);
    let del = s.request("DELETE", &path, &[KEY_A], "");
    assert_eq!(del.status, 200, "{}", del.text());
    assert_eq!(
        del.json(),
        json!({"id": r2["id"], "object": "response.deleted", "deleted": true})
    );
    assert_eq!(s.request("GET", &path, &[KEY_A], "").status, 404);
    assert_eq!(s.request("DELETE", &path, &[KEY_A], "").status, 404);
    let a = post(
        &s,
        "/v1/responses",
        &[KEY_A],
        &json!({"previous_response_id": r2["id"], "input": "x"}),
    );
    assert_eq!(error_param(&a), "previous_response_id");
    let series = "kiln_requests_total{endpoint=\"/v1/responses/{id}\",status=\"200\"}";
    assert_eq!(s.metric(series, &[KEY_A]), Some(2.0), "{series}");

    // The request counter names the route.
    let series = "kiln_requests_total{endpoint=\"/v1/responses\",status=\"200\"}";
    assert!(
        s.metric(series, &[KEY_A]).is_some_and(|n| n >= 4.0),
        "{series}"
    );

    // Malformed requests name their field.
    for (bad, param) in [
        (json!({"model": "smollm2"}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            "text.format",
        ),
        (json!({"input": "x", "temperature": "hot"}), "temperature"),
    ] {
        let a = post(&s, "/v1/responses", &[KEY_A], &bad);
        assert_eq!(error_param(&a), param, "{bad}");
    }
}

fn hermes_template() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/server/hermes_template.jinja")
}

#[test]
fn function_calls_go_out_as_items_and_come_back_as_outputs() {
    let model = common::real_model("smollm2");
    let tpl = hermes_template();
    let s = Server::start(
        &model,
        &["-P", "2", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let tools = json!([
        {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
             "required": ["city"], "additionalProperties": false}}
    ]);
    let ask = "What is the weather like in Paris today?";
    let body = json!({"input": ask, "tools": tools, "tool_choice": "required",
                      "max_output_tokens": 64, "temperature": 0});
    let r = response(&s, &[], &body);
    let calls: Vec<&Value> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert!(!calls.is_empty(), "{r}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather", "{call}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");

    // Streamed: the same items, each call's arguments in pieces.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&s, "/v1/responses", &[], &streamed));
    let last = ev.last().unwrap();
    let items = last["response"]["output"].as_array().unwrap();
    assert_eq!(items.len(), r["output"].as_array().unwrap().len(), "{last}");
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item["type"], r["output"][i]["type"], "{item}");
        if item["type"] != "function_call" {
            continue;
        }
        let of_item = |kind: &str| {
            ev.iter()
                .filter(|e| e["type"] == kind && e["output_index"] == json!(i))
                .collect::<Vec<_>>()
        };
        let pieces: String = of_item("response.function_call_arguments.delta")
            .iter()
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        let done = of_item("response.function_call_arguments.done");
        assert_eq!(done.len(), 1, "{:?}", kinds(&ev));
        assert_eq!(done[0]["arguments"], json!(pieces));
        assert_eq!(json!(pieces), r["output"][i]["arguments"]);
    }

    // Turn two: the call's output goes back; the answer is text, as the chat route's.
    let turn2 = json!({"previous_response_id": r["id"], "tools": tools, "max_output_tokens": 32,
        "temperature": 0, "input": [{"type": "function_call_output", "call_id": call["call_id"],
                                     "output": "{\"temperature_c\": 21, \"sky\": \"clear\"}"}]});
    let r2 = response(&s, &[], &turn2);
    let chat_tools: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t["name"],
                        "description": t["description"], "parameters": t["parameters"]}})
        })
        .collect();
    // The first turn as the chat route takes it: its text (if any) and every call.
    let turn_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"id": c["call_id"], "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]}})
        })
        .collect();
    let turn_text = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["type"] == "message")
        .then(|| output_text(&r));
    let chat = json!({"max_tokens": 32, "temperature": 0, "tools": chat_tools, "messages": [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": turn_text, "tool_calls": turn_calls},
        {"role": "tool", "tool_call_id": call["call_id"],
         "content": "{\"temperature_c\": 21, \"sky\": \"clear\"}"}]});
    let (text, c) = chat_text(&s, &[], &chat);
    let r2_calls = r2["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .count();
    let c_calls = c["choices"][0]["message"]["tool_calls"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(r2_calls, c_calls, "{r2} / {c}");
    assert_eq!(output_text(&r2).trim(), text.trim(), "{r2}");
}

/// The pins of tests/server_openai.rs (the same environment).
const PY_PACKAGES: [&str; 2] = ["openai==3.57.0", "httpx==0.28.1"];

#[test]
fn openai_python_client_creates_and_streams_responses() {
    let python = pyenv::python_env("py-venv", &PY_PACKAGES, "openai, httpx");
    let model = common::real_model("smollm2");
    let tpl = hermes_template();
    let s = Server::start(
        &model,
        &["-P", "2", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/responses_suite.py");
    let status = python
        .command()
        .arg(&script)
        .args(["--url", &s.url])
        .status()
        .expect("run the Python suite");
    assert!(
        status.success(),
        "the responses suite failed (see its output above)"
    );
}
