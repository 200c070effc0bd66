//! `Sampler::sample` must not touch the heap: every buffer is allocated in `Sampler::new`.
//! A counting global allocator proves it for every pipeline shape (greedy, penalties, top-k,
//! top-p over a large vocabulary with its full-sort fallback, min-p, all-masked rows, a logit
//! bias).
//! The sampler runs on the caller's thread, so only that thread's allocations are counted: the
//! test harness's own thread may still be allocating (its output, its timers) while the first
//! pipeline runs, which once made this test fail on a loaded machine.

use kiln::sampler::{Sampler, SamplerConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations count (the test's thread only). A `const` thread
    /// local without a destructor: reading it never allocates.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.with(Cell::get) {
        ALLOCS.fetch_add(1, SeqCst);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn base() -> SamplerConfig {
    SamplerConfig {
        seed: 1,
        ..SamplerConfig::default()
    }
}

#[test]
fn sample_never_allocates() {
    COUNTED.with(|c| c.set(true));
    const VOCAB: usize = 50_000;
    // Deterministic pseudo-random logits in [-8, 8), a peaked row and a flat row.
    let mut x = 12345u64;
    let noisy: Vec<f32> = (0..VOCAB)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 16.0 - 8.0
        })
        .collect();
    let flat = vec![0.0f32; VOCAB];
    let masked = vec![f32::NEG_INFINITY; VOCAB];
    let mut with_nan = noisy.clone();
    with_nan[17] = f32::NAN;
    with_nan[99] = f32::INFINITY;
    let history: Vec<u32> = (0..200).map(|i| (i * 37) % VOCAB as u32).collect();

    let configs = [
        SamplerConfig {
            temperature: 0.0,
            ..base()
        },
        SamplerConfig {
            temperature: 0.0,
            repeat_penalty: 1.3,
            ..base()
        },
        base(),
        SamplerConfig {
            repeat_penalty: 1.1,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            ..base()
        },
        SamplerConfig { top_k: 0, ..base() },
        SamplerConfig {
            top_k: 0,
            top_p: 0.99,
            min_p: 0.0,
            ..base()
        },
        SamplerConfig {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.5,
            ..base()
        },
        SamplerConfig { top_k: 1, ..base() },
        // A bias (every shape then takes the whole-row path): greedy, the default chain, with
        // penalties after it; ids past the vocabulary and a ban among them.
        SamplerConfig {
            temperature: 0.0,
            logit_bias: vec![(3, 100.0), (99, f32::NEG_INFINITY), (VOCAB as u32 + 5, 1.0)],
            ..base()
        },
        SamplerConfig {
            logit_bias: vec![(3, -100.0), (17, 2.5), (17, -0.5), (40_000, 100.0)],
            ..base()
        },
        SamplerConfig {
            repeat_penalty: 1.1,
            frequency_penalty: 0.2,
            logit_bias: (0..300).map(|i| (i * 151, -1.0)).collect(),
            ..base()
        },
    ];
    for cfg in configs {
        let at_new = ALLOCS.load(SeqCst);
        let mut s = Sampler::new(cfg.clone(), VOCAB);
        assert!(
            ALLOCS.load(SeqCst) > at_new,
            "the counter sees new()'s buffers"
        );
        let before = ALLOCS.load(SeqCst);
        let mut sink = 0u64;
        for row in [&noisy, &flat, &masked, &with_nan] {
            for _ in 0..3 {
                sink += s.sample(row, &history) as u64;
            }
        }
        s.reseed(9);
        sink += s.sample(&noisy, &[]) as u64;
        let after = ALLOCS.load(SeqCst);
        assert_eq!(
            after - before,
            0,
            "{cfg:?} allocated {} times",
            after - before
        );
        assert!(sink < 13 * VOCAB as u64);
    }
}
