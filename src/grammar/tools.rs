//! Grammars that constrain tool calls, one per [`ToolFormat`]: a call's JSON follows its
//! function's parameter schema, its name one of the functions offered.
//!
//! With `tool_choice: "required"` (or a named function) the answer must be calls. With `auto`
//! the grammar is lazy, llguidance's way (its docs' "tool calling" pattern): free text, a
//! lexeme that is lazy up to the call's opener (`<tool_call>`), then the call; once the opener
//! is written the rest must be a valid call, while text that never writes it is unconstrained.
//! An opener that is a control token is matched as that token (`<[id]>`), which no text can
//! produce. Llama 3's calls have no opener: plain text may not begin with `{`. The generic
//! format is a JSON schema over the whole answer (as llama.cpp's generic grammar is: with
//! `auto` a `{"response": "..."}` is the other choice).

use serde_json::{json, Value};

use super::GrammarSpec;
use crate::tokenizer::toolcall::ToolFormat;

/// What the calls of an answer may be.
#[derive(Debug, Clone)]
pub struct ToolGrammar<'a> {
    pub format: ToolFormat,
    /// The functions a call may name, with their parameter schemas.
    pub functions: &'a [(String, Value)],
    /// The answer must be calls (`required`, or a named function).
    pub required: bool,
    /// More than one call may follow.
    pub parallel: bool,
    /// The format's opener is this control token.
    pub opener_token: Option<u32>,
}

