//! Structured-output fields of a request: OpenAI's `response_format` and llama.cpp server's
//! `json_schema` and `grammar`, read into a [`GrammarSpec`] and compiled into the sequence's
//! [`Constraint`] before the request is queued, so that a bad schema is a 400 at once.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::error::ApiError;
use crate::grammar::{limits, Constraint, GrammarEngine, GrammarError, GrammarSpec};
use crate::tokenizer::Tokenizer;

/// A request's constraint and the field it came from (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    pub spec: GrammarSpec,
    pub field: &'static str,
    /// The field's full path, named where a limit of the spec is passed.
    pub path: &'static str,
}

/// Read `response_format`, `json_schema` and `grammar` (at most one of them may constrain).
pub fn read(
    response_format: Option<&Value>,
    json_schema: Option<&Value>,
    grammar: Option<&str>,
) -> Result<Option<Structured>, ApiError> {
    let mut found: Vec<Structured> = Vec::new();
    if let Some(rf) = response_format {
        if let Some((spec, path)) = response_format_spec(rf)? {
            found.push(Structured {
                spec,
                field: "response_format",
                path,
            });
        }
    }
    if let Some(s) = json_schema {
        found.push(Structured {
            spec: GrammarSpec::JsonSchema(s.clone()),
            field: "json_schema",
            path: "json_schema",
        });
    }
    if let Some(g) = grammar {
        if !g.trim().is_empty() {
            found.push(Structured {
                spec: GrammarSpec::from_grammar_text(g),
                field: "grammar",
                path: "grammar",
            });
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|s| s.field).collect();
        return Err(ApiError::invalid_param(
            found[1].field,
            format!(
                "{} each constrain the output; give only one",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `{"type": "text"}`, `{"type": "json_object"}` (llama.cpp also
/// takes a `schema` there) or `{"type": "json_schema", "json_schema": {"name", "schema"}}`.
fn response_format_spec(rf: &Value) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("response_format", msg);
    let obj = rf
        .as_object()
        .ok_or_else(|| bad("response_format must be an object with a `type`".into()))?;
    let kind = obj.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad("response_format.type must be one of `text`, `json_object`, `json_schema`".into())
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(match obj.get("schema") {
            Some(s) => (GrammarSpec::JsonSchema(s.clone()), "response_format.schema"),
            None => (GrammarSpec::JsonObject, "response_format"),
        })),
        "json_schema" => {
            let js = obj
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    bad("response_format.json_schema must be an object with a `schema`".into())
                })?;
            let schema = js.get("schema").ok_or_else(|| {
                bad("response_format.json_schema.schema is required (the JSON schema)".into())
            })?;
            Ok(Some((
                GrammarSpec::JsonSchema(schema.clone()),
                "response_format.json_schema.schema",
            )))
        }
        other => Err(bad(format!(
            "response_format.type `{other}` is not supported (text, json_object, json_schema)"
        ))),
    }
}

/// Compile `s` for the model of `tok` (its grammar engine built once, in `cell`), off the
/// async threads, on a compile thread of its own ([`limits::on_compile_stack`]: building the
/// engine walks the vocabulary, a large schema takes time, and the compiler recurses).
pub async fn compile(
    cell: Arc<OnceLock<Result<Arc<GrammarEngine>, GrammarError>>>,
    tok: Arc<Tokenizer>,
    s: Structured,
) -> Result<Constraint, ApiError> {
    let (field, path) = (s.field, s.path);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kiln-grammar".into())
        .stack_size(limits::COMPILE_STACK)
        .spawn(move || {
            let _ = tx.send(GrammarEngine::shared(&cell, &tok).and_then(|e| e.compile(&s.spec)));
        })
        .map_err(|e| ApiError::internal(format!("cannot start the grammar compiler: {e}")))?;
    let res = rx
        .await
        .map_err(|_| ApiError::internal("the grammar compiler failed"))?;
    res.map_err(|e| error(field, path, e))
}

/// A compile error as the API answers it: the request's fault a 400 naming `field`, or for a
/// limit passed the field's full `path`.
pub fn error(field: &str, path: &str, e: GrammarError) -> ApiError {
    match e {
        GrammarError::Vocabulary(_) | GrammarError::Matcher(_) => ApiError::internal(e.to_string()),
        GrammarError::Limit { at, msg } => {
            ApiError::invalid_param(path, format!("{path}: {msg} (at {at:?})"))
        }
        e => ApiError::invalid_param(field, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_each_shape() {
        let schema = json!({"type": "object"});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let s = read(Some(&rf), None, None).unwrap().unwrap();
        assert_eq!(s.spec, GrammarSpec::JsonSchema(schema.clone()));
        assert_eq!(s.field, "response_format");
        let s = read(Some(&json!({"type": "json_object"})), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(s.spec, GrammarSpec::JsonObject);
        assert_eq!(
            read(Some(&json!({"type": "text"})), None, None).unwrap(),
            None
        );
        let s = read(None, Some(&schema), None).unwrap().unwrap();
        assert_eq!(s.field, "json_schema");
        let s = read(None, None, Some("root ::= \"a\"")).unwrap().unwrap();
        assert_eq!(s.spec, GrammarSpec::Gbnf("root ::= \"a\"".into()));
        assert_eq!(read(None, None, Some("  ")).unwrap(), None);
        assert_eq!(read(None, None, None).unwrap(), None);
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let msg = |rf: Value| {
            let e = read(Some(&rf), None, None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"));
            e.message
        };
        assert!(msg(json!("json")).contains("must be an object"));
        assert!(msg(json!({"type": "xml"})).contains("`xml` is not supported"));
        assert!(msg(json!({"type": "json_schema"})).contains("json_schema must be an object"));
        assert!(
            msg(json!({"type": "json_schema", "json_schema": {"name": "x"}}))
                .contains("schema is required")
        );
        let e = read(
            Some(&json!({"type": "json_object"})),
            None,
            Some("root ::= \"a\""),
        )
        .unwrap_err();
        assert!(e.message.contains("give only one"), "{}", e.message);
    }
}
