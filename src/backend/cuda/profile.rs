//! Time per kernel, for finding where a step's time goes on a real GPU: with `KILN_CUDA_PROFILE`
//! set, a session runs its ops one at a time (no graphs), waits for each, and prints the totals
//! by kernel when it is dropped. The waits add a few microseconds to every op, so the figures
//! rank the ops; they are not the speed of the un-profiled engine.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Profile {
    by_op: HashMap<String, (usize, Duration)>,
}

impl Profile {
    /// A profile when `KILN_CUDA_PROFILE` is set.
    pub fn from_env() -> Option<Profile> {
        crate::tuning::get().cuda_profile.then(Profile::default)
    }

    pub fn add(&mut self, op: &str, t: Instant) {
        let e = self.by_op.entry(op.to_string()).or_default();
        e.0 += 1;
        e.1 += t.elapsed();
    }

    /// The table, largest total first.
    pub fn report(&self) -> String {
        let mut rows: Vec<_> = self.by_op.iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
        let total: Duration = rows.iter().map(|r| r.1 .1).sum();
        let mut out = format!(
            "kiln CUDA profile: {:.3} ms in ops\n",
            total.as_secs_f64() * 1e3
        );
        for (op, (n, t)) in rows {
            out.push_str(&format!(
                "{:>10.3} ms {:>5.1}% {:>8} × {:>8.2} µs  {op}\n",
                t.as_secs_f64() * 1e3,
                100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-12),
                n,
                t.as_secs_f64() * 1e6 / *n as f64
            ));
        }
        out
    }
}
