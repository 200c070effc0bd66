//! llama-server's utility routes on `kiln serve`: `/tokenize` and `/detokenize` give the
//! library tokenizer's ids and text, `/apply-template` the chat template's text that
//! `/v1/chat/completions` evaluates, `/props` the server's settings; bad bodies are 400s, the
//! routes need the API key, and `/metrics` counts them.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::Server;
use kiln::gguf::GgufFile;
use kiln::tokenizer::{ChatMessage, Tokenizer};
use serde_json::{json, Value};

const KEY: &str = "tokens-test-key";
const AUTH: &str = "Authorization: Bearer tokens-test-key";

fn post(s: &Server, path: &str, body: Value) -> Value {
    let a = s.request("POST", path, &[AUTH], &body.to_string());
    assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    a.json()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v["tokens"].clone()).expect("token ids")
}

#[test]
fn tokenize_detokenize_template_and_props() {
    let model = common::real_model("smollm2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let s = Server::start(&model, &["-P", "2", "--api-key", KEY]);

    // /tokenize: the library's ids, under each flag.
    let text = "Hello world, <|im_start|>kiln 🦀 é";
    for (add_special, parse_special) in [(false, true), (true, true), (false, false)] {
        let v = post(
            &s,
            "/tokenize",
            json!({"content": text, "add_special": add_special, "parse_special": parse_special}),
        );
        assert_eq!(
            ids(&v),
            tok.encode(text, add_special, parse_special),
            "add_special {add_special}, parse_special {parse_special}"
        );
    }
    // A mixed list of texts and ids (llama-server's): ids kept, `add_special` on the first.
    let v = post(
        &s,
        "/tokenize",
        json!({"content": ["Hello", 42, " world"], "add_special": true}),
    );
    let mut want = tok.encode("Hello", true, true);
    want.push(42);
    want.extend(tok.encode(" world", false, true));
    assert_eq!(ids(&v), want);
    // The defaults: no BOS, special tokens parsed.
    let plain = ids(&post(&s, "/tokenize", json!({ "content": text })));
    assert_eq!(plain, tok.encode(text, false, true));
    assert_ne!(
        plain,
        tok.encode(text, false, false),
        "the control token is one id"
    );

    // with_pieces: each id with its text, or its bytes where they are not UTF-8 alone; the
    // pieces spell the content.
    let v = post(
        &s,
        "/tokenize",
        json!({"content": text, "with_pieces": true}),
    );
    let mut spelled = Vec::new();
    let mut byte_pieces = 0;
    for (p, &id) in v["tokens"].as_array().unwrap().iter().zip(&plain) {
        assert_eq!(p["id"], id);
        match &p["piece"] {
            Value::String(t) => spelled.extend_from_slice(t.as_bytes()),
            Value::Array(b) => {
                byte_pieces += 1;
                spelled.extend(b.iter().map(|x| x.as_u64().unwrap() as u8));
            }
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(spelled, text.as_bytes());
    assert!(byte_pieces > 0, "the crab's bytes are split over tokens");

    // /detokenize: the text back, control tokens written out.
    let v = post(&s, "/detokenize", json!({ "tokens": plain }));
    assert_eq!(v["content"], text);
    assert_eq!(v["content"], tok.decode(&plain));

    // /apply-template: the chat template's text, which /v1/chat/completions evaluates.
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]);
    let v = post(&s, "/apply-template", json!({ "messages": messages }));
    let prompt = v["prompt"].as_str().unwrap();
    let lib = tok
        .apply_chat_template(
            &[
                ChatMessage::new("system", "You are terse."),
                ChatMessage::new("user", "Name a colour."),
            ],
            true,
        )
        .unwrap();
    assert_eq!(prompt, lib);
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let n = ids(&post(
        &s,
        "/tokenize",
        json!({"content": prompt, "add_special": true}),
    ))
    .len();
    let chat = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 1}),
    );
    assert_eq!(chat["usage"]["prompt_tokens"], n);

    // /props: the server's settings.
    let a = s.request("GET", "/props", &[AUTH], "");
    assert_eq!(a.status, 200, "{}", a.text());
    let p = a.json();
    assert_eq!(p["total_slots"], 2);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 1024);
    assert_eq!(p["chat_template"], tok.chat_template().unwrap());
    let file = GgufFile::open(&model).unwrap();
    let (config, _) = kiln::model::read_config(&file).unwrap();
    assert_eq!(p["n_vocab"], config.vocab_size);
    assert_eq!(
        p["bos_token"],
        tok.bos().map(|t| tok.token_text(t)).unwrap()
    );
    assert_eq!(
        p["eos_token"],
        tok.eos().map(|t| tok.token_text(t)).unwrap()
    );

    // Bad bodies: 400 naming the field, never a panic.
    let vocab = tok.vocab_size();
    for (path, body, param) in [
        ("/detokenize", json!({ "tokens": [1, vocab] }), "tokens"),
        ("/detokenize", json!({ "tokens": [-1] }), "tokens[0]"),
        ("/detokenize", json!({ "tokens": "12" }), "tokens"),
        ("/tokenize", json!({ "content": 7 }), "content"),
        ("/tokenize", json!({ "content": ["a", vocab] }), "content"),
        ("/tokenize", json!({ "content": ["a", -1] }), "content"),
        ("/tokenize", json!({ "text": "hi" }), ""),
        ("/apply-template", json!({ "messages": [] }), "messages"),
        (
            "/apply-template",
            json!({ "messages": [{"role": "user", "content": [{"type": "image_url"}]}] }),
            "",
        ),
    ] {
        let a = s.request("POST", path, &[AUTH], &body.to_string());
        let e = a.expect_error(400, &format!("{path} {body}"));
        if !param.is_empty() {
            assert_eq!(e["param"], param, "{path} {body}");
        }
    }
    let a = s.request("POST", "/tokenize", &[AUTH], "{not json");
    a.expect_error(400, "malformed JSON");

    // The API key, and the counts.
    for (method, path) in [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("GET", "/props"),
    ] {
        let a = s.request(method, path, &[], "{}");
        a.expect_error(401, path);
    }
    let ok = s.metric(
        "kiln_requests_total{endpoint=\"/tokenize\",status=\"200\"}",
        &[AUTH],
    );
    assert_eq!(ok, Some(7.0));
}
