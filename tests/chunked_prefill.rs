//! Chunked prefill in the scheduler: a step carries the generating sequences' tokens and at
//! most one chunk of prompt tokens, shortest prompt first, so a short request admitted while a
//! long prompt is being prefilled gets its first token after one step, the running sequences
//! decode at every step, and every output equals the sequence generated alone.

mod common;

use std::sync::{Arc, Mutex};

use kiln::cache::KvType;
use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::scheduler::{Finished, SchedMetrics, Scheduler, SeqRequest, SeqSink};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

const CHUNK: usize = 16;
const N_CTX: usize = 256;

/// Records the generated token ids and the end of a request.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<(Vec<u32>, Option<Finished>)>>);

impl Log {
    fn tokens(&self) -> Vec<u32> {
        self.0.lock().unwrap().0.clone()
    }
    fn finished(&self) -> bool {
        self.0.lock().unwrap().1.is_some()
    }
}

impl SeqSink for Log {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().0.push(id);
    }
    fn done(&mut self, f: Finished) {
        self.0.lock().unwrap().1 = Some(f);
    }
}

fn request(prompt: &[u32], max_new: usize) -> (Log, SeqRequest) {
    let log = Log::default();
    let req = SeqRequest {
        grammar: None,
        logprobs: None,
        forks: Vec::new(),
        embed: None,
        score: None,
        prompt: prompt.to_vec(),
        max_new,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        code: Default::default(),
        cache_prompt: false,
        tenant: 0,
        ignore_eos: true,
        sink: Box::new(log.clone()),
    };
    (log, req)
}

/// Deterministic prompt tokens (not special ones).
fn prompt(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i.wrapping_mul(2_654_435_761).wrapping_add(salt) % (vocab as u32 - 3)))
        .collect()
}

/// The sequence generated alone: a session prefilling in the same chunks, greedy sampling
/// with end-of-generation tokens masked (as `ignore_eos` does).
fn alone(m: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut opts = SessionOptions::new(N_CTX, 2);
    opts.prefill_chunk = CHUNK;
    let mut s = Session::new(Arc::clone(m), opts).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), m.config.vocab_size);
    s.prefill(prompt, &mut |_, _| {}).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let mut l = s.logits().to_vec();
        for &e in tok.eog_ids() {
            l[e as usize] = f32::NEG_INFINITY;
        }
        let t = sampler.sample(&l, s.tokens());
        out.push(t);
        if i + 1 < n {
            s.decode(t).unwrap();
        }
    }
    out
}

#[test]
fn short_request_overtakes_a_long_prompt_and_outputs_match() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let vocab = m.config.vocab_size;
    let metrics = Arc::new(SchedMetrics::default());
    let runner = BatchRunner::new(
        Arc::clone(&m),
        BatchOptions {
            n_slots: 3,
            n_ctx: N_CTX,
            n_threads: 2,
            prefill_chunk: CHUNK,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap();
    let mut sched = Scheduler::new(runner, &tok, Arc::clone(&metrics));
    use std::sync::atomic::Ordering::Relaxed;
    let prefilled = || metrics.prefill_tokens.load(Relaxed);

    // A request already generating, then a long prompt (7 chunks), then a short one.
    let (p_run, p_long, p_short) = (
        prompt(5, 1, vocab),
        prompt(100, 2, vocab),
        prompt(4, 3, vocab),
    );
    let (run, req) = request(&p_run, 40);
    sched.submit(req);
    sched.step();
    assert_eq!(run.tokens().len(), 1);
    let (long, req) = request(&p_long, 6);
    sched.submit(req);
    sched.step();
    assert_eq!(
        prefilled(),
        5 + CHUNK as u64,
        "one chunk of the long prompt"
    );
    assert_eq!(
        run.tokens().len(),
        2,
        "the running sequence decoded beside it"
    );

    let (short, req) = request(&p_short, 6);
    sched.submit(req);
    sched.step();
    assert_eq!(
        short.tokens().len(),
        1,
        "the short request got its first token in the step after it arrived"
    );
    assert!(
        long.tokens().is_empty(),
        "the long prompt is still prefilling"
    );
    assert_eq!(run.tokens().len(), 3);

    // The rest of the long prompt: one chunk per step, every running sequence decoding at
    // every step.
    let mut steps = 0;
    while long.tokens().is_empty() {
        let (before, r0, s0) = (prefilled(), run.tokens().len(), short.tokens().len());
        sched.step();
        steps += 1;
        assert!(
            prefilled() - before <= CHUNK as u64,
            "more than a chunk in a step"
        );
        assert_eq!(run.tokens().len(), r0 + 1);
        assert_eq!(short.tokens().len(), (s0 + 1).min(6));
        assert!(steps < 100);
    }
    assert_eq!(steps, 100usize.div_ceil(CHUNK) - 1);
    while !sched.is_idle() {
        sched.step();
    }
    assert!(run.finished() && long.finished() && short.finished());

    // Bit-identical to each sequence generated alone.
    assert_eq!(run.tokens(), alone(&m, &tok, &p_run, 40), "running request");
    assert_eq!(long.tokens(), alone(&m, &tok, &p_long, 6), "long request");
    assert_eq!(
        short.tokens(),
        alone(&m, &tok, &p_short, 6),
        "short request"
    );
}

/// Two prompts longer than a chunk: the one with fewer tokens left goes first, a chunk per
/// step, and neither step carries more than a chunk.
#[test]
fn prompts_share_the_chunk_shortest_first() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q4_0")).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let vocab = m.config.vocab_size;
    let metrics = Arc::new(SchedMetrics::default());
    let runner = BatchRunner::new(
        Arc::clone(&m),
        BatchOptions {
            n_slots: 2,
            n_ctx: N_CTX,
            n_threads: 2,
            prefill_chunk: CHUNK,
            kv_type: KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap();
    let mut sched = Scheduler::new(runner, &tok, Arc::clone(&metrics));
    let (pa, pb) = (prompt(70, 4, vocab), prompt(40, 5, vocab));
    let (a, req) = request(&pa, 3);
    sched.submit(req);
    let (b, req) = request(&pb, 3);
    sched.submit(req);
    // b (40 tokens) is done after 3 steps (16 + 16 + 8, the 8 with nothing else since a's next
    // piece of 16 does not fit beside it); a then needs its 5 chunks.
    for _ in 0..3 {
        sched.step();
        assert!(a.tokens().is_empty());
    }
    assert_eq!(b.tokens().len(), 1);
    let mut steps = 0;
    while a.tokens().is_empty() {
        sched.step();
        steps += 1;
    }
    assert_eq!(steps, 70usize.div_ceil(CHUNK));
    while !sched.is_idle() {
        sched.step();
    }
    assert_eq!(a.tokens(), alone(&m, &tok, &pa, 3));
    assert_eq!(b.tokens(), alone(&m, &tok, &pb, 3));
}