/// Layout of the JSON the grammar writes (as `json.dumps`): see `with_layout` in the parent.
fn layout(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

impl ToolGrammar<'_> {
    /// One call's object: `{"name": NAME, KEY: PARAMETERS}`, one branch per function.
    fn call_schema(&self) -> Value {
        let key = self.format.arguments_key();
        let calls: Vec<Value> = self
            .functions
            .iter()
            .map(|(name, params)| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, key: params},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        if calls.len() == 1 {
            calls.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": calls })
        }
    }

    fn json_rule(schema: Value) -> String {
        format!("%json {}", layout(schema))
    }

    /// The opener as a grammar symbol: the control token, or its text.
    fn opener(&self) -> Option<String> {
        let text = self.format.opener()?;
        Some(match self.opener_token {
            Some(id) => format!("<[{id}]>"),
            None => Value::String(text.to_string()).to_string(),
        })
    }

    /// The grammar of the answer.
    pub fn spec(&self) -> GrammarSpec {
        match self.format {
            ToolFormat::Generic | ToolFormat::PlainJson => GrammarSpec::JsonSchema(self.generic()),
            ToolFormat::Hermes => {
                let body = format!(
                    "\"\\n\" {} \"\\n</tool_call>\"",
                    Self::json_rule(self.call_schema())
                );
                self.lark_with_opener(&body, "\"\\n\"")
            }
            ToolFormat::Mistral => {
                let mut list = json!({"type": "array", "items": self.call_schema(), "minItems": 1});
                if !self.parallel {
                    list["maxItems"] = json!(1);
                }
                self.lark_with_opener(&Self::json_rule(list), "\"\"")
            }
            ToolFormat::Llama3 => {
                let body = Self::json_rule(self.call_schema());
                let calls = if self.parallel {
                    "body (\"; \" body)*"
                } else {
                    "body"
                };
                let start = if self.required {
                    "start: calls".to_string()
                } else {
                    // Text may not begin with `{` (that would be a call).
                    "start: TEXT | calls\nTEXT: /[^{](.|\\n)*/".to_string()
                };
                GrammarSpec::Lark(format!("{start}\ncalls: {calls}\nbody: {body}\n"))
            }
        }
    }

    /// `OPENER body`, once or (parallel) more separated by `sep`; after free text with `auto`.
    fn lark_with_opener(&self, body: &str, sep: &str) -> GrammarSpec {
        let open = self.opener().unwrap_or_default();
        let more = if self.parallel {
            format!(" ({sep} {open} body)*")
        } else {
            String::new()
        };
        let mut g = format!("body: {body}\n");
        if self.required {
            g.push_str(&format!("start: {open} body{more}\n"));
        } else {
            g.push_str("start: TEXT | calls\nTEXT: /(.|\\n)*/\n");
            g.push_str(&format!("calls: call_hd body{more}\n"));
            if self.opener_token.is_some() {
                // No text can produce the token: free text, then the token.
                g.push_str(&format!("call_hd: TEXT {open}\n"));
            } else {
                g.push_str(&format!("call_hd[lazy]: TEXT {open}\n"));
            }
        }
        GrammarSpec::Lark(g)
    }

    /// The generic format's schema of the whole answer.
    fn generic(&self) -> Value {
        let calls = if self.parallel {
            json!({
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": self.call_schema(), "minItems": 1}},
                "required": ["tool_calls"],
                "additionalProperties": false,
            })
        } else {
            json!({
                "type": "object",
                "properties": {"tool_call": self.call_schema()},
                "required": ["tool_call"],
                "additionalProperties": false,
            })
        };
        if self.required {
            calls
        } else {
            json!({"anyOf": [calls, {
                "type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"],
                "additionalProperties": false,
            }]})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::tests::{engine, feed, generate_with};
    use crate::tokenizer::toolcall::{parse_complete, ToolFormat};

    fn functions() -> Vec<(String, Value)> {
        vec![
            (
                "get_weather".to_string(),
                json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                       "required": ["city"], "additionalProperties": false}),
            ),
            (
                "add".to_string(),
                json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                       "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                       "required": ["a", "b"], "additionalProperties": false}),
            ),
        ]
    }

    /// Every call a grammar lets random logits write parses, in the format's parser, into
    /// calls of the offered functions whose arguments validate against their schemas.
    #[test]
    fn required_calls_are_valid_calls() {
        let f = functions();
        let validators: Vec<_> = f
            .iter()
            .map(|(n, s)| (n.clone(), jsonschema::validator_for(s).unwrap()))
            .collect();
        for format in [
            ToolFormat::Hermes,
            ToolFormat::Mistral,
            ToolFormat::Llama3,
            ToolFormat::Generic,
        ] {
            for parallel in [false, true] {
                let g = ToolGrammar {
                    format,
                    functions: &f,
                    required: true,
                    parallel,
                    opener_token: None,
                };
                for seed in 0..8 {
                    let (text, finished) = generate_with(&g.spec(), seed, 600);
                    assert!(finished, "{format:?} seed {seed}: never finished: {text:?}");
                    let (content, calls) = parse_complete(format, &text);
                    assert!(
                        content.is_none(),
                        "{format:?}: content {content:?} in {text:?}"
                    );
                    assert!(!calls.is_empty(), "{format:?}: no call in {text:?}");
                    if !parallel {
                        assert_eq!(calls.len(), 1, "{text:?}");
                    }
                    for (name, args) in calls {
                        let v = &validators
                            .iter()
                            .find(|(n, _)| *n == name)
                            .expect("an offered name")
                            .1;
                        let args: Value = serde_json::from_str(&args).unwrap();
                        assert!(v.is_valid(&args), "{format:?}: {args} for {name}");
                    }
                }
            }
        }
    }

    /// With `auto`, text is free until the opener; after it, only a call.
    #[test]
    fn auto_is_lazy_until_the_opener() {
        let f = functions();
        let (e, _, _) = engine();
        let g = ToolGrammar {
            format: ToolFormat::Hermes,
            functions: &f,
            required: false,
            parallel: false,
            opener_token: None,
        };
        let mut c = e.compile(&g.spec()).unwrap();
        let allowed = feed(&mut c, "");
        assert!(allowed.len() > 100, "free text at first: {}", allowed.len());
        let allowed = feed(&mut c, "Let me check. <tool_call>");
        assert_eq!(allowed, "\n", "only the call after the opener");
        let allowed = feed(&mut c, "\n");
        assert_eq!(allowed, "{");
        let allowed = feed(&mut c, "{\"name\": \"");
        assert_eq!(allowed, "ag", "a function's name");
        // Generic `auto`: a call or a response, nothing else.
        let g = ToolGrammar {
            format: ToolFormat::Generic,
            ..g
        };
        let mut c = e.compile(&g.spec()).unwrap();
        assert_eq!(feed(&mut c, ""), "{");
        assert_eq!(feed(&mut c, "{\""), "rt");
        // Llama 3 `auto`: text may not begin with `{`... unless it is a call.
        let g = ToolGrammar {
            format: ToolFormat::Llama3,
            ..g
        };
        let mut c = e.compile(&g.spec()).unwrap();
        feed(&mut c, "");
        assert_eq!(feed(&mut c, "{"), "\"");
        let mut c = e.compile(&g.spec()).unwrap();
        assert!(feed(&mut c, "Sure {").len() > 100);
    }

    #[test]
    fn an_opener_token_is_matched_as_the_token() {
        let f = functions();
        let g = ToolGrammar {
            format: ToolFormat::Mistral,
            functions: &f,
            required: false,
            parallel: true,
            opener_token: Some(300),
        };
        let GrammarSpec::Lark(text) = g.spec() else {
            panic!("lark expected")
        };
        assert!(text.contains("call_hd: TEXT <[300]>"), "{text}");
        let g = ToolGrammar {
            required: true,
            ..g
        };
        let GrammarSpec::Lark(text) = g.spec() else {
            panic!("lark expected")
        };
        assert!(text.contains("start: <[300]> body"), "{text}");
    }
}
