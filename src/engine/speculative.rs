//! Speculative decoding: a cheap drafter guesses the next few tokens, the model evaluates the
//! sampled token and the guesses in one forward pass (its weights read once for all of them),
//! and keeps the guesses its own sampler agrees with.
//!
//! Verification samples each position's logits with the generation's own sampler, in order,
//! and accepts a draft token only where the sample equals it; the first disagreement becomes
//! the next token. So every emitted token is a sample of the model's distribution at its
//! position, drawn with one sampler call per emitted token, in the same order as plain
//! decoding: with logits equal to plain decoding's, the output is the same, greedy or seeded
//! (for deterministic drafters, rejection sampling reduces to this comparison). The cache is
//! then rolled back to the accepted tokens (`Session::rollback`).
//!
//! Two drafters (llama.cpp's `--spec-type`):
//! - [`NgramDrafter`] (`ngram-simple`, prompt lookup decoding): the tokens that followed the
//!   latest earlier occurrence of the context's last `n` tokens. No second model; it pays
//!   where the output repeats its input (editing, extraction, code, quoting).
//! - [`ModelDrafter`] (`draft-simple`, `--model-draft`): a smaller model of the same
//!   vocabulary, decoding greedily in its own session.

use super::sequence::{mask_logits, StopReason};
use super::session::{EngineError, Session};
use crate::kernels::ops::{exp_sum, max_not_nan};
use crate::sampler::{argmax, Sampler};

