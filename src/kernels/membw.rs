//! A memory read-bandwidth probe, the denominator of decode's roofline: decoding one token
//! reads every weight once, so tokens/s × weight bytes ÷ bandwidth is how close we are.

use super::pool::{split_range, ThreadPool};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Bytes read per pass: well beyond the last-level cache.
const PROBE_BYTES: usize = 512 << 20;

/// Best-of-three read bandwidth with all the pool's threads, in GB/s (10⁹ bytes/s).
pub fn measure_read_gbs(pool: &ThreadPool) -> f64 {
    let words = PROBE_BYTES / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let sink = AtomicU64::new(0);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        pool.run(&|tid, nt| {
            let r = split_range(words, tid, nt);
            let mut acc = [0u64; 8];
            for chunk in buf[r].chunks_exact(8) {
                for (a, &v) in acc.iter_mut().zip(chunk) {
                    *a = a.wrapping_add(v);
                }
            }
            sink.fetch_add(
                acc.iter().fold(0u64, |x, &y| x.wrapping_add(y)),
                Ordering::Relaxed,
            );
        });
        let gbs = PROBE_BYTES as f64 / t0.elapsed().as_secs_f64() / 1e9;
        best = best.max(gbs);
    }
    std::hint::black_box(sink.load(Ordering::Relaxed));
    best
}
