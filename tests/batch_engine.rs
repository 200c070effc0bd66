//! Continuous batching without HTTP: a batched decode step gives each sequence exactly the
//! logits it would get alone, the scheduler's greedy output equals a single session's greedy
//! decoding, and the prefix cache prefills only new tokens.

mod common;

use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::scheduler::{
    FinishReason, SchedMetrics, Scheduler, SeqEvent, SeqRequest, SeqSink,
};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};
use kiln::tokenizer::{StreamDecoder, Tokenizer};

fn opts(n_slots: usize) -> BatchOptions {
    opts_kv(n_slots, KvType::F16)
}

fn opts_kv(n_slots: usize, kv_type: KvType) -> BatchOptions {
    BatchOptions {
        n_slots,
        n_ctx: 256,
        n_threads: 2,
        prefill_chunk: 512,
        kv_type,
        device: Default::default(),
        draft_max: 0,
    }
}

/// Nine sequences of different lengths decoded together (slots with gaps; some sit out from
/// step 4 on, as finished ones would), step by step, against each decoded alone in its own
/// session: logits equal bit for bit. Nine rows exercise every batch-size-dependent kernel
/// path (Q4_K groups of four, Q6_K tiles from eight rows).
fn batched_decode_matches_sessions(stem: &str, kv_type: KvType) {
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let prompts: Vec<Vec<u32>> = (0..9u32)
        .map(|i| {
            (0..3 + (i * 5) % 7)
                .map(|j| 1 + (i * 31 + j * 17) % 250)
                .collect()
        })
        .collect();
    let mut runner = BatchRunner::new(Arc::clone(&m), opts_kv(12, kv_type)).unwrap();
    let mut sessions: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut so = SessionOptions::new(256, 2);
            so.kv_type = kv_type;
            let mut s = Session::new(Arc::clone(&m), so).unwrap();
            s.prefill(p, &mut |_, _| {}).unwrap();
            s
        })
        .collect();
    let slots = [0usize, 2, 3, 4, 5, 7, 8, 10, 11];
    for (&slot, p) in slots.iter().zip(&prompts) {
        runner.prefill_chunk(slot, p, true).unwrap();
    }
    common::batch::decode_against_sessions(stem, &mut runner, &mut sessions, &slots, 10);
}

#[test]
fn batched_decode_is_bit_identical_to_single_sequences() {
    for stem in [
        "random-llama-q4_1",
        "random-llama-q8_0",
        "random-llama-q4_k",
        "random-llama-q6_k",
        "random-llama-iq4_xs",
        "random-llama-f16",
        "random-gpt2-q8_0",
        "random-qwen3-q4_k_m",
    ] {
        batched_decode_matches_sessions(stem, KvType::F16);
    }
    batched_decode_matches_sessions("random-llama-q4_1", KvType::Q8_0);
}

type EventLog = Arc<Mutex<Vec<SeqEvent>>>;
type Sink = Box<dyn SeqSink>;

/// Collects a request's events.
fn collector() -> (EventLog, Sink) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = Arc::clone(&events);
    (
        events,
        Box::new(move |ev: SeqEvent| {
            e.lock().unwrap().push(ev);
            true
        }),
    )
}

/// A greedy request with a collecting sink; returns its event log.
fn greedy_request(prompt: &[u32], max_new: usize, stop: &[&str]) -> (EventLog, SeqRequest) {
    let (log, sink) = collector();
    let req = SeqRequest {
        grammar: None,
        logprobs: None,
        forks: Vec::new(),
        embed: None,
        score: None,
        prompt: prompt.to_vec(),
        max_new,
        sampler: SamplerConfig::greedy(),
        stop: stop.iter().map(|s| s.to_string()).collect(),
        code: Default::default(),
        cache_prompt: true,
        tenant: 0,
        ignore_eos: false,
        sink,
    };
    (log, req)
}

/// Step the scheduler until every request has finished.
fn drain(sched: &mut Scheduler<'_>) {
    while !sched.is_idle() {
        sched.step();
    }
}

fn text_of(events: &[SeqEvent]) -> (String, FinishReason) {
    let mut text = String::new();
    for e in events {
        match e {
            SeqEvent::Text(t) => text.push_str(t),
            SeqEvent::Done(f) => return (text, f.reason.clone()),
        }
    }
    panic!("request did not finish");
}

fn sequential(m: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize) -> String {
    sequential_ids(m, tok, prompt, n).0
}

