//! Perplexity of corpus_pydoc.txt (n_ctx 512, 12 chunks) against the reference engine's values:
//! the real models, and a random Gemma-2, Mistral-3, OLMo-2, OLMo 3 and mixtures of experts
//! (gpt-oss in MXFP4, OLMoE in Q4_K_M).

mod common;

use std::sync::Arc;

use kiln::backend::exec::HasExecutor;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner, CacheOptions};
use kiln::engine::perplexity::{scoring_options, PerplexityReport};
use kiln::engine::scheduler::{
    FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::engine::{perplexity, Engine, Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;
use std::sync::Mutex;

/// Perplexity of `tokens` in `chunks` chunks of `opts.n_ctx` through the engine, its runner
/// sized for perplexity with `opts`.
fn engine_ppl(
    model: &Arc<Model>,
    tok: &Tokenizer,
    opts: SessionOptions,
    tokens: &[u32],
    chunks: usize,
) -> PerplexityReport {
    let (batch, cache) = scoring_options(&opts);
    let runner = BatchRunner::with_cache(Arc::clone(model), batch, cache, &mut |_, _| {}).unwrap();
    let kv = runner.executor().kv_cache(0).map(|kv| kv.ty());
    assert_eq!(kv, Some(opts.kv_type), "the runner's KV cache type");
    let mut engine = Engine::new(runner, tok).unwrap();
    let bos = if tok.adds_bos() { tok.bos() } else { None };
    let n_ctx = opts.n_ctx;
    perplexity(
        &mut engine,
        tokens,
        n_ctx,
        Some(chunks),
        bos,
        &mut |_, _| {},
    )
    .unwrap()
}

fn check(name: &str, golden_dir: &str) {
    check_file(&common::real_model(name), name, golden_dir)
}

fn check_file(path: &std::path::Path, name: &str, golden_dir: &str) {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::golden_dir()
                .join(golden_dir)
                .join("perplexity.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let want = golden["final_ppl"].as_f64().unwrap();
    let n_ctx = golden["n_ctx"].as_u64().unwrap() as usize;
    let chunks = golden["chunks"].as_u64().unwrap() as usize;
    let text = std::fs::read_to_string(common::golden_dir().join("corpus_pydoc.txt")).unwrap();
    let model = Arc::new(Model::load(path).unwrap());
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let tokens = tok.encode(&text, true, false);
    let report = engine_ppl(&model, &tok, SessionOptions::new(n_ctx, 2), &tokens, chunks);
    let rel = (report.final_ppl - want).abs() / want;
    eprintln!(
        "{name}: PPL {:.4} vs reference {want:.4} ({:+.3}%), running {:?}",
        report.final_ppl,
        100.0 * (report.final_ppl - want) / want,
        report.running_ppl
    );
    assert_eq!(report.chunks, chunks);
    assert!(
        rel < 0.005,
        "{name}: perplexity {:.4} is {:.3}% from {want}",
        report.final_ppl,
        rel * 100.0
    );
}

#[test]
fn smollm2_perplexity_matches_reference() {
    check("smollm2", "smollm2-135m-instruct-q4_1");
}

#[test]
fn gemma3_perplexity_matches_reference() {
    check("gemma3", "gemma3-270m-q4_k_m");
}

/// The random Gemma-2: chunks of 512 run as prompt batches, through the tiled attention with
/// its soft cap and sliding window, and the soft-capped logits of every scored position.
#[test]
fn random_gemma2_perplexity_matches_reference() {
    let stem = "random-gemma2-f32";
    check_file(&common::random_model(stem), stem, stem);
}

/// The random Mistral-3, OLMo-2 and OLMo 3: chunks of 512 as prompt batches, Mistral-3's
/// attention temperature over positions far past its floor of 32 (factors up to
/// ln 16·0.5 + 1), OLMo-2's blocks without input norms, OLMo 3's window of 16.
#[test]
fn random_mistral3_and_olmo_perplexity_match_reference() {
    for stem in [
        "random-mistral3-f32",
        "random-olmo2-f32",
        "random-olmo3-f32",
    ] {
        check_file(&common::random_model(stem), stem, stem);
    }
}

/// The mixtures of experts: chunks of 512 as prompt batches, so every expert's rows are
/// grouped and multiplied at once (gpt-oss: MXFP4 experts, sinks, its window of 16 over chunks
/// of 512; OLMoE: Q4_K_M experts, Q6_K down projections on some layers).
#[test]
fn random_moe_perplexity_matches_reference() {
    for stem in ["random-gpt-oss-mxfp4", "random-olmoe-q4_k_m"] {
        check_file(&common::random_model(stem), stem, stem);
    }
}

/// A q8_0 KV cache costs SmolLM2 well under 1% of perplexity on the corpus (n_ctx 512, 12
/// chunks, as the reference): both measured here, same tokens, same chunks.
#[test]
fn smollm2_q8_0_kv_perplexity_within_1pct_of_f16() {
    let text = std::fs::read_to_string(common::golden_dir().join("corpus_pydoc.txt")).unwrap();
    let model = Arc::new(Model::load(common::real_model("smollm2")).unwrap());
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let tokens = tok.encode(&text, true, false);
    let ppl = |kv_type| {
        let mut opts = SessionOptions::new(512, 2);
        opts.kv_type = kv_type;
        engine_ppl(&model, &tok, opts, &tokens, 12).final_ppl
    };
    let (f16, q8) = (ppl(KvType::F16), ppl(KvType::Q8_0));
    let rel = (q8 - f16) / f16;
    eprintln!(
        "PPL f16 KV {f16:.4}, q8_0 KV {q8:.4} ({:+.3}%)",
        100.0 * rel
    );
    assert!(rel.abs() < 0.01, "q8_0 KV perplexity {q8} vs f16 {f16}");
    assert!(q8 != f16, "the q8_0 cache was not used");
}

/// Per position from `first` on, the log-probability of `prompt`'s next token under the
/// logits a session's teacher-forced passes give that position (chunks of 64).
fn session_scores(model: &Arc<Model>, prompt: &[u32], first: usize) -> Vec<f64> {
    let mut opts = SessionOptions::new(256, 3);
    opts.prefill_chunk = 64;
    let mut want = vec![f64::NAN; prompt.len() - 1];
    Session::new(Arc::clone(model), opts)
        .unwrap()
        .eval_all(prompt, first, &mut |pos, l| {
            if pos + 1 < prompt.len() {
                want[pos] = kiln::sampler::log_softmax(l, prompt[pos + 1]);
            }
        })
        .unwrap();
    want.drain(..first);
    want
}

fn scoring_runner(model: &Arc<Model>, n_slots: usize, score_rows: usize) -> BatchRunner {
    let o = BatchOptions {
        n_slots,
        n_ctx: 256,
        n_threads: 3,
        prefill_chunk: 64,
        kv_type: KvType::F16,
        device: Default::default(),
        draft_max: 0,
    };
    let cache = CacheOptions {
        score_rows,
        ..CacheOptions::default()
    };
    BatchRunner::with_cache(Arc::clone(model), o, cache, &mut |_, _| {}).unwrap()
}

/// A scoring request through the engine hands every position from `first` on, in order and
/// once, the log-probability of the next given token, bit for bit what a session's
/// teacher-forced passes give (the same prefill chunks; output rows cut by `score_rows`); a
/// runner not sized for scoring refuses it by name, and a first position past the prompt is
/// refused.
#[test]
fn engine_scores_each_position_as_the_sessions_logits() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let v = model.config.vocab_size;
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7919 + 3) % v as u32).collect();
    let first = 37;
    let want = session_scores(&model, &prompt, first);
    for score_rows in [1, 5, 64] {
        let mut engine = Engine::new(scoring_runner(&model, 1, score_rows), &tok).unwrap();
        let mut got = Vec::new();
        engine
            .score(&prompt, first, &mut |at, lps| {
                assert_eq!(at, first + got.len(), "scores out of order");
                got.extend_from_slice(lps);
            })
            .unwrap();
        assert_eq!(got.len(), want.len(), "score_rows {score_rows}");
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                w.to_bits(),
                g.to_bits(),
                "position {}, score_rows {score_rows}",
                first + i
            );
        }
        // The engine scores again from a fresh sequence.
        let mut again = Vec::new();
        engine
            .score(&prompt, first, &mut |_, lps| again.extend_from_slice(lps))
            .unwrap();
        assert_eq!(again, got);
        let err = engine.score(&prompt, 150, &mut |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("past the prompt"), "{err}");
    }
    let mut plain = Engine::new(scoring_runner(&model, 1, 0), &tok).unwrap();
    let err = plain.score(&prompt, first, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("does not score"), "{err}");
}

