//! Batched decoding against sessions, for the CPU's and the GPU's batch tests.

use std::sync::{Arc, Mutex};

use kiln::engine::batch::BatchRunner;
use kiln::engine::scheduler::{Finished, SeqSink};
use kiln::engine::Session;
use kiln::sampler::argmax;

/// Prompt `i` of `len` tokens: ids in 1..=250, different for every `i`.
pub fn prompt(i: u32, len: u32) -> Vec<u32> {
    (0..len).map(|j| 1 + (i * 31 + j * 17) % 250).collect()
}

/// A sink collecting a request's token ids.
pub struct Ids(pub Arc<Mutex<Vec<u32>>>);

impl SeqSink for Ids {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn token(&mut self, id: u32) {
        self.0.lock().unwrap().push(id);
    }
    fn done(&mut self, _: Finished) {}
}

/// Decode `steps` steps of the sequences in `slots` (increasing) of `runner`, each slot's
/// greedy token also fed to its own session (`sessions[i]` for `slots[i]`), every third
/// sequence sitting out from step 4 on (as finished ones would): at every step each slot's
/// logits equal its session's, bit for bit.
pub fn decode_against_sessions(
    what: &str,
    runner: &mut BatchRunner,
    sessions: &mut [Session],
    slots: &[usize],
    steps: usize,
) {
    for step in 0..steps {
        let mut batch = Vec::new();
        for (i, &slot) in slots.iter().enumerate() {
            if step >= 4 && i % 3 == 1 {
                continue;
            }
            assert_eq!(
                runner.logits(slot),
                sessions[i].logits(),
                "{what}: slot {slot} step {step}"
            );
            batch.push((slot, argmax(runner.logits(slot))));
        }
        runner.decode(&batch).unwrap();
        for &(slot, t) in &batch {
            let i = slots.iter().position(|&s| s == slot).unwrap();
            sessions[i].decode(t).unwrap();
        }
    }
}

/// Greedy requests of `n` tokens after each of `prompts`, submitted at once to a scheduler
/// over `runner` (decode steps of several rows): each request's token ids, and the counters.
/// With `logprobs`, each also asks for its tokens' log-probabilities, which read its logits on
/// the host (the same tokens, sampled there).
pub fn greedy_ids(
    runner: kiln::engine::batch::BatchRunner,
    tok: &kiln::tokenizer::Tokenizer,
    prompts: &[Vec<u32>],
    n: usize,
    logprobs: bool,
) -> (
    Vec<Vec<u32>>,
    std::sync::Arc<kiln::engine::scheduler::SchedMetrics>,
) {
    use kiln::engine::scheduler::{Scheduler, SeqRequest};
    let metrics = Arc::new(Default::default());
    let mut sched = Scheduler::new(runner, tok, Arc::clone(&metrics));
    let ids: Vec<_> = prompts.iter().map(|_| Arc::default()).collect();
    for (p, ids) in prompts.iter().zip(&ids) {
        sched.submit(SeqRequest {
            prompt: p.clone(),
            max_new: n,
            sampler: kiln::sampler::SamplerConfig::greedy(),
            stop: Vec::new(),
            code: Default::default(),
            cache_prompt: false,
            tenant: 0,
            ignore_eos: false,
            grammar: None,
            logprobs: logprobs.then_some(0),
            forks: Vec::new(),
            embed: None,
            score: None,
            sink: Box::new(Ids(Arc::clone(ids))),
        });
    }
    while !sched.is_idle() {
        sched.step();
    }
    let ids = ids.iter().map(|i| i.lock().unwrap().clone()).collect();
    (ids, metrics)
}

/// [`greedy_ids`] over the runners `make` gives, the tokens picked by the executor's argmax
/// and sampled from host logits: the same ids, the first path taken for every token, the
/// second for none.
pub fn argmax_agrees_with_the_host(
    what: &str,
    make: &mut dyn FnMut() -> kiln::engine::batch::BatchRunner,
    tok: &kiln::tokenizer::Tokenizer,
    prompts: &[Vec<u32>],
    n: usize,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let (host, hm) = greedy_ids(make(), tok, prompts, n, true);
    let (picked, pm) = greedy_ids(make(), tok, prompts, n, false);
    assert_eq!(picked, host, "{what}: the argmax's tokens");
    let generated = pm.generated_tokens.load(Relaxed);
    assert!(
        generated as usize >= prompts.len(),
        "{what}: {generated} tokens"
    );
    assert_eq!(pm.argmax_tokens.load(Relaxed), generated, "{what}");
    assert_eq!(
        hm.argmax_tokens.load(Relaxed),
        0,
        "{what}: logprobs read the logits"
    );
}