/// Guesses the tokens that follow a history.
pub trait Drafter: Send {
    /// Append up to `max` guesses of the tokens after `history` (the whole sequence so far,
    /// its last token not yet evaluated by the model) to `out`; none is fine.
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>)
        -> Result<(), EngineError>;

    /// Run on the threads of `target`'s session (a drafter with a session of its own).
    fn share_threads(&mut self, _target: &Session) {}
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
    fn draft(
        &mut self,
        history: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        if let Some(start) = lookup(history, self.n_min, self.n_max) {
            let end = (start + max).min(history.len());
            out.extend_from_slice(&history[start..end]);
        }
        Ok(())
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

/// A smaller model of the same vocabulary, decoding greedily in its own session. It stops
/// drafting where its most likely token has a probability under `p_min` (llama.cpp's
/// `--draft-p-min`).
pub struct ModelDrafter {
    session: Session,
    p_min: f32,
}

impl ModelDrafter {
    pub fn new(session: Session, p_min: f32) -> ModelDrafter {
        ModelDrafter { session, p_min }
    }
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

impl Drafter for ModelDrafter {
    fn share_threads(&mut self, target: &Session) {
        // The draft runs between the target's passes, from the same thread.
        self.session.share_threads(target);
    }

    fn draft(
        &mut self,
        history: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        // The draft session holds the history and all but the last guess: fewer guesses near
        // the end of its context, none past it (the model goes on alone).
        let Some(left) = (self.session.n_ctx() + 1).checked_sub(history.len()) else {
            return Ok(());
        };
        let max = max.min(left);
        if max == 0 {
            return Ok(());
        }
        // The draft session keeps what it shares with the history and evaluates the rest.
        self.session.prefill_reuse(history, &mut |_, _| {})?;
        let (mut t, mut likely) = pick(self.session.logits(), self.p_min);
        while likely {
            out.push(t);
            if out.len() == max {
                break;
            }
            (t, likely) = pick(self.session.decode(t)?, self.p_min);
        }
        Ok(())
    }
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

/// What a verification step leaves to the generation loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing drafted: decode the token as usual.
    Plain,
    /// The accepted drafts were emitted; the next token (sampled, not yet evaluated), unless
    /// the token limit was reached.
    Next(Option<u32>),
    /// Generation stops (an accepted draft ended it, or its consumer did).
    Stop(StopReason),
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

/// A drafter with the buffers of verification, allocated once.
pub struct Speculation {
    drafter: Box<dyn Drafter>,
    /// Most draft tokens a step verifies (llama.cpp's `--draft-max`).
    pub draft_max: usize,
    /// Fewer drafts than this are not verified (llama.cpp's `--draft-min`).
    pub draft_min: usize,
    /// Drafts the next step asks for.
    want: DraftWant,
    /// Most drafts a pass may hold so that a rollback to its first token stays exact
    /// ([`Session::rollback_reach`] − 1).
    reach: usize,
    pub stats: SpecStats,
    vocab: usize,
    history: Vec<u32>,
    drafts: Vec<u32>,
    batch: Vec<u32>,
    /// `[draft_max + 1][vocab]`: the logits of each position of a verification pass.
    rows: Vec<f32>,
    redo: Vec<u32>,
}

impl Speculation {
    pub fn new(
        drafter: Box<dyn Drafter>,
        draft_max: usize,
        draft_min: usize,
        vocab: usize,
    ) -> Speculation {
        let draft_max = draft_max.max(1);
        Speculation {
            drafter,
            draft_max,
            draft_min: draft_min.clamp(1, draft_max),
            want: DraftWant::new(draft_max),
            reach: usize::MAX,
            stats: SpecStats::default(),
            vocab,
            history: Vec::new(),
            drafts: Vec::with_capacity(draft_max),
            batch: Vec::with_capacity(draft_max + 1),
            rows: vec![0.0; (draft_max + 1) * vocab],
            redo: Vec::new(),
        }
    }

    /// Let the drafter run on `target`'s threads (a draft model's session would otherwise
    /// keep a pool of its own, whose idle workers spin while the target's run, and the other
    /// way round).
    pub fn share_threads(&mut self, target: &Session) {
        self.drafter.share_threads(target);
    }

    /// A generation in `session` starts: counts from zero, [`FIRST_DRAFTS`] drafts asked for,
    /// passes kept within what the session's sliding-window rings can roll back.
    pub fn start(&mut self, session: &Session) {
        self.stats = SpecStats::default();
        self.want = DraftWant::new(self.draft_max);
        self.reach = session.rollback_reach().saturating_sub(1);
    }

    /// Evaluate `next` (sampled, emitted, not yet evaluated) with the drafter's guesses and
    /// emit the guesses `sampler` agrees with through `emit` (an `Err` stops generation there);
    /// at most `room` more tokens are emitted. The session is left holding `next` and the
    /// accepted guesses; its [`Session::logits`] are then not those after the last of them
    /// (the generation loop goes on from the returned token). `mask`: token ids whose logits
    /// are masked before sampling (`--ignore-eos`).
    pub fn step(
        &mut self,
        session: &mut Session,
        sampler: &mut Sampler,
        next: u32,
        room: usize,
        mask: Option<&[u32]>,
        emit: &mut dyn FnMut(u32) -> Result<(), StopReason>,
    ) -> Result<Step, EngineError> {
        let n0 = session.n_past();
        let fits = session.n_ctx().saturating_sub(n0 + 1);
        let cap = self
            .want
            .cap(self.draft_min, room.min(fits).min(self.reach));
        if cap < self.draft_min {
            return Ok(Step::Plain);
        }
        // Room for a whole context, taken once: a step allocates nothing.
        let most = session.n_ctx() + 1;
        self.history.clear();
        self.history.reserve(most);
        self.redo.clear();
        self.redo.reserve(most);
        self.history.extend_from_slice(session.tokens());
        self.history.push(next);
        self.drafts.clear();
        self.drafter.draft(&self.history, cap, &mut self.drafts)?;
        self.drafts.truncate(cap);
        let k = self.drafts.len();
        if k < self.draft_min {
            return Ok(Step::Plain);
        }
        self.batch.clear();
        self.batch.push(next);
        self.batch.extend_from_slice(&self.drafts);
        let (v, rows) = (self.vocab, &mut self.rows);
        session.eval_as_decodes(&self.batch, &mut |p, l| {
            rows[p * v..(p + 1) * v].copy_from_slice(&l[..v]);
        })?;
        self.stats.passes += 1;
        self.stats.drafted += k;
        // Row `i` holds the logits after `next` and the first `i` drafts.
        let mut i = 0;
        let step = loop {
            if i == room {
                break Step::Next(None);
            }
            let row = &mut self.rows[i * v..(i + 1) * v];
            if let Some(m) = mask {
                mask_logits(row, m);
            }
            let s = sampler.sample(row, &session.tokens()[..n0 + 1 + i]);
            if i == k || s != self.drafts[i] {
                break Step::Next(Some(s));
            }
            if let Err(stop) = emit(s) {
                break Step::Stop(stop);
            }
            self.stats.accepted += 1;
            i += 1;
        };
        self.want.passed(i, k);
        self.keep(session, n0 + 1 + i)?;
        Ok(step)
    }

    /// Roll `session` back to its first `n` tokens, evaluating again what a sliding-window
    /// ring could not keep (passes are held within [`Session::rollback_reach`], so only a
    /// session other than the one [`Speculation::start`] saw gets here).
    fn keep(&mut self, session: &mut Session, n: usize) -> Result<(), EngineError> {
        if session.n_past() == n {
            return Ok(());
        }
        self.redo.clear();
        self.redo.extend_from_slice(&session.tokens()[..n]);
        let kept = session.rollback(n);
        if kept < n {
            session.prefill(&self.redo[kept..], &mut |_, _| {})?;
        }
        Ok(())
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
        d.draft(&h, 2, &mut out).unwrap();
        assert_eq!(out, [13, 14]);
        out.clear();
        // The continuation stops at the end of the history.
        d.draft(&h, 20, &mut out).unwrap();
        assert_eq!(out, [13, 14, 15, 10, 11, 12]);
    }
}