/// Greedy decoding of `n` tokens after `prompt` in a session of its own, one token at a time:
/// the text (through a stream decoder, as generation decodes it) and the ids, up to an end of
/// generation.
fn sequential_ids(m: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize) -> (String, Vec<u32>) {
    let mut ids = Vec::new();
    let mut s = Session::new(Arc::clone(m), SessionOptions::new(512, 2)).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), m.config.vocab_size);
    let mut stream = StreamDecoder::new(tok);
    let mut out = String::new();
    s.prefill(prompt, &mut |_, _| {}).unwrap();
    while ids.len() < n {
        let t = sampler.sample(s.logits(), s.tokens());
        if tok.is_eog(t) {
            break;
        }
        ids.push(t);
        out.push_str(&stream.push(t).unwrap_or_default());
        s.decode(t).unwrap();
    }
    out.push_str(&stream.flush().unwrap_or_default());
    (out, ids)
}

#[test]
fn scheduler_greedy_equals_sequential_generation_and_reuses_prefixes() {
    let path = common::real_model("smollm2");
    let m = Arc::new(Model::load(&path).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let texts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "The three primary colors are",
        "To make a cup of tea, first",
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t, true, false)).collect();
    let n_new = 24;
    let expected: Vec<String> = prompts
        .iter()
        .map(|p| sequential(&m, &tok, p, n_new))
        .collect();

    let metrics = Arc::new(SchedMetrics::default());
    let runner = BatchRunner::new(
        Arc::clone(&m),
        BatchOptions {
            n_slots: 3,
            n_ctx: 512,
            n_threads: 2,
            prefill_chunk: 512,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap();
    let mut sched = Scheduler::new(runner, &tok, Arc::clone(&metrics));
    // Five requests on three slots: two wait, then join as others finish.
    let mut logs = Vec::new();
    for p in &prompts {
        let (log, req) = greedy_request(p, n_new, &[]);
        sched.submit(req);
        logs.push(log);
    }
    drain(&mut sched);
    for (i, log) in logs.iter().enumerate() {
        let (text, reason) = text_of(&log.lock().unwrap());
        assert_eq!(text, expected[i], "request {i}");
        assert_eq!(reason, FinishReason::Length);
    }
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(metrics.requests_finished.load(Relaxed), 5);
    assert!(
        metrics.decode_steps.load(Relaxed) < 5 * n_new as u64,
        "steps were batched"
    );
    // Greedy rows with nothing reading their logits: every token was the executor's argmax,
    // in steps of several rows.
    assert_eq!(
        metrics.argmax_tokens.load(Relaxed),
        metrics.generated_tokens.load(Relaxed)
    );

    // A second turn that extends the first prompt prefills only its new tokens.
    let first_turn = [
        prompts[0].clone(),
        sequential_ids(&m, &tok, &prompts[0], n_new).1,
    ]
    .concat();
    let more = tok.encode(" And the capital of Italy is", false, false);
    let second = [first_turn.clone(), more.clone()].concat();
    // (The five requests above evicted the first one's slot, least recently used first; run
    // the first turn again so that the second follows it as in a chat.)
    let (log, req) = greedy_request(&prompts[0], n_new, &[]);
    sched.submit(req);
    drain(&mut sched);
    assert_eq!(text_of(&log.lock().unwrap()).0, expected[0]);
    let before = metrics.prefill_tokens.load(Relaxed);
    let (log, req) = greedy_request(&second, 16, &[]);
    sched.submit(req);
    drain(&mut sched);
    let evaluated = metrics.prefill_tokens.load(Relaxed) - before;
    // The slot holds the prompt and all generated tokens but the last (never evaluated).
    assert!(
        evaluated <= more.len() as u64 + 1,
        "prefilled {evaluated} tokens for {} new",
        more.len()
    );
    assert!(metrics.prefix_hits.load(Relaxed) >= 1);
    let (text, _) = text_of(&log.lock().unwrap());
    assert_eq!(text, sequential(&m, &tok, &second, 16), "warm == cold");
}

#[test]
fn stop_sequences_cut_the_output_and_cancel_frees_the_slot() {
    let m = Arc::new(Model::load(common::real_model("smollm2")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let prompt = tok.encode("1, 2, 3, 4, 5,", true, false);
    let full = sequential(&m, &tok, &prompt, 20);
    // Stop at the first occurrence of a piece of the known continuation.
    let stop = full[3..6].to_string();
    let cut = &full[..full.find(&stop).unwrap()];

    let metrics = Arc::new(SchedMetrics::default());
    let runner = BatchRunner::new(Arc::clone(&m), opts(2)).unwrap();
    let mut sched = Scheduler::new(runner, &tok, Arc::clone(&metrics));
    let (log, req) = greedy_request(&prompt, 20, &[stop.as_str()]);
    sched.submit(req);
    // A request whose receiver is gone after three events.
    let mut seen = 0;
    let (_, mut req) = greedy_request(&prompt, 200, &[]);
    req.sink = Box::new(move |_: SeqEvent| {
        seen += 1;
        seen < 3
    });
    sched.submit(req);
    drain(&mut sched);
    let (text, reason) = text_of(&log.lock().unwrap());
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(text, cut, "stop sequence {stop:?} in {full:?}");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(metrics.requests_cancelled.load(Relaxed), 1);
    assert_eq!(metrics.slots_in_use.load(Relaxed), 0);
}

/// A step carrying prompt pieces beside the decode rows (chunked prefill in `kiln serve`):
/// the output head then runs over only the step's logit rows, one per sequence, and each must
/// still get the bits it gets alone. Nine decode rows (every batch-size-dependent kernel path
/// of the K-quant heads) beside two prompt pieces, one ending its prompt (logits) and one not.
#[test]
fn mixed_steps_give_every_logit_row_its_own_bits() {
    for stem in [
        "random-llama-q4_k",
        "random-llama-q6_k",
        "random-qwen3-q4_k_m",
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let prompt = |i: u32| -> Vec<u32> {
            (0..3 + (i * 5) % 7)
                .map(|j| 1 + (i * 31 + j * 17) % 250)
                .collect()
        };
        let session = |p: &[u32]| {
            let mut s = Session::new(Arc::clone(&m), SessionOptions::new(256, 2)).unwrap();
            s.prefill(p, &mut |_, _| {}).unwrap();
            s
        };
        let decoding = [0usize, 2, 3, 4, 5, 7, 8, 10, 11];
        let mut runner = BatchRunner::new(Arc::clone(&m), opts(12)).unwrap();
        let mut sessions = Vec::new();
        for (i, &slot) in decoding.iter().enumerate() {
            let p = prompt(i as u32);
            runner.prefill_chunk(slot, &p, true).unwrap();
            sessions.push(session(&p));
        }
        // Slot 1's prompt in two pieces over two steps, slot 6's in one, each beside every
        // decode row.
        let long: Vec<u32> = (0..24).map(|j| 3 + (j * 7) % 200).collect();
        let short = prompt(20);
        for step in 0..2 {
            runner.begin_step();
            let mut tokens = Vec::new();
            for (i, &slot) in decoding.iter().enumerate() {
                if slot == 2 {
                    let piece = &long[12 * step..12 * (step + 1)];
                    runner.push_part(1, piece, step == 1);
                }
                if slot == 7 && step == 1 {
                    runner.push_part(6, &short, true);
                }
                let t = kiln::sampler::argmax(runner.logits(slot));
                runner.push_part(slot, &[t], true);
                tokens.push(t);
                sessions[i].decode(t).unwrap();
            }
            runner.run_step().unwrap();
            for (i, &slot) in decoding.iter().enumerate() {
                assert_eq!(
                    runner.logits(slot),
                    sessions[i].logits(),
                    "{stem}: decode slot {slot} step {step}"
                );
            }
        }
        assert_eq!(runner.logits(1), session(&long).logits(), "{stem}: slot 1");
        assert_eq!(runner.logits(6), session(&short).logits(), "{stem}: slot 6");
    }
}

/// Greedy steps of several rows with nothing reading their logits take the executor's argmax:
/// the tokens sampled from the logits on the host, on three slots (rows of several sequences,
/// prompts finishing beside decode rows).
#[test]
fn greedy_steps_take_the_executors_argmax() {
    for stem in ["random-llama-q8_0", "random-qwen3-q4_k_m"] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let prompts: Vec<Vec<u32>> = (0..4u32)
            .map(|i| {
                (0..5 + 7 * i)
                    .map(|j| 1 + (i * 31 + j * 17) % 200)
                    .collect()
            })
            .collect();
        let mut make = || BatchRunner::new(Arc::clone(&m), opts(3)).unwrap();
        common::batch::argmax_agrees_with_the_host(stem, &mut make, &tok, &prompts, 12);
    }
}
