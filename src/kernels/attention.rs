//! Causal grouped-query attention over the head-major f16 KV cache, flash-attention style.
//!
//! Work is split into items `(token, kv_head, chunk of positions)`. Each item streams its keys
//! and values once for all the query heads of its group (GQA), keeping an online softmax
//! (running max `m`, running sum `l`, accumulator `acc`) instead of a score row as long as the
//! context. Decode (one token, few kv heads) splits the positions into chunks so every thread
//! has work (flash-decoding); a merge step then combines the chunks' partial results.

use super::f16ops::F16Ops;
use super::pool::{split_range, DisjointSlice, ThreadPool};
use half::f16;

/// Shape and masking of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplier applied to q·k (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at positions `> p - window`.
    pub window: Option<usize>,
    /// Positions per head in the cache buffers (the cache's `max_len`).
    pub kv_stride: usize,
}

/// Positions per streamed block: scores for a block are computed, then folded into the
/// online softmax at once.
const BLOCK: usize = 32;
/// Minimum positions per chunk when a decode is split across threads.
const MIN_CHUNK: usize = 128;

/// Per-thread and partial-result buffers, sized once at load for the largest batch.
pub struct AttnScratch {
    /// `[n_threads][group * BLOCK]` scores.
    scores: Vec<f32>,
    /// Partial results, `[items][group][head_dim_v + 2]` (`m`, `l`, `acc`).
    partial: Vec<f32>,
    group: usize,
    n_threads: usize,
    max_items: usize,
    head_dim_v: usize,
}

impl AttnScratch {
    /// Buffers for batches of up to `max_tokens` tokens.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim_v: usize, max_tokens: usize, n_threads: usize) -> Self {
        let group = n_heads / n_kv_heads.max(1);
        // Items: prefill uses `tokens × kv_heads`; decode splits positions into at most
        // `max_split` chunks per kv head.
        let max_items = (max_tokens * n_kv_heads).max(n_kv_heads * max_split(n_threads));
        AttnScratch {
            scores: vec![0.0; n_threads * group * BLOCK],
            partial: vec![0.0; max_items * group * (head_dim_v + 2)],
            group,
            n_threads,
            max_items,
            head_dim_v,
        }
    }

    /// Bytes held (for the memory plan).
    pub fn bytes(&self) -> usize {
        (self.scores.len() + self.partial.len()) * 4
    }

    /// The bytes `new` would allocate, without allocating.
    pub fn bytes_for(n_heads: usize, n_kv_heads: usize, head_dim_v: usize, max_tokens: usize, n_threads: usize) -> usize {
        let group = n_heads / n_kv_heads.max(1);
        let max_items = (max_tokens * n_kv_heads).max(n_kv_heads * max_split(n_threads));
        (n_threads * group * BLOCK + max_items * group * (head_dim_v + 2)) * 4
    }
}

fn max_split(n_threads: usize) -> usize {
    4 * n_threads
}

