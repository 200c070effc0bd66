//! llama-server's own `POST /completion` on `kiln serve` (SmolLM2): the text of
//! `/v1/completions` for the same prompt (a text or its token ids), whole and as events, with
//! llama-server's fields: `stop_type` `limit`, `word` (and `stopping_word`) or `eos` (special
//! tokens in the prompt parsed), the counts, the settings; llama-server's limits for
//! `n_predict`, `stop`, `temperature` and `seed`; bad fields are 400s naming them.

mod common;
#[path = "server/harness.rs"]
mod harness;

use harness::{sse_events, Server};
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn ok(s: &Server, path: &str, body: &Value) -> Value {
    let a = s.request("POST", path, &[], &body.to_string());
    assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    a.json()
}

#[test]
fn completion_answers_as_llama_server_does() {
    let model = common::real_model("smollm2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let s = Server::start(&model, &["-P", "2"]);
    let prompt = "The capital of France is";
    let v1 = ok(
        &s,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": 12}),
    );
    let want = v1["choices"][0]["text"].as_str().unwrap().to_string();
    let (n_prompt, n_pred) = (
        v1["usage"]["prompt_tokens"].as_u64().unwrap(),
        v1["usage"]["completion_tokens"].as_u64().unwrap(),
    );

    // Whole, from the text and from its token ids.
    let body = json!({"prompt": prompt, "temperature": 0, "n_predict": 12, "n_probs": 0});
    let c = ok(&s, "/completion", &body);
    assert_eq!(c["content"], want.as_str());
    assert_eq!(c["stop"], true);
    assert_eq!(c["stop_type"], "limit");
    assert_eq!(c["tokens_predicted"], n_pred);
    assert_eq!(c["tokens_evaluated"], n_prompt);
    assert_eq!(c["generation_settings"]["n_predict"], 12);
    assert_eq!(c["generation_settings"]["temperature"], 0.0);
    assert_eq!(c["timings"]["predicted_n"], n_pred);
    assert!(c["timings"]["predicted_ms"].as_f64().unwrap() > 0.0, "{c}");
    let ids = tok.encode(prompt, true, true);
    let by_ids = ok(
        &s,
        "/completions",
        &json!({"prompt": ids, "temperature": 0, "n_predict": 12}),
    );
    assert_eq!(by_ids["content"], want.as_str());

    // Streamed: a piece a event, then the whole answer's fields.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let a = s.request("POST", "/completion", &[], &streamed.to_string());
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(!a.text().contains("[DONE]"));
    let events = sse_events(&a.text());
    let (last, pieces) = events.split_last().expect("events");
    assert!(pieces.iter().all(|e| e["stop"] == false));
    let text: String = pieces
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, want);
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["tokens_predicted"], n_pred);

    // A stop sequence: the text before it, and which one.
    let word = want
        .split_whitespace()
        .nth(2)
        .expect("a third word")
        .to_string();
    let cut = ok(
        &s,
        "/completion",
        &json!({"prompt": prompt, "temperature": 0, "n_predict": 12, "stop": ["zzzz", word]}),
    );
    assert_eq!(cut["stop_type"], "word", "{cut}");
    assert_eq!(cut["stopping_word"], word.as_str());
    let before = &want[..want.find(word.as_str()).unwrap()];
    assert_eq!(cut["content"], before);

    // An end-of-generation token: the chat template's text, its special tokens parsed, gives
    // the chat route's answer.
    let messages = json!([{"role": "user", "content": "Name three colours."}]);
    let turn = ok(&s, "/apply-template", &json!({"messages": messages}));
    let chat = ok(
        &s,
        "/v1/chat/completions",
        &json!({"messages": messages, "temperature": 0, "max_tokens": 200}),
    );
    assert_eq!(chat["choices"][0]["finish_reason"], "stop", "{chat}");
    let eos = ok(
        &s,
        "/completion",
        &json!({"prompt": turn["prompt"], "temperature": 0, "n_predict": 200}),
    );
    assert_eq!(eos["stop_type"], "eos", "{eos}");
    assert_eq!(eos["stopping_word"], "");
    assert_eq!(eos["content"], chat["choices"][0]["message"]["content"]);

    // llama-server's limits, not OpenAI's: `n_predict` 0 evaluates the prompt only, more than
    // the context has room for is cut to it; any number of stops (empty ones dropped), a
    // temperature past 2; `seed` -1 is a fresh one each time.
    let warm = ok(
        &s,
        "/completion",
        &json!({"prompt": prompt, "n_predict": 0}),
    );
    assert_eq!(warm["content"], "");
    assert_eq!(warm["tokens_predicted"], 0);
    let long = ok(
        &s,
        "/completion",
        &json!({"prompt": turn["prompt"], "temperature": 0, "n_predict": 100000,
                "stop": ["", "s1", "s2", "s3", "s4", "s5", "s6"]}),
    );
    assert_eq!(long["content"], eos["content"]);
    // (`ignore_eos`: a draw this hot may pick the end-of-generation token.)
    let hot = json!({"prompt": prompt, "temperature": 3.5, "seed": -1, "n_predict": 24,
                     "ignore_eos": true});
    let (a, b) = (ok(&s, "/completion", &hot), ok(&s, "/completion", &hot));
    assert_eq!(a["tokens_predicted"], 24);
    assert_ne!(a["content"], b["content"], "seed -1 draws afresh");

    // Refused, naming the field.
    for (b, param) in [
        (
            json!({"prompt": prompt, "n_probs": 3, "post_sampling_probs": true}),
            "post_sampling_probs",
        ),
        (
            json!({"prompt": prompt, "repeat_last_n": -5}),
            "repeat_last_n",
        ),
        (json!({"prompt": [1, 99999999]}), "prompt"),
        (json!({"prompt": ["one", "two"]}), "prompt"),
        (json!({"n_predict": 3}), "prompt"),
    ] {
        let a = s.request("POST", "/completion", &[], &b.to_string());
        let e = a.expect_error(400, param);
        assert_eq!(e["param"], param, "{b}: {e}");
    }
}

