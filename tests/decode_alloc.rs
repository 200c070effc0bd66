//! Decoding a token allocates nothing: every buffer comes from the session.
//! A counting global allocator watches the decode + sample loop after warm-up.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::speculative::NgramDrafter;
use kiln::engine::{Engine, GenerateRequest, Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn decode_allocations(stem: &str, threads: usize, kv_type: KvType) -> usize {
    decode_allocations_with(stem, threads, kv_type, None)
}

fn decode_allocations_with(
    stem: &str,
    threads: usize,
    kv_type: KvType,
    kv_budget: Option<usize>,
) -> usize {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let vocab = model.config.vocab_size;
    let mut opts = SessionOptions::new(256, threads);
    opts.kv_type = kv_type;
    opts.kv_budget = kv_budget;
    let mut s = Session::new(model, opts).expect("session");
    assert_eq!(
        s.kv().unwrap().offload_ring().is_some(),
        kv_budget.is_some()
    );
    let cfg = SamplerConfig {
        seed: 42,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(cfg, vocab);
    s.prefill(&[1, 2, 3, 4, 5, 6, 7, 8], &mut |_, _| {})
        .expect("prefill");
    // Warm-up: lazily initialized state (thread wake-ups, CPU detection) settles here.
    for _ in 0..4 {
        let t = sampler.sample(s.logits(), s.tokens());
        s.decode(t).expect("decode");
    }
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..64 {
        let t = sampler.sample(s.logits(), s.tokens());
        s.decode(t).expect("decode");
    }
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst)
}

/// Speculative decoding's steps on the engine `kiln run` drives (n-gram drafts over a
/// repeating prompt: verification passes, acceptances, rollbacks), counted between the tokens
/// after warm-up and the last few (the end of a generation hands over its tail and report).
fn speculative_allocations(stem: &str, threads: usize) -> usize {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = Tokenizer::from_gguf(&model.file).expect("tokenizer");
    let vocab = model.config.vocab_size;
    let opts = BatchOptions {
        n_slots: 1,
        n_ctx: 256,
        n_threads: threads,
        prefill_chunk: 512,
        kv_type: KvType::F16,
        device: Default::default(),
        draft_max: 4,
    };
    let runner = BatchRunner::new(model, opts).expect("runner");
    let mut engine = Engine::new(runner, &tok).expect("engine");
    engine.speculate(NgramDrafter::new(1, 2), 1);
    let mut sampler = Sampler::new(SamplerConfig::greedy(), vocab);
    let prompt: Vec<u32> = (0..24).map(|i| [5, 9, 13][i % 3]).collect();
    let n = 176;
    let mut req = GenerateRequest::new(&prompt, Some(n));
    req.ignore_eos = true;
    let mut seen = 0;
    let mut on_token = |id: u32, _: &str| {
        if id != u32::MAX {
            seen += 1;
        }
        // Warm-up: lazily initialized state (thread wake-ups, CPU detection) settles first.
        COUNTING.store((8..n - 8).contains(&seen), Ordering::SeqCst);
        true
    };
    ALLOCS.store(0, Ordering::SeqCst);
    let stats = engine
        .generate(&req, &mut sampler, None, &mut |_, _| {}, &mut on_token)
        .expect("generate");
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(stats.gen_tokens, n);
    assert!(
        stats.spec.passes > 0 && stats.spec.accepted > 0,
        "{:?}",
        stats.spec
    );
    ALLOCS.load(Ordering::SeqCst)
}

/// One test: the counting allocator is global, so concurrent tests would count each other.
#[test]
fn decode_allocates_nothing() {
    for stem in [
        "random-llama-q4_0",
        "random-llama-q4_k",
        "random-qwen3-f32",
        "random-gpt2-q8_0",
        // Mixtures of experts: routing and the chosen experts' products.
        "random-qwen3moe-q8_0",
        "random-qwen2moe-q4_0",
        // gpt-oss: sinks, biases, MXFP4 experts, the clamped SwiGLU, a sliding-window ring.
        "random-gpt-oss-mxfp4",
    ] {
        for threads in [1, 2] {
            assert_eq!(
                decode_allocations(stem, threads, KvType::F16),
                0,
                "{stem} with {threads} threads allocated while decoding"
            );
        }
    }
    // A q8_0 cache.
    for threads in [1, 2] {
        assert_eq!(
            decode_allocations("random-llama-q4_0", threads, KvType::Q8_0),
            0,
            "q8_0 KV with {threads} threads allocated while decoding"
        );
    }
    // An offloaded cache: random-llama has 4 layers; a budget of two layer buffers
    // ((K + V) × kv heads × positions × head_dim × f16 each) streams it from a file.
    let slot = 2 * 2 * 256 * 32 * 2;
    for ty in [KvType::F16, KvType::Q8_0] {
        for threads in [1, 2] {
            assert_eq!(
                decode_allocations_with("random-llama-q4_0", threads, ty, Some(2 * slot)),
                0,
                "offloaded {ty} KV with {threads} threads allocated while decoding"
            );
        }
    }
    for stem in ["random-llama-q4_0", "random-llama-q4_k"] {
        for threads in [1, 2] {
            assert_eq!(
                speculative_allocations(stem, threads),
                0,
                "{stem} with {threads} threads allocated while speculating"
            );
        }
    }
}
