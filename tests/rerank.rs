//! Rerankers against the reference engine: the random BERT reranker (`bert-rerank`: a
//! classification head, `rank` pooling) pairs each query with each document as llama-server's
//! `format_prompt_rerank` does (the same ids) and scores the prompts as llama.cpp's rank pooling
//! does (tests/golden/random-bert-rerank-f32/rerank.json, scripts/make-fixtures.py), computed
//! through the scheduler as `kiln serve` computes them: several prompts per forward pass,
//! prefill chunks smaller than the prompts. Many documents run as batches (a few prompts per
//! pass), with the scores of each prompt alone; rank pooling without a head is refused.

mod common;

use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::pooling::{EmbedSpec, Pooling, PoolingError};
use kiln::engine::rerank::RerankFormat;
use kiln::engine::scheduler::{
    FinishReason, Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::model::Model;
use kiln::tokenizer::Tokenizer;
use serde_json::Value;

const RERANKER: &str = "random-bert-rerank-f32";
/// Largest difference from the reference's score, relative to the scores' spread (the
/// largest score magnitude, at least 1).
const MAX_SCORE_ERR: f64 = 1e-3;

const RANK: EmbedSpec = EmbedSpec {
    pooling: Pooling::Rank,
    normalize: -1,
};

/// A request's head outputs and how it ended.
type Got = (Option<Vec<Vec<f32>>>, Option<Finished>);

#[derive(Clone, Default)]
struct Out(Arc<Mutex<Got>>);

impl SeqSink for Out {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn embedding(&mut self, rows: Vec<Vec<f32>>) {
        self.0.lock().unwrap().0 = Some(rows);
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap().1 = Some(f);
    }
}

fn runner(m: &Arc<Model>, slots: usize, chunk: usize) -> BatchRunner {
    BatchRunner::new(
        Arc::clone(m),
        BatchOptions {
            n_slots: slots,
            n_ctx: 256,
            n_threads: 2,
            prefill_chunk: chunk,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap()
}

/// Each prompt's head outputs (or its error), all submitted at once; and the steps taken.
fn score_all(
    m: &Arc<Model>,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    slots: usize,
    chunk: usize,
) -> (Vec<Result<Vec<f32>, String>>, usize) {
    let mut sched = Scheduler::new(
        runner(m, slots, chunk),
        tok,
        Arc::new(SchedMetrics::default()),
    );
    let outs: Vec<Out> = prompts
        .iter()
        .map(|p| {
            let out = Out::default();
            sched.submit(SeqRequest::embedding(
                p.clone(),
                RANK,
                Box::new(out.clone()),
            ));
            out
        })
        .collect();
    let mut steps = 0;
    while !sched.is_idle() {
        sched.step();
        steps += 1;
        assert!(steps < 10_000, "the scheduler does not finish");
    }
    let results = outs
        .iter()
        .map(|o| {
            let mut g = o.0.lock().unwrap();
            match g.1.as_ref().map(|f| f.reason.clone()) {
                Some(FinishReason::Stop) => Ok(g.0.take().expect("rows").remove(0)),
                Some(FinishReason::Error(e)) => Err(e),
                other => panic!("ended as {other:?}"),
            }
        })
        .collect();
    (results, steps)
}

fn load() -> (Arc<Model>, Tokenizer) {
    let m = Arc::new(Model::load(common::random_model(RERANKER)).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    (m, tok)
}

fn golden() -> Value {
    let path = common::golden_dir().join(RERANKER).join("rerank.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn prompts() -> Vec<String> {
    let t: Value = serde_json::from_str(
        &std::fs::read_to_string(common::golden_dir().join("texts.json")).unwrap(),
    )
    .unwrap();
    t["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn reranker_declares_rank_pooling() {
    let (m, _) = load();
    assert_eq!(Pooling::for_model(&m, None), Ok(Pooling::Rank));
    assert_eq!(m.weights.classifier.as_ref().map(|c| c.n_out()), Some(1));
    // An encoder without a head cannot rank; a reranker can still be asked to pool cls.
    let plain = Model::load(common::random_model("random-bert-f32")).unwrap();
    assert_eq!(
        Pooling::for_model(&plain, Some(Pooling::Rank)),
        Err(PoolingError::NoClassifier)
    );
    assert_eq!(Pooling::for_model(&m, Some(Pooling::Cls)), Ok(Pooling::Cls));
}

#[test]
fn query_document_prompts_are_the_references() {
    let (m, tok) = load();
    let g = golden();
    let texts = prompts();
    let format = RerankFormat::new(&tok, &m.file);
    let rows = g["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "2 queries x 5 documents");
    for r in rows {
        let q = &texts[r["query_index"].as_u64().unwrap() as usize];
        let d = &texts[r["document_index"].as_u64().unwrap() as usize];
        assert_eq!(format.prompt(&tok, q, d), ids(&r["ids"]), "{q:?} / {d:?}");
    }
}

#[test]
fn scores_match_the_reference() {
    let (m, tok) = load();
    let g = golden();
    assert_eq!(g["n_cls_out"].as_u64(), Some(1));
    let rows = g["rows"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = rows.iter().map(|r| ids(&r["ids"])).collect();
    let want: Vec<f64> = rows
        .iter()
        .map(|r| r["scores"][0].as_f64().unwrap())
        .collect();
    let scale = want.iter().fold(1.0f64, |a, &b| a.max(b.abs()));
    // Every prompt at once on 4 slots, prefill chunks of 7 (prompts span several passes and
    // share them).
    let (got, _) = score_all(&m, &tok, &prompts, 4, 7);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.as_ref().unwrap_or_else(|e| panic!("prompt {i}: {e}"));
        assert_eq!(g.len(), 1, "one score per prompt");
        let err = (g[0] as f64 - w).abs() / scale;
        worst = worst.max(err);
        assert!(
            err <= MAX_SCORE_ERR,
            "prompt {i}: {} vs the reference's {w}",
            g[0]
        );
    }
    eprintln!("{RERANKER}: largest score error {worst:.2e} of the scale {scale:.3}");
    // The scores tell the documents apart (the test could not pass with a constant).
    let spread =
        want.iter().fold(f64::MIN, |a, &b| a.max(b)) - want.iter().fold(f64::MAX, |a, &b| a.min(b));
    assert!(
        spread > 0.1 * scale,
        "the golden scores barely differ: {want:?}"
    );
}

#[test]
fn many_documents_run_as_batches() {
    let (m, tok) = load();
    let format = RerankFormat::new(&tok, &m.file);
    let docs: Vec<String> = (0..256)
        .map(|i| format!("document {i} of the set"))
        .collect();
    let prompts: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| format.prompt(&tok, "which document", d))
        .collect();
    let (batched, steps) = score_all(&m, &tok, &prompts, 8, 512);
    // 256 prompts, 8 per pass: 32 passes (a few more as slots free up unevenly), not 256.
    assert!(steps <= 40, "{steps} steps for 256 prompts on 8 slots");
    for i in [0, 17, 255] {
        let (alone, _) = score_all(&m, &tok, &prompts[i..i + 1], 1, 512);
        let (a, b) = (
            batched[i].as_ref().unwrap()[0],
            alone[0].as_ref().unwrap()[0],
        );
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1.0),
            "prompt {i}: {a} batched, {b} alone"
        );
    }
}

#[test]
fn rank_without_a_head_fails_the_request() {
    let m = Arc::new(Model::load(common::random_model("random-bert-f32")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let (got, _) = score_all(&m, &tok, &[tok.encode("a b c", true, true)], 1, 64);
    let e = got[0].as_ref().unwrap_err();
    assert!(e.contains("classification head"), "{e}");
}

/// `kiln embedding` with a reranker: `QUERY<TAB>DOCUMENT` lines scored as the pair, each
/// score printed as llama-embedding prints it (`rerank score J: S`), the reference's.
#[test]
fn embedding_command_scores_pairs() {
    let g = golden();
    let texts = prompts();
    let text = format!("{}\t{}\n{}\t{}", texts[0], texts[1], texts[0], texts[4]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("embedding")
        .arg("-m")
        .arg(common::random_model(RERANKER))
        .args(["-p", &text])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scores: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("rerank score "))
        .map(|l| l.split_once(':').unwrap().1.trim().parse().unwrap())
        .collect();
    let want = |d: u64| {
        g["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["query_index"] == 0 && r["document_index"] == d)
            .unwrap()["scores"][0]
            .as_f64()
            .unwrap()
    };
    assert_eq!(scores.len(), 2, "{stdout}");
    for (s, d) in scores.iter().zip([1, 4]) {
        assert!(
            (s - want(d)).abs() <= 1.5e-3,
            "{stdout}: document {d} wants {}",
            want(d)
        );
    }
}
