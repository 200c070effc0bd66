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
    // On a real GPU the Q8_0 experts' fixture is held to the CPU's logits instead
    // (`every_fixture_model_agrees_with_the_cpu`, tests/cuda_backend.rs), as the IQ3_S one is:
    // its golden prompts have two near-ties, margins 0.0021 and 0.0064, inside the device's
    // rounding (CUDA's `expf` and contracted multiply-adds where the software GPU has the
    // host's; its largest |Δlogit| against the reference 0.0097 on an H200, 2026-11-30), so
    // its top-1 there is 139/141 where the bar asks 140. The software GPU holds it to the bar.
    let real_gpu = kiln::backend::cuda::open().is_ok();
    let stems: Vec<&str> = MOES
        .into_iter()
        .filter(|&s| !(real_gpu && s == "random-qwen3moe-q8_0"))
        .collect();
    goldens(&stems);
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

/// The q, k and v products' RoPE epilogue (`matvec_*_rope`) against the CPU's rotation of the
/// same products: a linear position scale and frequency factors, both unlike 1, where the
/// angle rounded as (scale · θ) / factor and as the CPU's scale · (θ / factor) differ at most
/// positions. Bit for bit on the software GPU (its `cosf` and `sinf` are the CPU's); on a GPU,
/// whose `cosf` and `sinf` are CUDA's, within 1e-5 of the rotated value's magnitude.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn scaled_rope_in_the_products_epilogue_rounds_as_the_cpu() {
    use common::ops::random;
    use kiln::backend::cuda::gpu::{Arena, Arg, Layout};
    use kiln::kernels::ops::{Rope, RopeKind};
    use kiln::quant::GgmlType;

    let g = common::ops::gpu();
    let (hd, n_dims, cols, n_tok) = (32usize, 32usize, 64usize, 24usize);
    // Two query heads, a key head, a value head: rows of a warp, eight to a block.
    let (rq, rk, rv) = (2 * hd, hd, hd);
    let rows = rq + rk + rv;
    let wf = random(rows * cols, 3);
    let rb = GgmlType::Q8_0.row_bytes(cols).unwrap();
    let mut w = vec![0u8; rows * rb];
    for (src, dst) in wf.chunks_exact(cols).zip(w.chunks_exact_mut(rb)) {
        kiln::quant::quantize_row(GgmlType::Q8_0, src, dst).unwrap();
    }
    let x = random(n_tok * cols, 4);
    let ff: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + 0.3 * i as f32).collect();
    let rope = Rope::new(RopeKind::Normal, n_dims, 10000.0, 0.37, Some(ff.clone()));
    let pos: Vec<i32> = (0..n_tok as i32).map(|t| 3 * t + 1).collect();

    let mut l = Layout::default();
    let (wo, xo, xq, po, fo) = (
        l.take(w.len()),
        l.take(x.len() * 4),
        l.take(n_tok * cols / 32 * 40),
        l.take(n_tok * 4),
        l.take(ff.len() * 4),
    );
    let (plain, roped) = (l.take(n_tok * rows * 4), l.take(n_tok * rows * 4));
    let mut a = Arena::new(&g, l.bytes).unwrap();
    let s = g.default_stream();
    a.write(s, wo, &w).unwrap();
    a.write(s, xo, zerocopy::IntoBytes::as_bytes(&x[..]))
        .unwrap();
    a.write(s, po, zerocopy::IntoBytes::as_bytes(&pos[..]))
        .unwrap();
    a.write(s, fo, zerocopy::IntoBytes::as_bytes(&ff[..]))
        .unwrap();
    let n = n_tok * cols;
    let args = [Arg::P(a.ptr(xo)), Arg::P(a.ptr(xq)), Arg::L(n as i64)];
    g.launch(s, "quantize_q8_0", n.div_ceil(256) as u32, 256, &args)
        .unwrap();
    // The three matrices: rows 0.., rq.., rq + rk.. of one stack, q8_0 bytes each.
    let (w0, w1, w2) = (a.ptr(wo), a.ptr(wo + rq * rb), a.ptr(wo + (rq + rk) * rb));
    for (kernel, out) in [("matvec_q8_0", plain), ("matvec_q8_0_rope", roped)] {
        let y = a.ptr(out);
        let (y0, y1, y2) = (
            y,
            y + (n_tok * rq * 4) as u64,
            y + (n_tok * (rq + rk) * 4) as u64,
        );
        let mut args = vec![
            Arg::P(w0),
            Arg::P(w1),
            Arg::P(w2),
            Arg::P(a.ptr(xq)),
            Arg::P(y0),
            Arg::P(y1),
            Arg::P(y2),
            Arg::I(rq as i32),
            Arg::I(rk as i32),
            Arg::I(rv as i32),
            Arg::I(cols as i32),
            Arg::I(n_tok as i32),
            Arg::I(0),
            Arg::I(32),
        ];
        if kernel.ends_with("_rope") {
            let theta_scale = 10000f32.powf(-2.0 / n_dims as f32);
            args.extend([
                Arg::P(a.ptr(po)),
                Arg::P(0),
                Arg::P(0),
                Arg::P(0),
                Arg::L(0),
                Arg::L(0),
                Arg::P(a.ptr(fo)),
                Arg::F(theta_scale),
                Arg::F(0.37),
                Arg::I(hd as i32),
                Arg::I(n_dims as i32),
                Arg::I(hd as i32),
                Arg::I(256),
            ]);
        }
        g.launch(s, kernel, (rows / 8) as u32, 256, &args).unwrap();
    }
    g.synchronize(s).unwrap();
    let read = |off: usize| {
        let mut v = vec![0f32; n_tok * rows];
        a.read(s, off, zerocopy::IntoBytes::as_mut_bytes(&mut v[..]))
            .unwrap();
        v
    };
    let (plain, roped) = (read(plain), read(roped));
    let exact = g.is_emulated();
    let mut cs = vec![0f32; n_dims];
    let mut rotated = 0;
    // The outputs: q `[n_tok, rq]`, then k `[n_tok, rk]`, then v `[n_tok, rv]`.
    for (base, width, rotates) in [
        (0, rq, true),
        (n_tok * rq, rk, true),
        (n_tok * (rq + rk), rv, false),
    ] {
        for (t, &p) in pos.iter().enumerate() {
            let at = base + t * width..base + (t + 1) * width;
            let mut want = plain[at.clone()].to_vec();
            if rotates {
                rope.cos_sin(p as usize, &mut cs);
                rope.apply(&mut want, hd, &cs);
                rotated += 1;
            }
            for (i, (&got, &want)) in roped[at].iter().zip(&want).enumerate() {
                let ok = if exact {
                    got.to_bits() == want.to_bits()
                } else {
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
                };
                assert!(
                    ok,
                    "token {t} at {p}, element {i}: {got} against the CPU's {want}"
                );
            }
        }
    }
    assert_eq!(rotated, 2 * n_tok);
}
