//! KV offload on the GPU (`--kv-budget` with `--device cuda`): the cache in page-locked host
//! memory, a ring of layers on the device. On the machine's GPU, or on the software GPU where
//! there is none (see `tests/cuda_backend.rs`).
//!
//! - the logits of chunked prompts, decode steps, a rollback and more steps are bit-identical
//!   to a session whose cache is all on the device, for rings that divide the layers and
//!   rings that do not, f16 and Q8_0 caches, and a Gemma-3 whose sliding-window layers keep
//!   their rings on the device while its global layers stream;
//! - the device holds only the ring, decode steps allocate nothing, and the device plan says
//!   both sizes.

mod common;

use std::sync::Arc;

use common::gpu;
use kiln::backend::cuda::exec::OnCuda;
use kiln::backend::{cuda, Device};
use kiln::cache::KvType;
use kiln::engine::plan::{device_plan, HOST_KV};
use kiln::engine::session::kv_layout;
use kiln::engine::{Session, SessionOptions};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::Model;
use kiln::sampler::argmax;

const CTX: usize = 256;

fn options(ty: KvType, budget: Option<usize>) -> SessionOptions {
    let mut o = SessionOptions::new(CTX, 2);
    o.prefill_chunk = 64;
    o.device = Device::Cuda;
    o.kv_type = ty;
    o.kv_budget = budget;
    o
}

fn session(m: &Arc<Model>, ty: KvType, budget: Option<usize>) -> Session {
    Session::new(Arc::clone(m), options(ty, budget)).unwrap_or_else(|e| panic!("session: {e}"))
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// A budget that holds `ring` layers of the cache and half of another.
fn budget(m: &Model, ty: KvType, ring: usize) -> usize {
    let slot = kv_layout(&m.config, &options(ty, None)).layer_kv_bytes(ty);
    ring * slot + slot / 2
}

/// Prefill `prompt` (in chunks), decode `steps` greedy tokens, go back to `keep` positions
/// and decode `steps` more from there: every logits vector, as bits.
fn trace(s: &mut Session, prompt: &[u32], steps: usize, keep: usize) -> Vec<Vec<u32>> {
    let mut out = vec![bits(s.prefill(prompt, &mut |_, _| {}).unwrap())];
    for _ in 0..steps {
        let t = argmax(s.logits());
        out.push(bits(s.decode(t).unwrap()));
    }
    s.rollback(keep);
    out.push(bits(
        s.prefill(&prompt[keep..keep + 3], &mut |_, _| {}).unwrap(),
    ));
    for _ in 0..steps {
        let t = argmax(s.logits());
        out.push(bits(s.decode(t).unwrap()));
    }
    out
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn offloaded_device_cache_is_bit_identical() {
    let _gpu = gpu("offloaded_device_cache_is_bit_identical");
    for (stem, ty) in [
        ("random-llama-q4_0", KvType::F16),
        ("random-qwen3-q4_k_m", KvType::Q8_0),
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        let vocab = m.config.vocab_size as u32;
        let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7 + 3) % vocab).collect();
        let mut resident = session(&m, ty, None);
        let want = trace(&mut resident, &prompt, 6, 140);
        let whole = resident.cuda().unwrap().kv_bytes();
        assert_eq!(resident.cuda().unwrap().host_kv_bytes(), 0);
        // 4 layers: a ring of 2 divides them, a ring of 3 does not (a layer's slot moves
        // from step to step).
        for ring in [2, 3] {
            let mut off = session(&m, ty, Some(budget(&m, ty, ring)));
            let s = off.cuda().unwrap();
            assert_eq!(
                s.host_kv_bytes(),
                whole,
                "{stem}: the whole cache in host memory"
            );
            assert!(
                s.kv_bytes() <= budget(&m, ty, ring) && s.kv_bytes() < whole,
                "{stem}: the device holds {} bytes of a {whole}-byte cache",
                s.kv_bytes()
            );
            let got = trace(&mut off, &prompt, 6, 140);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "{stem} {ty} ring {ring}: logits {i} differ");
            }
            assert_eq!(got.len(), want.len());
        }
    }
}

