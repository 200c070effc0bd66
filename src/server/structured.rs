//! Structured-output fields of a request: OpenAI's `response_format` and llama.cpp server's
//! `json_schema` and `grammar`, read into a [`GrammarSpec`] and compiled into the sequence's
//! [`Constraint`] before the request is queued, so that a bad schema is a 400 at once.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Semaphore;

use super::error::ApiError;
use super::AppState;
use crate::grammar::{limits, Constraint, GrammarEngine, GrammarError, GrammarSpec};

/// A request's constraint and the field it came from (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    pub spec: GrammarSpec,
    pub field: &'static str,
    /// The field's full path, named where a limit of the spec is passed.
    pub path: &'static str,
}

/// A chat answer's constraint: the tool-call grammar of its plan where it has one, else its own
/// structured-output field; both at once is a 400 naming the field.
pub fn chat_constraint(
    tool_grammar: Option<GrammarSpec>,
    own: Option<Structured>,
) -> Result<Option<Structured>, ApiError> {
    match (tool_grammar, own) {
        (Some(_), Some(s)) => Err(ApiError::invalid_param(
            s.field,
            format!(
                "{} cannot be combined with tools (unless tool_choice is \"none\")",
                s.field
            ),
        )),
        (Some(spec), None) => Ok(Some(Structured {
            spec,
            field: "tools",
            path: "tools",
        })),
        (None, own) => Ok(own),
    }
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

/// The grammar compiles of the server: at most `at_once` run at once, each on a thread of its
/// own with a [`limits::COMPILE_STACK`] stack (building the engine walks the vocabulary, a
/// large schema takes time, and the compiler recurses), off the async threads; up to
/// `max_waiting` more wait for a place in line, and past those a request is refused with 429,
/// as a full queue is. So a burst of heavy schemas takes no more than `at_once` such threads.
pub(crate) struct CompileGate {
    running: Arc<Semaphore>,
    at_once: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// One place in the line of a [`CompileGate`], given back when dropped (a request that left).
struct InLine<'a>(&'a AtomicUsize);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl CompileGate {
    pub fn new(at_once: usize, max_waiting: usize) -> CompileGate {
        let at_once = at_once.clamp(1, Semaphore::MAX_PERMITS);
        CompileGate {
            running: Arc::new(Semaphore::new(at_once)),
            at_once,
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// Run `f` on a compile thread once a place is free. The place is held until the thread
    /// ends, also where the request is dropped meanwhile (its compile still runs); a panic in
    /// `f` is an internal error (the process goes on).
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let permit = match Arc::clone(&self.running).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let _line = InLine(&self.waiting);
                if self.waiting.fetch_add(1, SeqCst) >= self.max_waiting {
                    return Err(ApiError {
                        message: format!(
                            "the server is busy compiling grammars and schemas ({} at once, {} waiting: the --queue limit); retry shortly",
                            self.at_once, self.max_waiting
                        ),
                        ..ApiError::queue_full(self.at_once, self.max_waiting)
                    });
                }
                Arc::clone(&self.running)
                    .acquire_owned()
                    .await
                    .map_err(|_| ApiError::internal("the grammar compiler has stopped"))?
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("kiln-grammar".into())
            .stack_size(limits::COMPILE_STACK)
            .spawn(move || {
                let r = f();
                drop(permit);
                let _ = tx.send(r);
            })
            .map_err(|e| ApiError::internal(format!("cannot start the grammar compiler: {e}")))?;
        rx.await
            .map_err(|_| ApiError::internal("the grammar compiler failed"))
    }
}

/// Compile `s` for the server's model (its grammar engine built once), through the server's
/// [`CompileGate`].
pub(crate) async fn compile(st: &AppState, s: Structured) -> Result<Constraint, ApiError> {
    let (field, path) = (s.field, s.path);
    let (cell, tok) = (Arc::clone(&st.grammar), Arc::clone(&st.tokenizer));
    let res = st
        .compiles
        .run(move || GrammarEngine::shared(&cell, &tok).and_then(|e| e.compile(&s.spec)))
        .await?;
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
    fn compiles_run_a_few_at_once_and_the_line_is_bounded() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let gate = Arc::new(CompileGate::new(1, 1));
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let started = Arc::new(AtomicUsize::new(0));
            // The first compile holds the only place until told to finish.
            let first = {
                let (gate, started) = (Arc::clone(&gate), Arc::clone(&started));
                tokio::spawn(async move {
                    gate.run(move || {
                        started.fetch_add(1, SeqCst);
                        go_rx.recv().unwrap();
                        1
                    })
                    .await
                })
            };
            while started.load(SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            // The second waits in line; the third finds the line full: 429.
            let second = {
                let (gate, started) = (Arc::clone(&gate), Arc::clone(&started));
                tokio::spawn(
                    async move { gate.run(move || started.fetch_add(1, SeqCst) + 1).await },
                )
            };
            while gate.waiting.load(SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let e = gate.run(|| 3).await.unwrap_err();
            assert_eq!(e.status.as_u16(), 429);
            assert!(e.message.contains("1 at once, 1 waiting"), "{}", e.message);
            assert_eq!(started.load(SeqCst), 1, "the second compile waits");
            go_tx.send(()).unwrap();
            assert_eq!(first.await.unwrap().unwrap(), 1);
            assert_eq!(second.await.unwrap().unwrap(), 2);
            // A waiting request that leaves gives its place in line back.
            let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
            let held = {
                let gate = Arc::clone(&gate);
                tokio::spawn(async move { gate.run(move || hold_rx.recv().unwrap()).await })
            };
            while gate.running.available_permits() == 1 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let left =
                tokio::time::timeout(std::time::Duration::from_millis(50), gate.run(|| ())).await;
            assert!(left.is_err(), "waited for the place");
            assert_eq!(gate.waiting.load(SeqCst), 0);
            hold_tx.send(()).unwrap();
            held.await.unwrap().unwrap();
            // A panicking compile is an error, and its place comes back.
            let e = gate.run(|| -> u8 { panic!("boom") }).await.unwrap_err();
            assert_eq!(e.status.as_u16(), 500);
            assert_eq!(gate.run(|| 4).await.unwrap(), 4);
        });
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
