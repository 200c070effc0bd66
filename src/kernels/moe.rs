//! Mixture-of-experts routing: each token's router logits into its chosen experts and their
//! weights, as llama.cpp's `build_moe_ffn` computes them (its CPU ops: `soft_max`, `argsort`,
//! `get_rows`, `sum_rows`, `clamp`, `div`, `scale`), and the plan that groups a batch's rows by
//! expert so each active expert multiplies all of its rows at once.
//!
//! Everything a pass needs is in [`MoeScratch`], sized at load from the model's shape and the
//! largest batch: routing allocates nothing.

use super::f16ops::expf_approx;

/// How router logits become probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFn {
    Softmax,
    Sigmoid,
    /// No gate before the choice (the raw logits rank the experts); the chosen logits'
    /// softmax is their weights (gpt-oss).
    SoftmaxWeight,
}

/// What routing needs to know about the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub n_expert: usize,
    pub n_used: usize,
    pub gate: GateFn,
    /// Renormalize the chosen weights to sum 1.
    pub norm: bool,
    /// Multiply the chosen weights by this (0 and 1: not at all).
    pub scale: f32,
}

/// The reference's `ggml_vec_soft_max_f32` followed by its scale, in place on one row (its
/// AVX-512 form: runs of 16 through the vectorized `expf`, each run's sum reduced as
/// `_mm512_reduce_add_ps` does, then the tail through `expf`; the sum in f64, its inverse
/// rounded to f32 once and multiplied in).
pub fn softmax_row(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        for v in c.iter_mut() {
            *v = expf_approx(*v - max);
        }
        let mut a = [0f32; 8];
        for i in 0..8 {
            a[i] = c[i + 8] + c[i];
        }
        let mut b = [0f32; 4];
        for i in 0..4 {
            b[i] = a[i + 4] + a[i];
        }
        let (c0, c1) = (b[0] + b[2], b[1] + b[3]);
        sum += (c0 + c1) as f64;
    }
    for v in chunks.into_remainder() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Route one token: `probs` holds its router logits and is left holding the gated
/// probabilities; `experts` and `weights` (`n_used` each) get the chosen experts, largest
/// probability first (ties: the lower index), and their weights.
pub fn route(r: &Routing, probs: &mut [f32], experts: &mut [u32], weights: &mut [f32]) {
    let (n, k) = (r.n_expert, r.n_used);
    let probs = &mut probs[..n];
    match r.gate {
        GateFn::Softmax => softmax_row(probs),
        GateFn::Sigmoid => probs
            .iter_mut()
            .for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
        GateFn::SoftmaxWeight => {}
    }
    let probs = &*probs;
    // Top k by insertion: k is small (2 to 8 of up to 512).
    let (experts, weights) = (&mut experts[..k], &mut weights[..k]);
    let mut have = 0;
    for (e, &p) in probs.iter().enumerate() {
        // NaN never ranks above anything.
        let mut at = have;
        while at > 0 && p > probs[experts[at - 1] as usize] {
            at -= 1;
        }
        if at >= k {
            continue;
        }
        let end = (have + 1).min(k);
        experts.copy_within(at..end - 1, at + 1);
        experts[at] = e as u32;
        have = end;
    }
    for (w, &e) in weights.iter_mut().zip(experts.iter()) {
        *w = probs[e as usize];
    }
    if r.gate == GateFn::SoftmaxWeight {
        // `ggml_soft_max` over the `n_used` chosen logits.
        softmax_row(weights);
    }
    if r.norm {
        let sum = weights.iter().map(|&w| w as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        weights.iter_mut().for_each(|w| *w *= r.scale);
    }
}

/// A batch's rows grouped by expert: the `(row, slot)` pairs of every token's chosen experts,
/// ordered by expert, so that expert `e`'s rows are the positions `start[e]..start[e + 1]`.
pub struct MoeScratch {
    /// `[T, n_expert]` router logits, then probabilities.
    pub probs: Vec<f32>,
    /// `[T, n_used]` chosen experts and their weights.
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
    /// `[n_expert + 1]` first grouped position of each expert.
    pub start: Vec<usize>,
    /// `[n_expert]` rows placed so far, while grouping.
    fill: Vec<usize>,
    /// `[T · n_used]` the batch row at each grouped position.
    pub row_of: Vec<u32>,
    /// `[T · n_used]` the grouped position of token `j`'s slot `s` (at `j · n_used + s`).
    pub pos_of: Vec<u32>,
    /// `[n_expert]` the experts with rows, in order (the first `n_active`).
    pub active: Vec<u32>,
    pub n_active: usize,
    /// `[n_expert + 1]` and `[T · n_used]`: expert `e`'s rows split by sequence, as the token
    /// counts `segs[seg_start[e]..seg_start[e + 1]]` (none: one sequence).
    pub seg_start: Vec<usize>,
    pub segs: Vec<usize>,
    /// `[T · n_used, dim]` the gathered inputs, then the experts' outputs.
    pub xg: Vec<f32>,
    /// `[T · n_used, ffn]` gate (then activated) and up products.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// `[T · n_used, act_row_bytes]` quantized expert inputs.
    pub xq: Vec<u8>,
    /// `[T]` the shared expert's gate (Qwen2-MoE).
    pub shared_gate: Vec<f32>,
}

/// The sizes a [`MoeScratch`] is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub max_tokens: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub dim: usize,
    pub ffn: usize,
    pub act_row_bytes: usize,
}

