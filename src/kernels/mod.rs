//! The compute seam: every numeric operation of a forward pass goes through this module.
//!
//! A future GPU backend replaces what is here; the model code above it only sees buffers and
//! these calls. CPU paths pick their SIMD variant once, at load, from runtime CPU features.

pub mod attention;
pub mod f16ops;
pub mod kv_type;
pub mod ops;
pub mod pool;

pub use pool::ThreadPool;
pub mod matmul;
pub mod membw;
pub mod moe;

use std::ops::Range;

/// Below this many elements a row-wise operation runs on the calling thread alone.
const PAR_MIN_ELEMS: usize = 16 * 1024;

/// Call `f(rows, part)` over `buf` cut into rows of `width` (the last may be shorter), the
/// rows split across the pool's threads when the buffer is large enough to be worth it.
/// `part` holds exactly the elements of `rows`.
pub fn par_rows(
    pool: &ThreadPool,
    buf: &mut [f32],
    width: usize,
    f: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
) {
    let len = buf.len();
    let n_rows = len.div_ceil(width.max(1));
    if len < PAR_MIN_ELEMS || pool.n_threads() == 1 {
        f(0..n_rows, buf);
        return;
    }
    let d = pool::DisjointSlice::new(buf);
    pool.for_each_range(n_rows, &|rows| {
        let (a, b) = (rows.start * width, (rows.end * width).min(len));
        // SAFETY: the pool hands out disjoint row ranges, hence disjoint element ranges.
        let part = unsafe { d.part(a..b) };
        f(rows, part);
    });
}

/// Call `f(part)` over `buf` cut into runs of `PAR_MIN_ELEMS` elements, split across the
/// pool's threads when there are several: an element-wise operation on a buffer that may be a
/// single long row (a decode step's logits), which [`par_rows`] would give one thread.
pub fn par_elems(pool: &ThreadPool, buf: &mut [f32], f: &(dyn Fn(&mut [f32]) + Sync)) {
    par_rows(pool, buf, PAR_MIN_ELEMS, &|_, part| f(part));
}

/// What [`par_ring_rows`] calls: `f(group, item, a_row, b_row)`.
pub type RingRowFn<'a, T> = dyn Fn(usize, usize, &mut [T], &mut [T]) + Sync + 'a;

/// Call `f(g, j, a_row, b_row)` for every group `g < groups` and item `j < n`, where `a_row`
/// is row `g * rows + (start + j) % rows` of `a` (rows of `a_width` elements) and `b_row` the
/// same row of `b` (rows of `b_width`): each group a ring of `rows` rows, as a KV cache keeps
/// each head's keys and values. `n <= rows`, so no two calls get the same row. The calls are
/// spread over the pool's threads when there are at least `PAR_MIN_ELEMS` elements to write.
#[allow(clippy::too_many_arguments)]
pub fn par_ring_rows<T: Send>(
    pool: &ThreadPool,
    (a, a_width): (&mut [T], usize),
    (b, b_width): (&mut [T], usize),
    groups: usize,
    rows: usize,
    start: usize,
    n: usize,
    f: &RingRowFn<'_, T>,
) {
    assert!(n <= rows, "{n} items into a ring of {rows} rows");
    assert!(
        a.len() >= groups * rows * a_width && b.len() >= groups * rows * b_width,
        "ring buffers shorter than {groups} groups of {rows} rows"
    );
    let row = |g: usize, j: usize| g * rows + (start + j) % rows;
    if n * groups * (a_width + b_width) < PAR_MIN_ELEMS || pool.n_threads() == 1 {
        for g in 0..groups {
            for j in 0..n {
                let r = row(g, j);
                let ar = &mut a[r * a_width..(r + 1) * a_width];
                f(g, j, ar, &mut b[r * b_width..(r + 1) * b_width]);
            }
        }
        return;
    }
    let (da, db) = (pool::DisjointSlice::new(a), pool::DisjointSlice::new(b));
    pool.for_each_range(groups * n, &|items| {
        for i in items {
            let (g, j) = (i / n, i % n);
            let r = row(g, j);
            // SAFETY: item `i` is the only one with group `g` and index `j`, and distinct
            // `(g, j)` give distinct rows: `j < n <= rows`, so `(start + j) % rows` differs
            // for each `j` of a group, and groups own disjoint blocks of `rows` rows. The
            // bounds were checked above.
            let (ar, br) = unsafe {
                (
                    da.part(r * a_width..(r + 1) * a_width),
                    db.part(r * b_width..(r + 1) * b_width),
                )
            };
            f(g, j, ar, br);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `par_elems` runs the soft cap on a decode step's single row of 256,000 logits (several
    /// runs, both threads) and on short buffers (the calling thread): the bits of one call over
    /// the whole buffer, every element once.
    #[test]
    fn par_elems_covers_a_single_long_row_once() {
        let pool = ThreadPool::new(2);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for n in [0, 1, 1000, PAR_MIN_ELEMS, PAR_MIN_ELEMS + 1, 256_000] {
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 40) as f32 / (1u64 << 24) as f32 * 200.0 - 100.0
                })
                .collect();
            let mut want = x.clone();
            ops::softcap_inplace(&mut want, 30.0);
            let mut got = x.clone();
            par_elems(&pool, &mut got, &|v| ops::softcap_inplace(v, 30.0));
            assert!(
                want.iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{n}"
            );
            let mut count = vec![0f32; n];
            par_elems(&pool, &mut count, &|v| v.iter_mut().for_each(|c| *c += 1.0));
            assert!(count.iter().all(|&c| c == 1.0), "{n}: every element once");
        }
    }
}
