//! Fill in the middle on `kiln serve`: llama-server's `POST /infill`, `/v1/completions`'
//! `suffix` and Ollama's `/api/generate` `suffix`. Neither real model has FIM tokens, so the
//! test gives SmolLM2 three (its `<issue_*>` tokens, named by `tokenizer.ggml.fim_*_token_id`;
//! `<reponame>` is FIM_REP by its text, `<file_sep>` is named FIM_SEP): each route's prompt is
//! the tokenizer's FIM prompt (`Tokenizer::infill_prompt`, checked token by token against
//! llama-server's layout in the library's tests) and its text `/completion`'s for those ids.
//! Without FIM tokens each route refuses, saying why. Code completion's early ends
//! (`n_indent`, `t_max_predict_ms`) cut the plain answer where llama-server's rules say.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::path::PathBuf;

use harness::{sse_events, Server};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::tokenizer::{ExtraChunk, InfillBudget, InfillParts, Tokenizer};
use serde_json::{json, Value};

/// The harness's context (`-c 1024`).
const N_CTX: usize = 1024;

/// SmolLM2 with FIM tokens: made once into the tests' scratch folder.
fn fim_model() -> PathBuf {
    let path = common::tmp_dir().join("smollm2-fim.gguf");
    if !path.exists() {
        let f = GgufFile::open(common::real_model("smollm2")).unwrap();
        let tok = Tokenizer::from_gguf(&f).unwrap();
        let id = |t: &str| tok.token_id(t).unwrap();
        let mut w = GgufWriter::from_file(&f);
        w.set("tokenizer.ggml.fim_pre_token_id", id("<issue_start>"));
        w.set("tokenizer.ggml.fim_suf_token_id", id("<issue_comment>"));
        w.set("tokenizer.ggml.fim_mid_token_id", id("<issue_closed>"));
        w.set("tokenizer.ggml.fim_sep_token_id", id("<file_sep>"));
        let part = path.with_extension(format!("part{}", std::process::id()));
        w.write(&part).unwrap();
        std::fs::rename(&part, &path).unwrap();
    }
    path
}

fn ok(s: &Server, path: &str, body: &Value) -> Value {
    let a = s.request("POST", path, &[], &body.to_string());
    assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    a.json()
}

fn refused(s: &Server, path: &str, body: &Value, status: u16) -> String {
    let a = s.request("POST", path, &[], &body.to_string());
    assert_eq!(a.status, status, "{path} {body}: {}", a.text());
    a.text()
}

const PREFIX: &str = "def add(a, b):\n    ";
const SUFFIX: &str = "\n\nprint(add(1, 2))  # <|im_end|>\n";

