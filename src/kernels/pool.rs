//! A persistent worker pool: threads are spawned once, at load, and every parallel operation of
//! a forward pass is one dispatch that hands the same closure to all of them.
//!
//! A dispatch is a list of *items* that threads take from a shared counter, so the work splits
//! itself: when a worker is descheduled (the machine is shared with other processes), the
//! others, the caller included, take its items instead of waiting for it. A worker takes part
//! in a job only by *joining* it (an atomic compare-and-swap on the job state) while the job is
//! open; the caller, once every item is taken and its own are done, *closes* the job and waits
//! only for workers that joined and are still finishing an item. A worker that wakes up late
//! finds the job closed and leaves it alone, so one slow thread never stalls a dispatch.
//!
//! Idle workers spin, then yield, then sleep on a condvar; the caller pays for a wake-up call
//! only when some worker sleeps. No allocation and no thread spawn per operation.
//!
//! # Soundness
//!
//! Workers call the caller's closure through a pointer whose lifetime is erased, so the
//! dispatch must not end (return *or unwind*) while a worker may still call it. Three rules
//! make that hold whatever the closure does:
//!
//! - the caller's wait for the workers is the `Drop` of a guard (`EndJob`) made before the
//!   pointer is stored, so a panic in the caller's own share waits for the workers too, and is
//!   re-raised only after they left;
//! - a worker runs its share under `catch_unwind`: a panic there ends the job (no items are
//!   handed out any more), the worker leaves it normally and lives on, and the caller re-raises
//!   the panic once every worker is out;
//! - one dispatch at a time, by construction: dispatches take the pool's lock, and a dispatch
//!   from inside a job of the same pool (which would wait for itself) runs inline on its
//!   thread, under that thread's index.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// The work of one dispatch: called as `f(thread_index, item)` for every item, by whichever
/// thread takes it. `thread_index < n_threads` identifies the thread (for per-thread scratch):
/// no two concurrent calls share it.
type ItemFn<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Job state word: `generation << GEN_SHIFT | CLOSED? | active workers`.
const ACTIVE_MASK: usize = (1 << 16) - 1;
const CLOSED: usize = 1 << 16;
const GEN_SHIFT: u32 = 17;

/// The current job: written by the caller only while no worker is inside a job (every joined
/// worker left, and the state is closed so none can join), read by workers only after joining.
struct JobCell {
    f: *const (dyn Fn(usize, usize) + Sync),
    n_items: usize,
}

