//! Batched decoding against sessions, for the CPU's and the GPU's batch tests.

use kiln::engine::batch::BatchRunner;
use kiln::engine::Session;
use kiln::sampler::argmax;

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
