//! Structured output on the real models (SmolLM2-135M-Instruct Q4_1, Gemma-3-270M Q4_K_M),
//! through `kiln serve` and `kiln run` as a user drives them: every schema of the set gives,
//! streamed and not, output that parses as JSON and validates against the schema (checked by
//! the `jsonschema` crate, not by kiln) with finish reason `stop`; GBNF grammars hold; an
//! unsupported schema keyword is a 400 naming it.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::process::Command;

use harness::Server;
use serde_json::{json, Value};

/// (what to ask for, schema). Every string and array is bounded, and most numbers have a
/// `multipleOf` (JSON numbers may otherwise have any number of digits, and a small model can
/// write zeros until its token limit), so that a complete answer fits in `MAX_TOKENS`
/// whatever a small model writes.
fn schemas() -> Vec<(&'static str, Value)> {
    let s = |n: u64| json!({"type": "string", "maxLength": n});
    vec![
        (
            "a person with a name and an age",
            json!({
            "type": "object",
            "properties": {"name": s(20), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "a person and their address",
            json!({
            "type": "object",
            "properties": {
                "name": s(20),
                "address": {"type": "object", "properties": {
                    "street": s(30), "city": s(20),
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": false}},
            "required": ["name", "address"], "additionalProperties": false}),
        ),
        (
            "three fruits",
            json!({
            "type": "array", "items": s(15), "minItems": 1, "maxItems": 3}),
        ),
        (
            "the color of the sky",
            json!({
            "type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
            "required": ["color"], "additionalProperties": false}),
        ),
        (
            "a product's price and quantity",
            json!({
            "type": "object",
            "properties": {
                "price": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.01},
                "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["price", "qty"], "additionalProperties": false}),
        ),
        (
            "a temperature in Celsius",
            json!({
            "type": "object",
            "properties": {"celsius": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60, "multipleOf": 0.1}},
            "required": ["celsius"], "additionalProperties": false}),
        ),
        (
            "a book, with optional fields",
            json!({
            "type": "object",
            "properties": {"title": s(40), "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
                           "isbn": s(17), "pages": {"type": "integer", "minimum": 1, "maximum": 5000}},
            "required": ["title"], "additionalProperties": false}),
        ),
        (
            "a value that is a short word or a number",
            json!({
            "type": "object",
            "properties": {"value": {"anyOf": [s(10), {"type": "integer", "minimum": -100, "maximum": 100}]}},
            "required": ["value"], "additionalProperties": false}),
        ),
        (
            "a shape: a circle or a square",
            json!({
            "anyOf": [
                {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0, "maximum": 100}},
                 "required": ["kind", "radius"], "additionalProperties": false},
                {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0, "maximum": 100}},
                 "required": ["kind", "side"], "additionalProperties": false}]}),
        ),
        (
            "a date",
            json!({
            "type": "object",
            "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
            "required": ["date"], "additionalProperties": false}),
        ),
        (
            "a phone number and a product code",
            json!({
            "type": "object",
            "properties": {"phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"},
                           "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
            "required": ["phone", "code"], "additionalProperties": false}),
        ),
        (
            "whether it rains, and a note that may be null",
            json!({
            "type": "object",
            "properties": {"rain": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 20}},
            "required": ["rain", "note"], "additionalProperties": false}),
        ),
        (
            "a list of tasks",
            json!({
            "type": "array", "maxItems": 3,
            "items": {"type": "object",
                      "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 10}, "status": {"enum": ["todo", "done"]}},
                      "required": ["id", "status"], "additionalProperties": false}}),
        ),
        (
            "a 2x2 matrix of small integers",
            json!({
            "type": "array", "minItems": 2, "maxItems": 2,
            "items": {"type": "array", "minItems": 2, "maxItems": 2,
                      "items": {"type": "integer", "minimum": -9, "maximum": 9}}}),
        ),
        (
            "a greeting message",
            json!({
            "type": "object",
            "properties": {"version": {"const": 1}, "text": s(30)},
            "required": ["version", "text"], "additionalProperties": false}),
        ),
        (
            "two points",
            json!({
            "$defs": {"point": {"type": "object",
                                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                                "required": ["x", "y"], "additionalProperties": false}},
            "type": "object",
            "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
            "required": ["from", "to"], "additionalProperties": false}),
        ),
        (
            "an answer",
            json!({
            "type": "object",
            "properties": {"answer": {"enum": [1, "two", null, true]}},
            "required": ["answer"], "additionalProperties": false}),
        ),
        (
            "a company, its team and its leader",
            json!({
            "type": "object",
            "properties": {"company": {"type": "object", "properties": {
                "name": s(20),
                "team": {"type": "object", "properties": {
                    "leader": {"type": "object", "properties": {"name": s(20), "level": {"type": "integer", "minimum": 1, "maximum": 5}},
                               "required": ["name", "level"], "additionalProperties": false}},
                    "required": ["leader"], "additionalProperties": false}},
                "required": ["name", "team"], "additionalProperties": false}},
            "required": ["company"], "additionalProperties": false}),
        ),
        (
            "a username",
            json!({
            "type": "object",
            "properties": {"username": {"type": "string", "minLength": 3, "maxLength": 12, "pattern": "^[a-z][a-z0-9_]*$"}},
            "required": ["username"], "additionalProperties": false}),
        ),
        (
            "a score out of ten, in halves",
            json!({
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10},
                           "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.05}},
            "required": ["score", "ratio"], "additionalProperties": false}),
        ),
        (
            "a list of up to four tags",
            json!({
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"enum": ["news", "sport", "tech", "art"]}, "maxItems": 4}},
            "required": ["tags"], "additionalProperties": false}),
        ),
        (
            "an event with an optional location",
            json!({
            "type": "object",
            "properties": {
                "title": s(25),
                "attendees": {"type": "integer", "minimum": 0, "maximum": 500},
                "location": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"city": s(20)}, "required": ["city"], "additionalProperties": false}]}},
            "required": ["title", "attendees"], "additionalProperties": false}),
        ),
    ]
}

