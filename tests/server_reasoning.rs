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
