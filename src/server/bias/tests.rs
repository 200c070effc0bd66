use serde_json::json;

use super::*;
use crate::tokenizer::{SpecialIds, TokenizerConfig};

/// GPT-2's byte-to-character table (the byte-level BPE alphabet).
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (0x21..=0x7e)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        table[b as usize] = char::from_u32(c).unwrap();
    }
    table
}

/// Two specials, the 256 bytes (ids 2..258), then " world" (258): " world" is one token,
/// "Hi" two.
fn tok() -> Tokenizer {
    let mut tokens = vec!["<s>".to_string(), "</s>".to_string()];
    let mut types = vec![3, 3];
    tokens.extend(byte_chars().iter().map(|c| c.to_string()));
    tokens.extend(["Ġw", "or", "ld", "Ġwor", "Ġworld"].map(String::from));
    types.resize(tokens.len(), 1);
    Tokenizer::from_config(TokenizerConfig {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types: Some(types),
        merges: ["Ġ w", "o r", "l d", "Ġw or", "Ġwor ld"]
            .map(String::from)
            .to_vec(),
        special: SpecialIds {
            bos: Some(0),
            eos: Some(1),
            ..Default::default()
        },
        add_bos: Some(true),
        ..Default::default()
    })
    .unwrap()
}

const VOCAB: usize = 263;

fn ok(v: Value, d: Dialect) -> Vec<(u32, f32)> {
    read(Some(&v), &tok(), VOCAB, d).unwrap_or_else(|e| panic!("{v}: {}", e.message))
}

/// The refusal's message; the param is always `logit_bias`.
fn refused(v: Value, d: Dialect) -> String {
    let e = read(Some(&v), &tok(), VOCAB, d).expect_err(&v.to_string());
    assert_eq!(e.status.as_u16(), 400, "{v}");
    assert_eq!(e.param.as_deref(), Some("logit_bias"), "{v}");
    e.message
}

use Dialect::{LlamaServer, OpenAi};

#[test]
fn openai_map_of_ids() {
    assert_eq!(read(None, &tok(), VOCAB, OpenAi).unwrap(), vec![]);
    assert_eq!(ok(json!(null), OpenAi), vec![]);
    assert_eq!(ok(json!({}), OpenAi), vec![]);
    let mut got = ok(json!({"5": -100, "262": 100, "0": 0.25}), OpenAi);
    got.sort_by_key(|p| p.0);
    assert_eq!(got, vec![(0, 0.25), (5, -100.0), (262, 100.0)]);
    // llama-server's `false`: banned.
    assert_eq!(
        ok(json!({"7": false}), OpenAi),
        vec![(7, f32::NEG_INFINITY)]
    );
}

#[test]
fn llama_server_pairs_and_texts() {
    // " world" is one token (262); "Hi" is its two bytes' tokens, each biased.
    let h = tok().encode("Hi", false, false);
    assert_eq!(h.len(), 2);
    for d in [OpenAi, LlamaServer] {
        let got = ok(json!([[5, 1.5], [" world", -3], ["Hi", false]]), d);
        let want = vec![
            (5, 1.5),
            (262, -3.0),
            (h[0], f32::NEG_INFINITY),
            (h[1], f32::NEG_INFINITY),
        ];
        assert_eq!(got, want, "{d:?}");
        // A token listed twice keeps both entries, in order.
        assert_eq!(ok(json!([[5, 1], [5, 2]]), d), vec![(5, 1.0), (5, 2.0)]);
    }
    // On llama-server's routes a map key that is not a number is a text; specials are text.
    assert_eq!(ok(json!({" world": 2}), LlamaServer), vec![(262, 2.0)]);
    let s = ok(json!({"<s>": -1}), LlamaServer);
    assert_eq!(s.len(), 3, "<s> as three byte tokens, not BOS: {s:?}");
    assert!(s.iter().all(|&(id, _)| id != 0));
    // Any finite bias there.
    assert_eq!(ok(json!([[3, -1000.5]]), LlamaServer), vec![(3, -1000.5)]);
}

#[test]
fn bad_entries_are_refused_by_name() {
    for d in [OpenAi, LlamaServer] {
        let m = refused(json!({"263": 1}), d);
        assert!(
            m.contains("logit_bias[\"263\"]") && m.contains("outside the vocabulary"),
            "{m}"
        );
        let m = refused(json!({"-1": 1}), d);
        assert!(m.contains("token id -1"), "{m}");
        let m = refused(json!([[1, 2], [99999999999i64, 1]]), d);
        assert!(m.contains("logit_bias[1]"), "{m}");
        let m = refused(json!([[1.5, 1]]), d);
        assert!(m.contains("not a token id"), "{m}");
        let m = refused(json!([[1, true]]), d);
        assert!(
            m.contains("logit_bias[0]") && m.contains("false to ban"),
            "{m}"
        );
        let m = refused(json!({"1": "5"}), d);
        assert!(m.contains("must be a number"), "{m}");
        for pair in [json!([1]), json!([1, 2, 3]), json!(5), json!({"a": 1})] {
            let m = refused(json!([pair]), d);
            assert!(m.contains("[token, bias] pair"), "{m}");
        }
        let m = refused(json!([[null, 1]]), d);
        assert!(m.contains("an id or a text"), "{m}");
        let m = refused(json!([["", 1]]), d);
        assert!(m.contains("empty text"), "{m}");
        for shape in [json!("5:-100"), json!(5), json!(true)] {
            let m = refused(shape, d);
            assert!(m.contains("must be an object"), "{m}");
        }
        let m = refused(json!([[1, 1e39]]), d);
        assert!(m.contains("1e39") || m.contains("10000000000"), "{m}");
    }
    // OpenAI's range and keys.
    let m = refused(json!({"5": 100.5}), OpenAi);
    assert!(m.contains("-100 to 100"), "{m}");
    assert_eq!(ok(json!({"5": -100}), OpenAi), vec![(5, -100.0)]);
    let m = refused(json!({"hello": 1}), OpenAi);
    assert!(m.contains("not a token id"), "{m}");
    let m = refused(json!({"": 1}), LlamaServer);
    assert!(m.contains("empty text"), "{m}");
}

#[test]
fn at_most_the_vocabulary() {
    let all: serde_json::Map<String, Value> =
        (0..VOCAB).map(|i| (i.to_string(), json!(-1))).collect();
    assert_eq!(ok(Value::Object(all), OpenAi).len(), VOCAB);
    let pairs: Vec<Value> = (0..=VOCAB).map(|i| json!([i % VOCAB, 1])).collect();
    let m = refused(json!(pairs), LlamaServer);
    assert!(m.contains(&format!("at most {VOCAB}")), "{m}");
    // Texts count by their tokens.
    let long = "Hi".repeat(200);
    let m = refused(json!([[long, -1]]), LlamaServer);
    assert!(m.contains("400 tokens"), "{m}");
}
