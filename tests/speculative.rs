//! Speculative decoding gives the tokens plain decoding gives: greedy and seeded sampling, with
//! drafts all accepted, all refused or in between, through the token limit, the end of
//! generation and `--ignore-eos`; the cache is left holding exactly the emitted tokens.
//!
//! Generations run on the engine `kiln run` drives (a scheduler over a runner of one slot). A
//! verification pass computes every row as a decode step of it would (`push_verify`, and a
//! session's `eval_as_decodes`: the K-quants' batch-dependent arithmetic included), so its
//! logits equal plain decoding's bit for bit and the outputs must match exactly.

mod common;

use std::sync::Arc;

use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::scheduler::ServeDrafter;
use kiln::engine::slot_drafter::SlotDrafter;
use kiln::engine::speculative::{Drafter, NgramDrafter};
use kiln::engine::{Engine, GenStats, GenerateRequest, Session, SessionOptions, StopReason};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

struct Run {
    ids: Vec<u32>,
    stop: StopReason,
    /// The slot's tokens after generation.
    cached: Vec<u32>,
    stats: GenStats,
}

fn sampler_cfg(seeded: bool) -> SamplerConfig {
    if seeded {
        SamplerConfig {
            seed: 1234,
            temperature: 0.9,
            // A penalty over the history: each verified position must see its own.
            repeat_penalty: 1.3,
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    }
}

/// Where a generation's drafts come from.
enum Spec {
    /// A drafter of the history alone, up to `max` drafts a pass.
    Guess(Box<dyn Drafter>, usize),
    /// The model drafting greedily for itself (every guess taken, `--draft-p-min 0`) in a
    /// runner of `n_ctx` positions, up to `max` guesses a pass.
    SelfDraft { n_ctx: usize, max: usize },
}

/// A runner of one slot of `n_ctx` positions verifying up to `draft_max` drafts a pass.
fn runner(m: &Arc<Model>, n_ctx: usize, draft_max: usize) -> BatchRunner {
    let o = BatchOptions {
        n_slots: 1,
        n_ctx,
        n_threads: 2,
        prefill_chunk: 512,
        kv_type: Default::default(),
        device: Default::default(),
        draft_max,
    };
    BatchRunner::new(Arc::clone(m), o).unwrap()
}

fn run(
    m: &Arc<Model>,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    seeded: bool,
    ignore_eos: bool,
    spec: Option<Spec>,
) -> Run {
    let draft_max = match &spec {
        None => 0,
        Some(Spec::Guess(_, max) | Spec::SelfDraft { max, .. }) => *max,
    };
    let mut engine = Engine::new(runner(m, 256, draft_max), tok).unwrap();
    match spec {
        None => {}
        Some(Spec::Guess(d, _)) => engine.speculate(ServeDrafter::Lookup(d), 1),
        Some(Spec::SelfDraft { n_ctx, .. }) => {
            // As the command line does: the draft's runner steps on the engine's threads.
            let d = SlotDrafter::new(runner(m, n_ctx, 0), engine.runner(), 0.0).unwrap();
            engine.speculate(d, 1);
        }
    }
    let mut sampler = Sampler::new(sampler_cfg(seeded), m.config.vocab_size);
    let mut req = GenerateRequest::new(prompt, Some(n));
    req.ignore_eos = ignore_eos;
    let mut ids = Vec::new();
    let mut on_token = |id: u32, _: &str| {
        if id != u32::MAX {
            ids.push(id);
        }
        true
    };
    let stats = engine
        .generate(&req, &mut sampler, None, &mut |_, _| {}, &mut on_token)
        .unwrap();
    Run {
        ids,
        stop: stats.stop.unwrap(),
        cached: engine.runner().tokens(0).to_vec(),
        stats,
    }
}

/// Proposes the continuation of a known sequence, every `spoil`-th guess of a step replaced by
/// another token (0: never), so steps accept all, none or part of their drafts.
struct Scripted {
    script: Vec<u32>,
    spoil: usize,
}

impl Drafter for Scripted {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        if history.len() < self.script.len() && self.script.starts_with(history) {
            for (i, &t) in self.script[history.len()..].iter().take(max).enumerate() {
                let spoiled = self.spoil > 0 && (i + 1) % self.spoil == 0;
                out.push(if spoiled { t ^ 1 } else { t });
            }
        }
    }
}

