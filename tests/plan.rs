//! The memory plan is what the session allocates: same formulas, one source of truth.

mod common;

use std::sync::Arc;

use kiln::engine::plan::plan;
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;

#[test]
fn plan_equals_session_allocations() {
    for stem in [
        "random-llama-q4_0",
        "random-qwen3-q4_k_m",
        "random-gpt2-q8_0",
    ] {
        for (ctx, chunk, threads) in [(64, 16, 1), (256, 512, 2), (200, 7, 3)] {
            let model = Arc::new(Model::load(common::random_model(stem)).unwrap());
            let mut opts = SessionOptions::new(ctx, threads);
            opts.prefill_chunk = chunk;
            let p = plan(&model.file, &opts, 1, Default::default()).unwrap();
            let s = Session::new(Arc::clone(&model), opts).unwrap();
            assert_eq!(
                p.get("KV cache").unwrap().bytes,
                s.kv().bytes() as u64,
                "{stem} ctx {ctx}"
            );
            let scratch =
                p.get("scratch (activations)").unwrap().bytes + p.get("logits").unwrap().bytes;
            assert_eq!(
                scratch,
                s.scratch().bytes() as u64,
                "{stem} ctx {ctx} chunk {chunk} threads {threads}"
            );
            let mapped: usize = model
                .file
                .tensors()
                .iter()
                .filter(|t| t.shape.len() == 2)
                .map(|t| t.n_bytes)
                .sum();
            assert_eq!(p.get("weights (mapped)").unwrap().bytes, mapped as u64);
        }
    }
}

#[test]
fn kv_cache_formula_for_smollm2() {
    let file = kiln::gguf::GgufFile::open(common::real_model("smollm2")).unwrap();
    let p = plan(&file, &SessionOptions::new(8192, 2), 1, Default::default()).unwrap();
    // 30 layers × 3 kv heads × 8192 positions × (64 + 64) × 2 bytes
    assert_eq!(p.get("KV cache").unwrap().bytes, 30 * 3 * 8192 * 128 * 2);
}