struct Shared {
    /// See [`ACTIVE_MASK`], [`CLOSED`], [`GEN_SHIFT`].
    state: AtomicUsize,
    /// Next item to take.
    next: AtomicUsize,
    job: UnsafeCell<JobCell>,
    /// Workers that are (about to be) asleep on `wake`.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Workers that have started running (see [`ThreadPool::new`]).
    started: AtomicUsize,
    n_threads: usize,
    /// Per thread, the part of a [`ThreadPool::run_split`] it has not taken yet.
    shares: Box<[Share]>,
    /// Held for the whole of a dispatch: one job (and one set of `shares`) at a time.
    dispatch: Mutex<()>,
    /// Set when a worker's share of the current job panicked; its payload is in `payload`.
    panicked: AtomicBool,
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

thread_local! {
    /// The pool (its `Shared` address) whose job this thread is running, and the thread's index
    /// in it; `(0, 0)` outside any job. A dispatch to that same pool from here runs inline.
    static IN_JOB: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

// SAFETY: `job` is accessed under the join/close protocol described on `JobCell` (never written
// while a reader may hold it); everything else is atomics and std sync primitives. The closure
// behind `job.f` is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// One thread's [`ThreadPool::run_split`] share, `start << 32 | end`, alone on its cache
/// lines (128 bytes: the adjacent-line prefetcher pairs lines). Each thread takes from its own
/// share at every grain (a compare-and-swap): with the shares side by side, every take of one
/// thread took the line away from the other, and a matrix-vector product paid a transfer
/// between cores every 64 KiB of weights on each of them.
#[repr(align(128))]
struct Share(AtomicU64);

/// A fixed set of threads that execute closures together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// Spins before a waiting thread yields; yields before an idle worker sleeps.
const SPIN_ITERS: usize = 20_000;
const YIELD_ITERS: usize = 2_000;

fn noop(_: usize, _: usize) {}

impl ThreadPool {
    /// A pool of `n_threads` (the caller counts as one, so `n_threads - 1` are spawned).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.clamp(1, ACTIVE_MASK);
        let shared = Arc::new(Shared {
            state: AtomicUsize::new(CLOSED),
            next: AtomicUsize::new(0),
            job: UnsafeCell::new(JobCell {
                f: &noop as &(dyn Fn(usize, usize) + Sync) as *const _,
                n_items: 0,
            }),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            started: AtomicUsize::new(0),
            n_threads,
            shares: (0..n_threads).map(|_| Share(AtomicU64::new(0))).collect(),
            dispatch: Mutex::new(()),
            panicked: AtomicBool::new(false),
            payload: Mutex::new(None),
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
        // Wait until every worker runs: a thread's start-up allocates (its name, thread-local
        // state), and a worker that is still starting when the first jobs are done without it
        // would allocate later, in the middle of decoding.
        while shared.started.load(Ordering::Acquire) < n_threads - 1 {
            std::thread::yield_now();
        }
        ThreadPool { shared, workers }
    }

    /// Number of threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Call `f(thread_index, item)` once for every `item` in `0..n_items`, spread over the
    /// pool's threads as they come, and return when all calls are done.
    ///
    /// A panic in `f`, on any thread, is re-raised here once no thread runs `f` any more (the
    /// remaining items are then skipped). Calls from several threads at once take turns; a
    /// call from inside `f` runs on the calling thread alone.
    pub fn run_items(&self, n_items: usize, f: ItemFn<'_>) {
        let s = &*self.shared;
        if s.n_threads == 1 || n_items <= 1 {
            for i in 0..n_items {
                f(0, i);
            }
            return;
        }
        if let Some(tid) = self.nested_index() {
            for i in 0..n_items {
                f(tid, i);
            }
            return;
        }
        let _turn = self.lock();
        self.dispatch(n_items, f);
    }

    /// This thread's index if it is inside a job of this pool.
    #[inline]
    fn nested_index(&self) -> Option<usize> {
        let (pool, tid) = IN_JOB.with(Cell::get);
        (pool == Arc::as_ptr(&self.shared) as usize).then_some(tid)
    }

    /// The pool's turn: dispatches are one at a time. A panic in a job is re-raised with the
    /// guard held (poisoning the mutex) but never leaves the pool inconsistent, as the job is
    /// wound up first; so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.shared
            .dispatch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One job over the pool's threads. The caller holds [`ThreadPool::lock`] and is not inside
    /// a job of this pool.
    fn dispatch(&self, n_items: usize, f: ItemFn<'_>) {
        let s = &*self.shared;
        // From here on, leaving this function (by return or unwinding) first closes the job
        // and waits until every worker that joined it has left.
        let mut end = EndJob {
            s,
            n_items,
            finished: false,
            outer: IN_JOB.with(|c| c.replace((Arc::as_ptr(&self.shared) as usize, 0))),
        };
        let st = s.state.load(Ordering::Acquire);
        // SAFETY: we hold the pool's lock, so no other dispatch runs; the previous one ended
        // by its `EndJob`, which left the state closed with no worker inside, so no thread
        // reads the cell now and none can join until we open the job below. We erase the
        // closure's lifetime: `end` (dropped on every way out of this function, unwinding
        // included) waits until every worker that joined has left, so no worker dereferences
        // the pointer after the borrow ends.
        unsafe {
            let cell = &mut *s.job.get();
            cell.f = std::mem::transmute::<ItemFn<'_>, ItemFn<'static>>(f);
            cell.n_items = n_items;
        }
        s.next.store(0, Ordering::Relaxed);
        let gen = (st >> GEN_SHIFT).wrapping_add(1);
        // Open the new generation (publishes the cell and the counter).
        s.state.store(gen << GEN_SHIFT, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.notify_all();
        }
        take_items(s, f, n_items, 0);
        end.finished = true;
        drop(end);
        if s.panicked.load(Ordering::Acquire) {
            s.panicked.store(false, Ordering::Relaxed);
            let payload = s
                .payload
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(p) = payload {
                std::panic::resume_unwind(p);
            }
        }
    }

    /// Run `f(part, n_threads)` for every `part` in `0..n_threads` (a static split into one
    /// part per thread; a part's index also names its per-thread scratch). Parts are taken
    /// like items, so a descheduled thread's part is done by another.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        self.run_items(n, &|_, part| f(part, n));
    }

    /// Call `f(thread_index, range)` over ranges that together cover `0..n` once.
    ///
    /// Each thread starts on its own contiguous share (one run, which streams fastest) and
    /// takes it from the front `grain` units at a time; a thread whose share is done takes the
    /// back half of the largest share left and goes on with that. So a thread slowed down by
    /// another process hands its remaining work over, without the cost of many small items.
    pub fn run_split(&self, n: usize, grain: usize, f: &(dyn Fn(usize, Range<usize>) + Sync)) {
        let s = &*self.shared;
        let nt = s.n_threads;
        let grain = grain.max(1);
        if nt == 1 || n <= grain || n > u32::MAX as usize || self.nested_index().is_some() {
            self.run_items(n.div_ceil(grain), &|tid, i| {
                f(tid, i * grain..n.min((i + 1) * grain))
            });
            return;
        }
        // The shares belong to the job: write them only on our turn.
        let _turn = self.lock();
        for (t, share) in s.shares.iter().enumerate() {
            let r = split_range(n, t, nt);
            share.0.store(pack(r), Ordering::Relaxed);
        }
        // One item per thread; the job's opening publishes the shares. Each item runs its own
        // share, then steals until the share it picks is empty; a thread that takes a second
        // item (its peer had not joined yet) usually finds nothing left. Every unit runs once
        // either way, and the job ends only when every thread has left its items.
        self.dispatch(nt, &|tid, _| {
            let own = &s.shares[tid].0;
            loop {
                while let Some(r) = take(own, grain, false) {
                    f(tid, r);
                }
                // Steal the back half of the largest share left into our own.
                let victim = s
                    .shares
                    .iter()
                    .max_by_key(|v| unpack(v.0.load(Ordering::Relaxed)).len());
                match victim.and_then(|v| take(&v.0, grain, true)) {
                    Some(r) => own.store(pack(r), Ordering::Relaxed),
                    None => return,
                }
            }
        });
    }

    /// Split `0..n` into contiguous ranges (a few per thread, so the split balances itself)
    /// and call `f(range)` on each, in parallel.
    pub fn for_each_range(&self, n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let parts = (self.shared.n_threads * 4).min(n);
        self.run_items(parts, &|_, p| {
            let r = split_range(n, p, parts);
            if !r.is_empty() {
                f(r);
            }
        });
    }
}

/// Take items from the shared counter until none are left.
#[inline]
fn take_items(s: &Shared, f: ItemFn<'_>, n_items: usize, tid: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_items {
            return;
        }
        f(tid, i);
    }
}

