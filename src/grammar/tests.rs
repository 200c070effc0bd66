//! Unit tests over a small made-up vocabulary: every byte, some multi-byte pieces, two
//! end-of-generation control tokens.

use super::*;
use crate::sampler::{argmax, Rng};

const WORDS: &[&str] = &[
    "{\"", "\":", "\"name", "name", "age", "\": ", ", \"", "true", "false", "null", "12", "ab",
    "}", "]", "[", " {", "\n",
];

/// Ids 0..=255 are the bytes, then `WORDS`, then `<eos>` and `<eot>` (control).
pub(crate) fn engine() -> (GrammarEngine, u32, u32) {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.extend(WORDS.iter().map(|w| w.as_bytes().to_vec()));
    let eos = words.len() as u32;
    words.push(b"\xFF<eos>".to_vec());
    let eot = words.len() as u32;
    words.push(b"\xFF<eot>".to_vec());
    let e = GrammarEngine::from_words(words, eos, &[eos, eot]).unwrap();
    (e, eos, eot)
}

fn text_of(ids: &[u32]) -> String {
    let mut all: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    all.extend(WORDS.iter().map(|w| w.as_bytes().to_vec()));
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| all[i as usize].clone()).collect();
    String::from_utf8(bytes).unwrap()
}

/// Generate under `spec` from random logits (argmax of the masked row), as the engine does:
/// stop at an end-of-generation token or when the grammar is done.
pub(crate) fn generate_with(spec: &GrammarSpec, seed: u64, limit: usize) -> (String, bool) {
    generate(spec, seed, limit)
}

/// Consume `text` (one byte token per byte) and compute the next mask: the ASCII bytes it
/// allows, in order.
pub(crate) fn feed(c: &mut Constraint, text: &str) -> String {
    if text.is_empty() {
        c.advance(None);
    }
    for b in text.bytes() {
        c.advance(Some(b as u32));
    }
    let m = c.mask.as_ref().expect("a mask");
    (0..128u32)
        .filter(|&t| m.is_allowed(t))
        .map(|t| t as u8 as char)
        .collect()
}

fn generate(spec: &GrammarSpec, seed: u64, limit: usize) -> (String, bool) {
    let (e, eos, eot) = engine();
    let mut c = e.compile(spec).unwrap();
    let mut rng = Rng::new(seed);
    let vocab = 256 + WORDS.len() + 2;
    let mut out = Vec::new();
    let mut last = None;
    for _ in 0..limit {
        overlap(&mut [(&mut c, last)], || ());
        if c.is_done() {
            return (text_of(&out), true);
        }
        let logits: Vec<f32> = (0..vocab).map(|_| rng.next_f64() as f32 * 10.0).collect();
        let t = argmax(c.apply(&logits).unwrap());
        if t == eos || t == eot {
            return (text_of(&out), true);
        }
        out.push(t);
        last = Some(t);
    }
    (text_of(&out), false)
}

#[test]
fn random_logits_under_a_schema_give_valid_json() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    for seed in 0..20 {
        let (text, finished) = generate(&GrammarSpec::JsonSchema(schema.clone()), seed, 400);
        assert!(finished, "seed {seed}: never finished: {text:?}");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
        assert!(
            validator.is_valid(&v),
            "seed {seed}: {text} breaks the schema"
        );
    }
}