/// Attention for `n_tokens` queries at positions `pos0..pos0+n_tokens`.
///
/// - `q`: `[n_tokens, n_heads * head_dim_k]` (RoPE applied)
/// - `keys`/`values`: one layer of the cache, `[n_kv_heads, kv_stride, head_dim]`, holding
///   every position `< pos0 + n_tokens`
/// - `out`: `[n_tokens, n_heads * head_dim_v]`
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    ops: &F16Ops,
    shape: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    keys: &[f16],
    values: &[f16],
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let s = *shape;
    let group = s.n_heads / s.n_kv_heads;
    assert_eq!(group, scratch.group, "attention scratch built for another head layout");
    assert!(scratch.n_threads >= pool.n_threads());
    assert_eq!(scratch.head_dim_v, s.head_dim_v);
    assert!(q.len() >= n_tokens * s.n_heads * s.head_dim_k);
    assert!(out.len() >= n_tokens * s.n_heads * s.head_dim_v);
    assert!(pos0 + n_tokens <= s.kv_stride);

    // Split positions into chunks when there are too few (token, kv_head) items to keep
    // every thread busy.
    let base_items = n_tokens * s.n_kv_heads;
    let longest = pos0 + n_tokens;
    let n_chunks = if base_items >= 2 * pool.n_threads() {
        1
    } else {
        let want = (2 * pool.n_threads()).div_ceil(base_items).min(max_split(pool.n_threads()));
        want.min(longest.div_ceil(MIN_CHUNK)).max(1)
    };
    let n_items = base_items * n_chunks;
    assert!(n_items <= scratch.max_items);

    let pstride = s.head_dim_v + 2;
    let partial = DisjointSlice::new(&mut scratch.partial[..n_items * group * pstride]);
    let scores = DisjointSlice::new(&mut scratch.scores);

    pool.run(&|tid, nt| {
        // SAFETY: thread `tid` owns scores row `tid`.
        let sc = unsafe { scores.part(tid * group * BLOCK..(tid + 1) * group * BLOCK) };
        for item in split_range(n_items, tid, nt) {
            let chunk = item % n_chunks;
            let kvh = (item / n_chunks) % s.n_kv_heads;
            let t = item / (n_chunks * s.n_kv_heads);
            let p = pos0 + t;
            let end = p + 1;
            let start = s.window.map_or(0, |w| end.saturating_sub(w));
            let span = end - start;
            let c0 = start + span * chunk / n_chunks;
            let c1 = start + span * (chunk + 1) / n_chunks;
            // SAFETY: item `item` owns its partial rows.
            let part = unsafe { partial.part(item * group * pstride..(item + 1) * group * pstride) };
            let qrow = &q[t * s.n_heads * s.head_dim_k..];
            let kbase = &keys[kvh * s.kv_stride * s.head_dim_k..];
            let vbase = &values[kvh * s.kv_stride * s.head_dim_v..];
            attend_range(ops, &s, group, kvh, qrow, kbase, vbase, c0, c1, sc, part);
        }
    });

    // Merge chunks: out = Σ_c acc_c·e^(m_c−M) / Σ_c l_c·e^(m_c−M).
    let partial = &scratch.partial;
    for t in 0..n_tokens {
        for kvh in 0..s.n_kv_heads {
            for j in 0..group {
                let h = kvh * group + j;
                let o = &mut out[(t * s.n_heads + h) * s.head_dim_v..][..s.head_dim_v];
                let rows = (0..n_chunks).map(|c| {
                    let item = (t * s.n_kv_heads + kvh) * n_chunks + c;
                    &partial[(item * group + j) * pstride..][..pstride]
                });
                let m_max = rows.clone().map(|r| r[0]).fold(f32::NEG_INFINITY, f32::max);
                o.fill(0.0);
                let mut l_sum = 0.0f32;
                for r in rows {
                    if r[1] == 0.0 {
                        continue;
                    }
                    let w = (r[0] - m_max).exp();
                    l_sum += r[1] * w;
                    for (a, &b) in o.iter_mut().zip(&r[2..]) {
                        *a += b * w;
                    }
                }
                // A fully masked row (no visible position) stays zero instead of NaN.
                if l_sum > 0.0 {
                    let inv = 1.0 / l_sum;
                    o.iter_mut().for_each(|a| *a *= inv);
                }
            }
        }
    }
}

/// Online-softmax attention of the `group` query heads of kv head `kvh` over positions
/// `c0..c1`, writing `[m, l, acc...]` per query head into `part`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn attend_range(
    ops: &F16Ops,
    s: &AttnShape,
    group: usize,
    kvh: usize,
    qrow: &[f32],
    kbase: &[f16],
    vbase: &[f16],
    c0: usize,
    c1: usize,
    sc: &mut [f32],
    part: &mut [f32],
) {
    let pstride = s.head_dim_v + 2;
    for j in 0..group {
        let r = &mut part[j * pstride..(j + 1) * pstride];
        r[0] = f32::NEG_INFINITY;
        r[1] = 0.0;
        r[2..].fill(0.0);
    }
    let mut b0 = c0;
    while b0 < c1 {
        let b1 = (b0 + BLOCK).min(c1);
        let nb = b1 - b0;
        // Scores of the block for every query head of the group (each key row read once).
        for (i, pos) in (b0..b1).enumerate() {
            let krow = &kbase[pos * s.head_dim_k..(pos + 1) * s.head_dim_k];
            for j in 0..group {
                let h = kvh * group + j;
                let qh = &qrow[h * s.head_dim_k..(h + 1) * s.head_dim_k];
                sc[j * BLOCK + i] = (ops.dot)(qh, krow) * s.scale;
            }
        }
        for j in 0..group {
            let r = &mut part[j * pstride..(j + 1) * pstride];
            let scj = &mut sc[j * BLOCK..j * BLOCK + nb];
            let bmax = scj.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = r[0].max(bmax);
            if m_new == f32::NEG_INFINITY {
                continue;
            }
            // Rescale what was accumulated under the old max.
            let mut scale = if r[0] == f32::NEG_INFINITY { 0.0 } else { (r[0] - m_new).exp() };
            r[0] = m_new;
            r[1] *= scale;
            for (i, pos) in (b0..b1).enumerate() {
                let p = (scj[i] - m_new).exp();
                r[1] += p;
                let vrow = &vbase[pos * s.head_dim_v..(pos + 1) * s.head_dim_v];
                (ops.axpby)(&mut r[2..], scale, p, vrow);
                scale = 1.0;
            }
        }
        b0 = b1;
    }
}

