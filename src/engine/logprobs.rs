//! Token log-probabilities as OpenAI and vLLM define them: the log-softmax of the model's raw
//! logits (before penalties, temperature, grammar masks and `ignore_eos`), for the sampled token
//! and the `k` most likely tokens of its position.
//!
//! [`TokenLogprobs`] holds one position's answer in buffers allocated once (at most
//! [`MAX_TOP_LOGPROBS`] alternatives), so a decode step that reports log-probabilities allocates
//! nothing: [`TokenLogprobs::observe`] reads the logits row (a pass each for the maximum, the
//! normalizer and the top-k insertion), [`TokenLogprobs::choose`] records the sampled token.

use crate::kernels::ops::{exp_sum, max_not_nan};

/// The most alternatives a position reports (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and its position's most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token and its log-probability.
    pub token: u32,
    pub logprob: f32,
    /// The `k` most likely tokens of the position, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
    /// Alternatives wanted.
    k: usize,
    /// `ln Σ exp(logit)` of the observed row (NaN logits count as -inf).
    log_norm: f64,
    /// The observed row's length.
    n: usize,
}

impl TokenLogprobs {
    /// Buffers for `k` alternatives (capped at [`MAX_TOP_LOGPROBS`]).
    pub fn new(k: usize) -> TokenLogprobs {
        let k = k.min(MAX_TOP_LOGPROBS);
        TokenLogprobs {
            token: 0,
            logprob: f32::NEG_INFINITY,
            top: Vec::with_capacity(k + 1),
            k,
            log_norm: 0.0,
            n: 0,
        }
    }

