//! The compute seam: every numeric operation of a forward pass goes through this module.
//!
//! A future GPU backend replaces what is here; the model code above it only sees buffers and
//! these calls. CPU paths pick their SIMD variant once, at load, from runtime CPU features.

pub mod attention;
pub mod f16ops;
pub mod ops;
pub mod pool;

pub use pool::ThreadPool;
pub mod matmul;
pub mod membw;

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
