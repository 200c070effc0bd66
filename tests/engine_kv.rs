//! KV cache behaviour through the engine: rollback and regenerate gives identical logits,
//! chunked prefill equals one-pass prefill, overflow is refused with both lengths named.

mod common;

use std::sync::Arc;

use kiln::engine::{EngineError, Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

fn model(stem: &str) -> Arc<Model> {
    Arc::new(Model::load(common::random_model(stem)).expect("load"))
}

fn greedy(s: &mut Session, n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut toks = Vec::new();
    let mut logits = Vec::new();
    for _ in 0..n {
        let t = argmax(s.logits());
        logits.push(s.logits().to_vec());
        toks.push(t);
        s.decode(t).expect("decode");
    }
    (toks, logits)
}

#[test]
fn rollback_then_regenerate_is_identical() {
    let m = model("random-llama-q8_0");
    let mut s = Session::new(m, SessionOptions::new(128, 2)).unwrap();
    let prompt = [10u32, 20, 30, 40, 50, 60];
    s.prefill(&prompt, &mut |_, _| {}).unwrap();
    let (t1, l1) = greedy(&mut s, 12);
    s.rollback(prompt.len() - 1);
    assert_eq!(s.n_past(), prompt.len() - 1);
    // Re-evaluate the last prompt token, then generate again.
    s.prefill(&prompt[prompt.len() - 1..], &mut |_, _| {})
        .unwrap();
    let (t2, l2) = greedy(&mut s, 12);
    assert_eq!(t1, t2);
    assert_eq!(l1, l2, "logits after rollback differ");
}

/// Chunked prefill equals a single pass. Attention follows the reference engine, whose
/// arithmetic depends on the batch size (under 64 tokens: f16 accumulation; 64 or more: f32
/// tiles), so each chunking is compared with a pass that takes the same path.
#[test]
fn chunked_prefill_equals_single_pass() {
    let m = model("random-qwen2-f32");
    let prompt: Vec<u32> = (0..128).map(|i| (i * 7 % 250) as u32).collect();
    let run = |chunk: usize| {
        let mut opts = SessionOptions::new(256, 2);
        opts.prefill_chunk = chunk;
        let mut s = Session::new(Arc::clone(&m), opts).unwrap();
        let mut calls = 0;
        s.prefill(&prompt, &mut |_, _| calls += 1).unwrap();
        assert_eq!(calls, prompt.len().div_ceil(chunk));
        s.logits().to_vec()
    };
    // Tiled path: one pass of 128 against two chunks of 64 — the same bits.
    let (a, b) = (run(128), run(64));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "chunks of 64 differ from one pass"
    );
    // Vector path: chunks of 7 against one token at a time. The f16 accumulator of this path
    // turns a last-bit difference upstream (matmul tiling differs between batch sizes) into
    // up to one f16 step (2^-11 relative) of an attention output, so logits agree to ~1e-3.
    let (a, b) = (run(1), run(7));
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max < 1e-2, "chunked prefill differs by {max}");
    assert_eq!(argmax(&a), argmax(&b));
}

#[test]
fn prompt_longer_than_context_is_refused() {
    let m = model("random-llama-q4_0");
    let mut s = Session::new(m, SessionOptions::new(16, 1)).unwrap();
    let prompt = vec![5u32; 17];
    let err = s.prefill(&prompt, &mut |_, _| {}).unwrap_err();
    assert_eq!(
        err,
        EngineError::PromptTooLong {
            prompt: 17,
            ctx: 16,
            used: 0
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("17") && msg.contains("16"), "{msg}");
    assert_eq!(s.n_past(), 0, "a refused prompt leaves the cache untouched");
    // Fill to the brim, then decoding one more is refused.
    s.prefill(&prompt[..16], &mut |_, _| {}).unwrap();
    assert_eq!(
        s.decode(1).unwrap_err(),
        EngineError::ContextFull { ctx: 16 }
    );
}

#[test]
fn out_of_vocabulary_token_is_an_error() {
    let m = model("random-llama-q4_0");
    let vocab = m.config.vocab_size as u32;
    let mut s = Session::new(m, SessionOptions::new(16, 1)).unwrap();
    assert!(s.prefill(&[1, vocab], &mut |_, _| {}).is_err());
    assert_eq!(s.n_past(), 0);
}
