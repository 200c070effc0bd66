//! `n` choices of one prompt in the scheduler (`SeqRequest::forks`): the prompt is evaluated
//! once, each choice then generates exactly what a request of its own with its sampler would;
//! choices wait for enough free slots, a request with more choices than slots is refused, and
//! forks end with their request when it ends before its prompt is evaluated.

mod common;

use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::logprobs::TokenLogprobs;
use kiln::engine::scheduler::{
    FinishReason, Finished, Fork, SchedMetrics, Scheduler, SeqRequest, SeqSink,
};
use kiln::model::Model;
use kiln::sampler::SamplerConfig;
use kiln::tokenizer::Tokenizer;

/// What a choice produced.
#[derive(Default, Debug, Clone)]
struct Out {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<(u32, f32)>,
    done: Option<Finished>,
    /// Answer `false` to the next text (a client that left).
    leave: bool,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Out>>);

impl SeqSink for Shared {
    fn text(&mut self, t: &str) -> bool {
        let mut o = self.0.lock().unwrap();
        o.text.push_str(t);
        !o.leave
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().ids.push(id);
    }
    fn logprobs(&mut self, lp: &TokenLogprobs) {
        self.0.lock().unwrap().logprobs.push((lp.token, lp.logprob));
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap().done = Some(f);
    }
}

impl Shared {
    fn get(&self) -> Out {
        self.0.lock().unwrap().clone()
    }
}

fn sampler(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        seed,
        ..SamplerConfig::default()
    }
}

fn request(prompt: &[u32], seed: u64, sink: &Shared) -> SeqRequest {
    SeqRequest {
        prompt: prompt.to_vec(),
        max_new: 24,
        sampler: sampler(seed),
        stop: vec![],
        code: Default::default(),
        cache_prompt: false,
        tenant: 0,
        ignore_eos: true,
        grammar: None,
        logprobs: Some(3),
        forks: Vec::new(),
        embed: None,
        score: None,
        sink: Box::new(sink.clone()),
    }
}

/// `req` with a fork per sink, seeded `seed`, `seed + 1`, ...
fn with_forks(mut req: SeqRequest, sinks: &[Shared], seed: u64) -> SeqRequest {
    for (i, sink) in sinks.iter().enumerate() {
        req.forks.push(Fork {
            sampler: sampler(seed + i as u64),
            grammar: None,
            sink: Box::new(sink.clone()),
        });
    }
    req
}

fn scheduler<'t>(
    m: &Arc<Model>,
    tok: &'t Tokenizer,
    slots: usize,
) -> (Scheduler<'t>, Arc<SchedMetrics>) {
    let runner = BatchRunner::new(
        Arc::clone(m),
        BatchOptions {
            n_slots: slots,
            n_ctx: 256,
            n_threads: 2,
            prefill_chunk: 8,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap();
    let metrics = Arc::new(SchedMetrics::default());
    (Scheduler::new(runner, tok, Arc::clone(&metrics)), metrics)
}

fn drain(s: &mut Scheduler<'_>) {
    while !s.is_idle() {
        s.step();
    }
}

#[test]
fn choices_share_one_prefill_and_equal_separate_requests() {
    for stem in ["random-llama-q4_0", "random-qwen3-f32"] {
        let m = Arc::new(Model::load(common::random_model(stem)).unwrap());
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let prompt: Vec<u32> = (0..21).map(|i| 3 + i * 11 % 200).collect();
        // Alone, one at a time.
        let alone: Vec<Out> = (0..3)
            .map(|i| {
                let (mut s, _) = scheduler(&m, &tok, 3);
                let sink = Shared::default();
                s.submit(request(&prompt, 100 + i, &sink));
                drain(&mut s);
                sink.get()
            })
            .collect();
        // Three choices of one request, beside an unrelated request that takes a slot first.
        let (mut s, metrics) = scheduler(&m, &tok, 4);
        let other = Shared::default();
        s.submit(request(&[5, 6, 7], 1, &other));
        s.step();
        let sinks: Vec<Shared> = (0..3).map(|_| Shared::default()).collect();
        let req = with_forks(request(&prompt, 100, &sinks[0]), &sinks[1..], 101);
        let prefilled = metrics
            .prefill_tokens
            .load(std::sync::atomic::Ordering::Relaxed);
        s.submit(req);
        drain(&mut s);
        let evaluated = metrics
            .prefill_tokens
            .load(std::sync::atomic::Ordering::Relaxed)
            - prefilled;
        assert_eq!(
            evaluated as usize,
            prompt.len(),
            "{stem}: the prompt evaluated once"
        );
        for (i, sink) in sinks.iter().enumerate() {
            let got = sink.get();
            assert_eq!(got.ids, alone[i].ids, "{stem}: choice {i}");
            assert_eq!(got.text, alone[i].text, "{stem}: choice {i}");
            assert_eq!(
                got.logprobs, alone[i].logprobs,
                "{stem}: choice {i}'s log-probabilities"
            );
            let f = got.done.expect("finished");
            assert_eq!(f.reason, FinishReason::Length);
            assert_eq!(f.usage.prompt_tokens, prompt.len());
            assert_eq!(f.usage.completion_tokens, 24);
        }
        assert_ne!(
            sinks[0].get().ids,
            sinks[1].get().ids,
            "{stem}: seeds differ"
        );
        assert!(other.get().done.is_some());
    }
}

#[test]
fn choices_wait_for_slots_and_more_than_the_slots_are_refused() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let (mut s, _) = scheduler(&m, &tok, 2);
    // Three choices, two slots: refused at once, every choice told.
    let sinks: Vec<Shared> = (0..3).map(|_| Shared::default()).collect();
    s.submit(with_forks(
        request(&[1, 2, 3], 1, &sinks[0]),
        &sinks[1..],
        2,
    ));
    for sink in &sinks {
        match sink.get().done.map(|f| f.reason) {
            Some(FinishReason::Error(e)) => assert!(e.contains("3 choices"), "{e}"),
            other => panic!("not refused: {other:?}"),
        }
    }
    // Two choices while one slot is busy: they wait until both slots are free.
    let busy = Shared::default();
    s.submit(request(&[9, 9, 9], 1, &busy));
    s.step();
    let pair: Vec<Shared> = (0..2).map(|_| Shared::default()).collect();
    s.submit(with_forks(
        request(&[1, 2, 3, 4], 1, &pair[0]),
        &pair[1..],
        2,
    ));
    s.step();
    assert!(pair[0].get().ids.is_empty() && busy.get().done.is_none());
    drain(&mut s);
    for p in &pair {
        assert_eq!(p.get().ids.len(), 24);
    }
}

#[test]
fn forks_end_with_a_request_cancelled_before_its_prefill() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let (mut s, metrics) = scheduler(&m, &tok, 3);
    let sinks: Vec<Shared> = (0..3).map(|_| Shared::default()).collect();
    sinks[0].0.lock().unwrap().leave = true;
    // A long prompt (8 tokens a step): the client leaves during its prefill.
    let prompt: Vec<u32> = (0..40).map(|i| 3 + i % 100).collect();
    s.submit(with_forks(request(&prompt, 1, &sinks[0]), &sinks[1..], 2));
    drain(&mut s);
    for sink in &sinks {
        let o = sink.get();
        assert_eq!(o.done.map(|f| f.reason), Some(FinishReason::Cancelled));
        assert!(o.ids.is_empty());
    }
    let cancelled = metrics
        .requests_cancelled
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(cancelled, 3);
    assert_eq!(
        metrics
            .slots_in_use
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
