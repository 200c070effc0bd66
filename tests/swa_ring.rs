//! Gemma-3's sliding-window layers keep only a ring of their window: the logits are the same
//! bits as with a cache of the whole context (`swa_full`), through a long prefill, a decode far
//! past the window, rollbacks and prefix reuse; the ring is a fraction of the memory.

mod common;

use std::sync::Arc;

use kiln::engine::batch::{BatchOptions, BatchRunner};
use kiln::engine::{Session, SessionOptions};
use kiln::model::Model;
use kiln::sampler::argmax;

fn gemma() -> Arc<Model> {
    Arc::new(Model::load(common::real_model("gemma3")).expect("load"))
}

/// The long golden prompt's tokens (2,600 of real text).
fn long_prompt() -> Vec<u32> {
    let rows = common::read_jsonl(
        &common::golden_dir()
            .join("gemma3-270m-q4_k_m")
            .join("long.jsonl"),
    );
    rows[0]["prompt_ids"]
        .as_array()
        .expect("prompt_ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

fn session(m: &Arc<Model>, ctx: usize, chunk: usize, swa_full: bool) -> Session {
    let mut o = SessionOptions::new(ctx, 2);
    o.prefill_chunk = chunk;
    o.swa_full = swa_full;
    Session::new(Arc::clone(m), o).expect("session")
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|x| x.to_bits()).collect()
}

/// Greedy decode of `n` tokens: every step's logits, as bits.
fn greedy(s: &mut Session, n: usize) -> Vec<Vec<u32>> {
    let mut out = vec![bits(s.logits())];
    for _ in 0..n {
        let t = argmax(s.logits());
        s.decode(t).expect("decode");
        out.push(bits(s.logits()));
    }
    out
}

#[test]
fn ring_decodes_past_the_window_like_the_full_cache() {
    let m = gemma();
    let prompt = long_prompt();
    let prompt = &prompt[..900];
    // Chunks of 128: ring of 512 + 127 → 640 rows, a fifth of the 3,072 positions.
    let mut full = session(&m, 3072, 128, true);
    let mut ring = session(&m, 3072, 128, false);
    let layout = ring.kv().unwrap().layout().clone();
    assert_eq!(layout.n_ring_layers(), 15);
    assert_eq!(layout.window.as_ref().unwrap().rows, 640);
    assert!(full.kv().unwrap().layout().window.is_none());
    assert_eq!(
        ring.kv().unwrap().bytes(),
        (3 * 3072 + 15 * 640) * 256 * 2 * 2,
        "3 global layers of the whole context, 15 rings"
    );
    full.prefill(prompt, &mut |_, _| {}).unwrap();
    ring.prefill(prompt, &mut |_, _| {}).unwrap();
    // 900 + 700 tokens: the rings turn over more than twice.
    let a = greedy(&mut full, 700);
    let b = greedy(&mut ring, 700);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "decode step {i} differs");
    }
    assert!(ring.kv().unwrap().kept_from() > 0);

    // Back 100 tokens (inside the ring's margin of 129): exact, and decodes the same again.
    let n = ring.n_past();
    assert_eq!(ring.rollback(n - 100), n - 100);
    assert_eq!(full.rollback(n - 100), n - 100);
    let a = greedy(&mut full, 20);
    let b = greedy(&mut ring, 20);
    assert!(a[1..] == b[1..], "after a rollback of 100");

    // Back 400: the rings no longer hold that window, so the session empties; reusing the
    // prefix recomputes it and the logits are again the full cache's.
    let tokens = ring.tokens().to_vec();
    let back = tokens.len() - 400;
    assert_eq!(ring.rollback(back), 0);
    assert_eq!(ring.n_past(), 0);
    full.rollback(back);
    let more = [tokens[back], 107, 2094, 236761];
    let mut again = tokens[..back].to_vec();
    again.extend_from_slice(&more);
    assert_eq!(
        reuse_prefix(&mut full, &again),
        back,
        "the full cache reuses the prefix"
    );
    assert_eq!(reuse_prefix(&mut ring, &again), 0, "the ring recomputes it");
    // Recomputed in chunks from 0, as a fresh full cache computes it.
    let mut fresh = session(&m, 3072, 128, true);
    fresh.prefill(&again, &mut |_, _| {}).unwrap();
    let a = greedy(&mut fresh, 10);
    let b = greedy(&mut ring, 10);
    assert!(a == b, "after recomputing");
}