impl MoeShape {
    /// Element counts of the buffers, in [`MoeScratch`]'s order: f32, u32, usize, u8.
    fn counts(&self) -> (usize, usize, usize, usize) {
        let (t, e) = (self.rows(), self.n_expert);
        let p = t * self.n_used;
        let f32s = t * e + p + p * self.dim + 2 * p * self.ffn + t;
        let u32s = p + 2 * p + e;
        let usizes = 2 * e + 1 + (e + 1) + p;
        (f32s, u32s, usizes, p * self.act_row_bytes)
    }

    /// Token rows held: none for a dense model.
    fn rows(&self) -> usize {
        if self.n_expert == 0 {
            0
        } else {
            self.max_tokens.max(1)
        }
    }

    /// Bytes a scratch of this shape holds.
    pub fn bytes(&self) -> usize {
        let (f, u, us, b) = self.counts();
        f * 4 + u * 4 + us * size_of::<usize>() + b
    }
}

impl MoeScratch {
    /// Empty (a dense model's).
    pub fn none() -> MoeScratch {
        MoeScratch::new(MoeShape {
            max_tokens: 0,
            n_expert: 0,
            n_used: 0,
            dim: 0,
            ffn: 0,
            act_row_bytes: 0,
        })
    }

    pub fn new(s: MoeShape) -> MoeScratch {
        let t = s.rows();
        let p = t * s.n_used;
        MoeScratch {
            probs: vec![0.0; t * s.n_expert],
            experts: vec![0; p],
            weights: vec![0.0; p],
            start: vec![0; s.n_expert + 1],
            fill: vec![0; s.n_expert],
            row_of: vec![0; p],
            pos_of: vec![0; p],
            active: vec![0; s.n_expert],
            n_active: 0,
            seg_start: vec![0; s.n_expert + 1],
            segs: vec![0; p],
            xg: vec![0.0; p * s.dim],
            gate: vec![0.0; p * s.ffn],
            up: vec![0.0; p * s.ffn],
            xq: vec![0; p * s.act_row_bytes],
            shared_gate: vec![0.0; t],
        }
    }

    pub fn bytes(&self) -> usize {
        (self.probs.len()
            + self.weights.len()
            + self.xg.len()
            + self.gate.len()
            + self.up.len()
            + self.shared_gate.len())
            * 4
            + (self.experts.len() + self.row_of.len() + self.pos_of.len() + self.active.len()) * 4
            + (self.start.len() + self.fill.len() + self.seg_start.len() + self.segs.len())
                * size_of::<usize>()
            + self.xq.len()
    }

    /// Route `rows` tokens (their router logits in `probs`, `n_expert` per row, in place)
    /// with [`route`], then [`MoeScratch::group`] them by expert.
    pub fn route_rows(&mut self, r: &Routing, rows: usize) {
        let (ne, k) = (r.n_expert, r.n_used);
        for j in 0..rows {
            route(
                r,
                &mut self.probs[j * ne..(j + 1) * ne],
                &mut self.experts[j * k..(j + 1) * k],
                &mut self.weights[j * k..(j + 1) * k],
            );
        }
        self.group(ne, k, rows);
    }

