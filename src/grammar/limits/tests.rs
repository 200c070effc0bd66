//! The limits' tests: each limit refused at one past it and passed at it, paths cut in
//! messages, and specs at every limit compiled on a fraction of the compile stack.

use super::*;
use serde_json::json;

#[test]
fn pointer_fragments_are_percent_decoded_before_their_escapes() {
    let root =
        json!({"$defs": {"a/b": {"type": "string"}, "a~1b": {"type": "integer"}, "c d": {}}});
    let ids = HashMap::new();
    let at = |r: &str| resolve(&root, &ids, r);
    assert_eq!(at("#/$defs/a~1b"), Some(&json!({"type": "string"})));
    // `%7E1` decodes to `~1`, which is then the pointer's escape for `/` (RFC 6901 §6).
    assert_eq!(at("#/$defs/a%7E1b"), Some(&json!({"type": "string"})));
    assert_eq!(at("#/$defs/c%20d"), Some(&json!({})));
    assert_eq!(at("#/$defs/c%2"), None);
}

/// `{"$ref": a0}`, each `a_i` a `$ref` to the next, the last a string: n + 2 levels
/// (the root, `$defs`, the chain).
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let d = if i + 1 == n {
            json!({"type": "string"})
        } else {
            json!({"$ref": format!("#/$defs/a{}", i + 1)})
        };
        defs.insert(format!("a{i}"), d);
    }
    json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

/// Objects nested `n` deep through `properties.x`: 2n + 1 levels.
fn nested(n: usize) -> Value {
    let mut s = json!({"type": "string"});
    for _ in 0..n {
        s = json!({"type": "object", "properties": {"x": s}, "required": ["x"]});
    }
    s
}

/// `root ::= r1`, each rule the next, the last a literal: n rules.
fn rule_chain(n: usize) -> String {
    let mut g = String::from("root ::= r1\n");
    for i in 1..n {
        if i + 1 == n {
            g.push_str(&format!("r{i} ::= \"a\"\n"));
        } else {
            g.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
        }
    }
    g
}

#[track_caller]
fn limit_at(r: Result<(), GrammarError>) -> (String, String) {
    match r {
        Err(GrammarError::Limit { at, msg }) => (at, msg),
        other => panic!("expected a limit, got {other:?}"),
    }
}

#[test]
fn ref_chains_are_bounded_at_the_limit() {
    let at_limit = MAX_SCHEMA_DEPTH - 2;
    check_schema(&ref_chain(at_limit)).unwrap();
    let (at, msg) = limit_at(check_schema(&ref_chain(at_limit + 1)));
    assert!(msg.contains("deeper than 256 levels"), "{msg}");
    assert!(at.starts_with("/$defs/a0"), "{at}");
    // The probe: 300 deep.
    limit_at(check_schema(&ref_chain(300)));
    // 100,000 deep is refused as quickly, with no recursion.
    limit_at(check_schema(&ref_chain(100_000)));
}

#[test]
fn nesting_is_bounded() {
    check_schema(&nested((MAX_SCHEMA_DEPTH - 1) / 2)).unwrap();
    let (_, msg) = limit_at(check_schema(&nested((MAX_SCHEMA_DEPTH - 1) / 2 + 1)));
    assert!(msg.contains("nests"), "{msg}");
}

#[test]
fn recursive_schemas_pass() {
    check_schema(&json!({"$ref": "#"})).unwrap();
    let list = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}},
        "$ref": "#/$defs/node"
    });
    check_schema(&list).unwrap();
    // A definition used many times is measured once (linear, not exponential).
    let mut defs = serde_json::Map::new();
    for i in 0..60 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
        );
    }
    defs.insert("d60".into(), json!({"type": "integer"}));
    check_schema(&json!({"$defs": defs, "$ref": "#/$defs/d0"})).unwrap();
}

#[test]
fn anchors_and_ids_are_followed() {
    // A chain of 300 definitions, each naming itself `name(i)` under `key` and referring to
    // the next, ending in a string.
    let chain = |key: &str, name: &dyn Fn(usize) -> String, refer: &dyn Fn(usize) -> String| {
        let mut defs = serde_json::Map::new();
        for i in 0..300 {
            defs.insert(format!("a{i}"), json!({key: name(i), "$ref": refer(i + 1)}));
        }
        defs.insert("end".into(), json!({key: name(300), "type": "string"}));
        json!({"$defs": defs, "$ref": refer(0)})
    };
    limit_at(check_schema(&chain(
        "$anchor",
        &|i| format!("k{i}"),
        &|i| format!("#k{i}"),
    )));
    limit_at(check_schema(&chain(
        "$id",
        &|i| format!("urn:k:{i}"),
        &|i| format!("urn:k:{i}"),
    )));
}

