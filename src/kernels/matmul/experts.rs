//! A mixture-of-experts layer's products: every active expert's matrix over all of its grouped
//! rows, all experts in one pool dispatch.
//!
//! The work is the 16-row tiles of every active expert's matrix, laid end to end (expert by
//! expert, in order): threads take runs of them as [`ThreadPool::run_split`] hands them out, so
//! 2 or 16 threads stay busy whether a step has one row per expert (a decode step: the tiles
//! stream like one long matrix-vector product over the chosen experts only) or hundreds (a
//! prompt: each tile is a gemm over all of the expert's rows, the repacked group kernels where
//! the format has them). Each tile's outputs have the bits of the per-expert product
//! ([`super::matmul_many`] over the expert's rows alone), whatever the split.

use super::{
    check_inputs, gemm_tile, store_tile, tiles_of, Linear, MatmulScratch, GATED_MIN_ROWS,
    SPLIT_GRAIN_BYTES, TILE_ROWS,
};
use crate::kernels::pool::{DisjointSlice, ThreadPool};

/// Where a step's rows are, grouped by expert.
#[derive(Clone, Copy)]
pub struct ExpertRows<'a> {
    /// The experts with at least one row, in order.
    pub active: &'a [u32],
    /// `[n_expert + 1]`: expert `e`'s rows are the grouped rows `start[e]..start[e + 1]`.
    pub start: &'a [usize],
    /// `[n_expert + 1]`: expert `e`'s rows split by sequence, as the token counts
    /// `segs[seg_start[e]..seg_start[e + 1]]` (an empty list: its rows are one batch). Formats
    /// whose arithmetic depends on the batch run each count as a batch of its own (see
    /// [`MatmulScratch::set_segments`]).
    pub seg_start: &'a [usize],
    pub segs: &'a [usize],
}

impl ExpertRows<'_> {
    /// Expert `e`'s grouped rows and their sequences' counts.
    fn of(&self, e: usize) -> (usize, usize, &[usize]) {
        let segs = &self.segs[self.seg_start[e]..self.seg_start[e + 1]];
        (self.start[e], self.start[e + 1], segs)
    }
}

/// An activation that combines a gate product with an up product, element by element, in
/// place of the gate's.
pub type GatedAct<'a> = &'a (dyn Fn(&mut [f32], &[f32]) + Sync);