    /// Group the chosen experts of `rows` tokens (`experts`, `n_used` per row) by expert:
    /// fills `start`, `row_of` and `pos_of`. Within an expert, rows keep their batch order.
    pub fn group(&mut self, n_expert: usize, n_used: usize, rows: usize) {
        let p = rows * n_used;
        let start = &mut self.start[..n_expert + 1];
        start.fill(0);
        for &e in &self.experts[..p] {
            start[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            start[e + 1] += start[e];
        }
        let fill = &mut self.fill[..n_expert];
        fill.copy_from_slice(&start[..n_expert]);
        for (i, &e) in self.experts[..p].iter().enumerate() {
            let at = fill[e as usize];
            fill[e as usize] += 1;
            self.row_of[at] = (i / n_used) as u32;
            self.pos_of[i] = at as u32;
        }
        self.n_active = 0;
        for e in 0..n_expert {
            if start[e + 1] > start[e] {
                self.active[self.n_active] = e as u32;
                self.n_active += 1;
            }
        }
    }

    /// After [`MoeScratch::group`]: split each expert's rows by the sequence they belong to,
    /// the batch being the sequences of `seqs` tokens in order (fewer than two: one sequence,
    /// and no split). Rows that are each alone are sequences of one.
    pub fn split_by_sequence(&mut self, n_expert: usize, seqs: &[usize]) {
        let seg_start = &mut self.seg_start[..n_expert + 1];
        seg_start.fill(0);
        if seqs.len() < 2 {
            return;
        }
        let mut k = 0;
        for e in 0..n_expert {
            let rows = &self.row_of[self.start[e]..self.start[e + 1]];
            // Rows are in batch order: walk the sequences along them.
            let (mut seq, mut end) = (0, seqs[0]);
            let mut i = 0;
            while i < rows.len() {
                while rows[i] as usize >= end {
                    seq += 1;
                    end += seqs[seq];
                }
                let from = i;
                while i < rows.len() && (rows[i] as usize) < end {
                    i += 1;
                }
                self.segs[k] = i - from;
                k += 1;
            }
            seg_start[e + 1] = k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`route`] of one row `p` (in place) over `n` experts, `k` used: `(experts, weights)`.
    fn pick(
        p: &mut [f32],
        (n, k): (usize, usize),
        gate: GateFn,
        norm: bool,
        scale: f32,
    ) -> (Vec<u32>, Vec<f32>) {
        let r = Routing {
            n_expert: n,
            n_used: k,
            gate,
            norm,
            scale,
        };
        let (mut e, mut w) = (vec![0u32; k], vec![0f32; k]);
        route(&r, p, &mut e, &mut w);
        (e, w)
    }

    /// The softmax against the f64 one: the vectorized runs and the scalar tail both within a
    /// few ulps; the probabilities sum to 1.
    #[test]
    fn softmax_matches_f64() {
        for n in [1, 5, 16, 20, 33, 64, 128] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7).collect();
            let mut y = x.clone();
            softmax_row(&mut y);
            let max = x
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
            let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
            for (a, &b) in y.iter().zip(&x) {
                let want = (b as f64 - max).exp() / sum;
                assert!(
                    (*a as f64 - want).abs() <= 4e-7 * want.max(1e-3),
                    "{n}: {a} {want}"
                );
            }
        }
    }

