//! Tool calls in a model's native syntax, end to end: SmolLM2 served with a Hermes / Qwen 2.5
//! chat template (`--chat-template-file tests/server/hermes_template.jinja`; SmolLM2 speaks
//! ChatML, as Qwen does). The template's syntax is detected, tools are rendered by it, calls are
//! constrained and parsed out of `<tool_call>` blocks, streamed as OpenAI streams them, and the
//! next turn renders the call and the tool's result natively. The generic format (SmolLM2's own
//! template) is driven by the `openai` client in tests/server/openai_suite.py.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::path::PathBuf;

use harness::Server;
use kiln::tokenizer::toolcall::template::ToolSupport;
use kiln::tokenizer::toolcall::ToolFormat;
use kiln::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn hermes_template() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/server/hermes_template.jinja")
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Get the local time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn ask() -> Value {
    json!([{"role": "user", "content": "What is the weather like in Paris today?"}])
}

/// A call's arguments follow its function's schema.
fn check_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"].as_str().is_some_and(|i| i.starts_with("call_")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().expect("name");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments of {call} are not JSON: {e}"));
    let obj = args.as_object().expect("an object");
    match name {
        "get_weather" => {
            assert_eq!(obj.len(), 2, "{args}");
            assert!(args["city"]
                .as_str()
                .is_some_and(|c| c.chars().count() <= 24));
            assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()));
        }
        "get_time" => assert!(obj.len() == 1 && args["zone"].is_string(), "{args}"),
        other => panic!("called {other}, which was not offered"),
    }
}

