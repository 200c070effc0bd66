//! Log-probabilities against the reference engine: `tests/golden/<model>/logprobs.jsonl` holds
//! llama.cpp's top-5 log-softmax values (float64 over its raw logits) after every position of
//! the golden prompts and at each of its greedy steps (scripts/make-fixtures.py). kiln's are
//! compared twice: at the prompt positions from the library (the log-softmax of kiln's logits,
//! as the server computes it), and at the greedy steps as `kiln serve` reports them
//! (`/v1/completions` with `logprobs: 5` at temperature 0, streamed and not), while kiln's greedy
//! tokens are the reference's.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::sync::Arc;

use harness::Server;
use kiln::engine::logprobs::TokenLogprobs;
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// `[[id, logprob], ...]`
fn top(v: &Value) -> Vec<(u32, f64)> {
    v.as_array()
        .expect("top list")
        .iter()
        .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap()))
        .collect()
}

/// Differences between kiln's and the reference's log-probabilities of the reference's top-5.
#[derive(Default)]
struct Errors {
    n: usize,
    sum: f64,
    max: f64,
    /// Positions where the reference's top-1 leads by more than 0.1 but kiln's top-1 differs.
    confident_misses: usize,
    positions: usize,
}

impl Errors {
    fn add(&mut self, kiln: f64, golden: f64) {
        let e = (kiln - golden).abs();
        self.n += 1;
        self.sum += e;
        self.max = self.max.max(e);
    }

    fn check(&self, what: &str, mean_bar: f64, max_bar: f64) {
        let mean = self.sum / self.n.max(1) as f64;
        eprintln!(
            "{what}: {} values at {} positions, mean |Δ| {mean:.2e}, max {:.2e}, confident top-1 misses {}",
            self.n, self.positions, self.max, self.confident_misses
        );
        assert!(self.n > 0, "{what}: nothing compared");
        assert!(
            mean <= mean_bar,
            "{what}: mean |Δlogprob| {mean:.3e} > {mean_bar:.0e}"
        );
        assert!(
            self.max <= max_bar,
            "{what}: max |Δlogprob| {:.3e} > {max_bar:.0e}",
            self.max
        );
        assert_eq!(
            self.confident_misses, 0,
            "{what}: top-1 differs where the reference is sure"
        );
    }
}

/// Compare one position: kiln's log-probabilities (`lp`, over the whole row) with the golden top.
fn compare_row(err: &mut Errors, logits: &[f32], golden: &[(u32, f64)]) {
    let mut lp = TokenLogprobs::new(5);
    lp.observe(logits);
    err.positions += 1;
    for &(id, g) in golden {
        lp.choose(id, logits[id as usize]);
        err.add(lp.logprob as f64, g);
    }
    let margin = golden[0].1 - golden.get(1).map_or(f64::NEG_INFINITY, |t| t.1);
    if lp.top[0].0 != golden[0].0 && margin > 0.1 {
        err.confident_misses += 1;
    }
}

/// The prompt positions, from the library.
fn prompt_positions(model: &Arc<Model>, lines: &[Value]) -> Errors {
    let mut err = Errors::default();
    for line in lines {
        let prompt = ids(&line["prompt_ids"]);
        let tops = line["prompt_top"].as_array().unwrap();
        let n_ctx = (prompt.len() + 8).next_power_of_two();
        let mut opts = SessionOptions::new(n_ctx, 2);
        opts.logit_rows = 16;
        let mut s = Session::new(Arc::clone(model), opts).expect("session");
        s.eval_all(&prompt, 0, &mut |pos: usize, logits: &[f32]| {
            compare_row(&mut err, logits, &top(&tops[pos]));
        })
        .expect("eval");
    }
    err
}

/// The token's text as the server writes it.
fn text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_bytes(id)).into_owned()
}