#[test]
fn json_object_gives_an_object() {
    for seed in 0..5 {
        let (text, finished) = generate(&GrammarSpec::JsonObject, seed, 2000);
        if finished {
            // Syntax only: random logits write numbers such as 1e999 that no f64 holds.
            serde_json::from_str::<serde::de::IgnoredAny>(&text)
                .unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
            assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
        } else {
            // Random logits may nest without end; what there is must still start an object.
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

#[test]
fn gbnf_grammar_constrains() {
    let g = GrammarSpec::from_grammar_text(
        "root ::= \"answer: \" (\"yes\" | \"no\") \"!\"\n# the end\n",
    );
    assert!(matches!(g, GrammarSpec::Gbnf(_)));
    for seed in 0..10 {
        let (text, finished) = generate(&g, seed, 100);
        assert!(finished);
        assert!(text == "answer: yes!" || text == "answer: no!", "{text:?}");
    }
}

#[test]
fn llguidance_marker_selects_lark() {
    let g = GrammarSpec::from_grammar_text("%llguidance {}\nstart: \"ab\" /[0-9]{2}/\n");
    let GrammarSpec::Lark(ref l) = g else {
        panic!("{g:?}")
    };
    assert!(l.trim_start().starts_with("start:"));
    let (text, finished) = generate(&g, 3, 50);
    assert!(finished);
    assert_eq!(text.len(), 4);
    assert!(text.starts_with("ab") && text[2..].chars().all(|c| c.is_ascii_digit()));
}

#[test]
fn end_of_generation_is_allowed_only_where_the_grammar_may_end() {
    let (e, eos, eot) = engine();
    // Digits, then optionally more: may end after the first digit, not before.
    let mut c = e
        .compile(&GrammarSpec::Gbnf("root ::= [0-9]+".into()))
        .unwrap();
    c.advance(None);
    let logits = vec![1.0; 256 + WORDS.len() + 2];
    let row = c.apply(&logits).unwrap().to_vec();
    assert_eq!(row[eos as usize], f32::NEG_INFINITY);
    assert_eq!(row[eot as usize], f32::NEG_INFINITY);
    assert_eq!(row[b'a' as usize], f32::NEG_INFINITY);
    assert_eq!(row[b'7' as usize], 1.0);
    c.advance(Some(b'7' as u32));
    let row = c.apply(&logits).unwrap().to_vec();
    assert_eq!(row[eos as usize], 1.0);
    assert_eq!(
        row[eot as usize], 1.0,
        "every end-of-generation token follows llguidance's EOS"
    );
    assert!(!c.is_done());
    // A longer logits row (a model's padded vocabulary): the extra ids are never allowed.
    let long = vec![1.0; 256 + WORDS.len() + 10];
    let row = c.apply(&long).unwrap().to_vec();
    assert!(row[256 + WORDS.len() + 2..]
        .iter()
        .all(|&l| l == f32::NEG_INFINITY));
}

/// `root ::= "ab"`, compiled and started.
fn ab_started() -> Constraint {
    let (e, ..) = engine();
    let mut c = e
        .compile(&GrammarSpec::Gbnf("root ::= \"ab\"".into()))
        .unwrap();
    c.advance(None);
    c
}

#[test]
fn a_complete_grammar_is_done() {
    let mut c = ab_started();
    assert!(!c.is_done());
    let ab = 256 + WORDS.iter().position(|w| *w == "ab").unwrap() as u32;
    c.advance(Some(ab));
    assert!(c.is_done());
}

#[test]
fn a_token_outside_the_grammar_is_an_error() {
    let mut c = ab_started();
    c.advance(Some(b'z' as u32));
    let err = c.apply(&[0.0; 300]).unwrap_err();
    assert!(matches!(err, GrammarError::Matcher(_)), "{err}");
    assert!(!c.is_done());
}

#[test]
fn overlap_returns_the_forward_result_and_advances_every_constraint() {
    let (e, ..) = engine();
    let spec = GrammarSpec::Gbnf("root ::= \"a\" \"b\"".into());
    let mut a = e.compile(&spec).unwrap();
    let mut b = e.compile(&spec).unwrap();
    let r = overlap(&mut [(&mut a, None), (&mut b, None)], || 42);
    assert_eq!(r, 42);
    let logits = vec![0.0; 300];
    for c in [&mut a, &mut b] {
        let row = c.apply(&logits).unwrap();
        let allowed: Vec<usize> = (0..row.len()).filter(|&i| row[i] == 0.0).collect();
        let ab = 256 + WORDS.iter().position(|w| *w == "ab").unwrap();
        assert_eq!(allowed, vec![b'a' as usize, ab], "`a`, or `ab` at once");
    }
    assert_eq!(overlap(&mut [], || 7), 7);
}

#[test]
fn unsupported_schema_features_are_named() {
    let (e, ..) = engine();
    let err = e
        .compile(&GrammarSpec::JsonSchema(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "dependentSchemas": {"a": {"required": ["b"]}}
        })))
        .err()
        .expect("refused");
    assert!(matches!(err, GrammarError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("dependentSchemas"), "{err}");
    let err = e
        .compile(&GrammarSpec::JsonSchema(
            json!({"type": "integer", "minimum": "x"}),
        ))
        .err()
        .expect("refused");
    assert!(matches!(err, GrammarError::InvalidSchema(_)), "{err}");
    let err = e
        .compile(&GrammarSpec::JsonSchema(json!([1, 2])))
        .err()
        .expect("refused");
    assert!(matches!(err, GrammarError::InvalidSchema(_)), "{err}");
    let err = e
        .compile(&GrammarSpec::Lark("start: nothing_here".into()))
        .err()
        .expect("refused");
    assert!(matches!(err, GrammarError::InvalidGrammar(_)), "{err}");
}

#[test]
fn multiple_of_bounds_the_fraction_digits() {
    // A plain JSON number may have any number of digits (a small model can loop on zeros);
    // `multipleOf` is how a schema bounds them.
    let (e, ..) = engine();
    let spec = |s: Value| GrammarSpec::JsonSchema(s);
    let mut c = e
        .compile(&spec(
            json!({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100}),
        ))
        .unwrap();
    c.advance(None);
    for b in b"1.00" {
        c.advance(Some(*b as u32));
    }
    assert!(c.is_done(), "no third fraction digit");
    let mut c = e
        .compile(&spec(
            json!({"type": "number", "minimum": 0, "maximum": 100}),
        ))
        .unwrap();
    c.advance(None);
    for b in b"1.00" {
        c.advance(Some(*b as u32));
    }
    let row = c.apply(&[0.0; 300]).unwrap();
    assert_eq!(
        row[b'0' as usize], 0.0,
        "without multipleOf, more digits may follow"
    );
}
