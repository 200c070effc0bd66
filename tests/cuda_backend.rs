//! The CUDA backend against the CPU's, on a machine with an NVIDIA GPU (elsewhere every test
//! here says why it skips; the kernels' compilation is checked everywhere by
//! `tests/cuda_kernels.rs`). `scripts/gpu-check.sh` runs this file on the GPU machine.
//!
//! - every random fixture model (five architectures, every block format): the prompt's
//!   logits and a greedy continuation agree with the CPU's;
//! - decode steps allocate nothing on the device and run as one recorded graph per batch
//!   shape, with the same results as without the graph;
//! - rollback and prefix reuse on the device cache give the logits of a fresh evaluation.

mod common;

use std::sync::Arc;

use kiln::backend::{cuda, Device};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

/// Whether this machine has a GPU; prints why the test skips when not.
fn gpu(test: &str) -> bool {
    match cuda::open() {
        Ok(g) => {
            println!("{test}: on {} ({})", g.name, g.arch);
            true
        }
        Err(e) => {
            println!("{test}: skipped: {e}");
            false
        }
    }
}

fn session(m: &Arc<Model>, device: Device, n_ctx: usize) -> Session {
    let mut o = SessionOptions::new(n_ctx, 2);
    o.prefill_chunk = 64;
    o.device = device;
    Session::new(Arc::clone(m), o).unwrap_or_else(|e| panic!("{device:?} session: {e}"))
}

/// The prompt's last logits and `n` greedy steps: tokens and logits of each.
fn run(s: &mut Session, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    s.prefill(prompt, &mut |_, _| {}).expect("prefill");
    let mut toks = Vec::new();
    let mut logits = vec![s.logits().to_vec()];
    for _ in 0..n {
        let t = argmax(s.logits());
        toks.push(t);
        s.decode(t).expect("decode");
        logits.push(s.logits().to_vec());
    }
    (toks, logits)
}

/// Largest difference between two logit rows, relative to the row's spread.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let spread = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / spread
}

#[test]
fn every_fixture_model_agrees_with_the_cpu() {
    if !gpu("every_fixture_model_agrees_with_the_cpu") {
        return;
    }
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 200 + 3) as u32).collect();
    for stem in common::random_model_names() {
        let m = Arc::new(Model::load(common::random_model(&stem)).unwrap());
        let (ct, cl) = run(&mut session(&m, Device::Cpu, 256), &prompt, 16);
        let (gt, gl) = run(&mut session(&m, Device::Cuda, 256), &prompt, 16);
        let worst = cl
            .iter()
            .zip(&gl)
            .map(|(a, b)| rel_err(a, b))
            .fold(0f32, f32::max);
        let same = ct.iter().zip(&gt).take_while(|(a, b)| a == b).count();
        println!(
            "{stem}: greedy tokens equal for {same}/16, worst relative logit error {worst:.2e}"
        );
        assert!(
            worst < 2e-2,
            "{stem}: logits differ from the CPU's by {worst}"
        );
        assert!(
            same >= 8,
            "{stem}: greedy diverges at step {same}: {ct:?} vs {gt:?}"
        );
    }
}

#[test]
fn decode_allocates_nothing_and_replays_one_graph() {
    if !gpu("decode_allocates_nothing_and_replays_one_graph") {
        return;
    }
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let mut s = session(&m, Device::Cuda, 256);
    s.prefill(&[1, 2, 3, 4, 5], &mut |_, _| {}).unwrap();
    s.decode(6).unwrap();
    let gpu = cuda::open().unwrap();
    let before = gpu.allocations();
    let mut graphed = Vec::new();
    for t in 7..40 {
        s.decode(t).unwrap();
        graphed.push(s.logits().to_vec());
    }
    assert_eq!(
        gpu.allocations(),
        before,
        "decode steps allocated device memory"
    );
    assert_eq!(s.cuda().unwrap().graphs(), 1, "one graph for one-row steps");
    assert_eq!(plain_graphs(&m), 0);

    // The same steps without graphs give the same bits.
    let mut plain = session(&m, Device::Cuda, 256);
    plain.set_cuda_graphs(false);
    plain.prefill(&[1, 2, 3, 4, 5], &mut |_, _| {}).unwrap();
    plain.decode(6).unwrap();
    for (i, t) in (7..40).enumerate() {
        plain.decode(t).unwrap();
        assert_eq!(
            plain.logits(),
            &graphed[i][..],
            "step {i}: the graph changed the result"
        );
    }
}

