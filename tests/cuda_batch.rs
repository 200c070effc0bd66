//! Continuous batching on the GPU: the batch runner (the engine of `kiln serve` and
//! `kiln embedding`) with every slot's KV cache in one device session, on the machine's GPU or
//! on the software GPU (see `tests/cuda_backend.rs`).
//!
//! - decode steps of many sequences give each the logits it gets alone in a GPU session, bit
//!   for bit (every op handles each row as it would handle it alone);
//! - steps mixing prefill chunks with decode tokens, a prefix copied between slots and a
//!   rollback agree with the same steps on the CPU;
//! - `kiln serve --device cuda` answers concurrent requests with the text each gets alone.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::sync::Arc;

use common::batch::prompt;
use common::gpu;
use kiln::backend::Device;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

fn runner(m: &Arc<Model>, device: Device, n_slots: usize) -> BatchRunner {
    runner_kv(m, device, n_slots, KvType::F16)
}

fn options(device: Device, n_slots: usize, kv_type: KvType) -> BatchOptions {
    BatchOptions {
        n_slots,
        n_ctx: 256,
        n_threads: 2,
        prefill_chunk: 32,
        kv_type,
        device,
        draft_max: 0,
    }
}

fn runner_kv(m: &Arc<Model>, device: Device, n_slots: usize, kv_type: KvType) -> BatchRunner {
    let o = options(device, n_slots, kv_type);
    BatchRunner::new(Arc::clone(m), o).unwrap_or_else(|e| panic!("{device:?} runner: {e}"))
}

/// Seven sequences of different lengths in slots with gaps, some sitting out from step 4 on
/// (as finished ones would): each slot's logits equal those of a GPU session fed the same
/// tokens, at every step, and the steps allocate nothing on the device.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn batched_gpu_decode_matches_gpu_sessions() {
    let _gpu = gpu("batched_gpu_decode_matches_gpu_sessions");
    for stem in ["random-llama-q4_0", "random-qwen2-q4_0"] {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        batch_matches_sessions(stem, &m, &[0, 2, 3, 5, 6, 7, 8], 9, 8);
    }
}

/// The same with the real Gemma-3, three sequences, then two: decode steps of up to four
/// rows take the products over f32 input, whose last block applies Gemma-3's post-norms and
/// residual adds for every row of the step (`matvec_*_f_post`).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn batched_gemma3_decode_matches_gpu_sessions() {
    let _gpu = gpu("batched_gemma3_decode_matches_gpu_sessions");
    let m = Arc::new(Model::load(common::real_model("gemma3")).unwrap());
    batch_matches_sessions("gemma3", &m, &[0, 1, 3], 4, 6);
}

/// Sequences in `slots` (increasing) of a runner of `n_slots`, prefilled with prompts of
/// different lengths, decoded `steps` steps (every third sits out from step 4 on), against a
/// GPU session each: the same logits bit for bit at every step, and no device allocation by
/// the steps.
fn batch_matches_sessions(
    what: &str,
    m: &Arc<Model>,
    slots: &[usize],
    n_slots: usize,
    steps: usize,
) {
    let prompts: Vec<Vec<u32>> = (0..slots.len() as u32)
        .map(|i| prompt(i, 3 + (i * 5) % 7))
        .collect();
    let mut r = runner(m, Device::Cuda, n_slots);
    let mut sessions: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut o = SessionOptions::new(256, 2);
            o.device = Device::Cuda;
            let mut s = Session::new(Arc::clone(m), o).unwrap();
            s.prefill(p, &mut |_, _| {}).unwrap();
            s
        })
        .collect();
    for (&slot, p) in slots.iter().zip(&prompts) {
        r.prefill_chunk(slot, p, true).unwrap();
    }
    let g = kiln::backend::cuda::open().unwrap();
    let before = g.allocations();
    common::batch::decode_against_sessions(what, &mut r, &mut sessions, slots, steps);
    assert_eq!(g.allocations(), before, "{what}: decode steps allocated");
}

/// The difference at the CPU's top token (refused from 0.1).
fn compare(what: &str, cpu: &[f32], gpu: &[f32]) -> f32 {
    let t = argmax(cpu) as usize;
    let d = (cpu[t] - gpu[t]).abs();
    assert!(
        d < 0.1,
        "{what}: the top token's logit is {} on the CPU, {} on the GPU",
        cpu[t],
        gpu[t]
    );
    d
}

