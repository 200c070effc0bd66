//! Speculative decoding in the continuous-batching scheduler (`kiln serve --spec-type
//! ngram-simple`, or `-md DRAFT`): every request gets the tokens, text, log-probabilities and finish reason it
//! gets without speculation (greedy and seeded, beside other sequences and prompt pieces,
//! through the token limit, stop sequences, the end of the context and a sliding window), and
//! drafts are verified and kept; on the CPU, and on the GPU (or the software GPU).

mod common;
#[path = "server/harness.rs"]
mod harness;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use kiln::backend::Device;
use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::logprobs::TokenLogprobs;
use kiln::engine::scheduler::{
    FinishReason, Finished, Fork, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::engine::slot_drafter::SlotDrafter;
use kiln::engine::speculative::NgramDrafter;
use kiln::grammar::{GrammarEngine, GrammarSpec};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

/// A token's log-probability and its alternatives', as bits: `(token, logprob, top)`.
type LogprobBits = (u32, u32, Vec<(u32, u32)>);

/// What a request produced.
#[derive(Clone, Debug, Default, PartialEq)]
struct Out {
    ids: Vec<u32>,
    text: String,
    /// Each token's log-probability and alternatives, as bits.
    logprobs: Vec<LogprobBits>,
    reason: Option<FinishReason>,
    completion_tokens: usize,
}

struct Collect(Arc<Mutex<Out>>);

impl SeqSink for Collect {
    fn text(&mut self, text: &str) -> bool {
        self.0.lock().unwrap().text.push_str(text);
        true
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().ids.push(id);
    }
    fn logprobs(&mut self, lp: &TokenLogprobs) {
        let top = lp.top.iter().map(|&(t, p)| (t, p.to_bits())).collect();
        let mut o = self.0.lock().unwrap();
        o.logprobs.push((lp.token, lp.logprob.to_bits(), top));
    }
    fn done(&mut self, f: Finished) {
        let mut o = self.0.lock().unwrap();
        o.reason = Some(f.reason);
        o.completion_tokens = f.usage.completion_tokens;
    }
}

/// One request of a test.
#[derive(Clone)]
struct Req {
    prompt: Vec<u32>,
    max_new: usize,
    seeded: bool,
    /// A greedy request's repetition penalty over its last 8 tokens.
    penalty: bool,
    stop: Vec<String>,
    ignore_eos: bool,
    logprobs: Option<usize>,
    /// A GBNF grammar the request decodes under (plainly: no drafts).
    grammar: Option<&'static str>,
    /// A second choice of the same prompt (`n: 2`), seeded or greedy: its output follows
    /// the requests'.
    fork: Option<bool>,
    /// `logit_bias`, added to the logits of every row the request samples.
    bias: Vec<(u32, f32)>,
}

impl Req {
    fn new(prompt: Vec<u32>, max_new: usize) -> Req {
        Req {
            prompt,
            max_new,
            seeded: false,
            penalty: false,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            grammar: None,
            fork: None,
            bias: Vec::new(),
        }
    }
}

fn sampler(seeded: bool, penalty: bool, i: usize) -> SamplerConfig {
    if penalty {
        // The last 8 tokens before each verified row, not the drafts after it: copying
        // text, those drafts are the very tokens the row would otherwise penalize.
        return SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: 8,
            ..SamplerConfig::greedy()
        };
    }
    if seeded {
        SamplerConfig {
            seed: 77 + i as u64,
            temperature: 0.9,
            // Penalties over the history: each verified row must see its own (the frequency
            // penalty counts every occurrence, so a later draft in the history would show).
            repeat_penalty: 1.2,
            frequency_penalty: 0.5,
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    }
}

struct Setup {
    slots: usize,
    n_ctx: usize,
    chunk: usize,
    /// Drafts a pass (0: no speculation).
    draft_max: usize,
    /// Fewer drafts than this are not verified.
    draft_min: usize,
    kv_type: KvType,
    /// A draft model (a random model's stem) guessing instead of prompt lookup, and its
    /// `--draft-p-min`.
    draft: Option<(&'static str, f32)>,
    device: Device,
}

impl Setup {
    fn new(slots: usize, n_ctx: usize, chunk: usize, draft_max: usize) -> Setup {
        Setup {
            slots,
            n_ctx,
            chunk,
            draft_max,
            draft_min: 1,
            kv_type: KvType::F16,
            draft: None,
            device: Device::Cpu,
        }
    }
}

fn options(s: &Setup) -> BatchOptions {
    BatchOptions {
        n_slots: s.slots,
        n_ctx: s.n_ctx,
        n_threads: 2,
        prefill_chunk: s.chunk,
        kv_type: s.kv_type,
        device: s.device,
        draft_max: s.draft_max,
    }
}

/// Serve `reqs` (all queued at once) and return each one's output and the metrics.
fn serve(
    m: &Arc<Model>,
    tok: &Tokenizer,
    s: &Setup,
    reqs: &[Req],
) -> (Vec<Out>, Arc<SchedMetrics>) {
    let runner = BatchRunner::new(Arc::clone(m), options(s)).unwrap();
    let drafter = s.draft.map(|(stem, p_min)| {
        let d = Arc::new(Model::load(common::random_model(stem)).expect("load the draft"));
        let opts = BatchOptions {
            draft_max: 0,
            ..options(s)
        };
        SlotDrafter::new(BatchRunner::new(d, opts).unwrap(), &runner, p_min).unwrap()
    });
    let metrics = Arc::new(SchedMetrics::default());
    let mut sched = Scheduler::new(runner, tok, Arc::clone(&metrics));
    match drafter {
        None => sched.speculate(NgramDrafter::new(2, 2), s.draft_min),
        Some(d) => sched.speculate(d, s.draft_min),
    }
    let engine = GrammarEngine::from_tokenizer(tok).unwrap();
    let grammar =
        |g: Option<&str>| g.map(|g| engine.compile(&GrammarSpec::from_grammar_text(g)).unwrap());
    let outs: Vec<Arc<Mutex<Out>>> = reqs.iter().map(|_| Arc::default()).collect();
    let mut fork_outs: Vec<Arc<Mutex<Out>>> = Vec::new();
    for (i, (r, o)) in reqs.iter().zip(&outs).enumerate() {
        let forks = r
            .fork
            .map(|seeded| {
                let out = Arc::default();
                fork_outs.push(Arc::clone(&out));
                Fork {
                    sampler: sampler(seeded, false, 100 + i),
                    grammar: None,
                    sink: Box::new(Collect(out)),
                }
            })
            .into_iter()
            .collect();
        sched.submit(SeqRequest {
            prompt: r.prompt.clone(),
            max_new: r.max_new,
            sampler: SamplerConfig {
                logit_bias: r.bias.clone(),
                ..sampler(r.seeded, r.penalty, i)
            },
            stop: r.stop.clone(),
            code: Default::default(),
            cache_prompt: true,
            tenant: 0,
            ignore_eos: r.ignore_eos,
            grammar: grammar(r.grammar),
            logprobs: r.logprobs,
            forks,
            embed: None,
            score: None,
            sink: Box::new(Collect(Arc::clone(o))),
        });
    }
    while !sched.is_idle() {
        sched.step();
    }
    let outs = outs
        .iter()
        .chain(&fork_outs)
        .map(|o| o.lock().unwrap().clone())
        .collect();
    (outs, metrics)
}

/// Serve `reqs` with and without speculation: the same outputs. Returns the speculative run's
/// metrics.
fn same_with_speculation(
    what: &str,
    m: &Arc<Model>,
    tok: &Tokenizer,
    s: Setup,
    reqs: &[Req],
) -> Arc<SchedMetrics> {
    let (plain, pm) = serve(m, tok, &Setup { draft_max: 0, ..s }, reqs);
    assert_eq!(
        pm.spec_passes.load(Relaxed),
        0,
        "{what}: no speculation asked"
    );
    let (spec, metrics) = serve(m, tok, &s, reqs);
    for (i, (p, q)) in plain.iter().zip(&spec).enumerate() {
        assert!(p.reason.is_some(), "{what}: request {i} finished");
        assert_eq!(p, q, "{what}: request {i}");
    }
    assert!(
        metrics.spec_passes.load(Relaxed) > 0,
        "{what}: verification passes ran"
    );
    eprintln!(
        "{what}: {} passes, {} drafts, {} kept; {} steps against {}",
        metrics.spec_passes.load(Relaxed),
        metrics.spec_drafted.load(Relaxed),
        metrics.spec_accepted.load(Relaxed),
        metrics.decode_steps.load(Relaxed),
        pm.decode_steps.load(Relaxed),
    );
    metrics
}

/// A prompt that repeats a pattern, so that prompt lookup finds drafts.
fn repeating(seed: u32, len: usize) -> Vec<u32> {
    let pattern: Vec<u32> = (0..7).map(|j| 1 + (seed * 37 + j * 13) % 240).collect();
    pattern.iter().cycle().take(len).copied().collect()
}

/// Five requests of copying prompts: greedy and seeded (1, 3), short and long, one past its
/// 128-token context with `ignore_eos` (2), one with log-probabilities (0), one under a
/// grammar (4).
fn mixed_requests() -> Vec<Req> {
    let mut reqs = vec![
        Req::new(repeating(1, 30), 40),
        Req::new(repeating(2, 12), 3),
        Req::new(repeating(3, 90), 100),
        Req::new(repeating(4, 20), 25),
        Req::new(repeating(6, 10), 12),
    ];
    reqs[1].seeded = true;
    reqs[3].seeded = true;
    reqs[2].ignore_eos = true;
    reqs[0].logprobs = Some(3);
    reqs[4].grammar = Some("root ::= [0-9]+");
    reqs
}

/// Random models of the batch-dependent formats (K-quants) and others: five requests on three
/// slots (two wait and join later, beside the others' decode rows and prompt pieces), greedy
/// and seeded, short and long, one past its context, one with `ignore_eos`, one with
/// log-probabilities, one cut by a stop sequence, one with a second choice, one under a
/// grammar (decoded plainly beside the others' passes); a q8_0 KV cache on one model.
#[test]
fn scheduler_speculation_gives_plain_outputs_on_random_models() {
    let mut stopped = 0;
    for (stem, kv_type) in [
        ("random-llama-q4_k", KvType::F16),
        ("random-llama-q6_k", KvType::F16),
        ("random-llama-q4_0", KvType::Q8_0),
        ("random-qwen3-q4_k_m", KvType::F16),
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let mut reqs = mixed_requests();
        reqs.insert(4, Req::new(repeating(5, 9), 1));
        reqs[3].logprobs = Some(0);
        reqs[0].fork = Some(true);
        let setup = || Setup {
            kv_type,
            ..Setup::new(3, 128, 16, 6)
        };
        // A stop sequence from the text the plain run generates for request 3 (its 6th
        // token's): generation stops in the middle of a pass.
        let (probe, _) = serve(
            &m,
            &tok,
            &Setup {
                draft_max: 0,
                ..setup()
            },
            &reqs,
        );
        let stop = tok.decode(&probe[3].ids[5..6]);
        let stops = !stop.trim().is_empty() && !tok.decode(&probe[3].ids[..5]).contains(&stop);
        if stops {
            reqs[3].stop = vec![stop];
        }
        let metrics = same_with_speculation(stem, &m, &tok, setup(), &reqs);
        assert!(
            metrics.spec_accepted.load(Relaxed) > 0,
            "{stem}: drafts kept"
        );
        if stops {
            let (out, _) = serve(&m, &tok, &setup(), &reqs);
            assert_eq!(out[3].reason, Some(FinishReason::Stop), "{stem}");
            assert_eq!(out[3].ids.len(), 6, "{stem}: cut at the stop");
            stopped += 1;
        }
        let digits = &probe[5].text;
        assert!(
            digits.chars().all(|c| c.is_ascii_digit()),
            "{stem}: {digits:?}"
        );
    }
    assert!(stopped > 0, "a stop sequence cut a pass");
}

/// A request with a `logit_bias` stays exact under speculation: each verified row is sampled
/// with the bias, as plain decoding samples it. The bias bans the token the unbiased greedy
/// run chose first (and favours another), so the biased outputs differ from the unbiased ones.
#[test]
fn scheduler_speculation_honours_logit_bias() {
    let stem = "random-llama-q4_k";
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let mut reqs = vec![
        Req::new(repeating(1, 30), 40),
        Req::new(repeating(3, 50), 60),
        Req::new(repeating(4, 20), 25),
    ];
    reqs[2].seeded = true;
    let setup = || Setup::new(2, 128, 16, 6);
    let (unbiased, _) = serve(
        &m,
        &tok,
        &Setup {
            draft_max: 0,
            ..setup()
        },
        &reqs,
    );
    for (r, u) in reqs.iter_mut().zip(&unbiased) {
        let first = u.ids[0];
        r.bias = vec![(first, -100.0), ((first + 1) % 200, 2.0), (first, -0.5)];
    }
    same_with_speculation(&format!("{stem} with logit_bias"), &m, &tok, setup(), &reqs);
    let (biased, _) = serve(&m, &tok, &setup(), &reqs);
    for (i, (b, u)) in biased.iter().zip(&unbiased).enumerate() {
        assert_ne!(b.ids.first(), u.ids.first(), "request {i}: the ban holds");
        assert!(!b.ids.contains(&u.ids[0]), "request {i}: banned everywhere");
    }
}

/// A draft model's slots instead of prompt lookup (`--model-draft`): the same outputs, the
/// draft's guesses decoded together for all slots. A model drafting for itself has its greedy
/// guesses kept; another random model's mostly refused; `--draft-p-min` cuts guesses short.
#[test]
fn scheduler_speculation_with_a_draft_model_gives_plain_outputs() {
    for (stem, draft, p_min) in [
        ("random-llama-q4_k", "random-llama-q4_k", 0.0),
        ("random-llama-q6_k", "random-llama-q4_0", 0.0),
        ("random-llama-q4_0", "random-llama-q4_0", 0.05),
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let mut reqs = mixed_requests();
        reqs[0].fork = Some(false);
        let setup = Setup {
            draft: Some((draft, p_min)),
            ..Setup::new(3, 128, 16, 6)
        };
        let what = format!("{stem} drafted by {draft}, p_min {p_min}");
        let metrics = same_with_speculation(&what, &m, &tok, setup, &reqs);
        let (drafted, kept) = (
            metrics.spec_drafted.load(Relaxed),
            metrics.spec_accepted.load(Relaxed),
        );
        if stem == draft && p_min == 0.0 {
            assert!(kept * 4 > drafted * 3, "{what}: {kept} of {drafted} kept");
        }
    }
}

/// A draft model's slots (`SlotDrafter`) guess what greedy decoding of the draft gives after
/// each history, bit for bit: several slots at once with their own caps, histories that go on
/// from kept guesses or start over (each slot rolled back and brought forward), another
/// tenant's sequence (which reuses nothing), and the end of the draft's context.
#[test]
fn slot_drafter_guesses_the_greedy_continuation() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_k")).expect("load"));
    let opts = |n_slots| BatchOptions {
        n_slots,
        n_ctx: 64,
        n_threads: 2,
        prefill_chunk: 8,
        kv_type: KvType::F16,
        device: Default::default(),
        draft_max: 0,
    };
    let runner = |n_slots, n_threads, draft_max| {
        let o = BatchOptions {
            n_threads,
            draft_max,
            ..opts(n_slots)
        };
        BatchRunner::new(Arc::clone(&m), o).unwrap()
    };
    let target = runner(3, 2, 6);
    let mut d = SlotDrafter::new(runner(3, 2, 0), &target, 0.0).unwrap();
    // A slot for each of the server's, on its threads.
    for (slots, threads, what) in [(2, 2, "2 slots"), (3, 1, "1 threads")] {
        let e = SlotDrafter::new(runner(slots, threads, 0), &target, 0.0).err();
        assert!(e.is_some_and(|e| e.to_string().contains(what)), "{what}");
    }
    let mut plain = BatchRunner::new(Arc::clone(&m), opts(1)).unwrap();
    let mut greedy = |h: &[u32], n: usize| -> Vec<u32> {
        plain.rollback(0, 0);
        for c in h.chunks(8) {
            plain.prefill_chunk(0, c, true).unwrap();
        }
        let mut out = Vec::new();
        loop {
            let t = kiln::sampler::argmax(plain.logits(0));
            out.push(t);
            if out.len() == n {
                return out;
            }
            plain.decode(&[(0, t)]).unwrap();
        }
    };
    // Calls of `start` until the slot has caught up with `h` of `tenant` (one chunk of 8 a
    // call).
    let as_tenant = |d: &mut SlotDrafter, slot: usize, tenant: u64, h: &[u32], max: usize| {
        (1..=10).find(|_| d.start(slot, tenant, h, max))
    };
    let catch_up =
        |d: &mut SlotDrafter, slot: usize, h: &[u32], max: usize| as_tenant(d, slot, 0, h, max);
    let (h0, h2) = (repeating(1, 20), repeating(2, 11));
    assert_eq!(catch_up(&mut d, 0, &h0, 6), Some(3), "20 tokens, 8 a call");
    assert_eq!(catch_up(&mut d, 2, &h2, 3), Some(2));
    d.run();
    assert_eq!(d.guesses(0), greedy(&h0, 6));
    assert_eq!(d.guesses(2), greedy(&h2, 3));
    assert!(d.guesses(1).is_empty(), "slot 1 did not start");
    // Slot 0 goes on from two of its guesses and another token; slot 2 holds a new request.
    let mut h0 = h0;
    h0.extend_from_slice(&d.guesses(0)[..2]);
    h0.push(7);
    let h2 = repeating(3, 13);
    assert_eq!(
        catch_up(&mut d, 0, &h0, 5),
        Some(1),
        "3 tokens past what it holds"
    );
    assert_eq!(catch_up(&mut d, 2, &h2, 6), Some(2));
    d.run();
    assert_eq!(d.guesses(0), greedy(&h0, 5));
    assert_eq!(d.guesses(2), greedy(&h2, 6));
    // The same history again: the slot holds it whole (and guesses after it).
    assert_eq!(catch_up(&mut d, 2, &h2, 4), Some(1));
    d.run();
    assert_eq!(d.guesses(2), greedy(&h2, 4));
    // The end of the context: a slot holds its history and all guesses but the last.
    let full = repeating(4, 63);
    assert_eq!(catch_up(&mut d, 1, &full, 6), Some(8));
    d.run();
    assert_eq!(d.guesses(1), greedy(&full, 2));
    assert_eq!(catch_up(&mut d, 1, &repeating(4, 64), 6), Some(1));
    d.run();
    assert_eq!(d.guesses(1).len(), 1);
    assert_eq!(
        catch_up(&mut d, 1, &repeating(4, 65), 6),
        None,
        "past the context"
    );
    // A slot reuses nothing of another tenant's sequence: the next tenant catches up from
    // the start, while the tenant that filled it goes on from what it holds.
    let h = repeating(5, 20);
    assert_eq!(as_tenant(&mut d, 0, 1, &h, 4), Some(3));
    d.run();
    assert_eq!(
        as_tenant(&mut d, 0, 2, &h, 4),
        Some(3),
        "another tenant starts over"
    );
    d.run();
    assert_eq!(d.guesses(0), greedy(&h, 4));
    assert_eq!(
        as_tenant(&mut d, 0, 2, &h, 4),
        Some(1),
        "its own tenant reuses it"
    );
    d.run();
    assert_eq!(d.guesses(0), greedy(&h, 4));
    // --draft-p-min: no guess of a random model is that likely.
    let mut sure = SlotDrafter::new(runner(3, 2, 0), &target, 0.99).unwrap();
    assert_eq!(catch_up(&mut sure, 0, &h2, 6), Some(2));
    sure.run();
    assert!(sure.guesses(0).is_empty());
}

/// Many slots in a short context: one step takes every slot's verification pass of
/// `1 + draft_max` rows beside another slot's prompt chunk (52 rows, more than a slot's 32
/// positions), and each row's logits are those of a plain decode step of the same tokens, the
/// chunk's those of a plain prefill, bit for bit.
#[test]
fn runner_takes_every_slots_pass_in_a_short_context() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_k")).expect("load"));
    let opts = |n_slots, draft_max| BatchOptions {
        n_slots,
        n_ctx: 32,
        n_threads: 2,
        prefill_chunk: 16,
        kv_type: KvType::F16,
        device: Default::default(),
        draft_max,
    };
    let mut spec = BatchRunner::new(Arc::clone(&m), opts(5, 8)).unwrap();
    let mut plain = BatchRunner::new(Arc::clone(&m), opts(1, 0)).unwrap();
    let prompt = |s: u32| repeating(s, 10);
    let pass = |s: u32| -> Vec<u32> { (0..9).map(|j| 3 + (s * 29 + j * 7) % 200).collect() };
    for s in 0..4 {
        spec.prefill_chunk(s, &prompt(s as u32), true).unwrap();
    }
    spec.begin_step();
    for s in 0..4 {
        spec.push_verify(s, &pass(s as u32));
    }
    let chunk = repeating(9, 16);
    spec.push_part(4, &chunk, true);
    spec.run_step()
        .expect("four passes of nine rows and a chunk in one step");
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    plain.prefill_chunk(0, &chunk, true).unwrap();
    assert!(bits(plain.logits(0)) == bits(spec.logits(4)), "the chunk");
    for s in 0..4 {
        plain.rollback(0, 0);
        plain.prefill_chunk(0, &prompt(s as u32), true).unwrap();
        for (i, &t) in pass(s as u32).iter().enumerate() {
            plain.decode(&[(0, t)]).unwrap();
            assert!(
                bits(plain.logits(0)) == bits(spec.logits_at(s, i)),
                "slot {s}, row {i}"
            );
        }
    }
}