    /// Top-k picks the largest, largest first, ties to the lower index; the weights are the
    /// probabilities, renormalized and scaled when asked.
    #[test]
    fn route_picks_top_k_in_order() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0, 0.0, 2.5, -4.0];
        let mut p = logits;
        let (e, w) = pick(&mut p, (8, 3), GateFn::Softmax, false, 0.0);
        assert_eq!(e, [1, 3, 6]);
        assert_eq!(w, [p[1], p[3], p[6]]);
        assert!(w[0] > w[2] && w[2] > 0.0);

        let mut p = logits;
        let (e, w) = pick(&mut p, (8, 3), GateFn::Softmax, true, 2.0);
        let s = p[1] + p[3] + p[6];
        assert_eq!(e, [1, 3, 6]);
        assert!((w.iter().sum::<f32>() - 2.0).abs() < 1e-6, "{w:?} {s}");

        let mut p = logits;
        let (e, w) = pick(&mut p, (8, 1), GateFn::Sigmoid, false, 0.0);
        assert_eq!(e[0], 1);
        assert_eq!(w[0], 1.0 / (1.0 + (-3.0f32).exp()));

        // All experts used, reverse order.
        let mut p = [1.0f32, 2.0, 3.0, 4.0];
        let (e4, _) = pick(&mut p, (4, 4), GateFn::Softmax, false, 0.0);
        assert_eq!(e4, [3, 2, 1, 0]);
    }

    /// gpt-oss's routing: the raw logits rank the experts (the probabilities are left as the
    /// logits), and the chosen logits' own softmax is the weights.
    #[test]
    fn softmax_weight_ranks_logits_and_normalizes_the_chosen() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0, 0.0, 2.5, -4.0];
        let mut p = logits;
        let (e, w) = pick(&mut p, (8, 4), GateFn::SoftmaxWeight, false, 0.0);
        assert_eq!(p, logits);
        assert_eq!(e, [1, 3, 6, 4]);
        // The reference's softmax of a short row: expf of each minus the maximum, the sum in
        // f64, its inverse rounded once.
        let x = [3.0f32, 3.0, 2.5, 2.0].map(|v| (v - 3.0f32).exp());
        let inv = (1.0 / x.iter().map(|&v| v as f64).sum::<f64>()) as f32;
        assert_eq!(w, x.map(|v| v * inv));
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// Grouping places every (row, slot) once, experts in order, rows in batch order.
    #[test]
    fn grouping_is_a_permutation_by_expert() {
        let (n_expert, k, rows) = (5, 2, 6);
        let mut s = MoeScratch::new(MoeShape {
            max_tokens: rows,
            n_expert,
            n_used: k,
            dim: 4,
            ffn: 4,
            act_row_bytes: 8,
        });
        let picks = [[0u32, 3], [3, 1], [4, 0], [0, 1], [3, 4], [1, 0]];
        for (j, p) in picks.iter().enumerate() {
            s.experts[j * k..j * k + k].copy_from_slice(p);
        }
        s.group(n_expert, k, rows);
        assert_eq!(&s.start[..], &[0, 4, 7, 7, 10, 12]);
        for (j, pick) in picks.iter().enumerate() {
            for (slot, &e) in pick.iter().enumerate() {
                let at = s.pos_of[j * k + slot] as usize;
                assert!((s.start[e as usize]..s.start[e as usize + 1]).contains(&at));
                assert_eq!(s.row_of[at] as usize, j);
            }
        }
        let e0: Vec<u32> = s.row_of[0..4].to_vec();
        assert_eq!(e0, [0, 2, 3, 5]);
        assert_eq!(&s.active[..s.n_active], &[0, 1, 3, 4]);
        // Sequences of 2, 1 and 3 tokens: expert 0's rows 0, 2, 3, 5 are 1 + 1 + 2.
        s.split_by_sequence(n_expert, &[2, 1, 3]);
        let segs = |s: &MoeScratch, e: usize| s.segs[s.seg_start[e]..s.seg_start[e + 1]].to_vec();
        assert_eq!(segs(&s, 0), [1, 1, 2]);
        // Expert 1: rows 1, 3, 5; expert 2 none; expert 3: rows 0, 1, 4; expert 4: 2, 4.
        assert_eq!(segs(&s, 1), [1, 2]);
        assert_eq!(segs(&s, 2), [0usize; 0]);
        assert_eq!(segs(&s, 3), [2, 1]);
        assert_eq!(segs(&s, 4), [1, 1]);
        // One sequence: no split.
        s.split_by_sequence(n_expert, &[6]);
        assert!((0..n_expert).all(|e| segs(&s, e).is_empty()));
        assert!(s.bytes() > 0 && MoeScratch::none().bytes() <= 8 * 2);
    }
}