/// The same schedule on a CPU runner and a GPU runner: a prompt, a prefix of it copied to
/// another slot and continued there as a prefill chunk beside the first slot's decode token
/// and a third slot's prompt, decode steps of all three (fed the CPU's greedy tokens), a
/// rollback and a re-prefill. Every step's logits agree (with f16 caches, and with Q8_0 caches
/// on one model).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn mixed_gpu_steps_agree_with_the_cpu() {
    let _gpu = gpu("mixed_gpu_steps_agree_with_the_cpu");
    let cases = [
        ("random-qwen3-q4_k_m", KvType::F16),
        ("random-qwen2-q4_0", KvType::F16),
        ("random-gpt2-q8_0", KvType::F16),
        ("random-llama-q4_0", KvType::Q8_0),
    ];
    for (stem, kv) in cases {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        let mut runners = [
            runner_kv(&m, Device::Cpu, 3, kv),
            runner_kv(&m, Device::Cuda, 3, kv),
        ];
        let a = prompt(1, 20);
        let mut b = a[..12].to_vec();
        b.extend(prompt(2, 9));
        let c = prompt(3, 14);
        let mut worst = 0f32;
        let mut check = |what: &str, rs: &[BatchRunner; 2], slots: &[usize]| {
            for &s in slots {
                let w = format!("{stem}: {what}, slot {s}");
                worst = worst.max(compare(&w, rs[0].logits(s), rs[1].logits(s)));
            }
        };
        for r in &mut runners {
            r.prefill_chunk(0, &a, true).unwrap();
            assert_eq!(r.copy_prefix(1, 0, 12), 12);
            assert_eq!(r.tokens(1), &a[..12]);
        }
        check("prompt", &runners, &[0]);
        let t0 = argmax(runners[0].logits(0));
        for r in &mut runners {
            r.begin_step();
            r.push_part(0, &[t0], true);
            r.push_part(1, &b[12..], true);
            r.push_part(2, &c, true);
            r.run_step().unwrap();
        }
        check("mixed step", &runners, &[0, 1, 2]);
        for step in 0..5 {
            let batch: Vec<(usize, u32)> =
                (0..3).map(|s| (s, argmax(runners[0].logits(s)))).collect();
            for r in &mut runners {
                r.decode(&batch).unwrap();
            }
            check(&format!("decode step {step}"), &runners, &[0, 1, 2]);
        }
        for r in &mut runners {
            assert_eq!(r.rollback(2, 5), 5);
            r.prefill_chunk(2, &c[5..9], true).unwrap();
            assert_eq!(r.tokens(2), &c[..9]);
        }
        check("after a rollback", &runners, &[2]);
        println!("{stem} ({kv:?} KV): largest |Δlogit| at the CPU's top token: {worst:.5}");
    }
}

/// `kiln serve --device cuda --parallel 3` on the software GPU (`$KILN_CUDA_EMULATOR`): three
/// concurrent greedy completions each get the text a one-sequence GPU server gives it alone.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn serve_on_the_software_gpu() {
    let lib = common::emulator_lib().unwrap_or_else(|why| panic!("no software GPU here: {why}"));
    let lib = lib.to_string_lossy().into_owned();
    let model = common::random_model("random-llama-q4_0");
    let env = [("KILN_CUDA_EMULATOR", lib.as_str())];
    let prompts = [
        "Once upon a time",
        "The quick brown fox",
        "In the beginning",
    ];
    let body = |p: &str| {
        format!(r#"{{"prompt": "{p}", "max_tokens": 10, "temperature": 0, "ignore_eos": true}}"#)
    };
    let text = |a: harness::Answer| {
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let line = "kiln: listening on ";
    let alone: Vec<String> = {
        let s = harness::Server::start_with(
            &model,
            &["--device", "cuda", "--parallel", "1"],
            &env,
            line,
        );
        prompts
            .iter()
            .map(|p| text(s.request("POST", "/v1/completions", &[], &body(p))))
            .collect()
    };
    let s =
        harness::Server::start_with(&model, &["--device", "cuda", "--parallel", "3"], &env, line);
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (s, b) = (&s, body(p));
                sc.spawn(move || text(s.request("POST", "/v1/completions", &[], &b)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone, "texts of concurrent requests on the GPU");
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
}

/// `kiln plan --device cuda --parallel 3` is what a three-slot runner allocates on the device
/// (weights, every slot's cache, the rows of a chunk beside a token per slot), and with
/// `--draft-max 5` beside them each slot's five verification rows and the head's five more.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn device_plan_of_a_server() {
    let _gpu = gpu("device_plan_of_a_server");
    let g = kiln::backend::cuda::open().unwrap();
    let m = Arc::new(Model::load(common::random_model("random-qwen3-q4_k_m")).unwrap());
    let mut o = SessionOptions::new(256, 2);
    o.prefill_chunk = 32;
    for drafts in [0, 5] {
        let p = kiln::engine::plan::device_plan(&m.file, &o, 3, drafts).unwrap();
        let (_, before) = g.allocations();
        let r = BatchRunner::new(
            Arc::clone(&m),
            BatchOptions {
                draft_max: drafts,
                ..options(Device::Cuda, 3, KvType::F16)
            },
        )
        .unwrap();
        let (_, after) = g.allocations();
        assert_eq!(
            (after - before) as u64,
            p.total_bytes,
            "allocated vs plan, {drafts} drafts"
        );
        let kv = p.components.iter().find(|c| c.name == "kv cache (device)");
        assert_eq!(kv.map(|c| c.bytes), Some(r.kv_bytes() as u64));
    }
}

/// Greedy steps of several rows on the GPU take the device's argmax (one id a row crosses the
/// bus): the tokens sampled from the logits brought to the host.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn greedy_gpu_steps_take_the_devices_argmax() {
    let _gpu = gpu("greedy_gpu_steps_take_the_devices_argmax");
    let stem = "random-llama-q4_0";
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = kiln::tokenizer::Tokenizer::from_gguf(&m.file).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(i, 5 + 7 * i)).collect();
    let mut make = || runner(&m, Device::Cuda, 3);
    common::batch::argmax_agrees_with_the_host(stem, &mut make, &tok, &prompts, 8);
}
