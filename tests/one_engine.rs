//! The engine `kiln run`, `chat`, `bench` and the Python bindings drive (the server's scheduler
//! over a runner of one slot) generates what a single session decoding token by token
//! generates: greedy and seeded, through the token limit and a full context; a chat's next
//! turn reuses the cached prefix and its sampler's random stream goes on; a consumer's stop
//! and the cancel flag end the generation as cancelled; an encoder is refused.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::{
    Engine, EngineError, GenStats, GenerateRequest, Session, SessionOptions, StopReason,
};
use kiln::model::Model;
use kiln::sampler::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

fn runner(m: &Arc<Model>, n_ctx: usize) -> BatchRunner {
    let o = BatchOptions {
        n_slots: 1,
        n_ctx,
        n_threads: 2,
        prefill_chunk: 16,
        kv_type: Default::default(),
        device: Default::default(),
        draft_max: 0,
    };
    BatchRunner::new(Arc::clone(m), o).unwrap()
}

fn sampler_cfg(seeded: bool) -> SamplerConfig {
    if seeded {
        SamplerConfig {
            seed: 99,
            temperature: 0.8,
            repeat_penalty: 1.2,
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    }
}

/// A session's decoding: `prompt` prefilled in chunks of 16, then up to `n` tokens sampled with
/// `sampler` and each evaluated, stopping at an end of generation (unless `ignore_eos` masks
/// them) or where the next token would not fit.
fn session_decode(
    s: &mut Session,
    sampler: &mut Sampler,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    ignore_eos: bool,
) -> (Vec<u32>, StopReason) {
    s.reset();
    s.prefill(prompt, &mut |_, _| {}).unwrap();
    let mut ids = Vec::new();
    loop {
        if ids.len() == n {
            return (ids, StopReason::Length);
        }
        if ignore_eos {
            s.mask_tokens(tok.eog_ids());
        }
        let t = sampler.sample(s.logits(), s.tokens());
        if tok.is_eog(t) {
            return (ids, StopReason::EndOfGeneration);
        }
        ids.push(t);
        if s.would_overflow(1) {
            return (ids, StopReason::ContextFull);
        }
        s.decode(t).unwrap();
    }
}

fn session(m: &Arc<Model>, n_ctx: usize) -> Session {
    let mut o = SessionOptions::new(n_ctx, 2);
    o.prefill_chunk = 16;
    Session::new(Arc::clone(m), o).unwrap()
}

/// The engine's generation: the ids handed out and the statistics.
fn engine_generate(
    e: &mut Engine<'_>,
    sampler: &mut Sampler,
    req: &GenerateRequest<'_>,
) -> (Vec<u32>, GenStats) {
    let mut ids = Vec::new();
    let stats = e
        .generate(req, sampler, None, &mut |_, _| {}, &mut |id, _| {
            if id != u32::MAX {
                ids.push(id);
            }
            true
        })
        .unwrap();
    assert_eq!(stats.gen_tokens, ids.len());
    (ids, stats)
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 1 + (i * 37 + 11) % 200).collect()
}

#[test]
fn engine_generations_equal_a_sessions_decoding() {
    for stem in [
        "random-llama-q8_0",
        "random-llama-q4_k",
        "random-qwen3-q4_k_m",
        // A sliding-window ring turned over by the prompt and the generation.
        "random-gpt-oss-mxfp4",
    ] {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let tok = Tokenizer::from_gguf(&m.file).unwrap();
        let v = m.config.vocab_size;
        let mut engine = Engine::new(runner(&m, 160), &tok).unwrap();
        let mut s = session(&m, 160);
        for seeded in [false, true] {
            // 40 tokens; a prompt of 50 in chunks of 16; then to the end of the context.
            for (len, n, ignore_eos) in [(5, 40, false), (50, 40, true), (90, 200, true)] {
                let p = prompt(len);
                let what = format!("{stem} seeded={seeded} prompt {len} n {n}");
                let mut sampler = Sampler::new(sampler_cfg(seeded), v);
                let want = session_decode(&mut s, &mut sampler, &tok, &p, n, ignore_eos);
                let mut sampler = Sampler::new(sampler_cfg(seeded), v);
                let mut req = GenerateRequest::new(&p, Some(n));
                req.ignore_eos = ignore_eos;
                let picked = engine.metrics().argmax_tokens.load(Ordering::Relaxed);
                let (ids, stats) = engine_generate(&mut engine, &mut sampler, &req);
                assert_eq!(ids, want.0, "{what}");
                // A greedy generation's tokens are the executor's argmax (but where it is an
                // end of generation a request ignores: the next best is on the host).
                let picked = engine.metrics().argmax_tokens.load(Ordering::Relaxed) - picked;
                match (seeded, ignore_eos) {
                    (true, _) => assert_eq!(picked, 0, "{what}"),
                    (false, false) => assert_eq!(picked as usize, ids.len(), "{what}"),
                    (false, true) => assert!(picked > 0 && picked as usize <= ids.len(), "{what}"),
                }
                assert_eq!(stats.stop, Some(want.1), "{what}");
                assert_eq!(stats.reused_tokens, 0, "{what}: no reuse asked");
            }
        }
    }
}

