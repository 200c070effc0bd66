//! Scoring requests ([`SeqRequest::score`]): a prompt's chunks evaluated as prefill pieces, the
//! log-probability of each given token after the first scored position handed to the sink as
//! the steps compute them (perplexity through the engine).

use std::ops::Range;

use super::{FinishReason, Phase, Scheduler, SeqRequest};
use crate::engine::batch::BatchRunner;

/// Add the prompt piece `piece` of slot `slot`'s scoring request to the runner's step, its
/// positions from `first` on (but the prompt's last, which has no next token) scored.
pub(super) fn push_scored(
    runner: &mut BatchRunner,
    slot: usize,
    prompt: &[u32],
    piece: Range<usize>,
    first: usize,
) {
    let rows = scored_rows(piece.clone(), first, prompt.len());
    let tokens = &prompt[piece.clone()];
    if rows.is_empty() {
        runner.push_part(slot, tokens, false);
    } else {
        let next = &prompt[piece.start + rows.start + 1..piece.start + rows.end + 1];
        runner.push_score_part(slot, tokens, rows, next);
    }
}

/// The rows of the prompt piece `piece` (relative to it) a score from position `first` of a
/// prompt of `len` tokens reads: those at or after `first` with a next token.
fn scored_rows(piece: Range<usize>, first: usize, len: usize) -> Range<usize> {
    let lo = first.max(piece.start).min(piece.end);
    let hi = piece.end.min(len.saturating_sub(1)).max(lo);
    lo - piece.start..hi - piece.start
}

impl Scheduler<'_> {
    /// Why a scoring request cannot run here, if it cannot.
    pub(super) fn refuse_score(&self, req: &SeqRequest) -> Option<String> {
        let first = req.score?;
        if !self.runner.can_score() {
            Some("this engine does not score prompts (its runner keeps no score rows)".into())
        } else if req.embed.is_some() || !req.forks.is_empty() || req.grammar.is_some() {
            Some("a scoring request has no embedding, choices or grammar".into())
        } else if first >= req.prompt.len() {
            Some(format!(
                "the first scored position {first} is past the prompt of {} tokens",
                req.prompt.len()
            ))
        } else {
            None
        }
    }

    /// Hand slot `slot`'s scores of the step just run to its sink; its prompt is evaluated up
    /// to `next`: the request is done there.
    pub(super) fn hand_scores(&mut self, slot: usize, next: usize) {
        let Some(a) = self.active[slot].as_mut() else {
            return;
        };
        let (&Phase::Prefill { next: start }, Some(first)) = (&a.phase, a.req.score) else {
            return;
        };
        self.scored.clear();
        self.scored.extend(self.runner.scores(slot));
        if !self.scored.is_empty() {
            let at = scored_rows(start..next, first, a.req.prompt.len()).start + start;
            a.req.sink.scores(at, &self.scored);
        }
        if next == a.req.prompt.len() {
            self.finish_with(slot, FinishReason::Stop, false);
        } else {
            a.phase = Phase::Prefill { next };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scored_rows;

    #[test]
    fn a_piece_scores_its_positions_from_first_that_have_a_next_token() {
        // A prompt of 10 tokens scored from position 4, in pieces of 3.
        assert!(scored_rows(0..3, 4, 10).is_empty());
        assert_eq!(scored_rows(3..6, 4, 10), 1..3);
        assert_eq!(scored_rows(6..9, 4, 10), 0..3);
        // The last position has no next token.
        assert!(scored_rows(9..10, 4, 10).is_empty());
        assert_eq!(scored_rows(0..10, 0, 10), 0..9);
        assert!(scored_rows(0..10, 9, 10).is_empty());
    }
}