#[test]
fn infill_routes_give_the_fim_prompts_answer() {
    let model = fim_model();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let fim = tok.fim_tokens().unwrap();
    assert_eq!(fim.rep, tok.token_id("<reponame>"));
    let s = Server::start(&model, &["-P", "2"]);
    let plain = |t: &str| tok.encode(t, false, false);
    let complete = |ids: &[u32]| {
        let body = json!({"prompt": ids, "temperature": 0, "n_predict": 12});
        ok(&s, "/completion", &body)["content"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // /infill, with extra files and the start of the answer.
    let extra = [ExtraChunk {
        filename: "util.py".into(),
        text: "def sub(a, b):\n    return a - b\n".into(),
    }];
    let want_ids = tok.infill_prompt(
        &fim,
        &InfillParts {
            prefix: plain(PREFIX),
            suffix: plain(SUFFIX),
            prompt: tok.encode("return", false, true),
            extra: &extra,
            repository: true,
        },
        InfillBudget::new(N_CTX, false),
    );
    let want = complete(&want_ids);
    assert!(!want.is_empty());
    let body = json!({
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "util.py", "text": extra[0].text}],
        "prompt": "return",
        "temperature": 0,
        "n_predict": 12,
    });
    let a = ok(&s, "/infill", &body);
    assert_eq!(a["prompt"], tok.decode(&want_ids).as_str());
    assert_eq!(a["tokens_evaluated"], want_ids.len());
    assert_eq!(a["content"], want.as_str());
    assert_eq!(a["stop_type"], "limit");
    // Streamed.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = sse_events(
        &s.request("POST", "/infill", &[], &streamed.to_string())
            .text(),
    );
    let (last, pieces) = events.split_last().unwrap();
    let text: String = pieces
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        (text.as_str(), &last["stop"]),
        (want.as_str(), &json!(true))
    );
    // Past the budget (-c 1024: a batch of 512): the prefix's last 384 tokens, the extra
    // file's last tokens in what the context leaves.
    let long_prefix: String = (0..300).map(|i| format!("x{i} = {i}\n")).collect();
    let long_extra = [ExtraChunk {
        filename: "big.py".into(),
        text: (0..300).map(|i| format!("y{i} = {i}\n")).collect(),
    }];
    let parts = InfillParts {
        prefix: plain(&long_prefix),
        suffix: plain(SUFFIX),
        extra: &long_extra,
        repository: true,
        ..Default::default()
    };
    let cut = tok.infill_prompt(&fim, &parts, InfillBudget::new(N_CTX, false));
    assert!(
        cut.len() < N_CTX && parts.prefix.len() > 384,
        "{}",
        cut.len()
    );
    let body = json!({"input_prefix": long_prefix, "input_suffix": SUFFIX, "n_predict": 1,
                      "input_extra": [{"filename": "big.py", "text": long_extra[0].text}]});
    let a = ok(&s, "/infill", &body);
    assert_eq!(a["tokens_evaluated"], cut.len());
    assert_eq!(a["prompt"], tok.decode(&cut).as_str());

    // Mixed prefix: texts and ids; no extra files, no prompt.
    let ids = tok.infill_prompt(
        &fim,
        &InfillParts {
            prefix: plain(PREFIX),
            suffix: plain(SUFFIX),
            ..Default::default()
        },
        InfillBudget::new(N_CTX, false),
    );
    let bare = complete(&ids);
    let (head, tail) = PREFIX.split_at(4);
    let mut mixed =
        json!({"input_prefix": [head], "input_suffix": SUFFIX, "temperature": 0, "n_predict": 12});
    mixed["input_prefix"]
        .as_array_mut()
        .unwrap()
        .extend(plain(tail).iter().map(|&i| json!(i)));
    let mut want_mixed = vec![fim.rep.unwrap()];
    want_mixed.extend(plain("myproject\n"));
    want_mixed.push(fim.sep.unwrap());
    want_mixed.extend(plain("filename\n"));
    want_mixed.push(fim.pre);
    want_mixed.extend(plain(head));
    want_mixed.extend(plain(tail));
    want_mixed.push(fim.suf);
    want_mixed.extend(plain(SUFFIX));
    want_mixed.push(fim.mid);
    let a = ok(&s, "/infill", &mixed);
    assert_eq!(a["prompt"], tok.decode(&want_mixed).as_str());

    // OpenAI's and Ollama's suffix: the prompt is the prefix.
    let v1 = ok(
        &s,
        "/v1/completions",
        &json!({"prompt": PREFIX, "suffix": SUFFIX, "temperature": 0, "max_tokens": 12}),
    );
    assert_eq!(v1["choices"][0]["text"], bare.as_str());
    assert_eq!(v1["usage"]["prompt_tokens"], ids.len());
    let ollama = ok(
        &s,
        "/api/generate",
        &json!({"model": "smollm2-fim", "prompt": PREFIX, "suffix": SUFFIX, "stream": false,
                "options": {"temperature": 0, "num_predict": 12}}),
    );
    assert_eq!(ollama["response"], bare.as_str());
    assert_eq!(ollama["prompt_eval_count"], ids.len());
    let show = ok(&s, "/api/show", &json!({"model": "smollm2-fim"}));
    assert!(
        show["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("insert")),
        "{show}"
    );

    // Refusals naming their field.
    for (body, param, says) in [
        (
            json!({"input_suffix": ""}),
            "input_prefix",
            "\"input_prefix\" is required",
        ),
        (
            json!({"input_prefix": ""}),
            "input_suffix",
            "\"input_suffix\" is required",
        ),
        (
            json!({"input_prefix": "", "input_suffix": "", "prompt": [1]}),
            "prompt",
            "must be a string",
        ),
        (
            json!({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "x"}]}),
            "input_extra[0]",
            "text",
        ),
        (
            json!({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}),
            "input_extra",
            "sequence",
        ),
        (
            json!({"input_prefix": [99999999], "input_suffix": ""}),
            "input_prefix",
            "vocabulary",
        ),
    ] {
        let e: Value = serde_json::from_str(&refused(&s, "/infill", &body, 400)).unwrap();
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{body}: {e}"
        );
    }
    let e = refused(
        &s,
        "/v1/completions",
        &json!({"prompt": [1, 2], "suffix": "x"}),
        400,
    );
    assert!(e.contains("needs one prompt text"), "{e}");
}