fn check(plain: &Run, spec: &Run, prompt: &[u32], what: &str) {
    assert_eq!(spec.ids, plain.ids, "{what}: tokens differ");
    assert_eq!(spec.stop, plain.stop, "{what}: stop reason differs");
    assert_eq!(spec.cached, plain.cached, "{what}: cached tokens differ");
    // Plain decoding evaluates every emitted token but one that ended generation.
    assert!(spec.cached.starts_with(prompt), "{what}");
}

fn same_output_as_plain(stem: &str, seeded: bool) {
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    // A prompt that repeats itself, so the n-gram drafter finds matches.
    let prompt: Vec<u32> = [3u32, 17, 29, 41, 3, 17, 29, 8, 3, 17].to_vec();
    // 300 tokens fill the 256-token context.
    for (n, ignore_eos) in [(40, false), (40, true), (7, false), (300, true)] {
        let plain = run(&m, &tok, &prompt, n, seeded, ignore_eos, None);
        let mut script = prompt.clone();
        script.extend(&plain.ids);
        let what = |d: &str| format!("{stem} seeded={seeded} n={n} ignore_eos={ignore_eos} {d}");
        for (name, drafter, max) in [
            (
                "ngram",
                Box::new(NgramDrafter::new(1, 3)) as Box<dyn Drafter>,
                4,
            ),
            (
                "script",
                Box::new(Scripted {
                    script: script.clone(),
                    spoil: 0,
                }),
                // Passes of up to 10 rows: Q6_K's tiled arithmetic starts at 8.
                9,
            ),
            (
                "script, every 3rd spoiled",
                Box::new(Scripted {
                    script: script.clone(),
                    spoil: 3,
                }),
                5,
            ),
            (
                "script, all spoiled",
                Box::new(Scripted {
                    script: script.clone(),
                    spoil: 1,
                }),
                3,
            ),
        ] {
            let r = run(
                &m,
                &tok,
                &prompt,
                n,
                seeded,
                ignore_eos,
                Some(Spec::Guess(drafter, max)),
            );
            check(&plain, &r, &prompt, &what(name));
            let st = r.stats.spec;
            assert!(st.accepted <= st.drafted, "{}", what(name));
            match name {
                // Every draft is right: only the passes' own tokens are not drafts.
                "script" => assert!(
                    st.accepted == st.drafted && st.passes > 0,
                    "{}: {st:?}",
                    what(name)
                ),
                "script, all spoiled" => assert_eq!(st.accepted, 0, "{}", what(name)),
                _ => {}
            }
        }
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding() {
    for stem in [
        "random-llama-q8_0",
        "random-qwen2-q4_0",
        "random-llama-q4_k",
        "random-llama-q6_k",
    ] {
        same_output_as_plain(stem, false);
    }
}

#[test]
fn seeded_speculation_equals_plain_decoding() {
    for stem in [
        "random-llama-q4_1",
        "random-qwen3-q4_k_m",
        "random-llama-q5_k",
    ] {
        same_output_as_plain(stem, true);
    }
}

/// `m` drafting greedily for itself in a runner of `n_ctx` positions, up to `max` guesses a
/// pass.
fn self_drafting(n_ctx: usize, max: usize) -> Option<Spec> {
    Some(Spec::SelfDraft { n_ctx, max })
}

/// The model as its own draft: greedy, every guess is accepted; through the real SmolLM2 on a
/// text the n-gram drafter also finds matches in.
#[test]
fn a_model_drafting_for_itself_is_always_right() {
    let m = Arc::new(Model::load(common::real_model("smollm2")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let prompt = tok.encode(
        "Copy the list: apples, pears, plums, figs. Copy the list: apples, pears,",
        true,
        false,
    );
    let plain = run(&m, &tok, &prompt, 24, false, false, None);
    let r = run(&m, &tok, &prompt, 24, false, false, self_drafting(256, 4));
    check(&plain, &r, &prompt, "self-draft");
    let st = r.stats.spec;
    assert_eq!(st.accepted, st.drafted, "{st:?}");
    assert!(st.accepted > 0);
    let ngram = Spec::Guess(Box::new(NgramDrafter::new(1, 3)), 8);
    let r = run(&m, &tok, &prompt, 24, false, false, Some(ngram));
    check(&plain, &r, &prompt, "ngram on SmolLM2");
    assert!(r.stats.spec.accepted > 0, "{:?}", r.stats.spec);
    // A draft whose context ends within the generation: fewer guesses near its end, none
    // after it, and the model goes on alone.
    let short = prompt.len() + 10;
    let r = run(&m, &tok, &prompt, 24, false, false, self_drafting(short, 4));
    check(&plain, &r, &prompt, "self-draft with a short context");
    let st = r.stats.spec;
    assert!(
        st.accepted == st.drafted && st.drafted > 0 && st.drafted <= 11,
        "{st:?}"
    );
}

/// An end of generation among the accepted drafts ends generation there, as it ends plain
/// decoding, and the cache keeps the tokens before it.
#[test]
fn an_accepted_end_of_generation_stops_as_plain_decoding_does() {
    let m = Arc::new(Model::load(common::real_model("smollm2")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let msgs = [kiln::tokenizer::ChatMessage::new(
        "user",
        "What is the capital of France? Answer in one word.",
    )];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    let prompt = tok.encode(&text, true, true);
    let plain = run(&m, &tok, &prompt, 64, false, false, None);
    assert_eq!(plain.stop, StopReason::EndOfGeneration, "{:?}", plain.ids);
    for max in [2, 8] {
        let r = run(&m, &tok, &prompt, 64, false, false, self_drafting(256, max));
        check(&plain, &r, &prompt, &format!("self-draft of {max}"));
    }
}

fn kiln(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

/// `kiln run` with `--spec-type ngram-simple` and with `-md` prints what it prints without, and
/// reports the passes; wrong combinations and a draft of another vocabulary are one-line errors.
#[test]
fn run_speculates_from_the_command_line() {
    let model = common::random_model("random-llama-q4_k");
    let m = model.to_str().unwrap();
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "ab ab ab ab ab",
        "-n",
        "24",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let plain = kiln(&base);
    assert!(plain.status.success());
    let draft = common::random_model("random-llama-q8_0");
    for extra in [
        vec!["--spec-type", "ngram-simple", "--spec-ngram-size-n", "1"],
        vec![
            "-md",
            draft.to_str().unwrap(),
            "--draft-max",
            "5",
            "--draft-p-min",
            "0",
        ],
    ] {
        let out = kiln(&[&base[..], &extra[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {stderr}");
        assert_eq!(out.stdout, plain.stdout, "{extra:?}");
        assert!(stderr.contains("verification passes"), "{stderr}");
        // The statistics line of --json: passes were made.
        let json = kiln(&[&base[..], &extra[..], &["--json"]].concat());
        let last = String::from_utf8_lossy(&json.stdout);
        let stats: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert!(
            stats["speculative"]["passes"].as_u64().unwrap() > 0,
            "{extra:?}: {stats}"
        );
    }
    let other = common::real_model("smollm2");
    for (extra, expect) in [
        (vec!["--spec-type", "draft-simple"], "needs --model-draft"),
        (vec!["-md", other.to_str().unwrap()], "vocabulary"),
        (
            vec!["--spec-type", "ngram-simple", "--draft-max", "0"],
            "from 1 to",
        ),
        (
            vec!["--spec-type", "ngram-simple", "--draft-max", "100000"],
            "from 1 to",
        ),
        (
            vec!["--spec-type", "ngram-simple", "--grammar", "root ::= \"a\""],
            "grammar",
        ),
    ] {
        let out = kiln(&[&base[..], &extra[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(stderr.contains(expect), "{extra:?}: {stderr}");
    }
}

/// A verification pass's rows are decode steps' logits bit for bit: short contexts (the
/// attention's vector path), long ones (a decode row's split keys, where a batch of rows would
/// take the vector path), K-quant products (whose batch arithmetic differs), and Gemma-3's
/// sliding-window rings past the window.
#[test]
fn verification_rows_are_decode_steps_bit_for_bit() {
    let cases = [
        (common::random_model("random-llama-q4_k"), vec![40, 300]),
        (common::random_model("random-qwen3-q4_k_m"), vec![300]),
        (common::real_model("gemma3"), vec![300, 700]),
    ];
    for (path, lens) in cases {
        let m = Arc::new(Model::load(&path).unwrap());
        let v = m.config.vocab_size;
        // The pass's logits in one part, and in parts of 4 rows (each part's products then
        // still a row at a time: random-llama-q4_k's output matrix is Q4_K).
        for (plen, logit_rows) in lens.into_iter().flat_map(|l| [(l, 9), (l, 4)]) {
            let mut o = SessionOptions::new(1024, 2);
            o.logit_rows = logit_rows;
            let prompt: Vec<u32> = (0..plen).map(|i| 1 + (i * 37 % 250) as u32).collect();
            let toks: Vec<u32> = (0..9).map(|i| 150 + 7 * i).collect();
            let mut a = Session::new(Arc::clone(&m), o).unwrap();
            let mut b = Session::new(Arc::clone(&m), o).unwrap();
            a.prefill(&prompt, &mut |_, _| {}).unwrap();
            b.prefill(&prompt, &mut |_, _| {}).unwrap();
            let mut rows = vec![vec![0f32; v]; toks.len()];
            b.eval_as_decodes(&toks, &mut |p, l| rows[p].copy_from_slice(&l[..v]))
                .unwrap();
            for (i, &t) in toks.iter().enumerate() {
                let d = a.decode(t).unwrap();
                assert!(
                    d.iter()
                        .zip(&rows[i])
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{} after {plen} tokens, row {i}, logits {logit_rows} rows a part",
                    path.display()
                );
            }
            assert_eq!(a.tokens(), b.tokens());
        }
    }
}

/// `kiln plan -md` adds the draft model's weights and runner to the total; `--draft-max`
/// plans the engine's verification rows (logits and scratch) and token buffers as its runner
/// of one slot allocates them.
#[test]
fn plan_counts_the_draft_model_and_the_verification_rows() {
    let model = common::random_model("random-llama-q4_k");
    let draft = common::random_model("random-llama-q8_0");
    let plan = |extra: &[&str]| {
        let m = model.to_str().unwrap();
        plan_json(&[&["-m", m, "-c", "256", "-t", "2"][..], extra].concat())
    };
    let plain = plan(&[]);
    let too_many = kiln(&["plan", "-m", model.to_str().unwrap(), "--draft-max", "1000"]);
    assert!(!too_many.status.success());
    assert!(String::from_utf8_lossy(&too_many.stderr).contains("from 1 to 128"));
    let rows = plan(&["--draft-max", "7"]);
    assert_eq!(
        component_bytes(&rows, "logits"),
        component_bytes(&plain, "logits")
    );
    let runner = |draft_max: usize| {
        let m = std::sync::Arc::new(kiln::model::Model::load(&model).unwrap());
        let mut o = kiln::engine::SessionOptions::new(256, 2);
        o.prefill_chunk = 512;
        let (b, c) = kiln::engine::batch::BatchOptions::from_session(&o, 1, draft_max);
        kiln::engine::batch::BatchRunner::with_cache(m, b, c, &mut |_, _| {}).unwrap()
    };
    let extra = runner(7).host_scratch_bytes() - runner(0).host_scratch_bytes();
    // The slot's pass, and the drafter's copy of its history.
    let tokens = (7 + 1) * 4 + (256 + 1) * 4;
    assert_eq!(
        component_bytes(&rows, "speculation"),
        Some((extra + tokens) as u64)
    );
    let with = plan(&["-md", draft.to_str().unwrap(), "--draft-max", "7"]);
    let d = &with["draft"];
    let model_total: u64 = with["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["bytes"].as_u64().unwrap())
        .sum();
    // The model's own part is planned as without the draft (the runtime is measured per run).
    assert_eq!(
        component_bytes(&with, "logits"),
        component_bytes(&rows, "logits")
    );
    assert_eq!(
        component_bytes(&with, "KV cache"),
        component_bytes(&rows, "KV cache")
    );
    assert_eq!(
        with["total_bytes"].as_u64().unwrap(),
        model_total + d["total_bytes"].as_u64().unwrap()
    );
    assert!(
        component_bytes(d, "KV cache").unwrap() > 0
            && component_bytes(d, "sampler and history").is_none()
    );
    assert!(component_bytes(d, "runtime").is_none());
    assert_eq!(
        component_bytes(&with, "speculation"),
        component_bytes(&rows, "speculation")
    );
    assert!(component_bytes(&plain, "speculation").is_none());
}

/// `kiln plan --parallel N` plans `kiln serve`'s speculation as its runners allocate it: the
/// verification rows (logits and scratch) and token buffers of `--draft-max` cut to `-b` − 1,
/// and a draft model's runner of a slot per sequence.
#[test]
fn serve_plan_counts_what_the_runners_allocate() {
    use kiln::engine::batch::{BatchOptions, BatchRunner};
    let model = common::random_model("random-llama-q4_k");
    let draft = common::random_model("random-llama-q8_0");
    let plan = |extra: &[&str]| {
        let m = model.to_str().unwrap();
        let args = [
            "-m",
            m,
            "-c",
            "256",
            "-b",
            "8",
            "--parallel",
            "4",
            "-t",
            "2",
        ];
        plan_json(&[&args[..], extra].concat())
    };
    let runner = |path: &std::path::Path, draft_max: usize| {
        let m = std::sync::Arc::new(kiln::model::Model::load(path).unwrap());
        BatchRunner::new(
            m,
            BatchOptions {
                n_slots: 4,
                n_ctx: 256,
                n_threads: 2,
                prefill_chunk: 8,
                kv_type: kiln::cache::KvType::F16,
                device: Default::default(),
                draft_max,
            },
        )
        .unwrap()
    };
    let plain = runner(&model, 0);
    // --draft-max 20 with -b 8: 7 drafts a pass.
    let p = plan(&["--draft-max", "20"]);
    assert_eq!(p["draft_max"], 7);
    let spec = runner(&model, 20);
    assert_eq!(spec.opts.draft_max, 7);
    let rows = (spec.host_scratch_bytes() - plain.host_scratch_bytes()) as u64;
    // Each sequence's pass, and the drafter's copy of a history.
    let tokens = 4 * (7 + 1) * 4 + (256 + 1) * 4;
    assert_eq!(component_bytes(&p, "speculation"), Some(rows + tokens));
    assert_eq!(
        component_bytes(&p, "scratch (activations)").unwrap()
            + component_bytes(&p, "logits").unwrap(),
        plain.host_scratch_bytes() as u64
    );
    // A draft model's runner.
    let p = plan(&["-md", draft.to_str().unwrap(), "--draft-max", "4"]);
    let d = &p["draft"];
    let dr = runner(&draft, 0);
    assert_eq!(component_bytes(d, "KV cache"), Some(dr.kv_bytes() as u64));
    assert_eq!(
        component_bytes(d, "scratch (activations)").unwrap()
            + component_bytes(d, "logits").unwrap(),
        dr.host_scratch_bytes() as u64
    );
}

/// `kiln plan ARGS --json`, parsed.
fn plan_json(args: &[&str]) -> serde_json::Value {
    let out = kiln(&[&["plan"][..], args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The bytes of the plan's component `name`.
fn component_bytes(p: &serde_json::Value, name: &str) -> Option<u64> {
    p["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .map(|c| c["bytes"].as_u64().unwrap())
}