/// The textbook computation, for tests: full softmax over every visible position in f64.
#[cfg(test)]
pub fn attention_reference(
    shape: &AttnShape,
    q: &[f32],
    n_tokens: usize,
    pos0: usize,
    keys: &[f16],
    values: &[f16],
) -> Vec<f32> {
    let s = shape;
    let group = s.n_heads / s.n_kv_heads;
    let mut out = vec![0.0f32; n_tokens * s.n_heads * s.head_dim_v];
    for t in 0..n_tokens {
        let p = pos0 + t;
        let start = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        for h in 0..s.n_heads {
            let kvh = h / group;
            let qh = &q[(t * s.n_heads + h) * s.head_dim_k..][..s.head_dim_k];
            let scores: Vec<f64> = (start..=p)
                .map(|pos| {
                    let k = &keys[(kvh * s.kv_stride + pos) * s.head_dim_k..][..s.head_dim_k];
                    qh.iter().zip(k).map(|(&a, &b)| a as f64 * b.to_f64()).sum::<f64>() * s.scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
            let o = &mut out[(t * s.n_heads + h) * s.head_dim_v..][..s.head_dim_v];
            for (i, pos) in (start..=p).enumerate() {
                let w = (scores[i] - m).exp() / z;
                let v = &values[(kvh * s.kv_stride + pos) * s.head_dim_v..][..s.head_dim_v];
                for (a, &b) in o.iter_mut().zip(v) {
                    *a += (w * b.to_f64()) as f32;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd_vec(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_reference_prefill_decode_and_window() {
        let mut seed = 7;
        for (n_heads, n_kv, hd) in [(4, 2, 16), (9, 3, 64), (4, 1, 256), (2, 2, 8)] {
            for window in [None, Some(5), Some(200)] {
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads);
                    let ops = F16Ops::detect();
                    let kv_stride = 300;
                    let shape = AttnShape {
                        n_heads,
                        n_kv_heads: n_kv,
                        head_dim_k: hd,
                        head_dim_v: hd,
                        scale: 1.0 / (hd as f32).sqrt(),
                        window,
                        kv_stride,
                    };
                    let keys: Vec<f16> =
                        rnd_vec(n_kv * kv_stride * hd, &mut seed).iter().map(|&x| f16::from_f32(x * 3.0)).collect();
                    let values: Vec<f16> =
                        rnd_vec(n_kv * kv_stride * hd, &mut seed).iter().map(|&x| f16::from_f32(x)).collect();
                    let mut scratch = AttnScratch::new(n_heads, n_kv, hd, 16, threads);
                    for (n_tokens, pos0) in [(1, 0), (1, 1), (1, 280), (7, 0), (16, 100), (3, 297)] {
                        let q = rnd_vec(n_tokens * n_heads * hd, &mut seed);
                        let want = attention_reference(&shape, &q, n_tokens, pos0, &keys, &values);
                        let mut out = vec![f32::NAN; want.len()];
                        attention(&pool, &ops, &shape, &q, n_tokens, pos0, &keys, &values, &mut out, &mut scratch);
                        for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                            assert!(
                                (a - b).abs() < 2e-5 + 2e-4 * b.abs(),
                                "heads {n_heads}/{n_kv} hd {hd} win {window:?} thr {threads} n {n_tokens} pos0 {pos0} i {i}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn scratch_size_formula_matches() {
        let s = AttnScratch::new(9, 3, 64, 32, 2);
        assert_eq!(s.bytes(), AttnScratch::bytes_for(9, 3, 64, 32, 2));
    }
}