#[test]
fn spm_infill_puts_the_suffix_first() {
    let model = fim_model();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let fim = tok.fim_tokens().unwrap();
    let s = Server::start(&model, &["--spm-infill"]);
    let parts = InfillParts {
        prefix: tok.encode(PREFIX, false, false),
        suffix: tok.encode(SUFFIX, false, false),
        repository: true,
        ..Default::default()
    };
    let want = tok.infill_prompt(&fim, &parts, InfillBudget::new(N_CTX, true));
    let body = json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4});
    let a = ok(&s, "/infill", &body);
    assert_eq!(a["prompt"], tok.decode(&want).as_str());
    let suf_at = want.iter().position(|&t| t == fim.suf).unwrap();
    let pre_at = want.iter().position(|&t| t == fim.pre).unwrap();
    assert!(suf_at < pre_at);
}

#[test]
fn a_model_without_fim_tokens_refuses_infill() {
    let s = Server::start(&common::real_model("smollm2"), &[]);
    let body = json!({"input_prefix": PREFIX, "input_suffix": SUFFIX});
    let e: Value = serde_json::from_str(&refused(&s, "/infill", &body, 501)).unwrap();
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing."),
        "{e}"
    );
    let body = json!({"prompt": PREFIX, "suffix": SUFFIX});
    let e: Value = serde_json::from_str(&refused(&s, "/v1/completions", &body, 400)).unwrap();
    assert_eq!(e["error"]["param"], "suffix", "{e}");
    // (An empty suffix is no suffix.)
    ok(
        &s,
        "/v1/completions",
        &json!({"prompt": PREFIX, "suffix": "", "max_tokens": 1}),
    );
    let name = "SmolLM2-135M-Instruct.Q4_1";
    let body = json!({"model": name, "prompt": PREFIX, "suffix": SUFFIX, "stream": false});
    let e = refused(&s, "/api/generate", &body, 400);
    assert!(e.contains("does not support insert"), "{e}");
    let show = ok(&s, "/api/show", &json!({"model": name}));
    assert!(
        !show["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("insert")),
        "{show}"
    );
}

/// llama-server's `n_indent` rule, written out apart from the scheduler's: the text up to the
/// first character (an empty line's newline too) of a line after the first whose indentation
/// is below `n`.
fn indent_cut(text: &str, n: usize) -> &str {
    let mut at = match text.find('\n') {
        Some(i) => i + 1,
        None => return text,
    };
    while at < text.len() {
        let line = &text[at..];
        let ws = line.len() - line.trim_start_matches([' ', '\t']).len();
        if ws < line.len() && ws < n {
            return &text[..at + ws];
        }
        match line.find('\n') {
            Some(i) => at += i + 1,
            None => break,
        }
    }
    text
}

#[test]
fn code_completion_ends_at_a_shallow_line_or_in_time() {
    let s = Server::start(&common::real_model("smollm2"), &[]);
    let prompt = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n";
    let run = |extra: Value| {
        let mut body = json!({"prompt": prompt, "temperature": 0, "n_predict": 48});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        ok(&s, "/completion", &body)
    };
    let plain = run(json!({}));
    let text = plain["content"].as_str().unwrap();
    assert_eq!(plain["tokens_predicted"], 48, "{plain}");
    let want = indent_cut(text, 4);
    assert!(
        want.len() < text.len() && want.contains('\n'),
        "{text:?}: nothing to cut"
    );
    let cut = run(json!({"n_indent": 4}));
    assert_eq!(cut["content"], want, "{text:?}");
    assert_eq!(cut["stop_type"], "limit");
    assert_eq!(cut["generation_settings"]["n_indent"], 4);
    assert!(cut["tokens_predicted"].as_u64().unwrap() < 48);
    // Streamed, the same text.
    let body = json!({"prompt": prompt, "temperature": 0, "n_predict": 48, "n_indent": 4,
                      "stream": true});
    let events = sse_events(
        &s.request("POST", "/completion", &[], &body.to_string())
            .text(),
    );
    let streamed: String = events
        .iter()
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(streamed, want);
    // 0: no cut.
    assert_eq!(run(json!({"n_indent": 0}))["content"], text);
    // A millisecond: the text ends at the end of its second line.
    let quick = run(json!({"t_max_predict_ms": 1}));
    let q = quick["content"].as_str().unwrap();
    assert!(text.starts_with(q), "{q:?} of {text:?}");
    let lines = q.trim_end_matches([' ', '\t']);
    assert!(
        lines.ends_with('\n') && lines.matches('\n').count() >= 2,
        "{q:?}"
    );
    assert!(quick["tokens_predicted"].as_u64().unwrap() < 48, "{quick}");
    assert_eq!(quick["stop_type"], "limit");
}
