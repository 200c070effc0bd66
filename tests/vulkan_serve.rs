//! Continuous batching on the Vulkan executor (the engine of `kiln serve --device vulkan`),
//! on the machine's Vulkan device (Mesa's lavapipe where there is no GPU):
//!
//! - a decode step of three slots gives each the logits it gets alone in a Vulkan session, bit
//!   for bit (every op handles each row as it would handle it alone);
//! - a request sharing a prompt prefix with one already in a slot takes that prefix's keys and
//!   values over (copied between slots on the device) and decodes what it decodes without;
//! - `kiln serve --device vulkan --parallel 3` answers concurrent requests with the text each
//!   gets alone.
//!
//! Where no Vulkan driver is present the tests install Mesa's with apt-get when they run as
//! root, and otherwise fail saying what to install; they are ignored only off Linux.

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use common::batch::{prompt, Ids};
use kiln::backend::Device;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::scheduler::{SchedMetrics, Scheduler, SeqRequest};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

fn load(stem: &str) -> Arc<Model> {
    Arc::new(Model::load(common::random_model(stem)).expect("load"))
}

fn runner(m: &Arc<Model>, n_slots: usize) -> BatchRunner {
    let o = BatchOptions {
        n_slots,
        n_ctx: 128,
        n_threads: 2,
        prefill_chunk: 32,
        kv_type: KvType::F16,
        device: Device::Vulkan,
        draft_max: 0,
    };
    BatchRunner::new(Arc::clone(m), o).unwrap_or_else(|e| panic!("Vulkan runner: {e}"))
}

/// Three sequences of different lengths in the three slots of a runner, decoded together
/// (the second sitting out from step 4 on, as a finished one would), against a Vulkan
/// session each: the same logits bit for bit at every step.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn batched_vulkan_decode_matches_vulkan_sessions() {
    common::cli::vulkan_device();
    for stem in ["random-llama-f16", "random-llama-q4_0"] {
        let m = load(stem);
        let slots = [0usize, 1, 2];
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, 3 + (i * 5) % 7)).collect();
        let mut r = runner(&m, 3);
        let mut sessions: Vec<Session> = prompts
            .iter()
            .map(|p| {
                let mut o = SessionOptions::new(128, 2);
                o.device = Device::Vulkan;
                let mut s = Session::new(Arc::clone(&m), o).unwrap();
                s.prefill(p, &mut |_, _| {}).unwrap();
                s
            })
            .collect();
        for (&slot, p) in slots.iter().zip(&prompts) {
            r.prefill_chunk(slot, p, true).unwrap();
        }
        common::batch::decode_against_sessions(stem, &mut r, &mut sessions, &slots, 8);
    }
}

fn request(
    prompt: &[u32],
    max_new: usize,
    cache_prompt: bool,
) -> (Arc<Mutex<Vec<u32>>>, SeqRequest) {
    let ids = Arc::new(Mutex::new(Vec::new()));
    let req = SeqRequest {
        prompt: prompt.to_vec(),
        max_new,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        code: Default::default(),
        cache_prompt,
        tenant: 0,
        ignore_eos: true,
        grammar: None,
        logprobs: None,
        forks: Vec::new(),
        embed: None,
        score: None,
        sink: Box::new(Ids(Arc::clone(&ids))),
    };
    (ids, req)
}

/// Request A runs in one slot; while it decodes, request B (A's prompt's first ten tokens,
/// then its own) arrives: with the prompt cache B takes those ten positions over from A's
/// slot (a device copy into its own) and prefills only the rest. Both decode exactly the
/// tokens they decode with no reuse (their prompts are short enough that every pass takes the
/// decode products, which compute each row as alone: the same bits however the prompt is
/// split).
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn a_shared_prefix_is_copied_between_vulkan_slots() {
    common::cli::vulkan_device();
    let m = load("random-llama-f16");
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let a = prompt(1, 13);
    let b = [&a[..10], &prompt(7, 4)[..]].concat();
    let run = |cache_prompt: bool| {
        let metrics = Arc::new(SchedMetrics::default());
        let mut sched = Scheduler::new(runner(&m, 2), &tok, Arc::clone(&metrics));
        let (ia, ra) = request(&a, 12, cache_prompt);
        sched.submit(ra);
        // A's prompt is in its slot, and it is decoding.
        while ia.lock().unwrap().len() < 2 {
            sched.step();
        }
        let (ib, rb) = request(&b, 8, cache_prompt);
        sched.submit(rb);
        while !sched.is_idle() {
            sched.step();
        }
        let ids = [ia, ib].map(|i| i.lock().unwrap().clone());
        (ids, metrics)
    };
    let (cold, cm) = run(false);
    let (warm, wm) = run(true);
    assert_eq!(cm.prefix_hits.load(Relaxed), 0);
    assert_eq!(wm.prefix_hits.load(Relaxed), 1, "B reused A's prefix");
    assert_eq!(wm.prefill_tokens_saved.load(Relaxed), 10);
    assert_eq!(
        cm.prefill_tokens.load(Relaxed) - wm.prefill_tokens.load(Relaxed),
        10,
        "B prefilled only its own tokens"
    );
    assert_eq!((cold[0].len(), cold[1].len()), (12, 8));
    assert_eq!(warm, cold, "tokens with the prefix copied == without");
}

/// `kiln serve --device vulkan --parallel 3`: three concurrent greedy completions each get the
/// text a one-sequence Vulkan server gives it alone.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn serve_on_vulkan() {
    common::cli::vulkan_device();
    let model = common::random_model("random-llama-q4_0");
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
    let alone: Vec<String> = {
        let s = harness::Server::start(&model, &["--device", "vulkan", "--parallel", "1"]);
        prompts
            .iter()
            .map(|p| text(s.request("POST", "/v1/completions", &[], &body(p))))
            .collect()
    };
    let s = harness::Server::start(&model, &["--device", "vulkan", "--parallel", "3"]);
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
    assert_eq!(together, alone, "texts of concurrent requests on Vulkan");
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
}
