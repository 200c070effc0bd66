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
    /// The format's markers ([`ToolFormat::markers`]) that are control tokens of the
    /// vocabulary, with their ids: the grammar writes them as those tokens.
    pub control: Vec<(&'static str, u32)>,
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

    /// The control token standing for the marker `text`, if the vocabulary has one.
    fn control_token(&self, text: &str) -> Option<u32> {
        self.control
            .iter()
            .find(|(t, _)| *t == text)
            .map(|&(_, id)| id)
    }

    /// A marker as a grammar symbol: its control token, or its text.
    fn marker(&self, text: &str) -> String {
        match self.control_token(text) {
            Some(id) => format!("<[{id}]>"),
            None => Value::String(text.to_string()).to_string(),
        }
    }

    /// The opener as a grammar symbol: the control token, or its text.
    fn opener(&self) -> Option<String> {
        self.format.opener().map(|text| self.marker(text))
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
            ToolFormat::Harmony => self.harmony(),
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
            if self
                .format
                .opener()
                .and_then(|o| self.control_token(o))
                .is_some()
            {
                // No text can produce the token: free text, then the token.
                g.push_str(&format!("call_hd: TEXT {open}\n"));
            } else {
                g.push_str(&format!("call_hd[lazy]: TEXT {open}\n"));
            }
        }
        GrammarSpec::Lark(g)
    }

    /// Harmony's call: a `commentary` message to one of the functions, its body the
    /// arguments' JSON (`<|call|>` after it ends generation). Where the vocabulary has
    /// harmony's markers as control tokens, an `analysis` message may come first (its text
    /// free: no text can write the control token that ends it). Only for a required call:
    /// with `auto` harmony's answer is its own markup, which a text grammar cannot leave free.
    fn harmony(&self) -> GrammarSpec {
        // `<|start|>`, `<|channel|>`, `<|message|>`, `<|constrain|>`, `<|end|>`.
        let mk = ToolFormat::Harmony.markers();
        let (start, channel, message, constrain, end) = (mk[0], mk[1], mk[2], mk[3], mk[4]);
        let m = |t| self.marker(t);
        let mut g = String::new();
        let analysis = [start, channel, message, end]
            .iter()
            .all(|t| self.control_token(t).is_some());
        if analysis {
            g.push_str(&format!(
                "start: analysis? call\nanalysis: {} \"analysis\" {} ATEXT {} {} \"assistant\"\nATEXT: /(.|\\n)*/\n",
                m(channel),
                m(message),
                m(end),
                m(start)
            ));
        } else {
            g.push_str("start: call\n");
        }
        g.push_str(&format!(
            "call: {} \"commentary to=functions.\" body\n",
            m(channel)
        ));
        let names: Vec<String> = (0..self.functions.len()).map(|i| format!("f{i}")).collect();
        g.push_str(&format!("body: {}\n", names.join(" | ")));
        for (rule, (name, params)) in names.iter().zip(self.functions) {
            g.push_str(&format!(
                "{rule}: {} \" \" {} \"json\" {} {}\n",
                Value::String(name.clone()),
                m(constrain),
                m(message),
                Self::json_rule(params.clone())
            ));
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
            ToolFormat::Harmony,
        ] {
            for parallel in [false, true] {
                let g = ToolGrammar {
                    format,
                    functions: &f,
                    required: true,
                    parallel,
                    control: Vec::new(),
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
                    if !parallel || format == ToolFormat::Harmony {
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
            control: Vec::new(),
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
            control: vec![("[TOOL_CALLS]", 300)],
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

    /// Harmony's markers that are control tokens are written as those tokens, and then an
    /// analysis message may come first; with text markers the answer is the call.
    #[test]
    fn harmony_markers_are_matched_as_their_tokens() {
        let f = functions();
        let control: Vec<(&str, u32)> = ToolFormat::Harmony
            .markers()
            .iter()
            .enumerate()
            .map(|(i, &m)| (m, 500 + i as u32))
            .collect();
        let g = ToolGrammar {
            format: ToolFormat::Harmony,
            functions: &f,
            required: true,
            parallel: false,
            control,
        };
        let GrammarSpec::Lark(text) = g.spec() else {
            panic!("lark expected")
        };
        assert!(text.starts_with("start: analysis? call\n"), "{text}");
        assert!(
            text.contains("analysis: <[501]> \"analysis\" <[502]> ATEXT <[504]> <[500]>"),
            "{text}"
        );
        assert!(
            text.contains("f0: \"get_weather\" \" \" <[503]> \"json\" <[502]> %json"),
            "{text}"
        );
        let g = ToolGrammar {
            control: Vec::new(),
            ..g
        };
        let GrammarSpec::Lark(text) = g.spec() else {
            panic!("lark expected")
        };
        assert!(text.starts_with("start: call\n"), "{text}");
        assert!(
            text.contains("call: \"<|channel|>\" \"commentary to=functions.\" body"),
            "{text}"
        );
    }
}
