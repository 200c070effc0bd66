//! Batched decoding allocates nothing: a step of the batch runner over four sequences, and a
//! step of the scheduler (four requests generating, or three beside a prompt being prefilled
//! in chunks, or four choices reporting log-probabilities, two of them forks of one prompt, or
//! four speculating with prompt lookup), after warm-up. A counting global allocator watches, as in tests/decode_alloc.rs.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::logprobs::TokenLogprobs;
use kiln::engine::scheduler::{Finished, Fork, SchedMetrics, Scheduler, SeqRequest, SeqSink};
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

/// Allocations made by `f`.
fn count(f: impl FnOnce()) -> usize {
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst)
}

fn runner(m: &Arc<Model>, threads: usize, kv_type: KvType) -> BatchRunner {
    runner_drafting(m, threads, kv_type, 0)
}

fn runner_drafting(
    m: &Arc<Model>,
    threads: usize,
    kv_type: KvType,
    draft_max: usize,
) -> BatchRunner {
    BatchRunner::new(
        Arc::clone(m),
        BatchOptions {
            n_slots: 4,
            n_ctx: 256,
            n_threads: threads,
            prefill_chunk: 16,
            kv_type,
            device: Default::default(),
            draft_max,
        },
    )
    .unwrap()
}

/// Four slots decoding together, sampled with a repetition penalty.
fn runner_allocations(m: &Arc<Model>, threads: usize, kv_type: KvType) -> usize {
    let mut r = runner(m, threads, kv_type);
    let vocab = m.config.vocab_size;
    let cfg = SamplerConfig {
        seed: 42,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let mut samplers: Vec<Sampler> = (0..4).map(|_| Sampler::new(cfg.clone(), vocab)).collect();
    for slot in 0..4 {
        let p: Vec<u32> = (1..=6 + slot as u32).collect();
        r.prefill_chunk(slot, &p, true).unwrap();
    }
    let mut batch = Vec::with_capacity(4);
    let mut step = |r: &mut BatchRunner| {
        batch.clear();
        for (slot, s) in samplers.iter_mut().enumerate() {
            batch.push((slot, s.sample(r.logits(slot), r.tokens(slot))));
        }
        r.decode(&batch).unwrap();
    };
    for _ in 0..4 {
        step(&mut r);
    }
    count(|| {
        for _ in 0..48 {
            step(&mut r);
        }
    })
}

/// Counts tokens without allocating.
struct Quiet(Arc<AtomicUsize>);

impl SeqSink for Quiet {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn token(&mut self, _: u32) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn logprobs(&mut self, lp: &TokenLogprobs) {
        assert!(lp.logprob <= 0.0 && lp.top.len() == lp.k());
    }
    fn done(&mut self, _: Finished) {}
}

fn request(prompt: Vec<u32>, tokens: &Arc<AtomicUsize>) -> SeqRequest {
    SeqRequest {
        grammar: None,
        logprobs: None,
        forks: Vec::new(),
        embed: None,
        score: None,
        prompt,
        max_new: 200,
        sampler: SamplerConfig {
            seed: 7,
            ..SamplerConfig::default()
        },
        stop: vec!["never-in-this-output\u{1}".into()],
        code: Default::default(),
        cache_prompt: true,
        tenant: 0,
        ignore_eos: true,
        sink: Box::new(Quiet(Arc::clone(tokens))),
    }
}

/// Scheduler steps: four requests generating; then three generating beside a 100-token prompt
/// prefilled 16 tokens a step (counted from its second chunk: admission allocates).
fn scheduler_allocations(m: &Arc<Model>, tok: &Tokenizer, threads: usize) -> (usize, usize) {
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(runner(m, threads, KvType::F16), tok, metrics);
    let counters: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    for (i, c) in counters.iter().take(3).enumerate() {
        sched.submit(request((1..=5 + i as u32).collect(), c));
    }
    for _ in 0..8 {
        sched.step();
    }
    sched.submit(request((1..=9).collect(), &counters[3]));
    for _ in 0..8 {
        sched.step();
    }
    let generated = |c: &[Arc<AtomicUsize>]| -> Vec<usize> {
        c.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    };
    let before = generated(&counters);
    let decoding = count(|| {
        for _ in 0..32 {
            sched.step();
        }
    });
    let after = generated(&counters);
    assert!(
        before.iter().zip(&after).all(|(b, a)| a - b == 32),
        "all four generated at every step: {before:?} -> {after:?}"
    );

    // A long prompt in a new slot: finish one request first (a fifth slot does not exist).
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(runner(m, threads, KvType::F16), tok, Arc::clone(&metrics));
    for (i, c) in counters.iter().take(3).enumerate() {
        sched.submit(request((1..=5 + i as u32).collect(), c));
    }
    for _ in 0..8 {
        sched.step();
    }
    sched.submit(request(
        (0..100).map(|i| 3 + i * 7 % 200).collect(),
        &counters[3],
    ));
    sched.step(); // admission and the first chunk
    let p0 = metrics.prefill_tokens.load(Ordering::Relaxed);
    let prefilling = count(|| {
        for _ in 0..4 {
            sched.step();
        }
    });
    assert_eq!(
        metrics.prefill_tokens.load(Ordering::Relaxed) - p0,
        4 * 16,
        "the counted steps carried prompt chunks"
    );
    (decoding, prefilling)
}

/// Four choices generating and reporting log-probabilities (20 alternatives, or none), two
/// of them forks of one prompt.
fn logprob_fork_allocations(m: &Arc<Model>, tok: &Tokenizer, threads: usize) -> usize {
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(runner(m, threads, KvType::F16), tok, metrics);
    let counters: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let mut forked = request((1..=5).collect(), &counters[0]);
    forked.logprobs = Some(20);
    forked.forks.push(Fork {
        sampler: SamplerConfig {
            seed: 8,
            ..SamplerConfig::default()
        },
        grammar: None,
        sink: Box::new(Quiet(Arc::clone(&counters[1]))),
    });
    sched.submit(forked);
    let mut plain = request((1..=7).collect(), &counters[2]);
    plain.logprobs = Some(0);
    sched.submit(plain);
    sched.submit(request((1..=6).collect(), &counters[3]));
    for _ in 0..8 {
        sched.step();
    }
    let before: Vec<usize> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let n = count(|| {
        for _ in 0..32 {
            sched.step();
        }
    });
    let after: Vec<usize> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert!(
        before.iter().zip(&after).all(|(b, a)| a - b == 32),
        "all four choices generated at every step: {before:?} -> {after:?}"
    );
    n
}

/// Four requests speculating with prompt lookup (greedy and seeded, with log-probabilities):
/// verification passes beside plain rows, drafts kept and refused, rollbacks.
/// With `draft`, a draft model's slots guess (each slot's history brought in, guesses decoded
/// together) instead of prompt lookup.
fn speculative_allocations(
    m: &Arc<Model>,
    tok: &Tokenizer,
    threads: usize,
    draft: Option<&Arc<Model>>,
) -> usize {
    let metrics = Arc::new(SchedMetrics::default());
    let runner = runner_drafting(m, threads, KvType::F16, 4);
    let drafter = draft.map(|d| {
        let dr = runner_drafting(d, threads, KvType::F16, 0);
        kiln::engine::slot_drafter::SlotDrafter::new(dr, &runner, 0.0).unwrap()
    });
    let mut sched = Scheduler::new(runner, tok, Arc::clone(&metrics));
    match drafter {
        None => sched.speculate(kiln::engine::speculative::NgramDrafter::new(2, 2), 1),
        Some(d) => sched.speculate(d, 1),
    }
    let counters: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    for (i, c) in counters.iter().enumerate() {
        let pattern = [3 + i as u32, 40, 41 + i as u32, 90];
        let mut r = request(pattern.iter().cycle().take(24).copied().collect(), c);
        if i % 2 == 0 {
            r.sampler = SamplerConfig::greedy();
        }
        r.logprobs = Some(i);
        sched.submit(r);
    }
    for _ in 0..8 {
        sched.step();
    }
    let passes = metrics.spec_passes.load(Ordering::Relaxed);
    let n = count(|| {
        for _ in 0..24 {
            sched.step();
        }
    });
    assert!(
        metrics.spec_passes.load(Ordering::Relaxed) > passes,
        "the counted steps verified drafts"
    );
    n
}

/// One test: the counting allocator is global, so concurrent tests would count each other.
#[test]
fn batched_steps_allocate_nothing() {
    for stem in [
        "random-llama-q4_0",
        "random-llama-q4_k",
        "random-qwen3-f32",
        "random-olmoe-q4_k_m",
        "random-gpt-oss-mxfp4",
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        for threads in [1, 2] {
            assert_eq!(
                runner_allocations(&m, threads, KvType::F16),
                0,
                "{stem}: batch runner, {threads} threads"
            );
        }
    }
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    for threads in [1, 2] {
        assert_eq!(
            runner_allocations(&m, threads, KvType::Q8_0),
            0,
            "q8_0 KV, {threads} threads"
        );
    }
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    for threads in [1, 2] {
        let (decoding, prefilling) = scheduler_allocations(&m, &tok, threads);
        assert_eq!(decoding, 0, "scheduler decode steps, {threads} threads");
        assert_eq!(
            prefilling, 0,
            "scheduler steps with a prompt chunk, {threads} threads"
        );
        assert_eq!(
            logprob_fork_allocations(&m, &tok, threads),
            0,
            "scheduler steps with log-probabilities and forks, {threads} threads"
        );
    }
    for stem in ["random-llama-q4_0", "random-llama-q4_k"] {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        for threads in [1, 2] {
            assert_eq!(
                speculative_allocations(&m, &tok, threads, None),
                0,
                "{stem}: speculative scheduler steps, {threads} threads"
            );
            assert_eq!(
                speculative_allocations(&m, &tok, threads, Some(&m)),
                0,
                "{stem}: speculative scheduler steps with a draft model, {threads} threads"
            );
        }
    }
}
