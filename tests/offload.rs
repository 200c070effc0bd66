//! KV offload: a cache streamed from a file through a ring of layer buffers gives the same
//! logits, bit for bit, as the in-RAM cache, and holds only the ring in RAM.

mod common;

use std::sync::Arc;

use kiln::cache::KvType;
use kiln::engine::{EngineError, Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

fn session(
    model: &Arc<Model>,
    ctx: usize,
    chunk: usize,
    ty: KvType,
    budget: Option<usize>,
) -> Session {
    let mut opts = SessionOptions::new(ctx, 2);
    opts.prefill_chunk = chunk;
    opts.kv_type = ty;
    opts.kv_budget = budget;
    Session::new(Arc::clone(model), opts).unwrap()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Prefill `prompt`, decode `steps` greedy tokens; every logits vector, in order.
fn trace(s: &mut Session, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut out = vec![bits(s.prefill(prompt, &mut |_, _| {}).unwrap())];
    for _ in 0..steps {
        let t = argmax(s.logits());
        out.push(bits(s.decode(t).unwrap()));
    }
    out
}

#[test]
fn offloaded_cache_is_bit_identical_on_random_models() {
    for stem in ["random-llama-q4_0", "random-qwen3-q4_k_m"] {
        let model = Arc::new(Model::load(common::random_model(stem)).unwrap());
        let vocab = model.config.vocab_size as u32;
        let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7 + 3) % vocab).collect();
        for ty in [KvType::F16, KvType::Q8_0] {
            let mut ram = session(&model, 512, 64, ty, None);
            let slot = ram.kv().unwrap().layout().layer_kv_bytes(ty);
            let full = ram.kv().unwrap().bytes();
            for ring in [2, 3] {
                let mut off = session(&model, 512, 64, ty, Some(ring * slot + slot / 2));
                assert_eq!(off.kv().unwrap().offload_ring(), Some(ring));
                assert_eq!(off.kv().unwrap().bytes(), ring * slot);
                assert!(off.kv().unwrap().bytes() < full);
                let want = trace(&mut ram, &prompt, 12);
                assert_eq!(
                    trace(&mut off, &prompt, 12),
                    want,
                    "{stem} {ty} ring {ring}"
                );
                // Roll back into the prompt and take another path: stale rows past the
                // cursor are never read, in the file as in RAM.
                for s in [&mut ram, &mut off] {
                    s.rollback(150);
                }
                let tail: Vec<u32> = (0..90u32).map(|i| (i * 11 + 5) % vocab).collect();
                let a = trace(&mut ram, &tail, 6);
                assert_eq!(
                    trace(&mut off, &tail, 6),
                    a,
                    "{stem} {ty} ring {ring} after rollback"
                );
                ram.reset();
            }
        }
    }
}

#[test]
fn budget_covering_the_cache_keeps_it_in_ram_and_a_tiny_one_is_refused() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let s = session(&model, 256, 64, KvType::F16, Some(1 << 30));
    assert_eq!(s.kv().unwrap().offload_ring(), None);
    let slot = s.kv().unwrap().layout().layer_kv_bytes(KvType::F16);
    let mut opts = SessionOptions::new(256, 1);
    opts.kv_budget = Some(slot + 1);
    let err = Session::new(Arc::clone(&model), opts).err().unwrap();
    assert!(matches!(err, EngineError::KvBudget(_)), "{err}");
    assert!(err.to_string().contains("too small"), "{err}");
}

/// SmolLM2 on the long golden prompt (~2,600 tokens, several prefill chunks, the split decode
/// path): offloaded with a ring of 4 of its 30 layers, logits identical to the in-RAM cache.
#[test]
fn smollm2_long_prompt_offloaded_matches_in_ram() {
    let lines = common::read_jsonl(
        &common::golden_dir()
            .join("smollm2-135m-instruct-q4_1")
            .join("long.jsonl"),
    );
    let prompt: Vec<u32> = lines[0]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert!(prompt.len() > 2000);
    let model = Arc::new(Model::load(common::real_model("smollm2")).unwrap());
    let ctx = 4096;
    let mut ram = session(&model, ctx, 512, KvType::F16, None);
    let slot = ram.kv().unwrap().layout().layer_kv_bytes(KvType::F16);
    let mut off = session(&model, ctx, 512, KvType::F16, Some(4 * slot));
    assert_eq!(off.kv().unwrap().offload_ring(), Some(4));
    assert_eq!(
        off.kv().unwrap().bytes() * 30,
        ram.kv().unwrap().bytes() * 4
    );
    let want = trace(&mut ram, &prompt, 4);
    let got = trace(&mut off, &prompt, 4);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "step {i}: offloaded logits differ");
    }
}

#[test]
fn contexts_past_the_training_context_are_refused() {
    let model = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let max = model.config.ctx_train;
    assert!(Session::new(Arc::clone(&model), SessionOptions::new(max, 1)).is_ok());
    let err = Session::new(Arc::clone(&model), SessionOptions::new(max + 1, 1))
        .err()
        .unwrap();
    assert_eq!(err, EngineError::ContextTooLarge { ctx: max + 1, max });
    let e = kiln::engine::plan::plan(
        &model.file,
        &SessionOptions::new(max + 1, 1),
        1,
        Default::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("exceeds"), "{e}");
}

/// Gemma-3 offloaded: its 3 global layers stream through 2 buffers while the 15 sliding-window
/// rings stay in RAM; prefill and a decode past the window give the in-RAM cache's bits.
#[test]
fn offloaded_gemma3_with_rings_is_bit_identical() {
    let model = Arc::new(Model::load(common::real_model("gemma3")).unwrap());
    let mut ram = session(&model, 2048, 128, KvType::F16, None);
    let layout = ram.kv().unwrap().layout().clone();
    assert_eq!(layout.n_ring_layers(), 15);
    let budget = layout.ring_kv_bytes(KvType::F16) + 2 * layout.layer_kv_bytes(KvType::F16);
    let mut off = session(&model, 2048, 128, KvType::F16, Some(budget));
    assert_eq!(off.kv().unwrap().offload_ring(), Some(2));
    assert_eq!(off.kv().unwrap().bytes(), budget);
    let prompt: Vec<u32> = (0..700u32).map(|i| 1000 + (i * 7919) % 200_000).collect();
    let a = trace(&mut ram, &prompt, 40);
    let b = trace(&mut off, &prompt, 40);
    assert!(a == b, "offloaded logits differ");
}
