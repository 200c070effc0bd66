//! Speculative decoding in the continuous-batching scheduler (`kiln serve --spec-type
//! ngram-simple`): every request gets the tokens, text, log-probabilities and finish reason it
//! gets without speculation (greedy and seeded, beside other sequences and prompt pieces,
//! through the token limit, stop sequences, the end of the context and a sliding window), and
//! drafts are verified and kept.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::logprobs::TokenLogprobs;
use kiln::engine::scheduler::{
    FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::engine::speculative::NgramDrafter;
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

/// A token's log-probability and its alternatives', as bits: `(token, logprob, top)`.
type LogprobBits = (u32, u32, Vec<(u32, u32)>);

/// What a request produced.
#[derive(Clone, Debug, Default, PartialEq)]
struct Out {
    ids: Vec<u32>,
    text: String,
    /// Each token's log-probability and alternatives, as bits.
    logprobs: Vec<LogprobBits>,
    reason: Option<FinishReason>,
    completion_tokens: usize,
}

struct Collect(Arc<Mutex<Out>>);

impl SeqSink for Collect {
    fn text(&mut self, text: &str) -> bool {
        self.0.lock().unwrap().text.push_str(text);
        true
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().ids.push(id);
    }
    fn logprobs(&mut self, lp: &TokenLogprobs) {
        let top = lp.top.iter().map(|&(t, p)| (t, p.to_bits())).collect();
        let mut o = self.0.lock().unwrap();
        o.logprobs.push((lp.token, lp.logprob.to_bits(), top));
    }
    fn done(&mut self, f: Finished) {
        let mut o = self.0.lock().unwrap();
        o.reason = Some(f.reason);
        o.completion_tokens = f.usage.completion_tokens;
    }
}

/// One request of a test.
#[derive(Clone)]
struct Req {
    prompt: Vec<u32>,
    max_new: usize,
    seeded: bool,
    /// A greedy request's repetition penalty over its last 8 tokens.
    penalty: bool,
    stop: Vec<String>,
    ignore_eos: bool,
    logprobs: Option<usize>,
}

impl Req {
    fn new(prompt: Vec<u32>, max_new: usize) -> Req {
        Req {
            prompt,
            max_new,
            seeded: false,
            penalty: false,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
        }
    }
}

fn sampler(seeded: bool, penalty: bool, i: usize) -> SamplerConfig {
    if penalty {
        // The last 8 tokens before each verified row, not the drafts after it: copying
        // text, those drafts are the very tokens the row would otherwise penalize.
        return SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: 8,
            ..SamplerConfig::greedy()
        };
    }
    if seeded {
        SamplerConfig {
            seed: 77 + i as u64,
            temperature: 0.9,
            // Penalties over the history: each verified row must see its own (the frequency
            // penalty counts every occurrence, so a later draft in the history would show).
            repeat_penalty: 1.2,
            frequency_penalty: 0.5,
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    }
}

struct Setup {
    slots: usize,
    n_ctx: usize,
    chunk: usize,
    /// Drafts a pass (0: no speculation).
    draft_max: usize,
}

/// Serve `reqs` (all queued at once) and return each one's output and the metrics.
fn serve(
    m: &Arc<Model>,
    tok: &Tokenizer,
    s: &Setup,
    reqs: &[Req],
) -> (Vec<Out>, Arc<SchedMetrics>) {
    let runner = BatchRunner::new(
        Arc::clone(m),
        BatchOptions {
            n_slots: s.slots,
            n_ctx: s.n_ctx,
            n_threads: 2,
            prefill_chunk: s.chunk,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: s.draft_max,
        },
    )
    .unwrap();
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(runner, tok, Arc::clone(&metrics));
    sched.speculate(NgramDrafter::new(2, 2), 1);
    let outs: Vec<Arc<Mutex<Out>>> = reqs.iter().map(|_| Arc::default()).collect();
    for (i, (r, o)) in reqs.iter().zip(&outs).enumerate() {
        sched.submit(SeqRequest {
            prompt: r.prompt.clone(),
            max_new: r.max_new,
            sampler: sampler(r.seeded, r.penalty, i),
            stop: r.stop.clone(),
            cache_prompt: true,
            ignore_eos: r.ignore_eos,
            grammar: None,
            logprobs: r.logprobs,
            forks: Vec::new(),
            embed: None,
            sink: Box::new(Collect(Arc::clone(o))),
        });
    }
    while !sched.is_idle() {
        sched.step();
    }
    let outs = outs.iter().map(|o| o.lock().unwrap().clone()).collect();
    (outs, metrics)
}

/// Serve `reqs` with and without speculation: the same outputs. Returns the speculative run's
/// metrics.
fn same_with_speculation(
    what: &str,
    m: &Arc<Model>,
    tok: &Tokenizer,
    s: Setup,
    reqs: &[Req],
) -> Arc<SchedMetrics> {
    let (plain, pm) = serve(m, tok, &Setup { draft_max: 0, ..s }, reqs);
    assert_eq!(
        pm.spec_passes.load(Relaxed),
        0,
        "{what}: no speculation asked"
    );
    let (spec, metrics) = serve(m, tok, &s, reqs);
    for (i, (p, q)) in plain.iter().zip(&spec).enumerate() {
        assert!(p.reason.is_some(), "{what}: request {i} finished");
        assert_eq!(p, q, "{what}: request {i}");
    }
    assert!(
        metrics.spec_passes.load(Relaxed) > 0,
        "{what}: verification passes ran"
    );
    eprintln!(
        "{what}: {} passes, {} drafts, {} kept; {} steps against {}",
        metrics.spec_passes.load(Relaxed),
        metrics.spec_drafted.load(Relaxed),
        metrics.spec_accepted.load(Relaxed),
        metrics.decode_steps.load(Relaxed),
        pm.decode_steps.load(Relaxed),
    );
    metrics
}

/// A prompt that repeats a pattern, so that prompt lookup finds drafts.
fn repeating(seed: u32, len: usize) -> Vec<u32> {
    let pattern: Vec<u32> = (0..7).map(|j| 1 + (seed * 37 + j * 13) % 240).collect();
    pattern.iter().cycle().take(len).copied().collect()
}

/// Random models of the batch-dependent formats (K-quants) and others: five requests on three
/// slots (two wait and join later, beside the others' decode rows and prompt pieces), greedy
/// and seeded, short and long, one past its context, one with `ignore_eos`, one with
/// log-probabilities, one cut by a stop sequence.
#[test]
fn scheduler_speculation_gives_plain_outputs_on_random_models() {
    for stem in [
        "random-llama-q4_k",
        "random-llama-q6_k",
        "random-llama-q4_0",
        "random-qwen3-q4_k_m",
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let mut reqs = vec![
            Req::new(repeating(1, 30), 40),
            Req::new(repeating(2, 12), 3),
            Req::new(repeating(3, 90), 100),
            Req::new(repeating(4, 20), 25),
            Req::new(repeating(5, 9), 1),
        ];
        reqs[1].seeded = true;
        reqs[3].seeded = true;
        reqs[2].ignore_eos = true;
        reqs[0].logprobs = Some(3);
        reqs[3].logprobs = Some(0);
        // A stop sequence from the text the plain run generates for request 4 (its 6th
        // token's): generation stops in the middle of a pass.
        let setup = || Setup {
            slots: 3,
            n_ctx: 128,
            chunk: 16,
            draft_max: 6,
        };
        let (probe, _) = serve(
            &m,
            &tok,
            &Setup {
                draft_max: 0,
                ..setup()
            },
            &reqs[3..4],
        );
        let stop = tok.decode(&probe[0].ids[5..6]);
        if !stop.trim().is_empty() && !tok.decode(&probe[0].ids[..5]).contains(&stop) {
            reqs[3].stop = vec![stop];
        }
        same_with_speculation(stem, &m, &tok, setup(), &reqs);
    }
}

/// SmolLM2 continuing a paragraph it has seen twice (drafts mostly kept), greedy and under a
/// repetition penalty over its last 8 tokens, beside a seeded story and a greedy question:
/// the same text, and most drafts kept.
#[test]
fn scheduler_speculation_keeps_drafts_on_a_real_model() {
    let m = Arc::new(Model::load(common::real_model("smollm2")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let chat = |text: &str| {
        let t = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
        tok.encode(&t, false, true)
    };
    let para = "The kiln was built of fire brick in the spring. It held forty pots at a time, \
                and the potters fired it every Friday until the clay ran out.";
    let copy = tok.encode(&format!("{para}\n\n{para}\n\nThe kiln"), true, false);
    let mut reqs = vec![
        Req::new(copy.clone(), 60),
        Req::new(chat("Write a short story about a fox."), 40),
        Req::new(copy, 60),
        Req::new(chat("What is the capital of France?"), 20),
    ];
    reqs[1].seeded = true;
    reqs[2].penalty = true;
    reqs[2].logprobs = Some(2);
    let setup = Setup {
        slots: 3,
        n_ctx: 512,
        chunk: 64,
        draft_max: 16,
    };
    let metrics = same_with_speculation("smollm2", &m, &tok, setup, &reqs);
    let (drafted, kept) = (
        metrics.spec_drafted.load(Relaxed),
        metrics.spec_accepted.load(Relaxed),
    );
    assert!(
        kept * 2 > drafted,
        "copying keeps most drafts: {kept} of {drafted}"
    );
}

/// Gemma-3's sliding-window rings: passes stay within what a ring can roll back (a small
/// prefill chunk makes the reach short), through a generation past the window.
#[test]
fn scheduler_speculation_respects_sliding_window_rings() {
    let m = Arc::new(Model::load(common::real_model("gemma3")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let window = m
        .config
        .sliding_window
        .expect("Gemma-3 has sliding-window layers");
    assert!(window < 600, "Gemma-3-270M's window");
    let mut prompt = tok.encode(
        "Count: one two three four five six seven eight nine ten.",
        true,
        false,
    );
    while prompt.len() + 60 < window {
        let n = prompt.len();
        prompt.extend_from_within(1..n.min(40));
    }
    // Log-probabilities compared bit for bit: a row past 256 positions takes the decode
    // path's split-key attention, a batch row the vector path.
    let mut reqs = [Req::new(prompt, 120)];
    reqs[0].logprobs = Some(1);
    let setup = Setup {
        slots: 1,
        n_ctx: 1024,
        chunk: 8,
        draft_max: 16,
    };
    let metrics = same_with_speculation("gemma3", &m, &tok, setup, &reqs);
    assert!(metrics.spec_accepted.load(Relaxed) > 0, "drafts kept");
}

/// `kiln serve --spec-type ngram-simple`: a completion's text and log-probabilities equal a
/// plain server's, `/metrics` counts the passes; flags it cannot honour are one-line errors.
#[test]
fn serve_speculates_over_http() {
    let model = common::real_model("smollm2");
    let para = "The kiln was built of fire brick in the spring. It held forty pots at a time, \
                and the potters fired it every Friday until the clay ran out.";
    let body = serde_json::json!({
        "prompt": format!("{para}\n\n{para}\n\nThe kiln"),
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": 2,
    })
    .to_string();
    let complete = |extra: &[&str]| {
        let server = harness::Server::start(&model, &[&["-t", "2"], extra].concat());
        let a = server.request("POST", "/v1/completions", &[], &body);
        assert_eq!(a.status, 200, "{}", a.text());
        let choice = a.json()["choices"][0].clone();
        let passes = server
            .metric("kiln_spec_passes_total", &[])
            .expect("the series");
        let kept = server
            .metric("kiln_spec_accepted_tokens_total", &[])
            .expect("the series");
        (choice, passes, kept)
    };
    let (plain, passes, _) = complete(&[]);
    assert_eq!(passes, 0.0);
    let (spec, passes, kept) = complete(&["--spec-type", "ngram-simple", "--draft-max", "8"]);
    assert_eq!(spec["text"], plain["text"]);
    assert_eq!(spec["logprobs"], plain["logprobs"]);
    assert!(passes > 0.0 && kept > 0.0, "{passes} passes, {kept} kept");

    for (extra, expect) in [
        (vec!["-md", "draft.gguf"], "ngram-simple only"),
        (
            vec!["--spec-type", "ngram-simple", "--draft-p-min", "0.5"],
            "--draft-p-min",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--port", "0", "-m"])
            .arg(&model)
            .args(&extra)
            .output()
            .expect("run kiln");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(stderr.contains(expect), "{extra:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
    }
}

/// A runner on the GPU refuses draft rows (its passes are batches, not decode steps), before
/// it touches the device.
#[test]
fn gpu_runner_refuses_speculation() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).expect("load"));
    let e = BatchRunner::new(
        m,
        BatchOptions {
            n_slots: 2,
            n_ctx: 64,
            n_threads: 2,
            prefill_chunk: 16,
            kv_type: KvType::F16,
            device: kiln::backend::Device::Cuda,
            draft_max: 4,
        },
    )
    .err()
    .expect("refused");
    assert!(e.to_string().contains("CPU only"), "{e}");
}
