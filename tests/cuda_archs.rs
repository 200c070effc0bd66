//! The architectures' own features on the CUDA backend (on a GPU, else on the software GPU:
//! see tests/cuda_backend.rs): Gemma-2's soft caps and post-norms, YaRN (llama-yarn),
//! LongRoPE with fused q/k/v and gate/up matrices and a partial rotation (Phi-3), Mistral-3's
//! attention temperature with YaRN, the blocks without input norms of OLMo-2, OLMo 3 and
//! EXAONE 4; mixtures of experts (Qwen3-MoE, OLMoE, Qwen2-MoE with its shared expert). Each
//! fixture against the reference engine's logits (tests/golden, the golden tests' bar), and
//! prompts long enough for the tiled attention and the prompt-sized products against the CPU.

mod common;

use std::sync::Arc;

use common::gpu;
use kiln::backend::Device;
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

/// The fixtures whose features the device runs, each with the greedy continuations the CPU's
/// golden check (tests/golden_archs.rs) requires.
const ARCHS: [&str; 7] = [
    "random-gemma2-f32",
    "random-llama-yarn-f32",
    "random-phi3-f32",
    "random-mistral3-f32",
    "random-olmo2-f32",
    "random-olmo3-f32",
    "random-exaone4-f32",
];

/// The mixture-of-experts fixtures the device runs (tests/golden_moe.rs's but the MXFP4
/// one: `gpt_oss_mxfp4_golden_on_the_gpu`); gpt-oss's with its attention sinks, clamped
/// SwiGLU, biases and alternating windows.
const MOES: [&str; 8] = [
    "random-qwen3moe-f32",
    "random-qwen3moe-q8_0",
    "random-olmoe-f32",
    "random-olmoe-q4_k_m",
    "random-qwen2moe-f32",
    "random-qwen2moe-q4_0",
    "random-gpt-oss-f32",
    "random-gpt-oss-q4_k_m",
];

fn load(stem: &str) -> Arc<Model> {
    Arc::new(Model::load(common::random_model(stem)).expect("load"))
}

/// The reference engine's logits (teacher forcing) and greedy continuations, on the GPU: the
/// bar the CPU meets in tests/golden_archs.rs (top-1 ≥ 99%, every confident position, mean
/// logit error ≤ 0.25, 4 greedy continuations equal).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn architecture_goldens_on_the_gpu() {
    let _gpu = gpu("architecture_goldens_on_the_gpu");
    goldens(&ARCHS);
}

/// The mixtures of experts against the reference engine, on the GPU: tests/golden_moe.rs's
/// bar (the same as the dense architectures').
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn moe_goldens_on_the_gpu() {
    let _gpu = gpu("moe_goldens_on_the_gpu");
    goldens(&MOES);
}

/// gpt-oss's MXFP4 experts on the GPU: the expert products call the backend's products of
/// each weight format, MXFP4's among them.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn gpt_oss_mxfp4_golden_on_the_gpu() {
    let _gpu = gpu("gpt_oss_mxfp4_golden_on_the_gpu");
    goldens(&["random-gpt-oss-mxfp4"]);
}

fn goldens(stems: &[&str]) {
    for &stem in stems {
        let m = load(stem);
        let mut agg = common::golden::Agreement::default();
        let file = common::golden_dir().join(stem).join("logits.jsonl");
        common::golden::compare_on(Device::Cuda, &m, &file, 2, true, &mut agg);
        agg.assert_meets_bar(&format!("{stem} on the GPU"), 4);
    }
}

/// The prompt's last logits and `n` greedy steps on `device`.
fn run(m: &Arc<Model>, device: Device, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut o = SessionOptions::new(256, 2);
    o.prefill_chunk = 128;
    o.device = device;
    let mut s = Session::new(Arc::clone(m), o).unwrap_or_else(|e| panic!("{device:?}: {e}"));
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

/// A 100-token prompt (tiled attention with its soft cap, the prompt-sized products of the
/// fused matrices, the temperature past its first step of positions, experts over many rows
/// each) and 8 decode steps
/// agree with the CPU: greedy tokens equal for 4 steps at least, the top token's logit within
/// 0.05 of the CPU's on average (tests/cuda_backend.rs's measure).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn long_prompts_agree_with_the_cpu() {
    let _gpu = gpu("long_prompts_agree_with_the_cpu");
    let prompt: Vec<u32> = (0..100).map(|i| (i * 37 % 200 + 3) as u32).collect();
    for stem in ARCHS.into_iter().chain(MOES) {
        let m = load(stem);
        let (ct, cl) = run(&m, Device::Cpu, &prompt, 8);
        let (gt, gl) = run(&m, Device::Cuda, &prompt, 8);
        let same = ct.iter().zip(&gt).take_while(|(a, b)| a == b).count();
        let n = same + 1;
        let mean_top = cl[..n]
            .iter()
            .zip(&gl[..n])
            .map(|(a, b)| {
                let t = argmax(a) as usize;
                (a[t] - b[t]).abs()
            })
            .sum::<f32>()
            / n as f32;
        println!("{stem}: greedy equal for {same}/8, mean |Δlogit| at the top token {mean_top:.4}");
        assert!(
            mean_top <= 0.05,
            "{stem}: the top token's logit differs by {mean_top}"
        );
        assert!(
            same >= 4,
            "{stem}: greedy diverges at step {same}: {ct:?} vs {gt:?}"
        );
    }
}
