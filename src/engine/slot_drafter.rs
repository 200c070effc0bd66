//! A draft model for a server's sequences (`kiln serve --model-draft`): a batch runner over the
//! draft model with a slot per sequence slot of the server. Before a step, each speculating
//! sequence's history is brought into its draft slot (what the slot shares with it is kept, the
//! rest evaluated in prefill chunks); then the guesses of all of them are decoded together,
//! one batched step of the draft model per guess, greedily, each sequence stopping where its
//! guess is less likely than `p_min` (as [`super::speculative::ModelDrafter`] does alone).

use super::batch::BatchRunner;
use super::speculative::pick;

/// The draft model's runner and the guesses of the step being drafted, allocated once.
pub struct SlotDrafter {
    runner: BatchRunner,
    p_min: f32,
    /// Per slot: guesses still wanted in this step (0: not guessing).
    want: Vec<usize>,
    /// Per slot: this step's guesses.
    guesses: Vec<Vec<u32>>,
    /// The batched decode step of the slots still guessing (reused).
    batch: Vec<(usize, u32)>,
}

impl SlotDrafter {
    /// Guessing in `runner` (a slot per server slot), at most `draft_max` guesses a step.
    pub fn new(runner: BatchRunner, p_min: f32, draft_max: usize) -> SlotDrafter {
        let n = runner.n_slots();
        SlotDrafter {
            runner,
            p_min,
            want: vec![0; n],
            guesses: (0..n).map(|_| Vec::with_capacity(draft_max)).collect(),
            batch: Vec::with_capacity(n),
        }
    }

    /// Run on the server's runner's threads (the draft's steps come between its steps, from
    /// the same thread).
    pub fn share_threads(&mut self, target: &BatchRunner) {
        self.runner.share_threads(target);
    }

    /// Bring `slot`'s draft cache to `history` (the sequence so far, its last token not yet
    /// evaluated by the server's model), to guess up to `max` tokens after it in
    /// [`SlotDrafter::run`]. False where it cannot (the draft's context is too short, or its
    /// forward pass failed): the sequence then decodes plainly.
    pub fn start(&mut self, slot: usize, history: &[u32], max: usize) -> bool {
        self.want[slot] = 0;
        self.guesses[slot].clear();
        let n = history.len();
        // The slot holds the history and all guesses but the last.
        let Some(room) = (self.runner.n_ctx() + 1).checked_sub(n) else {
            return false;
        };
        let max = max.min(room);
        if max == 0 || n == 0 {
            return false;
        }
        // Keep what the slot shares with the history, all but its last token (whose logits
        // the first guess is drawn from).
        let common = self.runner.common_prefix(slot, history).min(n - 1);
        let mut at = self.runner.rollback(slot, common);
        let chunk = self.runner.opts.prefill_chunk;
        while at < n {
            let end = (at + chunk).min(n);
            if self
                .runner
                .prefill_chunk(slot, &history[at..end], end == n)
                .is_err()
            {
                self.runner.rollback(slot, 0);
                return false;
            }
            at = end;
        }
        self.want[slot] = max;
        true
    }

    /// Decode the guesses of every slot started since the last run, together: each round
    /// draws every guessing slot's next guess from its logits, then evaluates those that want
    /// more in one batched step.
    pub fn run(&mut self) {
        loop {
            self.batch.clear();
            for s in 0..self.want.len() {
                if self.want[s] == 0 {
                    continue;
                }
                let (t, likely) = pick(self.runner.logits(s), self.p_min);
                if !likely {
                    self.want[s] = 0;
                    continue;
                }
                self.guesses[s].push(t);
                if self.guesses[s].len() == self.want[s] {
                    self.want[s] = 0;
                } else {
                    self.batch.push((s, t));
                }
            }
            if self.batch.is_empty() {
                return;
            }
            if self.runner.decode(&self.batch).is_err() {
                // The guesses so far stand; the slots are brought back at their next start.
                self.want.fill(0);
                return;
            }
        }
    }

    /// `slot`'s guesses of the last [`SlotDrafter::run`].
    pub fn guesses(&self, slot: usize) -> &[u32] {
        &self.guesses[slot]
    }
}
