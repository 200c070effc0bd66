//! Request fields kiln knows and does not implement: each is refused by name (a 400 with
//! `param` the field) where a request asks something of it, that is, sends it with a value
//! other than the one that leaves generation as it is. Sent with that value (as clients do
//! that send every field they know, SillyTavern's `mirostat: 0`, `typical_p: 1`), or `null`,
//! it is accepted. So nothing a client asks for is silently dropped.
//!
//! The fields a route ignores on purpose are not here: those OpenAI, Ollama or llama-server
//! ignore too, or that ask nothing of the answer (`user`, `store`, `metadata`,
//! `service_tier`, `n_keep`, Ollama's load options...); docs/server.md lists them.

use serde_json::Value;

use super::error::ApiError;

/// A field, when its value leaves generation as kiln does it, and what to say otherwise.
pub(super) struct Field {
    pub name: &'static str,
    pub off: fn(&Value) -> bool,
    pub why: &'static str,
}

/// Refuse the first of `fields` that `body` (an object; `prefix` names where it is, such as
/// `options.`) sends with a value asking for something.
pub(super) fn check(body: &Value, prefix: &str, fields: &[Field]) -> Result<(), ApiError> {
    for f in fields {
        match body.get(f.name) {
            None | Some(Value::Null) => {}
            Some(v) if (f.off)(v) => {}
            Some(v) => {
                let name = format!("{prefix}{}", f.name);
                let mut shown = v.to_string();
                if shown.len() > 80 {
                    let cut = (0..=80).rev().find(|&i| shown.is_char_boundary(i));
                    shown.truncate(cut.unwrap_or(0));
                    shown.push_str("...");
                }
                return Err(ApiError::invalid_param(
                    &name,
                    format!("{name} = {shown} is not supported: {}", f.why),
                ));
            }
        }
    }
    Ok(())
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}
fn at_most_zero(v: &Value) -> bool {
    num(v).is_some_and(|x| x <= 0.0)
}
fn at_most_one(v: &Value) -> bool {
    num(v).is_some_and(|x| x <= 1.0)
}
fn at_least_one(v: &Value) -> bool {
    num(v).is_some_and(|x| x >= 1.0)
}
fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}
/// An empty list, object or text.
fn empty(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}
fn never(_: &Value) -> bool {
    false
}

/// llama-server's sampler order, `samplers` (names, or a text of their letters), as far as it
/// concerns kiln's stages: `top_k`, `top_p`, `min_p`, `temperature` all there, in that order,
/// after `penalties` where it is named (not `adaptive_p` nor `infill`). Other stages (`dry`, `xtc`, `typ_p`, `top_n_sigma`,
/// ...) may be named anywhere: each is off unless its own field turns it on, and that is
/// refused ([`LLAMA_SAMPLING`]).
fn kiln_order(v: &Value) -> bool {
    const ORDER: [&str; 5] = ["penalties", "top_k", "top_p", "min_p", "temperature"];
    let canon = |name: &str| -> Option<&'static str> {
        let n = name.to_ascii_lowercase().replace('-', "_");
        match n.as_str() {
            "penalties" => Some("penalties"),
            "top_k" | "topk" => Some("top_k"),
            "top_p" | "topp" | "nucleus" => Some("top_p"),
            "min_p" | "minp" => Some("min_p"),
            "temperature" | "temp" => Some("temperature"),
            _ => None,
        }
    };
    let letter = |c: char| match c {
        'e' => Some("penalties"),
        'k' => Some("top_k"),
        'p' => Some("top_p"),
        'm' => Some("min_p"),
        't' => Some("temperature"),
        _ => None,
    };
    // Stages that replace kiln's draw (`adaptive_p`) or add to it (`infill`) are refused.
    let replaces = |n: &str| {
        let n = n.to_ascii_lowercase().replace(['-', '_'], "");
        n == "adaptivep" || n == "infill"
    };
    let stages: Vec<&str> = match v {
        Value::Array(a) if a.iter().any(|s| s.as_str().is_none_or(replaces)) => return false,
        Value::Array(a) => a.iter().filter_map(|s| canon(s.as_str()?)).collect(),
        Value::String(s) if s.contains(['a', 'i']) => return false,
        Value::String(s) => s.chars().filter_map(letter).collect(),
        _ => return false,
    };
    let expected: Vec<&str> = ORDER
        .iter()
        .copied()
        .filter(|s| *s != "penalties" || stages.contains(s))
        .collect();
    stages == expected
}

/// Mirostat, refused alike on llama-server's fields and in Ollama's `options`.
const MIROSTAT: Field = Field {
    name: "mirostat",
    off: at_most_zero,
    why: "kiln has no mirostat sampler (send 0)",
};