/// Winds up a dispatch when dropped (on return or unwinding): ends the job early if the
/// caller's share did not finish, closes it, and waits until every worker that joined it has
/// left. Only then may the closure's borrow end.
struct EndJob<'a> {
    s: &'a Shared,
    n_items: usize,
    /// The caller's share ran to its end (false: it is unwinding).
    finished: bool,
    /// The caller's [`IN_JOB`] before this job.
    outer: (usize, usize),
}

impl Drop for EndJob<'_> {
    fn drop(&mut self) {
        let s = self.s;
        if !self.finished {
            // Hand out no more items: the job ends with the panic.
            s.next.store(self.n_items, Ordering::Relaxed);
        }
        // Close, then wait for the workers still inside.
        let mut st = s.state.fetch_or(CLOSED, Ordering::AcqRel) | CLOSED;
        let mut spins = 0usize;
        while st & ACTIVE_MASK != 0 {
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            st = s.state.load(Ordering::Acquire);
        }
        IN_JOB.with(|c| c.set(self.outer));
        if !self.finished && s.panicked.swap(false, Ordering::Acquire) {
            // The caller's own panic wins; a worker's is dropped with the job.
            let p = s
                .payload
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(p);
        }
    }
}

fn pack(r: Range<usize>) -> u64 {
    ((r.start as u64) << 32) | r.end as u64
}

