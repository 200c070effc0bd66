//! Decoding a token allocates nothing: every buffer comes from the session.
//! A counting global allocator watches the decode + sample loop after warm-up.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use kiln::cache::KvType;
use kiln::engine::speculative::{NgramDrafter, Speculation, Step};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};

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

/// Speculative decoding's steps (n-gram drafts over a repeating prompt: verification passes,
/// acceptances, rollbacks), after warm-up.
fn speculative_allocations(stem: &str, threads: usize) -> usize {
    let model = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let vocab = model.config.vocab_size;
    let mut opts = SessionOptions::new(256, threads);
    opts.logit_rows = 5;
    let mut s = Session::new(model, opts).expect("session");
    let mut sampler = Sampler::new(SamplerConfig::greedy(), vocab);
    let mut sp = Speculation::new(Box::new(NgramDrafter::new(1, 2)), 4, 1, vocab);
    sp.start(&s);
    let prompt: Vec<u32> = (0..24).map(|i| [5, 9, 13][i % 3]).collect();
    s.prefill(&prompt, &mut |_, _| {}).expect("prefill");
    let mut next = sampler.sample(s.logits(), s.tokens());
    let mut step = |s: &mut Session, sampler: &mut Sampler, next: &mut u32| match sp.step(
        s,
        sampler,
        *next,
        usize::MAX,
        None,
        &mut |_| Ok(()),
    ) {
        Ok(Step::Plain) => {
            s.decode(*next).expect("decode");
            *next = sampler.sample(s.logits(), s.tokens());
        }
        Ok(Step::Next(Some(t))) => *next = t,
        other => panic!("{other:?}"),
    };
    for _ in 0..4 {
        step(&mut s, &mut sampler, &mut next);
    }
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    while s.n_past() < 200 {
        step(&mut s, &mut sampler, &mut next);
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert!(
        sp.stats.passes > 0 && sp.stats.accepted > 0,
        "{:?}",
        sp.stats
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