/// Locally typical sampling, refused alike on llama-server's fields and in Ollama's `options`.
const TYPICAL_P: Field = Field {
    name: "typical_p",
    off: at_least_one,
    why: "kiln has no locally typical sampling (send 1)",
};

/// llama-server's sampling fields beyond kiln's stages, on its routes and the OpenAI ones
/// (llama-server takes them on both).
pub(super) const LLAMA_SAMPLING: &[Field] = &[
    MIROSTAT,
    TYPICAL_P,
    Field {
        name: "dynatemp_range",
        off: at_most_zero,
        why: "kiln has no dynamic temperature (send 0)",
    },
    Field {
        name: "top_n_sigma",
        off: at_most_zero,
        why: "kiln has no top-n-sigma sampler (send -1)",
    },
    Field {
        name: "xtc_probability",
        off: at_most_zero,
        why: "kiln has no XTC sampler (send 0)",
    },
    Field {
        name: "dry_multiplier",
        off: at_most_zero,
        why: "kiln has no DRY repetition penalty (send 0; repeat_penalty, frequency_penalty and presence_penalty are kiln's)",
    },
    Field {
        name: "min_keep",
        off: at_most_one,
        why: "kiln's filters keep at least one token (send 0 or 1)",
    },
    Field {
        name: "samplers",
        off: kiln_order,
        why: "kiln applies penalties, top_k, top_p, min_p and temperature in this order (a list must name the last four in it; turn a stage off with its own field: top_k 0, top_p 1, min_p 0)",
    },
    Field {
        name: "lora",
        off: empty,
        why: "kiln serves the model without adapters",
    },
    Field {
        name: "grammar_lazy",
        off: is_false,
        why: "grammars apply from the first token",
    },
    Field {
        name: "grammar_triggers",
        off: empty,
        why: "grammars apply from the first token",
    },
    Field {
        name: "timings_per_token",
        off: is_false,
        why: "timings come with the last event",
    },
    Field {
        name: "return_progress",
        off: is_false,
        why: "no prompt progress events are sent",
    },
    Field {
        name: "t_max_prompt_ms",
        off: at_most_zero,
        why: "the prompt is evaluated whole",
    },
];

/// OpenAI's chat fields beyond what kiln does (llama-server's chat options among them).
pub(super) const OPENAI_CHAT: &[Field] = &[
    Field {
        name: "functions",
        off: empty,
        why: "the deprecated functions are not read: send them as tools",
    },
    Field {
        name: "function_call",
        off: |v| v == "none" || v == "auto",
        why: "the deprecated function_call is not read: send tools and tool_choice",
    },
    Field {
        name: "audio",
        off: never,
        why: "kiln answers in text",
    },
    Field {
        name: "modalities",
        off: |v| v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
        why: "kiln answers in text (send [\"text\"])",
    },
    Field {
        name: "reasoning_effort",
        off: never,
        why: "the model's chat template decides how it reasons",
    },
    Field {
        name: "verbosity",
        off: never,
        why: "the model decides how long it answers (max_tokens limits it)",
    },
    Field {
        name: "web_search_options",
        off: never,
        why: "kiln has no web search",
    },
    Field {
        name: "reasoning_budget_tokens",
        off: |v| num(v).is_some_and(|x| x < 0.0),
        why: "the model's reasoning is not budgeted (send -1)",
    },
    Field {
        name: "continue_final_message",
        off: is_false,
        why: "the answer is a new assistant turn",
    },
    Field {
        name: "n_probs",
        off: at_most_zero,
        why: "use logprobs and top_logprobs",
    },
    Field {
        name: "post_sampling_probs",
        off: is_false,
        why: "log-probabilities are the model's",
    },
];

/// OpenAI's legacy completion fields beyond what kiln does.
pub(super) const OPENAI_COMPLETIONS: &[Field] = &[
    Field {
        name: "echo",
        off: is_false,
        why: "the answer holds the completion only",
    },
    Field {
        name: "best_of",
        off: at_most_one,
        why: "each choice is generated once (n asks for more)",
    },
    Field {
        name: "n_probs",
        off: at_most_zero,
        why: "use logprobs",
    },
    Field {
        name: "post_sampling_probs",
        off: is_false,
        why: "log-probabilities are the model's",
    },
];

/// llama-server's `/completion` and `/infill` fields beyond what kiln does there.
pub(super) const LLAMA_COMPLETION: &[Field] = &[
    Field {
        name: "n_cmpl",
        off: at_most_one,
        why: "/completion gives one completion (n on /v1/completions gives several)",
    },
    Field {
        name: "echo",
        off: is_false,
        why: "the answer holds the completion only",
    },
];