fn unpack(v: u64) -> Range<usize> {
    let (a, b) = ((v >> 32) as usize, (v & u32::MAX as u64) as usize);
    a..b.max(a)
}

/// Take from a [`ThreadPool::run_split`] share: `grain` units from the front, or (`steal`)
/// the back half (at least `grain` units, or all that is left). `None` once it is empty.
fn take(share: &AtomicU64, grain: usize, steal: bool) -> Option<Range<usize>> {
    let mut v = share.load(Ordering::Relaxed);
    loop {
        let r = unpack(v);
        if r.is_empty() {
            return None;
        }
        let (mine, left) = if steal {
            let k = (r.len() / 2).max(grain.min(r.len()));
            (r.end - k..r.end, r.start..r.end - k)
        } else {
            let k = grain.min(r.len());
            (r.start..r.start + k, r.start + k..r.end)
        };
        match share.compare_exchange_weak(v, pack(left), Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(mine),
            Err(now) => v = now,
        }
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
    // A worker only ever runs jobs of this pool: a dispatch from inside one runs inline.
    IN_JOB.with(|c| c.set((s as *const Shared as usize, tid)));
    let mut seen = s.state.load(Ordering::Acquire) >> GEN_SHIFT;
    s.started.fetch_add(1, Ordering::Release);
    loop {
        // Wait for a new generation: spin, then yield, then sleep.
        let mut iters = 0usize;
        let mut st;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            st = s.state.load(Ordering::Acquire);
            if st >> GEN_SHIFT != seen {
                break;
            }
            iters += 1;
            if iters < SPIN_ITERS {
                std::hint::spin_loop();
            } else if iters < SPIN_ITERS + YIELD_ITERS {
                std::thread::yield_now();
            } else {
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                let guard = s.sleep.lock().unwrap_or_else(PoisonError::into_inner);
                if s.state.load(Ordering::SeqCst) >> GEN_SHIFT == seen
                    && !s.shutdown.load(Ordering::SeqCst)
                {
                    let _unused = s
                        .wake
                        .wait_timeout(guard, std::time::Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner());
                } else {
                    drop(guard);
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                iters = SPIN_ITERS; // keep yielding/sleeping until work arrives
            }
        }
        seen = st >> GEN_SHIFT;
        // Join the job while it is open; a closed (or already replaced) job is not ours.
        let joined = loop {
            if st & CLOSED != 0 || st >> GEN_SHIFT != seen {
                break false;
            }
            match s
                .state
                .compare_exchange_weak(st, st + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => st = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: we joined the open job, so the caller wrote the cell before opening it and
        // will not touch it (nor drop the closure) until we leave below.
        let (f, n_items) = unsafe {
            let cell = &*s.job.get();
            (&*cell.f, cell.n_items)
        };
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| take_items(s, f, n_items, tid)));
        if let Err(p) = run {
            // End the job (no more items for anyone) and leave the panic to the caller.
            s.next.store(n_items, Ordering::Relaxed);
            let mut slot = s.payload.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(p);
            }
            drop(slot);
            s.panicked.store(true, Ordering::Release);
        }
        s.state.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
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

    /// Every item runs exactly once, whoever takes it, over many back-to-back jobs of every
    /// size, with some items slow (a thread stuck in one while the others drain the rest).
    #[test]
    fn run_items_runs_each_item_once() {
        for nt in [1, 2, 3, 4] {
            let pool = ThreadPool::new(nt);
            let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            for round in 0..2000usize {
                let n = round % 65;
                pool.run_items(n, &|tid, item| {
                    assert!(tid < nt);
                    if round % 500 == 7 && item == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(3));
                    }
                    hits[item].fetch_add(1, Ordering::Relaxed);
                });
                for (i, h) in hits.iter().enumerate() {
                    let got = h.swap(0, Ordering::Relaxed);
                    assert_eq!(got, usize::from(i < n), "nt {nt} round {round} item {i}");
                }
            }
        }
    }

    /// `run_split` hands out every unit of `0..n` exactly once, in ranges of at most `grain`
    /// from a share's front (or a stolen back half), whatever the sizes and thread counts, and
    /// a thread stuck in its first range has the rest of its share taken by the others.
    #[test]
    fn run_split_covers_each_unit_once() {
        for nt in [1, 2, 3, 4] {
            let pool = ThreadPool::new(nt);
            let hits: Vec<AtomicUsize> = (0..300).map(|_| AtomicUsize::new(0)).collect();
            for round in 0..1500usize {
                let (n, grain) = (round % 301, 1 + round % 7);
                let slow = round % 100 == 3;
                pool.run_split(n, grain, &|tid, r| {
                    assert!(tid < nt && !r.is_empty() && r.end <= n);
                    if slow && r.start == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    for h in &hits[r] {
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                });
                for (i, h) in hits.iter().enumerate() {
                    let got = h.swap(0, Ordering::Relaxed);
                    assert_eq!(got, usize::from(i < n), "nt {nt} round {round} unit {i}");
                }
            }
        }
    }

    /// A thread stuck in its share's first range has the rest of that share taken over: the
    /// caller waits inside its first range until the worker has run a unit of the caller's
    /// share (or gives up after 10 s, and the test fails).
    #[test]
    fn run_split_steals_from_a_stuck_thread() {
        let pool = ThreadPool::new(2);
        let (n, grain) = (1000, 10);
        let stolen = AtomicBool::new(false);
        pool.run_split(n, grain, &|tid, r| {
            if tid == 0 && r.start == 0 {
                let t0 = std::time::Instant::now();
                while !stolen.load(Ordering::Acquire) && t0.elapsed().as_secs() < 10 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            } else if tid != 0 && r.start < n / 2 {
                stolen.store(true, Ordering::Release);
            }
        });
        assert!(
            stolen.load(Ordering::Acquire),
            "the worker never took the caller's units"
        );
    }

    /// Per-thread indices are exclusive: no two concurrent calls share one.
    #[test]
    fn thread_indices_are_exclusive() {
        let pool = ThreadPool::new(3);
        let busy: Vec<AtomicBool> = (0..3).map(|_| AtomicBool::new(false)).collect();
        for _ in 0..300 {
            pool.run_items(24, &|tid, _| {
                assert!(
                    !busy[tid].swap(true, Ordering::AcqRel),
                    "thread index {tid} reused"
                );
                std::hint::spin_loop();
                busy[tid].store(false, Ordering::Release);
            });
        }
    }

    /// Every thread of the pool takes part in one job: each item waits (at most 10 s) until
    /// every thread index has been seen. False if a worker is gone.
    fn all_threads_take_part(pool: &ThreadPool) -> bool {
        let nt = pool.n_threads();
        let seen: Vec<AtomicBool> = (0..nt).map(|_| AtomicBool::new(false)).collect();
        pool.run_items(nt, &|tid, _| {
            seen[tid].store(true, Ordering::Release);
            let t0 = std::time::Instant::now();
            while !seen.iter().all(|s| s.load(Ordering::Acquire)) && t0.elapsed().as_secs() < 10 {
                std::thread::yield_now();
            }
        });
        seen.iter().all(|s| s.load(Ordering::Acquire))
    }

    fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    /// A panic on the caller's share reaches the caller only after the workers have left the
    /// job (they were still running the closure, which borrows the caller's stack), and the
    /// pool works afterwards.
    #[test]
    fn caller_panic_waits_for_the_workers() {
        let pool = ThreadPool::new(2);
        let inside = AtomicUsize::new(0);
        let caller_took = AtomicBool::new(false);
        for _ in 0..20 {
            caller_took.store(false, Ordering::SeqCst);
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run_items(64, &|tid, _| {
                    if tid == 0 {
                        caller_took.store(true, Ordering::SeqCst);
                        panic!("caller share");
                    }
                    inside.fetch_add(1, Ordering::SeqCst);
                    let t0 = std::time::Instant::now();
                    while !caller_took.load(Ordering::SeqCst) && t0.elapsed().as_secs() < 10 {
                        std::thread::yield_now();
                    }
                    // Still running the closure while the caller unwinds.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                });
            }));
            let p = r.expect_err("the caller's panic is propagated");
            assert_eq!(panic_message(p), "caller share");
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "run_items unwound while a worker was still inside the job"
            );
        }
        assert!(all_threads_take_part(&pool));
        let sum = AtomicUsize::new(0);
        pool.run_items(100, &|_, i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }

    /// A panic on a worker is caught there and re-raised on the caller (instead of the worker
    /// dying inside the job and the caller waiting for it forever); the worker lives on.
    #[test]
    fn worker_panic_reaches_the_caller() {
        for nt in [2, 3] {
            let pool = ThreadPool::new(nt);
            let worker_took = AtomicBool::new(false);
            for round in 0..20 {
                worker_took.store(false, Ordering::SeqCst);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    pool.run_items(64, &|tid, _| {
                        if tid != 0 {
                            worker_took.store(true, Ordering::SeqCst);
                            panic!("worker share {round}");
                        }
                        let t0 = std::time::Instant::now();
                        while !worker_took.load(Ordering::SeqCst) && t0.elapsed().as_secs() < 10 {
                            std::thread::yield_now();
                        }
                    });
                }));
                let p = r.expect_err("the worker's panic is propagated");
                assert_eq!(panic_message(p), format!("worker share {round}"));
                // run_split goes through the same dispatch.
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    pool.run_split(10_000, 10, &|tid, r| {
                        if tid != 0 && r.start > 0 {
                            panic!("split share");
                        }
                    });
                }));
                if let Err(p) = r {
                    assert_eq!(panic_message(p), "split share");
                }
            }
            assert!(all_threads_take_part(&pool), "a worker died with its panic");
        }
    }

    /// Two threads using one pool at once (each dispatch owns the workers or runs alone):
    /// every item and unit runs exactly once per call, thread indices stay exclusive within a
    /// call.
    #[test]
    fn concurrent_callers_get_correct_results() {
        let pool = ThreadPool::new(3);
        std::thread::scope(|sc| {
            for caller in 0..2usize {
                let pool = &pool;
                sc.spawn(move || {
                    let hits: Vec<AtomicUsize> = (0..200).map(|_| AtomicUsize::new(0)).collect();
                    let busy: Vec<AtomicBool> = (0..3).map(|_| AtomicBool::new(false)).collect();
                    for round in 0..3000usize {
                        let n = (round * 7 + caller * 13) % 200;
                        if round % 2 == 0 {
                            pool.run_items(n, &|tid, i| {
                                assert!(!busy[tid].swap(true, Ordering::AcqRel));
                                hits[i].fetch_add(1, Ordering::Relaxed);
                                busy[tid].store(false, Ordering::Release);
                            });
                        } else {
                            pool.run_split(n, 1 + round % 5, &|tid, r| {
                                assert!(!busy[tid].swap(true, Ordering::AcqRel));
                                for h in &hits[r] {
                                    h.fetch_add(1, Ordering::Relaxed);
                                }
                                busy[tid].store(false, Ordering::Release);
                            });
                        }
                        for (i, h) in hits.iter().enumerate() {
                            let got = h.swap(0, Ordering::Relaxed);
                            assert_eq!(got, usize::from(i < n), "caller {caller} round {round}");
                        }
                    }
                });
            }
        });
        assert!(all_threads_take_part(&pool));
    }

    /// A dispatch from inside a job of the same pool runs on its thread alone.
    #[test]
    fn nested_dispatch_runs_inline() {
        let pool = ThreadPool::new(2);
        let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..100 {
            pool.run_items(8, &|_, i| {
                pool.run_items(8, &|_, j| {
                    hits[i * 8 + j].fetch_add(1, Ordering::Relaxed);
                });
            });
            for h in &hits {
                assert_eq!(h.swap(0, Ordering::Relaxed), 1);
            }
        }
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