/// A session with graphs off records none.
fn plain_graphs(m: &Arc<Model>) -> usize {
    let mut s = session(m, Device::Cuda, 64);
    s.set_cuda_graphs(false);
    s.prefill(&[1, 2], &mut |_, _| {}).unwrap();
    s.decode(3).unwrap();
    s.decode(4).unwrap();
    s.cuda().unwrap().graphs()
}

#[test]
fn rollback_and_prefix_reuse_on_the_device_cache() {
    if !gpu("rollback_and_prefix_reuse_on_the_device_cache") {
        return;
    }
    let m = Arc::new(Model::load(common::random_model("random-qwen3-f32")).unwrap());
    let prompt: Vec<u32> = (0..30).map(|i| (i * 11 % 150 + 1) as u32).collect();
    let mut s = session(&m, Device::Cuda, 128);
    let (t1, l1) = run(&mut s, &prompt, 8);
    s.rollback(prompt.len() - 1);
    s.prefill(&prompt[prompt.len() - 1..], &mut |_, _| {})
        .unwrap();
    let mut l2 = vec![s.logits().to_vec()];
    let mut t2 = Vec::new();
    for _ in 0..8 {
        let t = argmax(s.logits());
        t2.push(t);
        s.decode(t).unwrap();
        l2.push(s.logits().to_vec());
    }
    assert_eq!(t1, t2);
    for (a, b) in l1.iter().zip(&l2) {
        assert!(rel_err(a, b) < 1e-5, "logits after rollback differ");
    }
}

/// `kiln plan --device cuda` against the device: the bytes the session allocates equal the
/// plan, and the driver's free memory drops by the plan within 3%, at several context sizes.
#[test]
fn device_plan_matches_the_measured_device_memory() {
    if !gpu("device_plan_matches_the_measured_device_memory") {
        return;
    }
    let g = cuda::open().unwrap();
    // A model big enough that the driver's page granularity is noise: the real Gemma-3, or
    // `$KILN_PLAN_MODEL` (its twin on the GPU machine, which cannot download).
    let path = match std::env::var_os("KILN_PLAN_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => common::real_model("gemma3"),
    };
    for ctx in [512, 4096, 32768] {
        let m = Arc::new(Model::load(&path).unwrap());
        let mut o = SessionOptions::new(ctx, 2);
        o.device = Device::Cuda;
        let p = kiln::engine::plan::device_plan(&m.file, &o).unwrap();
        let (free0, _) = g.mem_info().unwrap();
        let (_, bytes0) = g.allocations();
        let s = Session::new(Arc::clone(&m), o).unwrap();
        let (free1, _) = g.mem_info().unwrap();
        let (_, bytes1) = g.allocations();
        assert_eq!(
            (bytes1 - bytes0) as u64,
            p.total_bytes,
            "ctx {ctx}: allocated vs plan"
        );
        let used = (free0 - free1) as f64;
        let ratio = used / p.total_bytes as f64;
        println!(
            "ctx {ctx}: plan {} B, driver delta {used} B ({ratio:.4})",
            p.total_bytes
        );
        assert!(
            (ratio - 1.0).abs() <= 0.03,
            "ctx {ctx}: measured {used} vs plan {}",
            p.total_bytes
        );
        drop(s);
    }
}