/// Ollama's `options` beyond kiln's sampler.
pub(super) const OLLAMA_OPTIONS: &[Field] = &[
    MIROSTAT,
    TYPICAL_P,
    Field {
        name: "tfs_z",
        off: at_least_one,
        why: "kiln has no tail-free sampling (send 1)",
    },
];

/// `/api/generate`'s `think` (`/api/chat` separates the model's thoughts).
pub(super) const OLLAMA_RAW_THINK: &[Field] = &[Field {
    name: "think",
    off: is_false,
    why: "/api/generate does not separate the model's thoughts (/api/chat does)",
}];

/// Ollama's `/api/chat` and `/api/generate` fields beyond what kiln does.
pub(super) const OLLAMA_GENERATE: &[Field] = &[
    Field {
        name: "logprobs",
        off: is_false,
        why: "Ollama's log-probabilities are not given (the OpenAI routes give them)",
    },
    Field {
        name: "top_logprobs",
        off: at_most_zero,
        why: "Ollama's log-probabilities are not given (the OpenAI routes give them)",
    },
];

/// Anthropic's Messages fields beyond what kiln does.
pub(super) const ANTHROPIC: &[Field] = &[
    Field {
        name: "mcp_servers",
        off: empty,
        why: "kiln connects to no MCP servers",
    },
    Field {
        name: "container",
        off: never,
        why: "kiln runs no code containers",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_values_pass_and_others_are_named() {
        let sillytavern = json!({"mirostat": 0, "mirostat_tau": 5, "typical_p": 1, "top_n_sigma": -1,
            "xtc_probability": 0, "dry_multiplier": 0, "min_keep": 0, "dynatemp_range": 0,
            "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
            "lora": [], "timings_per_token": false, "n_probs": 0});
        check(&sillytavern, "", LLAMA_SAMPLING).unwrap();
        for (field, value) in [
            ("mirostat", json!(2)),
            ("typical_p", json!(0.9)),
            ("dynatemp_range", json!(0.5)),
            ("top_n_sigma", json!(1.5)),
            ("xtc_probability", json!(0.5)),
            ("dry_multiplier", json!(0.8)),
            ("min_keep", json!(5)),
            ("lora", json!([{"id": 0, "scale": 1}])),
            ("timings_per_token", json!(true)),
            (
                "samplers",
                json!(["temperature", "top_k", "top_p", "min_p"]),
            ),
            ("samplers", json!(["top_k", "temperature"])),
            ("samplers", json!("tkpm")),
            (
                "samplers",
                json!(["top_k", "top_p", "min_p", "temperature", "adaptive_p"]),
            ),
            ("samplers", json!("kpmti")),
            (
                "samplers",
                json!(["top_k", 5, "top_p", "min_p", "temperature"]),
            ),
            ("mirostat", json!("1")),
        ] {
            let mut body = sillytavern.clone();
            body[field] = value.clone();
            let e = check(&body, "", LLAMA_SAMPLING).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{field} = {value}");
            assert!(e.message.contains("not supported"), "{}", e.message);
        }
        check(&json!({"samplers": "kpmt"}), "", LLAMA_SAMPLING).unwrap();
        check(&json!({"samplers": "ekypmxt"}), "", LLAMA_SAMPLING).unwrap();
        check(
            &json!({"samplers": ["top-k", "nucleus", "min_p", "temp"]}),
            "",
            LLAMA_SAMPLING,
        )
        .unwrap();
        assert!(check(
            &json!({"samplers": ["top_k", "penalties", "top_p", "min_p", "temperature"]}),
            "",
            LLAMA_SAMPLING
        )
        .is_err());
        let e = check(&json!({"mirostat": 1}), "options.", OLLAMA_OPTIONS).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.mirostat"));
        check(
            &json!({"mirostat": 0, "typical_p": 1.0, "tfs_z": 1}),
            "options.",
            OLLAMA_OPTIONS,
        )
        .unwrap();
        check(
            &json!({"modalities": ["text"], "function_call": "auto", "functions": [], "audio": null,
            "reasoning_budget_tokens": -1}),
            "",
            OPENAI_CHAT,
        )
        .unwrap();
        for (field, value) in [
            ("modalities", json!(["text", "audio"])),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!({"name": "f"})),
            ("reasoning_effort", json!("low")),
            ("reasoning_budget_tokens", json!(0)),
        ] {
            let e = check(&json!({field: value}), "", OPENAI_CHAT).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
        }
        let long = json!({"container": "x".repeat(500)});
        let e = check(&long, "", ANTHROPIC).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
    }
}
