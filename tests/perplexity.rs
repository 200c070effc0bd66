//! Perplexity of corpus_pydoc.txt (n_ctx 512, 12 chunks) against the reference engine's values:
//! the real models, and a random Gemma-2, Mistral-3, OLMo-2, OLMo 3 and mixtures of experts
//! (gpt-oss in MXFP4, OLMoE in Q4_K_M).

mod common;

use std::sync::Arc;

use kiln::cache::KvType;
use kiln::engine::{perplexity, Session, SessionOptions};
use kiln::model::Model;
use kiln::tokenizer::Tokenizer;

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
    let mut opts = SessionOptions::new(n_ctx, 2);
    opts.logit_rows = 32;
    let mut s = Session::new(model, opts).unwrap();
    let bos = if tok.adds_bos() { tok.bos() } else { None };
    let report = perplexity(&mut s, &tokens, n_ctx, Some(chunks), bos, &mut |_, _| {}).unwrap();
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
    let bos = if tok.adds_bos() { tok.bos() } else { None };
    let ppl = |kv_type| {
        let mut opts = SessionOptions::new(512, 2);
        opts.logit_rows = 32;
        opts.kv_type = kv_type;
        let mut s = Session::new(Arc::clone(&model), opts).unwrap();
        assert_eq!(s.kv().unwrap().ty(), kv_type);
        perplexity(&mut s, &tokens, 512, Some(12), bos, &mut |_, _| {})
            .unwrap()
            .final_ppl
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

/// `Session::eval_all_each` (positions scored on the session's threads, in any order) hands
/// every position from `first` on the same logits, bit for bit, as `eval_all` (in order), over
/// passes cut by the prefill chunk and output rows cut by `logit_rows`.
#[test]
fn eval_all_each_hands_every_position_its_logits() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let v = model.config.vocab_size;
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7919 + 3) % v as u32).collect();
    let first = 37;
    let session = || {
        let mut opts = SessionOptions::new(256, 3);
        opts.prefill_chunk = 64;
        opts.logit_rows = 5;
        Session::new(Arc::clone(&model), opts).unwrap()
    };
    let mut want = vec![Vec::new(); prompt.len()];
    session()
        .eval_all(&prompt, first, &mut |pos, l| want[pos] = l.to_vec())
        .unwrap();
    let got: Vec<std::sync::Mutex<Vec<f32>>> =
        (0..prompt.len()).map(|_| Default::default()).collect();
    session()
        .eval_all_each(&prompt, first, &|pos, l| {
            let mut row = got[pos].lock().unwrap();
            assert!(row.is_empty(), "position {pos} handed twice");
            *row = l.to_vec();
        })
        .unwrap();
    for (pos, (w, g)) in want.iter().zip(&got).enumerate() {
        let g = g.lock().unwrap();
        assert_eq!(w.len(), if pos < first { 0 } else { v }, "position {pos}");
        assert!(
            w.iter()
                .map(|x| x.to_bits())
                .eq(g.iter().map(|x| x.to_bits())),
            "position {pos}"
        );
    }
}