    /// Alternatives reported per position.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Read a position's raw logits: the normalizer and the top `k`.
    pub fn observe(&mut self, logits: &[f32]) {
        self.n = logits.len();
        let max = max_not_nan(logits);
        self.top.clear();
        if !max.is_finite() {
            // All masked (uniform), or +inf present: no meaningful normalizer; mirror
            // `sampler::log_softmax`'s conventions through `log_prob`.
            self.log_norm = if max == f32::INFINITY {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
        } else {
            self.log_norm = max as f64 + exp_sum(logits, max).ln();
        }
        if self.k == 0 {
            return;
        }
        // Insertion into a sorted list of at most k: a logit enters only if it beats the
        // current k-th (ties keep the lower id, which came first). Once the list is full, a
        // chunk of 16 none of which beats it is passed over whole (an `|` of compares, which
        // vectorizes; NaN compares false, as its −∞ would lose).
        for (c, chunk) in logits.chunks(16).enumerate() {
            if self.top.len() == self.k {
                let floor = self.top[self.k - 1].1;
                if !chunk.iter().fold(false, |a, &v| a | (v > floor)) {
                    continue;
                }
            }
            for (j, &v) in chunk.iter().enumerate() {
                let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
                if self.top.len() == self.k && v <= self.top[self.k - 1].1 {
                    continue;
                }
                let at = self.top.partition_point(|&(_, l)| l >= v);
                self.top.insert(at, ((16 * c + j) as u32, v));
                self.top.truncate(self.k);
            }
        }
        for i in 0..self.top.len() {
            self.top[i].1 = self.log_prob_of(self.top[i].1);
        }
    }

    /// Record the sampled `token`, whose raw logit is `logit`.
    pub fn choose(&mut self, token: u32, logit: f32) {
        self.token = token;
        self.logprob = self.log_prob_of(logit);
    }

    /// `ln softmax` of one logit of the observed row.
    fn log_prob_of(&self, logit: f32) -> f32 {
        if logit.is_nan() {
            return f32::NEG_INFINITY;
        }
        if self.log_norm == f64::NEG_INFINITY {
            // Every logit is -inf: the sampler draws uniformly.
            return -(self.n.max(1) as f64).ln() as f32;
        }
        if self.log_norm == f64::INFINITY {
            return if logit == f32::INFINITY {
                0.0
            } else {
                f32::NEG_INFINITY
            };
        }
        (logit as f64 - self.log_norm) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::log_softmax;

    #[test]
    fn matches_log_softmax_and_sorts_the_top() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 1000) as f32 / 100.0).sin() * 5.0)
            .collect();
        let mut lp = TokenLogprobs::new(5);
        lp.observe(&logits);
        lp.choose(17, logits[17]);
        assert!((lp.logprob as f64 - log_softmax(&logits, 17)).abs() < 1e-5);
        assert_eq!(lp.top.len(), 5);
        let mut order: Vec<u32> = (0..1000).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        for (i, &(id, l)) in lp.top.iter().enumerate() {
            assert_eq!(id, order[i], "rank {i}");
            assert!((l as f64 - log_softmax(&logits, id)).abs() < 1e-5);
        }
        // Probabilities sum to one.
        let total: f64 = (0..1000u32)
            .map(|t| {
                lp.choose(t, logits[t as usize]);
                (lp.logprob as f64).exp()
            })
            .sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
    }

    /// The chunked insertion keeps what inserting every logit keeps: the top k by logit, the
    /// lower id first among equals (±0 equal), NaN as −∞; rows of every length around the
    /// chunk of 16, rising runs (every chunk beats the floor), ties, NaN, ±0 and ±∞.
    #[test]
    fn top_matches_inserting_every_logit() {
        let plain = |logits: &[f32], k: usize| {
            let mut top: Vec<(u32, f32)> = Vec::new();
            for (i, &v) in logits.iter().enumerate() {
                let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
                let at = top.partition_point(|&(_, l)| l >= v);
                top.insert(at, (i as u32, v));
                top.truncate(k);
            }
            top.iter().map(|t| t.0).collect::<Vec<u32>>()
        };
        let specials = crate::sampler::SPECIAL_LOGITS;
        let mut x = 0x2545f4914f6cdd1du64;
        for case in 0..600 {
            let n = case % 50 + if case % 5 == 0 { 300 } else { 0 };
            let logits: Vec<f32> = (0..n)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match case / 50 % 4 {
                        0 => specials[(x % 7) as usize],
                        1 => (x % 3) as f32,
                        2 => i as f32,
                        _ => (x >> 40) as f32 / 1e7,
                    }
                })
                .collect();
            for k in [0, 1, 3, 20] {
                let mut lp = TokenLogprobs::new(k);
                lp.observe(&logits);
                let got: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
                assert_eq!(got, plain(&logits, k), "case {case}, k {k}");
            }
        }
    }

    #[test]
    fn ties_go_to_the_lower_id_and_k_is_capped() {
        let logits = [1.0, 3.0, 3.0, 2.0, 3.0];
        let mut lp = TokenLogprobs::new(3);
        lp.observe(&logits);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 4]);
        let mut lp = TokenLogprobs::new(0);
        lp.observe(&logits);
        assert!(lp.top.is_empty());
        assert_eq!(TokenLogprobs::new(100).k(), MAX_TOP_LOGPROBS);
        let mut lp = TokenLogprobs::new(10);
        lp.observe(&logits);
        assert_eq!(lp.top.len(), 5, "no more than the vocabulary");
    }

    #[test]
    fn edge_rows() {
        let mut lp = TokenLogprobs::new(2);
        lp.observe(&[f32::NEG_INFINITY; 4]);
        lp.choose(1, f32::NEG_INFINITY);
        assert!((lp.logprob - -(4f32).ln()).abs() < 1e-6);
        lp.observe(&[0.0, f32::NAN, 1.0]);
        lp.choose(1, f32::NAN);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert_eq!(lp.top[0].0, 2);
        lp.observe(&[0.0, f32::INFINITY]);
        lp.choose(1, f32::INFINITY);
        assert_eq!(lp.logprob, 0.0);
        lp.choose(0, 0.0);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn observing_allocates_nothing_after_new() {
        let logits: Vec<f32> = (0..5000).map(|i| (i as f32).cos()).collect();
        let mut lp = TokenLogprobs::new(20);
        let cap = lp.top.capacity();
        for _ in 0..3 {
            lp.observe(&logits);
        }
        assert_eq!(lp.top.capacity(), cap, "the top-k buffer never grows");
    }
}
