//! Speculative decoding's drafters: a cheap drafter guesses the next few tokens, the model
//! evaluates the sampled token and the guesses in one forward pass (its weights read once for
//! all of them), and keeps the guesses its own sampler agrees with. The verification is the
//! scheduler's ([`super::scheduler::Scheduler::speculate`]), for a server's sequences and the
//! command line's alike.
//!
//! Verification samples each position's logits with the generation's own sampler, in order,
//! and accepts a draft token only where the sample equals it; the first disagreement becomes
//! the next token. So every emitted token is a sample of the model's distribution at its
//! position, drawn with one sampler call per emitted token, in the same order as plain
//! decoding: with logits equal to plain decoding's, the output is the same, greedy or seeded
//! (for deterministic drafters, rejection sampling reduces to this comparison). The cache is
//! then rolled back to the accepted tokens.
//!
//! Two drafters (llama.cpp's `--spec-type`):
//! - [`NgramDrafter`] (`ngram-simple`, prompt lookup decoding): the tokens that followed the
//!   latest earlier occurrence of the context's last `n` tokens. No second model; it pays
//!   where the output repeats its input (editing, extraction, code, quoting).
//! - a draft model (`draft-simple`, `--model-draft`): a smaller model of the same vocabulary,
//!   decoding greedily in a runner of its own ([`super::slot_drafter::SlotDrafter`]).

use crate::kernels::ops::{exp_sum, max_not_nan};
use crate::sampler::argmax;

/// Guesses the tokens that follow a history from the history alone.
pub trait Drafter: Send {
    /// Append up to `max` guesses of the tokens after `history` (the whole sequence so far,
    /// its last token not yet evaluated by the model) to `out`; none is fine.
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>);
}

/// Prompt lookup: find the latest earlier occurrence of the history's last `n` tokens (`n`
/// from `n_max` down to `n_min`) and propose what followed it.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub n_min: usize,
    pub n_max: usize,
}

impl NgramDrafter {
    pub fn new(n_min: usize, n_max: usize) -> NgramDrafter {
        let n_min = n_min.max(1);
        NgramDrafter {
            n_min,
            n_max: n_max.max(n_min),
        }
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        if let Some(start) = lookup(history, self.n_min, self.n_max) {
            let end = (start + max).min(history.len());
            out.extend_from_slice(&history[start..end]);
        }
    }
}

/// Where the continuation of the latest earlier occurrence of `history`'s last `n` tokens
/// starts (the longest `n` in `n_min..=n_max` that occurs), if any.
fn lookup(history: &[u32], n_min: usize, n_max: usize) -> Option<usize> {
    let len = history.len();
    for n in (n_min..=n_max.min(len.saturating_sub(1))).rev() {
        let key = &history[len - n..];
        // Latest first: an occurrence ending before the last token, so something follows it.
        if let Some(i) = (0..len - n).rev().find(|&i| history[i..i + n] == *key) {
            return Some(i + n);
        }
    }
    None
}

/// The most likely token of `logits` and whether its probability reaches `p_min`.
pub(crate) fn pick(logits: &[f32], p_min: f32) -> (u32, bool) {
    let t = argmax(logits);
    if p_min <= 0.0 {
        return (t, true);
    }
    // p(top) = exp(0) / Σ exp(l − max).
    let p = 1.0 / exp_sum(logits, max_not_nan(logits));
    (t, p >= f64::from(p_min))
}

/// The context of a draft model beside a model's `n_ctx` positions: the same, or `asked`
/// (`-cd`, llama.cpp's `--ctx-size-draft`; 0: the same) where shorter, or the draft's training
/// context where that is shorter still (a training context of 0: unknown, no bound).
#[must_use]
pub fn draft_context(
    n_ctx: usize,
    asked: Option<usize>,
    draft: &crate::model::ModelConfig,
) -> usize {
    let n = asked.filter(|&c| c > 0).map_or(n_ctx, |c| c.min(n_ctx));
    match draft.ctx_train {
        0 => n,
        train => n.min(train),
    }
}

/// Counts of one generation's speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Verification passes (forward passes over a token and its drafts).
    pub passes: usize,
    /// Draft tokens evaluated.
    pub drafted: usize,
    /// Draft tokens accepted (emitted without a forward pass of their own).
    pub accepted: usize,
}

/// Drafts a generation's first step asks for (then doubled while all are accepted).
const FIRST_DRAFTS: usize = 4;

/// How many drafts a generation's next verification pass asks for: [`FIRST_DRAFTS`] first,
/// doubled (up to `max`) after a pass that kept all of its drafts, one more than were kept
/// after one that did not, so text the drafter cannot guess costs passes of a few rows, not
/// of `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DraftWant {
    want: usize,
    max: usize,
}

impl DraftWant {
    pub(crate) fn new(max: usize) -> DraftWant {
        DraftWant {
            want: FIRST_DRAFTS.min(max),
            max,
        }
    }

    /// The drafts to ask for: at least `min`, at most `limit` (what the pass may hold).
    #[must_use]
    pub(crate) fn cap(&self, min: usize, limit: usize) -> usize {
        self.want.max(min).min(limit)
    }

    /// A pass kept `kept` of its `drafted` drafts.
    pub(crate) fn passed(&mut self, kept: usize, drafted: usize) {
        self.want = if kept == drafted {
            (2 * self.want).min(self.max)
        } else {
            kept + 1
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // "1 2 3 4 | 9 2 3 5 | 2 3": the last 2 tokens (2 3) last occurred before 5.
        let h = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3];
        assert_eq!(lookup(&h, 1, 2), Some(7));
        // With n up to 3: "5 2 3" never occurred before, "2 3" did.
        assert_eq!(lookup(&h, 1, 3), Some(7));
        // "9 2 3" then ... : a longer key wins over a later, shorter one.
        let h = [9, 2, 3, 7, 2, 3, 8, 9, 2, 3];
        assert_eq!(lookup(&h, 1, 3), Some(3));
        assert_eq!(lookup(&h, 1, 2), Some(6));
        // Nothing repeats.
        assert_eq!(lookup(&[1, 2, 3, 4], 1, 3), None);
        // A run: the key overlaps its match.
        assert_eq!(lookup(&[5, 5, 5], 2, 2), Some(2));
        assert_eq!(lookup(&[], 1, 3), None);
        assert_eq!(lookup(&[7], 1, 3), None);
    }

    #[test]
    fn ngram_drafter_proposes_what_followed() {
        let mut d = NgramDrafter::new(1, 3);
        let mut out = Vec::new();
        let h = [10, 11, 12, 13, 14, 15, 10, 11, 12];
        d.draft(&h, 2, &mut out);
        assert_eq!(out, [13, 14]);
        out.clear();
        // The continuation stops at the end of the history.
        d.draft(&h, 20, &mut out);
        assert_eq!(out, [13, 14, 15, 10, 11, 12]);
    }
}