/// A Gemma-3 of 18 layers made from the random Qwen-3 (whose per-head q/k norms it shares):
/// its blocks repeated, post-norms of ones, a sliding window of 40, so layers 5, 11 and 17
/// attend the whole context and the others keep rings.
fn windowed_model() -> Arc<Model> {
    let f = GgufFile::open(common::random_model("random-qwen3-f32")).unwrap();
    let mut src = GgufWriter::from_file(&f);
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        let k = k
            .strip_prefix("qwen3.")
            .map_or(k.clone(), |r| format!("gemma3.{r}"));
        w.add(k, v.clone());
    }
    w.set("general.architecture", "gemma3");
    w.set("gemma3.block_count", 18u32);
    w.set("gemma3.attention.sliding_window", 40u32);
    let dim = m_dim(&f);
    let tensors = std::mem::take(src.tensors_mut());
    for t in tensors.iter().filter(|t| !t.name.starts_with("blk.")) {
        w.add_raw_tensor(t.clone());
    }
    for i in 0..18 {
        let from = format!("blk.{}.", i % 4);
        for t in tensors.iter().filter(|t| t.name.starts_with(&from)) {
            let mut t = t.clone();
            t.name = t.name.replacen(&from, &format!("blk.{i}."), 1);
            w.add_raw_tensor(t);
        }
        for norm in ["post_attention_norm", "post_ffw_norm"] {
            w.add_f32_tensor(format!("blk.{i}.{norm}.weight"), &[dim], &vec![1.0; dim]);
        }
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Arc::new(Model::from_gguf(file).unwrap())
}

fn m_dim(f: &GgufFile) -> usize {
    kiln::model::read_config(f).unwrap().0.dim
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn sliding_window_rings_stay_on_the_device() {
    let _gpu = gpu("sliding_window_rings_stay_on_the_device");
    let m = windowed_model();
    let layout = kv_layout(&m.config, &options(KvType::F16, None));
    assert_eq!(layout.n_full_layers(), 3);
    assert!(
        layout.ring_rows(0).is_some_and(|r| r < CTX),
        "layer 0 keeps a ring"
    );
    let vocab = m.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 5 + 1) % vocab).collect();
    let mut resident = session(&m, KvType::F16, None);
    let want = trace(&mut resident, &prompt, 6, 140);
    let whole = resident.cuda().unwrap().kv_bytes();
    // Two slots for the three global layers.
    let budget = layout.ring_kv_bytes(KvType::F16) + 2 * layout.layer_kv_bytes(KvType::F16) + 1;
    let mut off = session(&m, KvType::F16, Some(budget));
    let s = off.cuda().unwrap();
    let full = 3 * layout.layer_kv_bytes(KvType::F16);
    assert_eq!(s.host_kv_bytes(), full, "the global layers in host memory");
    assert!(s.kv_bytes() <= budget && s.kv_bytes() < whole);
    assert_eq!(
        s.kv_bytes() + full,
        whole + 2 * layout.layer_kv_bytes(KvType::F16)
    );
    let got = trace(&mut off, &prompt, 6, 140);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "windowed model: logits {i} differ");
    }
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn offloaded_decode_allocates_nothing_and_the_plan_says_both_sizes() {
    let _gpu = gpu("offloaded_decode_allocates_nothing_and_the_plan_says_both_sizes");
    let path = common::random_model("random-llama-q4_0");
    let m = Arc::new(Model::load(&path).unwrap());
    let ty = KvType::F16;
    let opts = options(ty, Some(budget(&m, ty, 2)));
    let mut s = Session::new(Arc::clone(&m), opts).unwrap();
    s.prefill(&[1, 2, 3, 4, 5], &mut |_, _| {}).unwrap();
    s.decode(6).unwrap();
    let gpu = cuda::open().unwrap();
    let before = gpu.allocations();
    for t in 7..30 {
        s.decode(t).unwrap();
    }
    assert_eq!(
        gpu.allocations(),
        before,
        "decode steps allocated device memory"
    );

    let file = kiln::gguf::GgufFile::open(&path).unwrap();
    let plan = device_plan(&file, &opts, 1, 0).unwrap();
    let dev = plan.get("kv cache (device)").unwrap();
    let host = plan.get(HOST_KV).unwrap();
    let c = s.cuda().unwrap();
    assert_eq!(dev.bytes, c.kv_bytes() as u64);
    assert_eq!(host.bytes, c.host_kv_bytes() as u64);
    let device_sum: u64 = plan
        .components
        .iter()
        .filter(|c| c.name != HOST_KV)
        .map(|c| c.bytes)
        .sum();
    assert_eq!(
        plan.total_bytes, device_sum,
        "host memory is not in the device total"
    );

    // Without a budget the plan has no host part.
    let plain = device_plan(&file, &options(ty, None), 1, 0).unwrap();
    assert!(plain.get(HOST_KV).is_none());
    assert_eq!(plain.get("kv cache (device)").unwrap().bytes, host.bytes);
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn a_budget_below_two_layers_is_refused() {
    let _gpu = gpu("a_budget_below_two_layers_is_refused");
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let small = budget(&m, KvType::F16, 1);
    match Session::new(Arc::clone(&m), options(KvType::F16, Some(small))) {
        Ok(_) => panic!("a ring of one layer was accepted"),
        Err(e) => assert!(e.to_string().contains("budget"), "{e}"),
    }
}
