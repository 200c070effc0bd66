//! Speculative decoding in the scheduler: each step's drafts (prompt lookup, or a draft
//! model's slots), verified as passes of their own beside the other sequences' rows, and the
//! drafts kept.

use std::sync::atomic::Ordering::Relaxed;

use super::{FinishReason, Phase, Scheduler};
use crate::engine::slot_drafter::SlotDrafter;
use crate::engine::speculative::{Drafter, NgramDrafter};

/// Speculative decoding in a scheduler: at most the runner's `draft_max` drafts a pass, none
/// verified below `draft_min`.
pub(super) struct ServeSpec {
    drafter: ServeDrafter,
    draft_min: usize,
}

/// Where a scheduler's drafts come from.
pub enum ServeDrafter {
    /// Guesses from the history alone: prompt lookup (`--spec-type ngram-simple`), or another
    /// [`Drafter`].
    Lookup(Box<dyn Drafter>),
    /// A draft model with a slot per sequence slot (`--model-draft`).
    Model(Box<SlotDrafter>),
}

impl From<NgramDrafter> for ServeDrafter {
    fn from(d: NgramDrafter) -> ServeDrafter {
        ServeDrafter::Lookup(Box::new(d))
    }
}

impl From<SlotDrafter> for ServeDrafter {
    fn from(d: SlotDrafter) -> ServeDrafter {
        ServeDrafter::Model(Box::new(d))
    }
}

impl<'t> Scheduler<'t> {
    /// Decode speculatively with `drafter`'s guesses (prompt lookup, or a draft model's slots):
    /// up to the runner's `opts.draft_max` drafts a pass, fewer than `draft_min` not verified.
    /// Sequences with a grammar decode plainly. A runner without draft rows (`draft_max` 0)
    /// leaves it off.
    pub fn speculate(&mut self, drafter: impl Into<ServeDrafter>, draft_min: usize) {
        let max = self.runner.opts.draft_max;
        if max == 0 {
            return;
        }
        let mut drafter = drafter.into();
        if let ServeDrafter::Model(d) = &mut drafter {
            d.share_threads(&self.runner);
        }
        self.history = Vec::with_capacity(self.runner.n_ctx() + 1);
        self.spec = Some(ServeSpec {
            drafter,
            draft_min: draft_min.clamp(1, max),
        });
    }

    /// With speculation on, each generating sequence's verification pass for this step: its
    /// pending token and the drafts after it (`Active::verify`; empty for a plain row).
    pub(super) fn draft(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        let r = &self.runner;
        // Passes within what a slot can carry and roll back exactly.
        let most = r.opts.draft_max.min(r.rollback_reach().saturating_sub(1));
        for (s, a) in self.active.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            a.verify.clear();
            let Phase::Decode { pending } = a.phase else {
                continue;
            };
            if a.req.grammar.is_some() {
                continue;
            }
            let tokens = r.tokens(s);
            let cap = a.want.cap(
                spec.draft_min,
                // (the pending token is counted; the last token asked for ends the request
                // unevaluated, so no draft follows it)
                most.min(a.req.max_new.saturating_sub(a.generated + 1))
                    .min(r.n_ctx().saturating_sub(tokens.len() + 1)),
            );
            if cap < spec.draft_min {
                continue;
            }
            self.history.clear();
            self.history.extend_from_slice(tokens);
            self.history.push(pending);
            a.verify.push(pending);
            match &mut spec.drafter {
                ServeDrafter::Lookup(d) => {
                    d.draft(&self.history, cap, &mut a.verify);
                    a.verify.truncate(1 + cap);
                }
                ServeDrafter::Model(d) => {
                    if !d.start(s, a.req.tenant, &self.history, cap) {
                        a.verify.clear();
                    }
                }
            }
        }
        // A draft model's guesses for every started sequence, decoded together.
        if let ServeDrafter::Model(d) = &mut spec.drafter {
            d.run();
            for (s, a) in self.active.iter_mut().enumerate() {
                if let Some(a) = a.as_mut().filter(|a| !a.verify.is_empty()) {
                    a.verify.extend_from_slice(d.guesses(s));
                }
            }
        }
        for a in self.active.iter_mut().flatten() {
            if !a.verify.is_empty() && a.verify.len() - 1 < spec.draft_min {
                a.verify.clear();
            }
        }
    }

    /// After `slot`'s verification pass: sample its rows in order, keeping each draft the
    /// sample equals; the first sample that differs (or follows the last draft) is the next
    /// pending token. The slot is rolled back to the pending token and the drafts kept.
    pub(super) fn accept_drafts(&mut self, slot: usize) {
        let a = self.active[slot].as_mut().expect("active slot");
        let k = a.verify.len() - 1;
        let base = self.runner.tokens(slot).len() - a.verify.len();
        let mut i = 0;
        while let Some(t) = self.sample_emit(slot, i, base + 1 + i) {
            let a = self.active[slot]
                .as_mut()
                .expect("a sampled slot is active");
            if i < k && t == a.verify[1 + i] {
                i += 1;
                continue;
            }
            a.phase = Phase::Decode { pending: t };
            break;
        }
        if let Some(a) = self.active[slot].as_mut() {
            a.want.passed(i, k);
        }
        let kept = self.runner.rollback(slot, base + 1 + i);
        if kept < base + 1 + i {
            // (Passes are held within the rollback reach: not reached.)
            debug_assert!(false, "a pass past the rollback reach");
            let e = format!("speculative decoding lost the cache past position {kept}");
            self.finish(slot, FinishReason::Error(e));
        }
        let m = &self.metrics;
        m.spec_passes.fetch_add(1, Relaxed);
        m.spec_drafted.fetch_add(k as u64, Relaxed);
        m.spec_accepted.fetch_add(i as u64, Relaxed);
    }
}