#[test]
fn completion_gives_token_probabilities_and_ids() {
    let model = common::real_model("smollm2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let s = Server::start(&model, &[]);
    let prompt = "The capital of France is";
    let v1 = ok(
        &s,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": 10, "logprobs": 3}),
    );
    let lp = &v1["choices"][0]["logprobs"];
    let body = json!({"prompt": prompt, "temperature": 0, "n_predict": 10, "n_probs": 3,
                      "return_tokens": true});
    let c = ok(&s, "/completion", &body);
    assert_eq!(c["generation_settings"]["n_probs"], 3);
    let probs = c["completion_probabilities"].as_array().unwrap();
    let ids: Vec<u32> = serde_json::from_value(c["tokens"].clone()).unwrap();
    assert_eq!(probs.len(), 10);
    assert_eq!(tok.decode(&ids), c["content"].as_str().unwrap());
    for (i, p) in probs.iter().enumerate() {
        // The token, its log-probability (`/v1/completions`' own), and 3 alternatives, the
        // most likely first: the token itself at temperature 0.
        assert_eq!(p["id"], ids[i], "{p}");
        assert_eq!(p["logprob"], lp["token_logprobs"][i], "{p}");
        assert_eq!(p["token"], lp["tokens"][i], "{p}");
        assert_eq!(p["bytes"], json!(tok.token_bytes(ids[i])), "{p}");
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{p}");
        assert_eq!(top[0]["id"], ids[i], "{p}");
        assert_eq!(top[0]["logprob"], p["logprob"], "{p}");
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        let alts = lp["top_logprobs"][i].as_object().unwrap();
        for t in top {
            assert_eq!(alts[t["token"].as_str().unwrap()], t["logprob"], "{p}");
        }
    }
    // Streamed: each event carries its own tokens; together, the whole answer's.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = sse_events(
        &s.request("POST", "/completion", &[], &streamed.to_string())
            .text(),
    );
    let (last, pieces) = events.split_last().unwrap();
    assert_eq!(last["tokens"], json!([]));
    assert!(last.get("completion_probabilities").is_none(), "{last}");
    let cat = |k: &str| -> Vec<Value> {
        pieces
            .iter()
            .flat_map(|e| e[k].as_array().unwrap().clone())
            .collect()
    };
    assert_eq!(cat("completion_probabilities"), *probs);
    assert_eq!(cat("tokens"), *c["tokens"].as_array().unwrap());
    // Neither asked: neither given; more than 20 alternatives: 20.
    let plain = ok(
        &s,
        "/completion",
        &json!({"prompt": prompt, "n_predict": 2}),
    );
    assert_eq!(plain["tokens"], json!([]));
    assert!(plain.get("completion_probabilities").is_none(), "{plain}");
    let many = ok(
        &s,
        "/completion",
        &json!({"prompt": prompt, "n_predict": 1, "n_probs": 50}),
    );
    let top = &many["completion_probabilities"][0]["top_logprobs"];
    assert_eq!(top.as_array().unwrap().len(), 20, "{many}");

    // `response_fields` (llama.vscode's): the named fields only, under their paths, whole and
    // as the last event.
    let fields = ["content", "timings/predicted_n", "truncated", "nope/x"];
    let mut body = json!({"prompt": prompt, "temperature": 0, "n_predict": 2,
                          "response_fields": fields});
    let some = ok(&s, "/completion", &body);
    let mut keys: Vec<&str> = some
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["content", "timings/predicted_n", "truncated"],
        "{some}"
    );
    assert_eq!(some["timings/predicted_n"], 2);
    let whole = c["content"].as_str().unwrap();
    assert!(
        whole.starts_with(some["content"].as_str().unwrap()),
        "{some}"
    );
    body["stream"] = json!(true);
    let events = sse_events(
        &s.request("POST", "/completion", &[], &body.to_string())
            .text(),
    );
    let (last, pieces) = events.split_last().unwrap();
    assert_eq!(last.as_object().unwrap().len(), 3, "{last}");
    assert!(
        pieces.iter().all(|e| e["stop"] == false),
        "pieces are whole"
    );
}