/// Evaluate `tokens` after the prefix the session shares with them, as the scheduler admits a
/// request (the cache rolled back to the shared part, at least one token evaluated); returns
/// how many tokens were kept (0 where the rings no longer hold the window before them).
fn reuse_prefix(s: &mut Session, tokens: &[u32]) -> usize {
    let kept = s.rollback(s.common_prefix(tokens).min(tokens.len() - 1));
    s.prefill(&tokens[kept..], &mut |_, _| {}).unwrap();
    kept
}

/// Teacher-forced logits of every position of a prompt evaluated in odd chunks equal the full
/// cache's, and a chat-style reuse of a long prefix (rollback of a few tokens) is exact.
#[test]
fn ring_teacher_forcing_and_prefix_reuse_match_the_full_cache() {
    let m = gemma();
    let prompt = long_prompt();
    let prompt = &prompt[..1400];
    let mut rows = [Vec::new(), Vec::new()];
    for (i, swa_full) in [true, false].into_iter().enumerate() {
        let mut s = session(&m, 2048, 333, swa_full);
        assert_eq!(s.kv().unwrap().layout().window.is_none(), swa_full);
        s.eval_all(prompt, 500, &mut |p, l| {
            if p % 7 == 0 || p + 1 == prompt.len() {
                rows[i].push(bits(l));
            }
        })
        .unwrap();
        // Next turn: the same 1,390 tokens and another ending.
        let mut turn = prompt[..1390].to_vec();
        turn.extend_from_slice(&[107, 2094, 236761, 108]);
        assert_eq!(reuse_prefix(&mut s, &turn), 1390);
        rows[i].push(bits(s.logits()));
    }
    assert_eq!(rows[0].len(), rows[1].len());
    for (j, (a, b)) in rows[0].iter().zip(&rows[1]).enumerate() {
        assert!(a == b, "row {j} differs");
    }
}

/// The server's prefix cache copies a prefix from another slot: exact where the source's rings
/// still hold its window, recomputed (0 copied) where they do not; logits equal a full cache's.
#[test]
fn ring_prefix_copy_between_slots_is_exact_or_recomputed() {
    let m = gemma();
    let prompt = long_prompt();
    let mut r = BatchRunner::new(
        Arc::clone(&m),
        BatchOptions {
            n_slots: 2,
            n_ctx: 2048,
            n_threads: 2,
            prefill_chunk: 256,
            kv_type: kiln::cache::KvType::F16,
            device: Default::default(),
            draft_max: 0,
        },
    )
    .unwrap();
    let mut full = session(&m, 2048, 256, true);
    for chunk in prompt[..1200].chunks(256) {
        r.prefill_chunk(0, chunk, true).unwrap();
    }
    // Slot 0 holds 1,200 tokens; its rings (768 rows) keep positions 432.. .
    for (want, got) in [(1000, 1000), (950, 950), (900, 0), (300, 0)] {
        let kept = r.copy_prefix(1, 0, want);
        assert_eq!(kept, got, "copy of {want}");
        let rest = &prompt[kept..want + 5];
        for chunk in rest.chunks(256) {
            r.prefill_chunk(1, chunk, true).unwrap();
        }
        // The reference computes each position as the slot did: copied positions as slot 0
        // did (chunks of 256 from 0), the rest in chunks of 256 from `kept`.
        full.reset();
        if kept > 0 {
            full.prefill(&prompt[..1200], &mut |_, _| {}).unwrap();
            full.rollback(kept);
        }
        full.prefill(rest, &mut |_, _| {}).unwrap();
        assert!(
            bits(r.logits(1)) == bits(full.logits()),
            "slot logits after a copy of {want}"
        );
    }
}