const MAX_TOKENS: usize = 400;

fn chat_body(what: &str, format: &Value, stream: bool) -> String {
    json!({
        "messages": [{"role": "user", "content": format!("Reply in JSON with {what}.")}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        "response_format": format,
    })
    .to_string()
}

/// The content and finish reason of a chat answer, whole or streamed.
fn answer(server: &Server, body: &str, stream: bool) -> (String, String) {
    let a = server.request("POST", "/v1/chat/completions", &[], body);
    assert_eq!(a.status, 200, "{}", a.text());
    if !stream {
        let v = a.json();
        let c = &v["choices"][0];
        return (
            c["message"]["content"].as_str().unwrap().to_string(),
            c["finish_reason"].as_str().unwrap().to_string(),
        );
    }
    let (mut text, mut finish) = (String::new(), String::new());
    for line in a.text().lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

fn check_schemas(model: &str) {
    let server = Server::start(&common::real_model(model), &[]);
    let set = schemas();
    assert!(set.len() >= 20);
    let mut failures = Vec::new();
    for (what, schema) in &set {
        let validator = jsonschema::validator_for(schema).expect("the test's schema is valid");
        let format = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
        for stream in [false, true] {
            let (text, finish) = answer(&server, &chat_body(what, &format, stream), stream);
            let ok = finish == "stop"
                && serde_json::from_str::<Value>(&text).is_ok_and(|v| validator.is_valid(&v));
            if !ok {
                failures.push(format!(
                    "{model} {what:?} stream={stream}: {finish} {text:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} answers invalid:\n{}",
        failures.len(),
        2 * set.len(),
        failures.join("\n")
    );
}

#[test]
fn every_schema_validates_on_smollm2() {
    check_schemas("smollm2");
}

#[test]
fn every_schema_validates_on_gemma3() {
    check_schemas("gemma3");
}

#[test]
fn json_object_grammar_and_llama_cpp_fields() {
    let server = Server::start(&common::real_model("smollm2"), &[]);
    // Any JSON object.
    let body = chat_body(
        "a city and its country",
        &json!({"type": "json_object"}),
        false,
    );
    let (text, finish) = answer(&server, &body, false);
    assert_eq!(finish, "stop", "{text}");
    assert!(
        serde_json::from_str::<Value>(&text).unwrap().is_object(),
        "{text}"
    );

    // llama.cpp server's `json_schema` on /v1/completions.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    let body = json!({"prompt": "A digit in JSON:", "max_tokens": 50, "temperature": 0, "json_schema": schema}).to_string();
    let a = server.request("POST", "/v1/completions", &[], &body);
    assert_eq!(a.status, 200, "{}", a.text());
    let text = a.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(jsonschema::is_valid(&schema, &v), "{text}");

    // llama.cpp's `grammar` (GBNF), streamed and not, at a temperature.
    let gbnf =
        "root ::= \"The answer is \" answer \".\"\nanswer ::= (\"yes\" | \"no\" | [0-9]{1,2})\n";
    for stream in [false, true] {
        let body = json!({
            "messages": [{"role": "user", "content": "Is water wet?"}],
            "max_tokens": 30, "temperature": 0.8, "seed": 7, "stream": stream, "grammar": gbnf,
        })
        .to_string();
        let (text, finish) = answer(&server, &body, stream);
        assert_eq!(finish, "stop", "{text}");
        let rest = text
            .strip_prefix("The answer is ")
            .and_then(|t| t.strip_suffix('.'));
        assert!(
            rest.is_some_and(|r| r == "yes"
                || r == "no"
                || (1..=2).contains(&r.len()) && r.chars().all(|c| c.is_ascii_digit())),
            "{text:?}"
        );
    }
}

#[test]
fn unsupported_and_invalid_constraints_are_400s() {
    let server = Server::start(&common::real_model("smollm2"), &[]);
    let post = |body: Value| server.request("POST", "/v1/chat/completions", &[], &body.to_string());
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let unsupported = json!({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}});
    let e = post(json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": unsupported}}}))
        .expect_error(400, "unsupported keyword");
    assert_eq!(e["param"], "response_format");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("unsupported") && m.contains("dependentSchemas"),
        "{m}"
    );

    let e = post(json!({"messages": msgs, "json_schema": {"type": "integer", "minimum": "low"}}))
        .expect_error(400, "invalid schema");
    assert_eq!(e["param"], "json_schema");

    let e = post(json!({"messages": msgs, "grammar": "root ::= undefined-rule"}))
        .expect_error(400, "bad grammar");
    assert_eq!(e["param"], "grammar");
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("`undefined-rule` is not defined"));

    let e = post(json!({"messages": msgs, "response_format": {"type": "yaml"}}))
        .expect_error(400, "unknown type");
    assert!(e["message"].as_str().unwrap().contains("yaml"));

    let e = post(json!({"messages": msgs, "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}))
        .expect_error(400, "two constraints");
    assert!(e["message"].as_str().unwrap().contains("only one"));

    // The server still answers normally afterwards.
    let a = server.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &json!({"messages": msgs, "max_tokens": 3}).to_string(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
}

fn kiln_run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .args(args)
        .output()
        .expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_flags_constrain_like_llama_cpp() {
    let model = common::real_model("smollm2");
    let m = model.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (what, schema) = &schemas()[1];
    let file = dir.join("schema.json");
    std::fs::write(&file, schema.to_string()).unwrap();
    let prompt = format!("Reply in JSON with {what}.");
    let base = [
        "-m",
        m,
        "--chat",
        "-p",
        prompt.as_str(),
        "--temp",
        "0",
        "-n",
        "300",
    ];
    let inline = schema.to_string();
    let mut outs = Vec::new();
    for extra in [
        vec!["--json-schema", file.to_str().unwrap()],
        vec!["-j", inline.as_str()],
        vec!["--json-schema-file", file.to_str().unwrap()],
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let (ok, out, err) = kiln_run(&args);
        assert!(ok, "{extra:?}: {err}");
        let v: Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{extra:?}: {out:?}: {e}"));
        assert!(jsonschema::is_valid(schema, &v), "{extra:?}: {out}");
        outs.push(out);
    }
    assert!(
        outs.windows(2).all(|w| w[0] == w[1]),
        "the three spellings differ: {outs:?}"
    );

    let gbnf = "root ::= [A-Z] [a-z]{2,8} \" \" [0-9]{4}\n";
    let gfile = dir.join("g.gbnf");
    std::fs::write(&gfile, gbnf).unwrap();
    let check = |out: &str| {
        let t = out.trim_end_matches('\n');
        let (word, year) = t.split_once(' ').unwrap_or_else(|| panic!("{t:?}"));
        assert!(
            word.chars().next().unwrap().is_ascii_uppercase()
                && word[1..].chars().all(|c| c.is_ascii_lowercase()),
            "{t:?}"
        );
        assert!(
            (3..=9).contains(&word.len())
                && year.len() == 4
                && year.chars().all(|c| c.is_ascii_digit()),
            "{t:?}"
        );
    };
    for extra in [
        vec!["--grammar-file", gfile.to_str().unwrap()],
        vec!["--grammar", gfile.to_str().unwrap()],
        vec!["--grammar", gbnf],
    ] {
        let args: Vec<&str> = [
            "-m",
            m,
            "-p",
            "A famous scientist and a year:",
            "--temp",
            "0",
            "-n",
            "40",
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
        let (ok, out, err) = kiln_run(&args);
        assert!(ok, "{extra:?}: {err}");
        check(&out);
    }

    // Errors: one line, exit 1, naming the problem.
    let (ok, _, err) = kiln_run(&[
        "-m",
        m,
        "-p",
        "x",
        "-j",
        r#"{"type": "object", "dependentSchemas": {}}"#,
    ]);
    assert!(!ok && err.contains("dependentSchemas"), "{err}");
    let (ok, _, err) = kiln_run(&[
        "-m",
        m,
        "-p",
        "x",
        "--json-schema",
        "/nonexistent/schema.json",
    ]);
    assert!(!ok && err.contains("/nonexistent/schema.json"), "{err}");
    let (ok, _, err) = kiln_run(&["-m", m, "-p", "x", "--grammar", "root ::= \"a"]);
    assert!(!ok && err.contains("unterminated string"), "{err}");
    let (ok, _, err) = kiln_run(&[
        "-m",
        m,
        "-p",
        "x",
        "-j",
        "{}",
        "--grammar",
        "root ::= \"a\"",
    ]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