#[test]
fn width_and_size_are_bounded() {
    let alts = |n: usize| json!({"anyOf": vec![json!({"type": "integer"}); n]});
    check_schema(&alts(MAX_SCHEMA_ALTERNATIVES)).unwrap();
    let (at, msg) = limit_at(check_schema(&alts(MAX_SCHEMA_ALTERNATIVES + 1)));
    assert_eq!(at, "/anyOf");
    assert!(msg.contains("at most 1024"), "{msg}");
    let one_of = json!({"properties": {"p": {"oneOf": vec![json!({}); 5000]}}});
    assert_eq!(limit_at(check_schema(&one_of)).0, "/properties/p/oneOf");
    let many = json!({"properties": (0..MAX_SCHEMA_NODES + 1)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect::<serde_json::Map<_, _>>()});
    assert!(limit_at(check_schema(&many)).1.contains("more than 65536"));
}

#[test]
fn grammar_rule_chains_are_bounded() {
    check(&GrammarSpec::Gbnf(rule_chain(MAX_GRAMMAR_DEPTH))).unwrap();
    let (at, msg) = limit_at(check(&GrammarSpec::Gbnf(rule_chain(MAX_GRAMMAR_DEPTH + 1))));
    assert!(msg.contains("deeper than 256"), "{msg}");
    assert!(at.starts_with('r'), "{at}");
    limit_at(check(&GrammarSpec::Gbnf(rule_chain(700))));
    limit_at(check(&GrammarSpec::Gbnf(rule_chain(50_000))));
    // Recursion (any JSON grammar's) is not depth.
    check(&GrammarSpec::Gbnf(
        "root ::= value\nvalue ::= \"[\" (value (\",\" value)*)? \"]\" | \"1\"\n".into(),
    ))
    .unwrap();
    // Nested groups count.
    let deep = format!(
        "root ::= {}\"a\"{}\n",
        "(".repeat(MAX_GRAMMAR_DEPTH + 1),
        ")".repeat(MAX_GRAMMAR_DEPTH + 1)
    );
    assert!(limit_at(check(&GrammarSpec::Gbnf(deep)))
        .1
        .contains("groups"));
}

#[test]
fn lark_grammars_and_their_json_are_checked() {
    let mut g = String::from("start: r1\n");
    for i in 1..400 {
        g.push_str(&format!("r{i}: \"x\" r{}  // r0 \"quoted r0\"\n", i + 1));
    }
    g.push_str("r400: /[a-z]+/\n");
    limit_at(check(&GrammarSpec::Lark(g)));
    let schema = ref_chain(300).to_string();
    let (at, _) = limit_at(check(&GrammarSpec::Lark(format!(
        "start: obj\nobj: %json {schema}\n"
    ))));
    assert!(at.starts_with("obj: %json/$defs"), "{at}");
    check(&GrammarSpec::Lark(format!(
        "start: obj\nobj: %json {}\n",
        ref_chain(10)
    )))
    .unwrap();
}

#[test]
fn long_keys_with_many_children_stay_small() {
    // A 3 MB key over 60,000 arrays: paths are not copied per child, so this is fast and
    // small; past the node limit it is refused with a short path.
    let key = "k".repeat(3 << 20);
    let wide = |n: usize| {
        let mut m = serde_json::Map::new();
        m.insert(key.clone(), Value::Array(vec![json!([]); n]));
        Value::Object(m)
    };
    check_schema(&wide(60_000)).unwrap();
    let (at, msg) = limit_at(check_schema(&wide(MAX_SCHEMA_NODES)));
    assert!(msg.contains("more than 65536"), "{msg}");
    assert!(at.len() < 100, "{} bytes", at.len());
    assert!(at.starts_with("/kkkk"), "{at}");
    // Deep under a long key: the depth message's path is cut too.
    let mut s = json!({"type": "string"});
    for _ in 0..MAX_SCHEMA_DEPTH {
        let mut m = serde_json::Map::new();
        m.insert("x".repeat(1000), s);
        s = Value::Object(m);
    }
    let (at, msg) = limit_at(check_schema(&s));
    assert!(msg.contains("deeper than 256"), "{msg}");
    assert!(at.len() < PATH_SHOWN + 200, "{} bytes", at.len());
}

/// `start: r-1`, each rule naming the next, `sep` at the end of its line: n rules.
fn lark_chain(n: usize, sep: &str) -> String {
    let mut g = String::from("start: r-1\n");
    for i in 1..n {
        g.push_str(&format!("r-{i}: \"x\" r-{} {sep}\n", i + 1));
    }
    g.push_str(&format!("r-{n}: \"x\"\n"));
    g
}