/// What a scheduler's scoring request receives.
#[derive(Default)]
struct Scored {
    lps: Vec<f64>,
    text: String,
    done: Option<FinishReason>,
}

struct ScoreSink(Arc<Mutex<Scored>>);

impl SeqSink for ScoreSink {
    fn text(&mut self, t: &str) -> bool {
        self.0.lock().unwrap().text.push_str(t);
        true
    }
    fn scores(&mut self, at: usize, lps: &[f64]) {
        let mut s = self.0.lock().unwrap();
        assert_eq!(at, 37 + s.lps.len(), "scores out of order");
        s.lps.extend_from_slice(lps);
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap().done = Some(f.reason);
    }
}

/// On a server's scheduler, a scoring request's chunks share steps with another request's
/// prefill and decode rows (the scored rows handed out beside the other slot's logits row):
/// the same scores, bit for bit, and the generation the same text as alone.
#[test]
fn a_score_beside_a_generation_scores_and_generates_as_alone() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let v = model.config.vocab_size;
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7919 + 3) % v as u32).collect();
    let want = session_scores(&model, &prompt, 37);
    let gen_prompt: Vec<u32> = (0..20u32).map(|i| (i * 31 + 5) % v as u32).collect();
    let run = |with_score: bool| {
        let metrics = Arc::new(SchedMetrics::default());
        let mut sched = Scheduler::new(scoring_runner(&model, 2, 4), &tok, metrics);
        let gen = Arc::new(Mutex::new(Scored::default()));
        let mut req =
            SeqRequest::scoring(gen_prompt.clone(), 0, Box::new(ScoreSink(Arc::clone(&gen))));
        req.score = None;
        req.max_new = 24;
        req.ignore_eos = true;
        req.sampler = SamplerConfig::greedy();
        sched.submit(req);
        let scored = Arc::new(Mutex::new(Scored::default()));
        if with_score {
            let sink = Box::new(ScoreSink(Arc::clone(&scored)));
            sched.submit(SeqRequest::scoring(prompt.clone(), 37, sink));
        }
        while !sched.is_idle() {
            sched.step();
        }
        let (g, s) = (gen.lock().unwrap(), scored.lock().unwrap());
        assert_eq!(g.done, Some(FinishReason::Length));
        assert_eq!(s.done.is_some(), with_score);
        (g.text.clone(), s.lps.clone())
    };
    let (alone, _) = run(false);
    let (text, got) = run(true);
    assert_eq!(text, alone, "the generation beside a score");
    assert_eq!(got.len(), want.len());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.to_bits(), g.to_bits(), "position {}", 37 + i);
    }
}