/// A chat's second turn: the first turn's prompt and reply are reused from the cache, only the
/// new message is evaluated, and the sampler draws on from where the first turn left it.
#[test]
fn a_second_turn_reuses_the_cache_and_the_samplers_stream() {
    // (Q8_0: a row's products do not depend on the rows beside it, so the reused turn's
    // logits equal the session's, which evaluates the whole conversation again.)
    let m = Arc::new(Model::load(common::random_model("random-llama-q8_0")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let v = m.config.vocab_size;
    let first = prompt(30);
    // The session's reference: one sampler through both turns, each turn evaluated whole.
    let mut s = session(&m, 256);
    let mut sampler = Sampler::new(sampler_cfg(true), v);
    let (reply, _) = session_decode(&mut s, &mut sampler, &tok, &first, 20, true);
    let mut second = [&first[..], &reply[..]].concat();
    second.extend(prompt(7).iter().map(|t| t + 3));
    let (want, _) = session_decode(&mut s, &mut sampler, &tok, &second, 20, true);

    let mut engine = Engine::new(runner(&m, 256), &tok).unwrap();
    let mut sampler = Sampler::new(sampler_cfg(true), v);
    let mut req = GenerateRequest::new(&first, Some(20));
    req.reuse_prefix = true;
    req.ignore_eos = true;
    let (ids, _) = engine_generate(&mut engine, &mut sampler, &req);
    assert_eq!(ids, reply);
    let mut req = GenerateRequest::new(&second, Some(20));
    req.reuse_prefix = true;
    req.ignore_eos = true;
    let (ids, stats) = engine_generate(&mut engine, &mut sampler, &req);
    assert_eq!(ids, want, "the second turn");
    // Every token of the first turn is reused but its last reply token, which ended the turn
    // as it was sampled (no forward pass ran it): the second turn's prefill evaluates it.
    assert_eq!(stats.reused_tokens, first.len() + reply.len() - 1);
}

#[test]
fn a_consumers_stop_and_the_cancel_flag_cancel() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q8_0")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let v = m.config.vocab_size;
    let mut engine = Engine::new(runner(&m, 256), &tok).unwrap();
    let p = prompt(20);
    let mut req = GenerateRequest::new(&p, Some(50));
    req.ignore_eos = true;
    let mut sampler = Sampler::new(SamplerConfig::greedy(), v);
    let mut ids = Vec::new();
    let stats = engine
        .generate(&req, &mut sampler, None, &mut |_, _| {}, &mut |id, _| {
            ids.push(id);
            ids.len() < 3
        })
        .unwrap();
    assert_eq!(stats.stop, Some(StopReason::Cancelled));
    assert_eq!(
        (stats.gen_tokens, ids.len()),
        (3, 3),
        "nothing after the stop"
    );
    // A set flag cancels before any token.
    let flag = AtomicBool::new(true);
    req.cancel = Some(&flag);
    let (ids, stats) = engine_generate(&mut engine, &mut sampler, &req);
    assert_eq!(stats.stop, Some(StopReason::Cancelled));
    assert!(ids.is_empty(), "{ids:?}");
    // And the engine generates on afterwards.
    flag.store(false, Ordering::Relaxed);
    let (ids, stats) = engine_generate(&mut engine, &mut sampler, &req);
    assert_eq!((ids.len(), stats.stop), (50, Some(StopReason::Length)));
}

#[test]
fn bad_prompts_and_encoders_are_refused() {
    let m = Arc::new(Model::load(common::random_model("random-llama-q8_0")).expect("load"));
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let mut engine = Engine::new(runner(&m, 32), &tok).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), m.config.vocab_size);
    let mut none = |_: u32, _: &str| true;
    let long = prompt(32);
    for (p, want) in [
        (&[][..], EngineError::EmptyPrompt),
        (
            &long[..],
            EngineError::PromptTooLong {
                prompt: 32,
                ctx: 32,
                used: 0,
            },
        ),
    ] {
        let req = GenerateRequest::new(p, Some(4));
        let r = engine.generate(&req, &mut sampler, None, &mut |_, _| {}, &mut none);
        assert_eq!(r.unwrap_err(), want);
    }
    let bert = Arc::new(Model::load(common::random_model("random-bert-f32")).expect("load"));
    let btok = Tokenizer::from_gguf(&bert.file).unwrap();
    match Engine::new(runner(&bert, 32), &btok) {
        Err(EngineError::Encoder { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an encoder generates"),
    }
}