/// `out[a..b] = act(gate[e] · xq[a..b], up[e] · xq[a..b])` for every active expert `e` (its
/// grouped rows `a..b`; `out` is `[rows, f]`), or `out[a..b] = gate[e] · xq[a..b]` without
/// `up`, biases added. `xq` holds the grouped rows quantized for the matrices' activation
/// format, `rb` bytes each. `act` works element by element (the same bits as applying it to
/// the whole rows afterwards).
#[allow(clippy::too_many_arguments)]
pub fn experts_product(
    pool: &ThreadPool,
    gate: &[Linear],
    up: Option<(&[Linear], GatedAct<'_>)>,
    rows: &ExpertRows<'_>,
    xq: &[u8],
    rb: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let Some(&first) = rows.active.first() else {
        return;
    };
    let g0 = &gate[first as usize];
    let f = g0.out_dim;
    let mut most = 0;
    for &e in rows.active {
        let (a, b, segs) = rows.of(e as usize);
        let mats = [&gate[e as usize], up.map_or(g0, |(u, _)| &u[e as usize])];
        check_inputs(&mats, b - a, scratch);
        for m in mats {
            assert_eq!(m.out_dim, f, "{}: experts of different widths", m.name);
        }
        assert!(
            segs.is_empty() || segs.iter().sum::<usize>() == b - a,
            "{}: sequences that do not cover the expert's rows",
            g0.name
        );
        assert!(out.len() >= b * f, "{}: output buffer too small", g0.name);
        most = most.max(b - a);
    }
    let per = tiles_of(g0);
    let units = rows.active.len() * per;
    let tile_len = scratch.tile_len;
    let tiles = DisjointSlice::new(&mut scratch.tiles);
    let out = DisjointSlice::new(out);
    // A step of a few rows per expert streams the weights (a run per thread, as a decode
    // step's products); a prompt's tiles are gemms of their own, handed out one by one.
    let grain = if most < GATED_MIN_ROWS {
        let tile_bytes = TILE_ROWS * g0.row_bytes * if up.is_some() { 2 } else { 1 };
        (SPLIT_GRAIN_BYTES / tile_bytes.max(1)).max(1)
    } else {
        1
    };
    pool.run_split(units, grain, &|tid, mine| {
        // SAFETY: thread `tid` owns its pair of tiles while it runs a range.
        let pair = unsafe { tiles.part(2 * tid * tile_len..(2 * tid + 2) * tile_len) };
        let (tg, tu) = pair.split_at_mut(tile_len);
        for u in mine {
            let e = rows.active[u / per] as usize;
            let (a, b, segs) = rows.of(e);
            let (n, x) = (b - a, &xq[a * rb..b * rb]);
            let i = (u % per) * TILE_ROWS;
            let nw = (f - i).min(TILE_ROWS);
            gemm_tile(&gate[e], i, nw, x, rb, 0..n, segs, tg);
            if let Some((up, act)) = up {
                gemm_tile(&up[e], i, nw, x, rb, 0..n, segs, tu);
                act(&mut tg[..n * nw], &tu[..n * nw]);
            }
            store_tile(&out, f, i, nw, a..b, tg);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::random_linear;
    use super::super::{matmul_many, quantize_input};
    use super::*;
    use crate::quant::tests::Rng;
    use crate::quant::GgmlType;

    /// One dispatch over every active expert gives each expert's rows the bits of that
    /// expert's own products (over its rows alone, or over each of its sequences' rows alone),
    /// gated or not, for one row per expert (a decode step) and for many (a prompt), on 1, 2
    /// and 5 threads.
    #[test]
    fn experts_match_each_experts_own_products() {
        let mut rng = Rng(0xe4e);
        let (n, f, ne) = (512, 48, 5);
        for ty in [
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Q8_0,
            GgmlType::MXFP4,
            GgmlType::Q4_0,
        ] {
            let gate: Vec<Linear> = (0..ne)
                .map(|_| random_linear(ty, n, f, &mut rng).0)
                .collect();
            let up: Vec<Linear> = (0..ne)
                .map(|_| random_linear(ty, n, f, &mut rng).0)
                .collect();
            // Rows per expert (expert 2 idle), and for each its sequences' counts.
            for (counts, segs) in [
                (vec![1, 1, 0, 1, 1], vec![vec![]; 5]),
                (vec![3, 70, 0, 17, 1], vec![vec![]; 5]),
                (
                    vec![3, 70, 0, 17, 1],
                    vec![vec![1, 2], vec![40, 30], vec![], vec![17], vec![1]],
                ),
            ] {
                let mut start = vec![0usize];
                for c in &counts {
                    start.push(start.last().unwrap() + c);
                }
                let mut seg_start = vec![0usize];
                for s in &segs {
                    seg_start.push(seg_start.last().unwrap() + s.len());
                }
                let flat: Vec<usize> = segs.concat();
                let active: Vec<u32> = (0..ne as u32).filter(|&e| counts[e as usize] > 0).collect();
                let rows = ExpertRows {
                    active: &active,
                    start: &start,
                    seg_start: &seg_start,
                    segs: &flat,
                };
                let p = start[ne];
                let x: Vec<f32> = (0..p * n).map(|_| rng.uniform() * 2.0 - 1.0).collect();
                let rb = gate[0].act_row_bytes();
                for threads in [1, 2, 5] {
                    let pool = ThreadPool::new(threads);
                    let mut xq = vec![0u8; p * rb];
                    quantize_input(&pool, &gate[0], &x, p, &mut xq);
                    let mut scratch = MatmulScratch::new(p, threads);
                    let act = |g: &mut [f32], u: &[f32]| {
                        for (g, &u) in g.iter_mut().zip(u) {
                            *g = *g * 0.25 - u;
                        }
                    };
                    let (mut plain, mut gated) = (vec![0f32; p * f], vec![0f32; p * f]);
                    experts_product(&pool, &gate, None, &rows, &xq, rb, &mut plain, &mut scratch);
                    experts_product(
                        &pool,
                        &gate,
                        Some((&up, &act)),
                        &rows,
                        &xq,
                        rb,
                        &mut gated,
                        &mut scratch,
                    );
                    // Each expert alone.
                    for &e in &active {
                        let e = e as usize;
                        let (a, b) = (start[e], start[e + 1]);
                        let k = b - a;
                        let mut one = MatmulScratch::new(k, threads);
                        one.set_segments(segs[e].iter().copied());
                        let (mut og, mut ou) = (vec![0f32; k * f], vec![0f32; k * f]);
                        matmul_many(
                            &pool,
                            &[&gate[e], &up[e]],
                            &xq[a * rb..b * rb],
                            rb,
                            k,
                            &mut [&mut og, &mut ou],
                            &mut one,
                            None,
                        );
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let what =
                            format!("{ty} expert {e} of {counts:?} {segs:?}, {threads} threads");
                        assert_eq!(bits(&plain[a * f..b * f]), bits(&og), "{what}");
                        act(&mut og, &ou);
                        assert_eq!(bits(&gated[a * f..b * f]), bits(&og), "{what} gated");
                    }
                }
            }
        }
    }
}
