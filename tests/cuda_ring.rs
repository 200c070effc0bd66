//! Sliding-window layers on the GPU keep a ring of their window and a pass's chunk, as a
//! cache in RAM does (`tests/swa_ring.rs`), on the machine's GPU or the software GPU. The
//! fixture models have no sliding window, so these tests give a random llama one (every other
//! layer, a window of 40 positions) and check, through prefills, decode far past the window,
//! long-context decode split over the keys, rollbacks and prefix copies:
//! - the logits are the same bits as with a cache of the whole context (`swa_full`): the
//!   attention visits the same keys in the same order, wherever they are stored;
//! - they agree with the CPU's ring;
//! - `kiln plan --device cuda` is what the session allocates, and the rings are smaller.

mod common;

use std::sync::Arc;

use common::gpu;
use kiln::backend::cuda::exec::OnCuda;
use kiln::backend::Device;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

const WINDOW: usize = 40;
const CHUNK: usize = 16;

/// A random model whose even layers see the last `WINDOW` positions.
fn windowed(stem: &str) -> Arc<Model> {
    let mut m = Model::load(common::random_model(stem)).unwrap();
    let layers: Vec<bool> = (0..m.config.n_layers).map(|l| l % 2 == 0).collect();
    m.config.sliding_window = Some(WINDOW);
    m.config.swa_layers = layers.clone();
    for (layer, &w) in m.weights.layers.iter_mut().zip(&layers) {
        layer.window = w.then_some(WINDOW);
    }
    Arc::new(m)
}

fn options(device: Device, ctx: usize, swa_full: bool, kv: KvType) -> SessionOptions {
    let mut o = SessionOptions::new(ctx, 2);
    o.prefill_chunk = CHUNK;
    o.swa_full = swa_full;
    o.device = device;
    o.kv_type = kv;
    o
}

fn session(m: &Arc<Model>, o: SessionOptions) -> Session {
    Session::new(Arc::clone(m), o).unwrap()
}

/// A prompt's logits, `n` greedy steps' logits, then a rollback of 12 positions (within the
/// ring) and the same steps again, then one of 60 (past it: a session with rings starts over;
/// one with the whole context is reset to match) and a new prompt.
fn schedule(s: &mut Session, prompt: &[u32], n: usize) -> Vec<Vec<f32>> {
    s.prefill(prompt, &mut |_, _| {}).unwrap();
    let mut out = vec![s.logits().to_vec()];
    let mut toks = Vec::new();
    for _ in 0..n {
        let t = argmax(s.logits());
        toks.push(t);
        s.decode(t).unwrap();
        out.push(s.logits().to_vec());
    }
    let len = prompt.len() + n;
    let kept = s.rollback(len - 12);
    assert_eq!(
        kept,
        len - 12,
        "a rollback within the ring keeps the positions"
    );
    s.prefill(&toks[n - 12..n - 6], &mut |_, _| {}).unwrap();
    out.push(s.logits().to_vec());
    let kept = s.rollback(len - 6 - 60);
    if s.opts.swa_full {
        assert_eq!(kept, len - 66, "a whole-context cache goes back anywhere");
        s.reset();
    } else {
        assert_eq!(
            kept, 0,
            "the rings no longer hold the window 60 positions back"
        );
    }
    s.prefill(&prompt[..20], &mut |_, _| {}).unwrap();
    out.push(s.logits().to_vec());
    out
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The ring against the whole context on the GPU (bit for bit), and against the CPU's ring,
/// for f16 and Q8_0 caches; short contexts, and a long one whose decode splits over the keys.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn gpu_rings_match_the_full_cache_and_the_cpu() {
    let _gpu = gpu("gpu_rings_match_the_full_cache_and_the_cpu");
    let m = windowed("random-llama-q4_0");
    let cases = [
        (256, KvType::F16, 150, 24),
        (256, KvType::Q8_0, 150, 24),
        // Past 256 positions decode takes the f32 attention, split over the keys.
        (1024, KvType::F16, 300, 12),
    ];
    for (ctx, kv, len, steps) in cases {
        let prompt: Vec<u32> = (0..len).map(|i| (i * 37 % 200 + 3) as u32).collect();
        let ring = schedule(
            &mut session(&m, options(Device::Cuda, ctx, false, kv)),
            &prompt,
            steps,
        );
        let full = schedule(
            &mut session(&m, options(Device::Cuda, ctx, true, kv)),
            &prompt,
            steps,
        );
        assert_eq!(
            bits(&ring),
            bits(&full),
            "ctx {ctx} {kv:?}: ring vs whole context"
        );
        let cpu = schedule(
            &mut session(&m, options(Device::Cpu, ctx, false, kv)),
            &prompt,
            steps,
        );
        let mut worst = 0f32;
        for (i, (c, g)) in cpu.iter().zip(&ring).enumerate() {
            let t = argmax(c) as usize;
            let d = (c[t] - g[t]).abs();
            assert!(
                d < 0.05,
                "ctx {ctx} {kv:?}: step {i}: top logit {} vs {}",
                c[t],
                g[t]
            );
            worst = worst.max(d);
        }
        println!("ctx {ctx} {kv:?}: ring = whole context bit for bit; |Δ| vs CPU ≤ {worst:.5}");
    }
}