/// SmolLM2 continuing a paragraph it has seen twice (drafts mostly kept), greedy and under a
/// repetition penalty over its last 8 tokens, beside a seeded story and a greedy question:
/// the same text, and most drafts kept.
#[test]
fn scheduler_speculation_keeps_drafts_on_a_real_model() {
    let m = Arc::new(Model::load(common::real_model("smollm2")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let chat = |text: &str| {
        let t = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
        tok.encode(&t, false, true)
    };
    let para = "The kiln was built of fire brick in the spring. It held forty pots at a time, \
                and the potters fired it every Friday until the clay ran out.";
    let copy = tok.encode(&format!("{para}\n\n{para}\n\nThe kiln"), true, false);
    let mut reqs = vec![
        Req::new(copy.clone(), 60),
        Req::new(chat("Write a short story about a fox."), 40),
        Req::new(copy, 60),
        Req::new(chat("What is the capital of France?"), 20),
    ];
    reqs[1].seeded = true;
    reqs[2].penalty = true;
    reqs[2].logprobs = Some(2);
    let setup = Setup::new(3, 512, 64, 16);
    let metrics = same_with_speculation("smollm2", &m, &tok, setup, &reqs);
    let (drafted, kept) = (
        metrics.spec_drafted.load(Relaxed),
        metrics.spec_accepted.load(Relaxed),
    );
    assert!(
        kept * 2 > drafted,
        "copying keeps most drafts: {kept} of {drafted}"
    );
    // `--draft-min 8 --draft-max 8`: every pass verifies 8 drafts (fewer are not verified).
    let setup = Setup {
        draft_min: 8,
        ..Setup::new(3, 512, 64, 8)
    };
    let metrics = same_with_speculation("smollm2, 8 drafts", &m, &tok, setup, &reqs);
    let (passes, drafted) = (
        metrics.spec_passes.load(Relaxed),
        metrics.spec_drafted.load(Relaxed),
    );
    assert!(
        passes > 0 && drafted == 8 * passes,
        "{passes} passes of {drafted} drafts"
    );
}

/// Gemma-3's sliding-window rings: passes stay within what a ring can roll back (a small
/// prefill chunk makes the reach short), through a generation past the window.
#[test]
fn scheduler_speculation_respects_sliding_window_rings() {
    let m = Arc::new(Model::load(common::real_model("gemma3")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let window = m
        .config
        .sliding_window
        .expect("Gemma-3 has sliding-window layers");
    assert!(window < 600, "Gemma-3-270M's window");
    let mut prompt = tok.encode(
        "Count: one two three four five six seven eight nine ten.",
        true,
        false,
    );
    while prompt.len() + 60 < window {
        let n = prompt.len();
        prompt.extend_from_within(1..n.min(40));
    }
    // Log-probabilities compared bit for bit: a row past 256 positions takes the decode
    // path's split-key attention, a batch row the vector path.
    let mut reqs = [Req::new(prompt, 120)];
    reqs[0].logprobs = Some(1);
    let setup = Setup::new(1, 1024, 8, 16);
    let metrics = same_with_speculation("gemma3", &m, &tok, setup, &reqs);
    assert!(metrics.spec_accepted.load(Relaxed) > 0, "drafts kept");
}

/// `kiln serve --spec-type ngram-simple`: a completion's text and log-probabilities equal a
/// plain server's, with prompt lookup and with a draft model (`-md`); `/metrics` counts the
/// passes; flags it cannot honour are one-line errors.
#[test]
fn serve_speculates_over_http() {
    let model = common::real_model("smollm2");
    let para = "The kiln was built of fire brick in the spring. It held forty pots at a time, \
                and the potters fired it every Friday until the clay ran out.";
    let body = serde_json::json!({
        "prompt": format!("{para}\n\n{para}\n\nThe kiln"),
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": 2,
    })
    .to_string();
    let complete = |extra: &[&str]| {
        let server = harness::Server::start(&model, &[&["-t", "2"], extra].concat());
        let a = server.request("POST", "/v1/completions", &[], &body);
        assert_eq!(a.status, 200, "{}", a.text());
        let choice = a.json()["choices"][0].clone();
        let passes = server
            .metric("kiln_spec_passes_total", &[])
            .expect("the series");
        let kept = server
            .metric("kiln_spec_accepted_tokens_total", &[])
            .expect("the series");
        (choice, passes, kept)
    };
    let (plain, passes, _) = complete(&[]);
    assert_eq!(passes, 0.0);
    let (spec, passes, kept) = complete(&["--spec-type", "ngram-simple", "--draft-max", "8"]);
    assert_eq!(spec["text"], plain["text"]);
    assert_eq!(spec["logprobs"], plain["logprobs"]);
    assert!(passes > 0.0 && kept > 0.0, "{passes} passes, {kept} kept");
    // A draft model (the model itself: its greedy guesses are kept).
    let path = model.to_str().unwrap();
    let (spec, passes, kept) = complete(&["-md", path, "--draft-max", "8", "--draft-p-min", "0"]);
    assert_eq!(spec["text"], plain["text"]);
    assert_eq!(spec["logprobs"], plain["logprobs"]);
    assert!(passes > 0.0 && kept > 0.0, "{passes} passes, {kept} kept");

    // -b 1 leaves no room for drafts: speculation is off, and /props says so.
    for (extra, on) in [(&["-b", "4"], true), (&["-b", "1"], false)] {
        let server = harness::Server::start(
            &model,
            &[&["-t", "2", "--spec-type", "ngram-simple"][..], extra].concat(),
        );
        let props = server.request("GET", "/props", &[], "").json();
        assert_eq!(
            props["default_generation_settings"]["speculative"], on,
            "{extra:?}"
        );
    }

    for (extra, expect) in [
        (
            vec!["--spec-type", "ngram-simple", "-md", "draft.gguf"],
            "draft-simple",
        ),
        (
            vec!["--spec-type", "ngram-simple", "--draft-p-min", "0.5"],
            "--draft-p-min is for a draft model",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--port", "0", "-m"])
            .arg(&model)
            .args(&extra)
            .output()
            .expect("run kiln");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(stderr.contains(expect), "{extra:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
    }
}

/// On the GPU (or the software GPU), where a verification pass runs as decode rows: prompt
/// lookup and a draft model drafting for itself give the outputs of plain serving on the GPU,
/// five requests on three slots (prompt chunks beside passes, a fork, a grammar,
/// log-probabilities, one past its context). (In a context of up to 256 positions, where plain
/// serving on the GPU gives a sequence the same logits whatever else its steps carry.)
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn scheduler_speculation_on_the_gpu_gives_plain_outputs() {
    let _gpu = common::gpu("scheduler_speculation_on_the_gpu_gives_plain_outputs");
    let stem = "random-llama-q4_0";
    let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let mut reqs = mixed_requests();
    reqs[0].fork = Some(false);
    for draft in [None, Some((stem, 0.0))] {
        let setup = Setup {
            draft,
            device: Device::Cuda,
            ..Setup::new(3, 128, 16, 6)
        };
        let what = format!("{stem} on the GPU, drafted by {draft:?}");
        same_with_speculation(&what, &m, &tok, setup, &reqs);
    }
}
