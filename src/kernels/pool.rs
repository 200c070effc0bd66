//! A persistent worker pool: threads are spawned once, at load, and every parallel operation of
//! a forward pass is one `run` call that hands the same closure to all of them.
//!
//! Dispatch is a generation counter the workers spin on (then yield, then sleep on a condvar
//! when idle for long), and completion is a countdown the caller spins on. No allocation and no
//! thread spawn per operation; the caller does its own share of the work as thread 0.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The work of one `run`: called as `f(thread_index, n_threads)` on every thread.
type Job<'a> = &'a (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Incremented by `run` to publish a new job.
    generation: AtomicUsize,
    /// Workers still busy with the current job.
    pending: AtomicUsize,
    /// The current job, valid while `pending > 0` (a lifetime-erased `Job`).
    job: Mutex<Option<JobPtr>>,
    /// Sleeping workers wait here when no work came for a while.
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    n_threads: usize,
}

#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize, usize) + Sync));
// SAFETY: the pointee is `Sync`, and `run` keeps it alive until every worker is done with it.
unsafe impl Send for JobPtr {}

/// A fixed set of threads that execute closures together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// Spins before a waiting worker yields, then sleeps.
const SPIN_ITERS: usize = 20_000;
const YIELD_ITERS: usize = 2_000;

impl ThreadPool {
    /// A pool of `n_threads` (the caller counts as one, so `n_threads - 1` are spawned).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            job: Mutex::new(None),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            n_threads,
        });
        let workers = (1..n_threads)
            .map(|tid| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kiln-worker-{tid}"))
                    .spawn(move || worker_loop(&s, tid))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    /// Number of threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f(thread_index, n_threads)` on every thread of the pool and return when all are done.
    pub fn run(&self, f: Job<'_>) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        // SAFETY: we erase the closure's lifetime to hand it to the workers. This function does
        // not return until `pending` reaches zero, i.e. until every worker has finished calling
        // it, so the reference never outlives the borrow it came from.
        let ptr: *const (dyn Fn(usize, usize) + Sync) = unsafe { std::mem::transmute(f) };
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(ptr));
        self.shared.pending.store(n - 1, Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        // Wake sleepers (cheap when nobody sleeps: the lock is uncontended).
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        f(0, n);
        let mut spins = 0usize;
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Split `0..n` into `n_threads` contiguous ranges and call `f(range)` on each thread.
    pub fn for_each_range(&self, n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        self.run(&|tid, nt| {
            let r = split_range(n, tid, nt);
            if !r.is_empty() {
                f(r);
            }
        });
    }
}

/// The `tid`-th of `nt` near-equal contiguous parts of `0..n`.
#[inline]
pub fn split_range(n: usize, tid: usize, nt: usize) -> std::ops::Range<usize> {
    let base = n / nt;
    let rem = n % nt;
    let start = tid * base + tid.min(rem);
    let len = base + usize::from(tid < rem);
    start..start + len
}

fn worker_loop(s: &Shared, tid: usize) {
    // The generation at construction: a worker that starts late must still see the first job.
    let mut seen = 0;
    loop {
        // Wait for a new generation: spin, then yield, then sleep.
        let mut iters = 0usize;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            iters += 1;
            if iters < SPIN_ITERS {
                std::hint::spin_loop();
            } else if iters < SPIN_ITERS + YIELD_ITERS {
                std::thread::yield_now();
            } else {
                let guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                if s.generation.load(Ordering::Acquire) == seen
                    && !s.shutdown.load(Ordering::Acquire)
                {
                    let _unused = s
                        .wake
                        .wait_timeout(guard, std::time::Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner());
                }
                iters = SPIN_ITERS; // keep yielding/sleeping until work arrives
            }
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: `run` published this pointer before bumping the generation and keeps the
            // closure alive until `pending` reaches zero, which happens only after this call.
            let f = unsafe { &*ptr };
            f(tid, s.n_threads);
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Physical cores (logical CPUs divided by SMT siblings where the OS tells us), at least 1.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    #[cfg(target_os = "linux")]
    {
        if let Ok(s) =
            std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
        {
            let siblings = s
                .trim()
                .split(',')
                .map(|p| match p.split_once('-') {
                    Some((a, b)) => {
                        b.parse::<usize>()
                            .unwrap_or(0)
                            .saturating_sub(a.parse().unwrap_or(0))
                            + 1
                    }
                    None => 1,
                })
                .sum::<usize>()
                .max(1);
            return (logical / siblings).max(1);
        }
    }
    logical
}

/// A mutable slice that several pool threads write to, each in its own disjoint part.
///
/// This is how a parallel kernel hands out `&mut` views of one output buffer: the kernel
/// decides the partition (by rows, by heads) and asserts it is disjoint.
pub struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: access goes through `part`, whose contract forbids overlapping parts; with that,
// sharing the pointer across threads is like handing out disjoint `&mut` sub-slices.
unsafe impl<T: Send> Send for DisjointSlice<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        DisjointSlice {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A mutable view of `range`.
    ///
    /// # Safety
    /// While the returned slice lives, no other call may return a range overlapping it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "DisjointSlice range out of bounds"
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 2, 7, 100] {
            for nt in 1..5 {
                let mut covered = 0;
                let mut next = 0;
                for t in 0..nt {
                    let r = split_range(n, t, nt);
                    assert_eq!(r.start, next);
                    next = r.end;
                    covered += r.len();
                }
                assert_eq!(covered, n);
            }
        }
    }

    #[test]
    fn every_thread_runs_every_job() {
        for nt in [1, 2, 3] {
            let pool = ThreadPool::new(nt);
            let total = AtomicU64::new(0);
            for round in 0..1000u64 {
                pool.run(&|tid, n| {
                    assert_eq!(n, nt);
                    total.fetch_add(round * 10 + tid as u64, Ordering::Relaxed);
                });
            }
            let expect: u64 = (0..1000u64)
                .map(|r| (0..nt as u64).map(|t| r * 10 + t).sum::<u64>())
                .sum();
            assert_eq!(total.load(Ordering::Relaxed), expect);
        }
    }

    #[test]
    fn borrowed_data_is_safe_to_use() {
        let pool = ThreadPool::new(2);
        let mut out = vec![0u32; 1000];
        {
            let chunks: Vec<std::sync::Mutex<&mut [u32]>> =
                out.chunks_mut(500).map(std::sync::Mutex::new).collect();
            pool.run(&|tid, _| {
                let mut c = chunks[tid].lock().unwrap();
                for (i, v) in c.iter_mut().enumerate() {
                    *v = (tid * 500 + i) as u32;
                }
            });
        }
        assert!(out.iter().enumerate().all(|(i, &v)| v as usize == i));
    }

    #[test]
    fn idle_workers_wake_up() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let hits = AtomicUsize::new(0);
        pool.run(&|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
