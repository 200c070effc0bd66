//! `logit_bias` on `kiln serve` (SmolLM2): OpenAI's `{"token id": bias}` on
//! `/v1/completions` and `/v1/chat/completions`, llama-server's `[[id, bias]]`,
//! `[["text", bias]]` (`false`: banned) and text keys on `/completion`. −100 on the greedy
//! answer's first token changes the answer, +100 on another token makes it the first; a
//! grammar still bounds what a bias can force; bad entries are 400s naming `logit_bias`.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::Server;
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

fn ok(s: &Server, path: &str, body: &Value) -> Value {
    let a = s.request("POST", path, &[], &body.to_string());
    assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    a.json()
}

/// `/completion`'s greedy answer to the prompt with `extra` fields: its text and token ids.
fn native(s: &Server, extra: Value) -> (String, Vec<u32>) {
    let mut body =
        json!({"prompt": PROMPT, "temperature": 0, "n_predict": 6, "return_tokens": true});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let c = ok(s, "/completion", &body);
    let ids = c["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    (c["content"].as_str().unwrap().to_string(), ids)
}

fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or(c["message"]["content"].as_str())
        .unwrap()
        .to_string()
}

#[test]
fn logit_bias_bans_and_forces_on_every_route() {
    let model = common::real_model("smollm2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let s = Server::start(&model, &["-P", "2"]);

    // The greedy answer and its first token (" Paris").
    let (plain, ids) = native(&s, json!({}));
    let first = ids[0];
    let word = tok.decode(&[first]);
    assert_eq!(
        tok.encode(&word, false, false),
        vec![first],
        "{word:?} is one token"
    );
    // Another token to force: the first of " London".
    let forced = tok.encode(" London", false, false)[0];
    let forced_text = tok.decode(&[forced]);

    // OpenAI's map on /v1/completions: the same answer without a bias, another with -100 on
    // its first token, the forced token first with +100.
    let v1 = |bias: Value| {
        let body = json!({"prompt": PROMPT, "temperature": 0, "max_tokens": 6, "logit_bias": bias});
        text_of(&ok(&s, "/v1/completions", &body))
    };
    assert_eq!(v1(json!({})), plain);
    let banned = v1(json!({first.to_string(): -100}));
    assert_ne!(banned, plain);
    assert!(
        !banned.starts_with(&word),
        "{banned:?} starts with the banned {word:?}"
    );
    assert!(v1(json!({forced.to_string(): 100})).starts_with(&forced_text));
    // A moderate bias on another token leaves a confident answer as it is.
    assert_eq!(v1(json!({forced.to_string(): 0.5})), plain);

    // Chat: the answer's first token banned (its first word's tokens, all of them), then
    // the forced token first; streamed choices (n = 2) each carry the bias.
    let chat = |bias: Value, extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0, "max_tokens": 6, "logit_bias": bias});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        ok(&s, "/v1/chat/completions", &body)
    };
    let chat_plain = text_of(&chat(json!({}), json!({})));
    let head = chat_plain
        .split_whitespace()
        .next()
        .expect("a word")
        .to_string();
    let head_ids = tok.encode(&head, false, false);
    let ban: serde_json::Map<String, Value> = head_ids
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    let chat_banned = text_of(&chat(Value::Object(ban), json!({})));
    assert!(
        !chat_banned.starts_with(&head),
        "{chat_banned:?} after banning {head:?}"
    );
    let two = chat(
        json!({forced.to_string(): 100}),
        json!({"n": 2, "temperature": 0.7, "seed": 5}),
    );
    for c in two["choices"].as_array().unwrap() {
        let t = c["message"]["content"].as_str().unwrap();
        assert!(
            t.trim_start().starts_with(forced_text.trim_start()),
            "{t:?}"
        );
    }

    // llama-server's forms on /completion: pairs by id, by text, `false`, text keys.
    let (t, got) = native(&s, json!({"logit_bias": [[first, false]]}));
    assert_ne!(got[0], first, "{t:?}");
    let (t, got) = native(&s, json!({"logit_bias": [[word, -100]]}));
    assert_ne!(got[0], first, "{t:?}");
    assert!(!got.contains(&first), "banned throughout: {t:?}");
    let (_, got) = native(&s, json!({"logit_bias": {word.as_str(): false}}));
    assert_ne!(got[0], first);
    let (_, got) = native(&s, json!({"logit_bias": [[forced, 100]]}));
    assert_eq!(got[0], forced);
    let (_, got) = native(&s, json!({"logit_bias": {forced.to_string(): 1000}}));
    assert_eq!(got[0], forced, "llama-server takes any finite bias");
    // `generation_settings` lists the biases as llama-server does.
    let body =
        json!({"prompt": PROMPT, "n_predict": 1, "logit_bias": [[forced, 2.5], [first, false]]});
    let c = ok(&s, "/completion", &body);
    assert_eq!(
        c["generation_settings"]["logit_bias"],
        json!([{"bias": 2.5, "token": forced}, {"bias": null, "token": first}])
    );

    // A grammar bounds what a bias can do: +100 on a letter, yet only digits come.
    let letter = tok.encode("x", false, false)[0];
    let body = json!({"prompt": PROMPT, "n_predict": 4, "temperature": 0, "grammar": "root ::= [0-9]+",
        "logit_bias": [[letter, 100]], "repeat_penalty": 1.3});
    let c = ok(&s, "/completion", &body);
    let digits = c["content"].as_str().unwrap();
    assert!(
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()),
        "{digits:?}"
    );
}

#[test]
fn bad_logit_bias_is_refused_by_name() {
    let model = common::real_model("smollm2");
    let s = Server::start(&model, &[]);
    let vocab = 49152;
    let routes = [
        (
            "/v1/completions",
            json!({"prompt": PROMPT, "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
        ("/completion", json!({"prompt": PROMPT, "n_predict": 2})),
    ];
    let refuse = |path: &str, base: &Value, bias: Value, says: &str| {
        let mut body = base.clone();
        body["logit_bias"] = bias.clone();
        let a = s.request("POST", path, &[], &body.to_string());
        let e = a.expect_error(400, &format!("{path} {bias}"));
        assert_eq!(e["param"], "logit_bias", "{path} {bias}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(says), "{path} {bias}: {m}");
    };
    for (path, base) in &routes {
        refuse(
            path,
            base,
            json!({vocab.to_string(): 1}),
            "outside the vocabulary",
        );
        refuse(path, base, json!([[1, 2], [-3, 1]]), "logit_bias[1]");
        refuse(path, base, json!([[1, true]]), "false to ban");
        refuse(path, base, json!([[1]]), "[token, bias] pair");
        refuse(path, base, json!("1:100"), "must be an object");
        refuse(path, base, json!([["", 1]]), "empty text");
    }
    // OpenAI's range and keys on its routes; llama-server's wider ones on its own.
    for (path, base) in &routes[..2] {
        refuse(path, base, json!({"5": 101}), "-100 to 100");
        refuse(path, base, json!({"Paris": -100}), "not a token id");
    }
    let (path, base) = &routes[2];
    for bias in [json!({"5": 101}), json!({" Paris": -100})] {
        let mut body = base.clone();
        body["logit_bias"] = bias;
        assert_eq!(
            s.request("POST", path, &[], &body.to_string()).status,
            200,
            "{body}"
        );
    }
}