/// A server's slots with rings: a prefix copied within the ring's reach is taken over (and
/// continues as on the CPU); one whose window the rings lost is not (0, as on the CPU).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn prefix_copies_between_gpu_rings() {
    let _gpu = gpu("prefix_copies_between_gpu_rings");
    let m = windowed("random-llama-q4_0");
    let runner = |device| {
        let o = BatchOptions {
            n_slots: 3,
            n_ctx: 256,
            n_threads: 2,
            prefill_chunk: CHUNK,
            kv_type: KvType::F16,
            device,
            draft_max: 0,
        };
        BatchRunner::new(Arc::clone(&m), o).unwrap()
    };
    let mut rs = [runner(Device::Cpu), runner(Device::Cuda)];
    let prompt: Vec<u32> = (0..96).map(|i| (i * 11 % 150 + 1) as u32).collect();
    for r in &mut rs {
        for part in prompt.chunks(CHUNK) {
            r.prefill_chunk(0, part, true).unwrap();
        }
        // The rings hold positions from 96 − 64 = 32: the window before 90 is held, before 40
        // it is not.
        assert_eq!(r.copy_prefix(1, 0, 90), 90);
        assert_eq!(r.copy_prefix(2, 0, 40), 0);
        r.prefill_chunk(1, &prompt[90..96], true).unwrap();
    }
    let (c, g) = (rs[0].logits(1), rs[1].logits(1));
    let t = argmax(c) as usize;
    assert!(
        (c[t] - g[t]).abs() < 0.05,
        "after the copy: {} vs {}",
        c[t],
        g[t]
    );
    assert_eq!(
        rs[1].logits(1),
        rs[1].logits(0),
        "the copy continues as the original"
    );
}

/// A GPU session's cache has the geometry of the cache in RAM: its rings' rows for the
/// sliding-window layers, the context for the others (the memory plan lays it out with the
/// same functions), so it takes less than the whole context.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn gpu_cache_takes_the_rings_geometry() {
    let _gpu = gpu("gpu_cache_takes_the_rings_geometry");
    let m = windowed("random-llama-q4_0");
    let bytes = |swa_full| {
        let o = options(Device::Cuda, 1024, swa_full, KvType::F16);
        let want = kiln::engine::session::kv_layout(&m.config, &o).bytes_as(KvType::F16);
        let s = session(&m, o);
        (s.cuda().unwrap().kv_bytes(), want)
    };
    let (ring, ring_want) = bytes(false);
    let (full, full_want) = bytes(true);
    // (Each layer's keys and values start 256-byte aligned.)
    let layers = 2 * m.config.n_layers;
    assert!(
        ring >= ring_want && ring < ring_want + 256 * layers,
        "{ring} vs {ring_want}"
    );
    assert!(
        full >= full_want && full < full_want + 256 * layers,
        "{full} vs {full_want}"
    );
    assert!(ring < full, "rings {ring} B, whole context {full} B");
    println!("KV cache: {ring} B with rings, {full} B without");
}