/// The greedy steps, from `kiln serve`.
fn greedy_steps(server: &Server, tok: &Tokenizer, lines: &[Value], stream: bool) -> Errors {
    let mut err = Errors::default();
    for line in lines {
        let prompt = ids(&line["prompt_ids"]);
        let gen = ids(&line["gen_ids"]);
        let tops = line["gen_top"].as_array().unwrap();
        if gen.is_empty() {
            continue;
        }
        // A cold prompt: evaluated in one pass, as the reference did (a prompt continued from
        // a cached prefix is evaluated in two, which moves Gemma-3's values by up to ~0.2).
        let body = json!({"prompt": prompt, "max_tokens": gen.len(), "temperature": 0,
                          "logprobs": 5, "stream": stream, "cache_prompt": false});
        let a = server.request("POST", "/v1/completions", &[], &body.to_string());
        assert_eq!(a.status, 200, "{}", a.text());
        let lp = if stream {
            merge_stream(&a.text())
        } else {
            a.json()["choices"][0]["logprobs"].clone()
        };
        let tokens = lp["tokens"].as_array().expect("tokens");
        let chosen = lp["token_logprobs"].as_array().unwrap();
        let alts = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(tokens.len(), chosen.len());
        assert_eq!(tokens.len(), alts.len());
        for (i, &g) in gen.iter().enumerate() {
            let Some(t) = tokens.get(i) else { break };
            if t.as_str() != Some(&text(tok, g)) {
                break; // kiln's greedy path left the reference's
            }
            let golden = top(&tops[i]);
            err.positions += 1;
            // The greedy token is the reference's top-1: its log-probability.
            err.add(chosen[i].as_f64().unwrap(), golden[0].1);
            let alts = alts[i].as_object().expect("alternatives");
            // (texts of different tokens may coincide: a byte-level piece of a character is
            // U+FFFD; the legacy shape keys alternatives by text)
            assert!(!alts.is_empty() && alts.len() <= 6, "{alts:?}");
            let texts: Vec<String> = golden.iter().map(|&(id, _)| text(tok, id)).collect();
            for (k, &(_, g)) in golden.iter().enumerate() {
                let unique = texts.iter().filter(|t| **t == texts[k]).count() == 1;
                // Alternatives near the 5th may trade places with the 6th.
                let clear = golden.get(4).is_none_or(|fifth| g > fifth.1 + 0.01);
                if unique && clear {
                    let mine = alts
                        .get(&texts[k])
                        .and_then(Value::as_f64)
                        .unwrap_or_else(|| panic!("{:?} not among {alts:?}", texts[k]));
                    err.add(mine, g);
                }
            }
        }
    }
    err
}

/// The legacy `logprobs` of a stream's chunks, joined.
fn merge_stream(sse: &str) -> Value {
    let mut out =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for v in harness::sse_events(sse) {
        let Some(lp) = v["choices"][0].get("logprobs").filter(|l| !l.is_null()) else {
            continue;
        };
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let items = lp[key].as_array().unwrap().clone();
            out[key].as_array_mut().unwrap().extend(items);
        }
    }
    out
}

fn check_model(stem: &str, path: std::path::PathBuf, bars: (f64, f64)) {
    let golden = common::golden_dir().join(stem).join("logprobs.jsonl");
    let lines = common::read_jsonl(&golden);
    let model = Arc::new(Model::load(&path).expect("load"));
    let tok = Tokenizer::from_gguf(&model.file).expect("tokenizer");
    prompt_positions(&model, &lines).check(&format!("{stem} prompt positions"), bars.0, bars.1);
    let server = Server::start(&path, &["-P", "1", "-t", "2"]);
    let whole = greedy_steps(&server, &tok, &lines, false);
    whole.check(&format!("{stem} served greedy steps"), bars.0, bars.1);
    let streamed = greedy_steps(&server, &tok, &lines, true);
    assert_eq!(
        (streamed.n, streamed.sum.to_bits()),
        (whole.n, whole.sum.to_bits()),
        "{stem}: streamed log-probabilities differ from the whole response's"
    );
}

/// Bars (mean, max of |Δlogprob|) at two to ten times what was measured on the development
/// machine (mean / max over prompt positions and served steps): llama-f32 3e-7..1e-5 / 7e-5,
/// llama-q4_0 2e-3 / 1.3e-2, qwen2-f32 2e-6..2e-4 / 1.4e-3, qwen3-q4_k_m 3e-7 / 1e-6,
/// gpt2-f32 1e-4 / 6e-4, SmolLM2 and Gemma-3 2e-7 / 8e-7.
#[test]
fn random_models_match_the_reference() {
    for (stem, bars) in [
        ("random-llama-f32", (1e-4, 1e-3)),
        ("random-llama-q4_0", (5e-3, 3e-2)),
        ("random-qwen2-f32", (5e-4, 3e-3)),
        ("random-qwen3-q4_k_m", (1e-4, 1e-3)),
        ("random-gpt2-f32", (3e-4, 2e-3)),
    ] {
        check_model(stem, common::random_model(stem), bars);
    }
}

#[test]
fn real_models_match_the_reference() {
    check_model(
        "smollm2-135m-instruct-q4_1",
        common::real_model("smollm2"),
        (1e-5, 1e-4),
    );
    check_model(
        "gemma3-270m-q4_k_m",
        common::real_model("gemma3"),
        (1e-5, 1e-4),
    );
}