#[test]
fn lark_is_read_as_llguidance_reads_it() {
    // Hyphenated names are names.
    check(&GrammarSpec::Lark(lark_chain(100, ""))).unwrap();
    let (_, msg) = limit_at(check(&GrammarSpec::Lark(lark_chain(300, ""))));
    assert!(msg.contains("deeper than 256"), "{msg}");
    let (_, msg) = limit_at(check(&GrammarSpec::Lark(lark_chain(100_000, ""))));
    assert!(msg.contains("more than 16384 rules"), "{msg}");
    // A quote in a `#` comment or a special token hides nothing.
    for sep in ["# \"", "// \"", "<\">", "<|x\"|>", "\"a\"i /b/i"] {
        let (_, msg) = limit_at(check(&GrammarSpec::Lark(lark_chain(300, sep))));
        assert!(msg.contains("deeper than 256"), "{sep}: {msg}");
    }
    // Names end where the case changes: `r1X` names `r1` and `X`.
    let mut g = String::from("start: r1X\n");
    for i in 1..300 {
        g.push_str(&format!("r{i}: r{}X\n", i + 1));
    }
    g.push_str("r300: \"x\"\nX: \"y\"\n");
    assert!(limit_at(check(&GrammarSpec::Lark(g))).1.contains("deeper"));
}

#[test]
fn lark_definitions_anywhere_are_counted() {
    // An attribute holding `]`, and definitions that do not start a line.
    for (pre, post) in [
        ("", "[stop=\"]\"]"),
        ("%import common.WS ", ""),
        ("", "[lazy]"),
    ] {
        let mut g = String::from("start: r1\n");
        for i in 1..300 {
            g.push_str(&format!("{pre}r{i}{post}: \"x\" r{}\n", i + 1));
        }
        g.push_str("r300: \"x\"\n");
        let (_, msg) = limit_at(check(&GrammarSpec::Lark(g)));
        assert!(msg.contains("deeper than 256"), "{pre:?} {post:?}: {msg}");
    }
}

#[test]
fn unreadable_lark_is_refused() {
    for g in [
        "start: \"abc\nr1: r2\n",
        "start: /abc\nr1: r2\n",
        "start: \"abc\\\nr1: r2\n",
        "start: \"abc",
        "start: a\na: %json {\"type\": \nr1: r2\n",
        "start: a\na: %json nope\n",
    ] {
        let (_, msg) = limit_at(check(&GrammarSpec::Lark(g.into())));
        assert!(msg.contains("cannot check"), "{g:?}: {msg}");
    }
    // What llguidance reads is still accepted.
    check(&GrammarSpec::Lark(
        "start: a <[1]> \"q\\\"\"i b # \"\nb: /x\\/y/s | B\nB: \"z\"\n".into(),
    ))
    .unwrap();
}

#[test]
fn gbnf_rule_count_is_checked_first() {
    let (at, msg) = limit_at(check(&GrammarSpec::Gbnf(rule_chain(MAX_GRAMMAR_RULES + 1))));
    assert!(msg.contains("at most 16384"), "{msg}");
    assert_eq!(at, "grammar");
    // Many small rules, none deep: refused by count, not translated.
    let mut g = String::from("root ::= \"a\"\n");
    for i in 0..200_000 {
        g.push_str(&format!("a{i} ::= \"a\"\n"));
    }
    assert!(limit_at(check(&GrammarSpec::Gbnf(g)))
        .1
        .contains("at most 16384"));
}

/// Specs at every limit compile on an eighth of the compile thread's stack.
#[test]
fn the_limits_fit_the_stack() {
    let specs = vec![
        GrammarSpec::JsonSchema(ref_chain(MAX_SCHEMA_DEPTH - 2)),
        GrammarSpec::JsonSchema(nested((MAX_SCHEMA_DEPTH - 1) / 2)),
        GrammarSpec::Gbnf(rule_chain(MAX_GRAMMAR_DEPTH)),
        // (Nested groups: llguidance refuses more than a few dozen itself.)
    ];
    for spec in specs {
        let h = std::thread::Builder::new()
            .stack_size(COMPILE_STACK / 8)
            .spawn(move || {
                let (e, _, _) = crate::grammar::tests::engine();
                e.compile(&spec).map(|_| ())
            })
            .unwrap();
        let r = h.join().unwrap();
        assert!(r.is_ok(), "at the limit: {r:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Generated deep and wide schemas and grammars, through the compile path as the
    /// server runs it: each is compiled or refused, and the process survives.
    #[test]
    fn deep_and_wide_specs_never_crash(
        kind in 0usize..6,
        n in 0usize..3000,
    ) {
        let spec = match kind {
            0 => GrammarSpec::JsonSchema(ref_chain(n.max(1))),
            1 => GrammarSpec::JsonSchema(nested(n / 4)),
            2 => GrammarSpec::JsonSchema(json!({"anyOf": (0..n / 2)
                .map(|i| json!({"const": i})).collect::<Vec<_>>()})),
            3 => GrammarSpec::Gbnf(rule_chain(n.max(1))),
            4 => GrammarSpec::Gbnf(format!("root ::= {}\"a\"{}\n", "(".repeat(n / 2), ")".repeat(n / 2))),
            _ => GrammarSpec::Lark(format!("start: a\na: %json {}\n", ref_chain(n.max(1)))),
        };
        let r = on_compile_stack(move || {
            let (e, _, _) = crate::grammar::tests::engine();
            e.compile(&spec).map(|_| ())
        });
        let r = r.expect("the compile thread returns");
        if let Err(e) = r {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }
}