fn chat(s: &Server, body: Value) -> Value {
    let a = s.request("POST", "/v1/chat/completions", &[], &body.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

/// A streamed chat answer joined: content, calls (id, name, arguments), finish reason.
fn chat_stream(s: &Server, mut body: Value) -> (String, Vec<Value>, String) {
    body["stream"] = json!(true);
    let a = s.request("POST", "/v1/chat/completions", &[], &body.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<Value>::new(), String::new());
    for v in harness::sse_events(&a.text()) {
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        if let Some(t) = c["delta"]["content"].as_str() {
            content.push_str(t);
        }
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if d.get("id").is_some() {
                assert_eq!(i, calls.len(), "calls begin in order: {d}");
                assert!(
                    d["function"]["name"].is_string(),
                    "the first delta names the call: {d}"
                );
                calls.push(json!({"id": d["id"], "type": d["type"],
                    "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let call = calls
                .get_mut(i)
                .expect("arguments after the call's first delta");
            let more = d["function"]["arguments"].as_str().unwrap_or("");
            let args = call["function"]["arguments"].as_str().unwrap().to_owned() + more;
            call["function"]["arguments"] = json!(args);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, calls, finish)
}

/// The raw text generated, from the log-probabilities' tokens.
fn raw_text(r: &Value) -> String {
    r["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs")
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect()
}

#[test]
fn templates_are_probed_for_tool_support() {
    let model = kiln::model::Model::load(common::real_model("smollm2")).unwrap();
    let mut tok = Tokenizer::from_gguf(&model.file).unwrap();
    let own = ToolSupport::probe(&tok);
    assert_eq!(
        (own.tools, own.calls, own.native, own.format()),
        (false, false, None, ToolFormat::Generic),
        "SmolLM2's template knows nothing of tools"
    );
    let text = std::fs::read_to_string(hermes_template()).unwrap();
    tok.set_chat_template(text).unwrap();
    let hermes = ToolSupport::probe(&tok);
    assert_eq!(
        (hermes.tools, hermes.calls, hermes.results, hermes.format()),
        (true, true, true, ToolFormat::Hermes)
    );
    let gemma = kiln::model::Model::load(common::real_model("gemma3")).unwrap();
    let mut tok = Tokenizer::from_gguf(&gemma.file).unwrap();
    let g = ToolSupport::probe(&tok);
    assert_eq!(
        (g.tools, g.calls, g.results, g.format()),
        (false, false, false, ToolFormat::Generic),
        "Gemma-3's template refuses a `tool` turn (roles must alternate)"
    );
    // --chat-template-file refuses a template that does not render.
    let e = tok.set_chat_template("{% for m in %}".into()).unwrap_err();
    assert!(e.to_string().contains("template"), "{e}");
}

#[test]
fn hermes_calls_end_to_end() {
    let model = common::real_model("smollm2");
    let tpl = hermes_template();
    let s = Server::start(
        &model,
        &["-P", "2", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let base = json!({"messages": ask(), "tools": tools(), "max_tokens": 96, "temperature": 0});

    // Required: calls in the template's syntax, parsed, their arguments valid.
    let mut body = base.clone();
    body["tool_choice"] = json!("required");
    body["logprobs"] = json!(true);
    let r = chat(&s, body.clone());
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    assert!(c["message"]["content"].is_null(), "{r}");
    let calls = c["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .clone();
    assert!(!calls.is_empty());
    calls.iter().for_each(check_call);
    let raw = raw_text(&r);
    eprintln!("required: {raw:?}");
    assert!(
        raw.starts_with("<tool_call>\n{\"name\": \""),
        "generated {raw:?}"
    );
    assert!(
        raw.trim_end().ends_with("</tool_call>"),
        "generated {raw:?}"
    );

    // Streamed: the same calls.
    let (content, streamed, finish) = chat_stream(&s, body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
    let strip = |v: &[Value]| -> Vec<(Value, Value)> {
        v.iter()
            .map(|c| {
                (
                    c["function"]["name"].clone(),
                    c["function"]["arguments"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(strip(&streamed), strip(&calls));

    // Auto: lazy. Whatever the model does, a call it begins is a valid call and text is text.
    let mut body = base.clone();
    body["logprobs"] = json!(true);
    let r = chat(&s, body);
    let c = &r["choices"][0];
    let raw = raw_text(&r);
    eprintln!("auto: {raw:?}");
    match c["message"]["tool_calls"].as_array() {
        Some(calls) => {
            assert_eq!(c["finish_reason"], "tool_calls");
            calls.iter().for_each(check_call);
            assert!(raw.contains("<tool_call>"), "{raw:?}");
        }
        None => {
            assert!(
                !raw.contains("<tool_call>"),
                "an opener but no call: {raw:?}"
            );
            assert_eq!(c["message"]["content"].as_str(), Some(raw.as_str()));
        }
    }

    // The next turn renders the call and the result in the template's own syntax.
    let mut history = ask().as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    history.push(json!({"role": "tool", "tool_call_id": calls[0]["id"],
                        "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}));
    let r = chat(
        &s,
        json!({"messages": history, "tools": tools(), "tool_choice": "none", "max_tokens": 32,
               "temperature": 0}),
    );
    let c = &r["choices"][0];
    assert!(c["message"]["tool_calls"].is_null(), "{r}");
    assert!(
        c["message"]["content"]
            .as_str()
            .is_some_and(|t| !t.trim().is_empty()),
        "{r}"
    );
    // The prompt holds the call and the result: longer than the question's by their text.
    let first = chat(
        &s,
        json!({"messages": ask(), "max_tokens": 1, "temperature": 0}),
    );
    let grew = r["usage"]["prompt_tokens"].as_u64().unwrap()
        - first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        grew > 20,
        "the second turn's prompt grew by {grew} tokens only"
    );
}

/// Harmony (gpt-oss's format) over SmolLM2: `tests/server/harmony_template.jinja` is detected
/// as harmony; a required call is constrained to a `commentary` message to a function and
/// parsed into `tool_calls` (streamed too), and the next turn renders the call and its result.
#[test]
fn harmony_calls_end_to_end() {
    let model = common::real_model("smollm2");
    let tpl = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/server/harmony_template.jinja");
    let loaded = kiln::model::Model::load(&model).unwrap();
    let mut tok = Tokenizer::from_gguf(&loaded.file).unwrap();
    tok.set_chat_template(std::fs::read_to_string(&tpl).unwrap())
        .unwrap();
    let support = ToolSupport::probe(&tok);
    assert_eq!(
        (
            support.tools,
            support.calls,
            support.results,
            support.format()
        ),
        (true, true, true, ToolFormat::Harmony)
    );
    let s = Server::start(
        &model,
        &["-P", "2", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let mut body = json!({"messages": ask(), "tools": tools(), "max_tokens": 96,
                          "temperature": 0, "tool_choice": "required", "logprobs": true});
    let r = chat(&s, body.clone());
    let c = &r["choices"][0];
    let raw = raw_text(&r);
    eprintln!("required: {raw:?}");
    assert!(
        raw.starts_with("<|channel|>commentary to=functions."),
        "generated {raw:?}"
    );
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    assert!(c["message"]["content"].is_null(), "{r}");
    let calls = c["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .clone();
    assert_eq!(calls.len(), 1, "{r}");
    calls.iter().for_each(check_call);

    // Streamed: the same call, no content.
    body["logprobs"] = json!(false);
    let (content, streamed, finish) = chat_stream(&s, body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
    assert_eq!(streamed.len(), 1);
    assert_eq!(streamed[0]["function"], calls[0]["function"]);

    // The next turn renders the call and the result.
    let mut history = ask().as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    history.push(json!({"role": "tool", "tool_call_id": calls[0]["id"],
                        "content": "{\"temperature\": 21}"}));
    let r = chat(
        &s,
        json!({"messages": history, "tools": tools(), "tool_choice": "none", "max_tokens": 8,
               "temperature": 0}),
    );
    assert!(r["choices"][0]["message"]["tool_calls"].is_null(), "{r}");
    let first = chat(
        &s,
        json!({"messages": ask(), "max_tokens": 1, "temperature": 0}),
    );
    let grew = r["usage"]["prompt_tokens"].as_u64().unwrap()
        - first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        grew > 20,
        "the second turn's prompt grew by {grew} tokens only"
    );
}

/// Ollama's `/api/chat` with tools streams each call as soon as it is whole: a line of its
/// own with `message.tool_calls` (the arguments an object), before the final line, as Ollama
/// does; the same calls as the whole answer and the chat route. Cut short by `num_predict`,
/// the call is no call: the lines' content is the whole answer's text. (Two earlier calls in
/// the conversation lead SmolLM2 to call.)
#[test]
fn ollama_streams_calls_as_they_complete() {
    let model = common::real_model("smollm2");
    let tpl = hermes_template();
    let s = Server::start(&model, &["--chat-template-file", tpl.to_str().unwrap()]);
    let shot = |city: &str| {
        json!({"role": "assistant", "content": "", "tool_calls": [{"function":
            {"name": "get_weather", "arguments": {"city": city, "unit": "celsius"}}}]})
    };
    let messages = json!([{"role": "system", "content": "You call tools."},
        {"role": "user", "content": "Weather in London?"}, shot("London"),
        {"role": "user", "content": "Weather in Rome?"}, shot("Rome"),
        {"role": "user", "content": "Weather in Paris?"}]);
    let ollama = |stream: bool, num_predict: u32| {
        let b = json!({"model": "x", "messages": messages, "tools": tools(), "stream": stream,
                       "options": {"temperature": 0, "num_predict": num_predict}});
        let a = s.request("POST", "/api/chat", &[], &b.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        a.text()
    };
    let lines = |text: String| -> Vec<Value> {
        text.lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };

    let streamed = lines(ollama(true, 96));
    let last = streamed.last().unwrap();
    assert_eq!(last["done"], true, "{last}");
    assert!(last["message"].get("tool_calls").is_none(), "{last}");
    let mut calls = Vec::new();
    for l in &streamed[..streamed.len() - 1] {
        assert_eq!(l["done"], false, "{l}");
        if let Some(c) = l["message"]["tool_calls"].as_array() {
            assert_eq!(c.len(), 1, "a line per call: {l}");
            assert_eq!(l["message"]["content"], "", "{l}");
            assert_eq!(c[0]["function"]["index"], calls.len(), "{l}");
            assert!(c[0]["function"]["arguments"].is_object(), "{l}");
            calls.push(c[0].clone());
        }
    }
    assert!(!calls.is_empty(), "{streamed:?}");
    let whole: Value = serde_json::from_str(&ollama(false, 96)).unwrap();
    assert_eq!(whole["message"]["tool_calls"], json!(calls), "{whole}");
    // The chat route's calls for the same conversation.
    let mut history = messages.as_array().unwrap().clone();
    for m in &mut history {
        if let Some(c) = m.get_mut("tool_calls") {
            let args = c[0]["function"]["arguments"].to_string();
            c[0]["function"]["arguments"] = json!(args);
        }
    }
    let r = chat(
        &s,
        json!({"messages": history, "tools": tools(), "max_tokens": 96, "temperature": 0}),
    );
    let openai: Vec<(Value, Value)> = r["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            (f["name"].clone(), args)
        })
        .collect();
    let ours: Vec<(Value, Value)> = calls
        .iter()
        .map(|c| {
            (
                c["function"]["name"].clone(),
                c["function"]["arguments"].clone(),
            )
        })
        .collect();
    assert_eq!(ours, openai);

    // Cut short: no call; the streamed content is the whole answer's, the call's text.
    let cut = lines(ollama(true, 8));
    let text: String = cut
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert!(
        cut.iter().all(|l| l["message"].get("tool_calls").is_none()),
        "{cut:?}"
    );
    let whole: Value = serde_json::from_str(&ollama(false, 8)).unwrap();
    assert_eq!(whole["message"]["content"], text.as_str(), "{whole}");
    assert!(whole["message"].get("tool_calls").is_none(), "{whole}");
    assert!(text.starts_with("<tool_call>"), "{text:?}");
}
