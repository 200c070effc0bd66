//! Perplexity of corpus_pydoc.txt (n_ctx 512, 12 chunks) against the reference engine's values.

mod common;

use std::sync::Arc;

use kiln::engine::{perplexity, Session, SessionOptions};
use kiln::model::Model;
use kiln::tokenizer::Tokenizer;

fn check(name: &str, golden_dir: &str) {
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
    let model = Arc::new(Model::load(common::real_model(name)).unwrap());
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
