//! A draft model for a server's sequences (`kiln serve --model-draft`): a batch runner over the
//! draft model with a slot per sequence slot of the server. Before a step, each speculating
//! sequence's history is brought into its draft slot (what the slot shares with it is kept, the
//! rest evaluated one prefill chunk a step, so that a long prompt delays the other sequences by
//! at most a chunk of the draft's); then the guesses of all of them are decoded together,
//! one batched step of the draft model per guess, greedily, each sequence stopping where its
//! guess is less likely than `p_min`. (`kiln run` and `chat` draft the same way, with one slot.)
//! A slot's cache is reused only by a sequence of the tenant that filled it, as the server's
//! own slots are ([`super::scheduler::SeqRequest::tenant`]): how fast drafts come says nothing
//! of another tenant's prompt.

use super::batch::BatchRunner;
use super::session::EngineError;
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
    /// Per slot: the tenant whose tokens its cache holds.
    tenants: Vec<u64>,
}

impl SlotDrafter {
    /// Guessing in `runner` for `target`'s slots (at most its `draft_max` guesses a step): a
    /// slot each, the same vocabulary and threads, else an error.
    pub fn new(
        runner: BatchRunner,
        target: &BatchRunner,
        p_min: f32,
    ) -> Result<SlotDrafter, EngineError> {
        let (d, t) = (&runner.model.config, &target.model.config);
        let why = if runner.n_slots() != target.n_slots() {
            Some(format!(
                "{} slots for the server's {}",
                runner.n_slots(),
                target.n_slots()
            ))
        } else if d.vocab_size != t.vocab_size {
            Some(format!(
                "a vocabulary of {} tokens, the model {}",
                d.vocab_size, t.vocab_size
            ))
        } else if runner.opts.n_threads != target.opts.n_threads {
            Some(format!(
                "{} threads for the server's {}",
                runner.opts.n_threads, target.opts.n_threads
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(EngineError::Draft(why));
        }
        let n = runner.n_slots();
        let draft_max = target.opts.draft_max;
        Ok(SlotDrafter {
            runner,
            p_min,
            want: vec![0; n],
            guesses: (0..n).map(|_| Vec::with_capacity(draft_max)).collect(),
            batch: Vec::with_capacity(n),
            tenants: vec![0; n],
        })
    }

    /// Run on the server's runner's threads (the draft's steps come between its steps, from
    /// the same thread).
    pub fn share_threads(&mut self, target: &BatchRunner) {
        self.runner.share_threads(target);
    }

    /// Bring `slot`'s draft cache to `history` (the sequence so far, its last token not yet
    /// evaluated by the server's model) of `tenant`, to guess up to `max` tokens after it in
    /// [`SlotDrafter::run`]; what the slot holds of another tenant is dropped first. At most one prefill chunk is evaluated a call: false while the
    /// slot is still behind (the next call goes on from what it holds), and where it cannot
    /// guess (the draft's context is too short, or its forward pass failed). The sequence then
    /// decodes plainly this step.
    pub fn start(&mut self, slot: usize, tenant: u64, history: &[u32], max: usize) -> bool {
        self.want[slot] = 0;
        self.guesses[slot].clear();
        if self.tenants[slot] != tenant {
            self.runner.rollback(slot, 0);
            self.tenants[slot] = tenant;
        }
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
        let at = self.runner.rollback(slot, common);
        let end = (at + self.runner.opts.prefill_chunk).min(n);
        if self
            .runner
            .prefill_chunk(slot, &history[at..end], end == n)
            .is_err()
        {
            self.runner.rollback(slot, 0);
            return false;
        }
        if end < n {
            return false;
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
