//! KV offload on the CPU: the whole cache lives in a file; a small ring of
//! per-layer buffers holds the layers being computed, and a background thread streams them.
//!
//! The file holds every layer in the in-RAM layout (`[K: n_kv_heads, max_len, row][V: …]`,
//! layer `l` at `l · layer_bytes`). A forward pass visits layers in order; the ring has `R < L`
//! slots. Around layer `l`:
//!
//! ```text
//! begin_layer(l)  wait for slot (l mod R) to come back from the I/O thread holding layer l
//! write / attend  the new positions are written into the slot, attention reads it
//! end_layer(l)    hand the slot to the I/O thread: write back the new positions of layer l,
//!                 then load layer (l + R) mod L (its positions 0..len) into it
//! ```
//!
//! Loads are issued and consumed in the same cyclic order, so the slot that comes back next is
//! always the layer the pass needs next; while layer `l` computes, layers `l+1 … l+R−1` are
//! loading or loaded. Jobs run in FIFO order on one thread, so a layer's write-back always
//! precedes its next load. The bytes the attention reads are exactly those an in-RAM cache
//! would hold: results are bit-identical.
//!
//! The two queues are preallocated for the `R` buffers (a mutex and condition variable each:
//! waiting allocates nothing, unlike `std::sync::mpsc`'s first block on a thread) and the
//! ring's buffers move between the threads by ownership, so decoding allocates nothing. The file is created in
//! the temporary directory and unlinked at once (its disk space is freed when the cache is
//! dropped); its pages go through the OS page cache, which is shared and evictable, not part of
//! the process's resident set.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use half::f16;
use zerocopy::IntoBytes;

/// `n` zero f16 values from a zeroed allocation: the OS maps zero pages lazily, so only the
/// positions actually written become resident (`vec![f16::ZERO; n]` would memset them all).
pub(crate) fn zeroed_f16(n: usize) -> Vec<f16> {
    use half::vec::HalfBitsVecExt;
    vec![0u16; n].reinterpret_into()
}

/// Byte geometry of one layer's keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerGeom {
    pub n_kv_heads: usize,
    pub max_len: usize,
    /// Bytes of one head's key row at one position.
    pub row_k: usize,
    /// Bytes of one head's value row.
    pub row_v: usize,
}

impl LayerGeom {
    /// Bytes of the layer's keys (the values follow).
    pub fn k_bytes(&self) -> usize {
        self.n_kv_heads * self.max_len * self.row_k
    }

    /// Bytes of the layer's keys and values.
    pub fn bytes(&self) -> usize {
        self.k_bytes() + self.n_kv_heads * self.max_len * self.row_v
    }

    /// `(offset in the layer, length)` of positions `rows` of every head, keys then values.
    fn spans(&self, rows: Range<usize>) -> impl Iterator<Item = (usize, usize)> + '_ {
        let n = rows.len();
        let k = (0..self.n_kv_heads)
            .map(move |h| ((h * self.max_len + rows.start) * self.row_k, n * self.row_k));
        let v = (0..self.n_kv_heads).map(move |h| {
            (
                self.k_bytes() + (h * self.max_len + rows.start) * self.row_v,
                n * self.row_v,
            )
        });
        k.chain(v).filter(|&(_, len)| len > 0)
    }
}

/// Why an offloaded cache could not be created.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error("KV offload file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why an offloaded cache failed during a forward pass. The cache's contents are lost then:
/// every later pass on it fails with [`OffloadFault::Lost`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadFault {
    #[error("KV offload file: {op} layer {layer}: {message}")]
    Io {
        /// `"writing"` or `"reading"`.
        op: &'static str,
        layer: usize,
        kind: std::io::ErrorKind,
        message: String,
    },
    #[error("the KV offload cache was lost to an earlier I/O error or an interrupted pass")]
    Lost,
    #[error("the KV offload thread stopped")]
    Stopped,
}

/// One unit of work for the I/O thread.
struct Job {
    buf: Vec<f16>,
    /// Write these positions of this layer from `buf` back to the file.
    write: Option<(usize, Range<usize>)>,
    /// Then load positions `0..rows` of this layer into `buf`.
    load: (usize, usize),
}

type Ready = Result<(usize, Vec<f16>), OffloadFault>;

/// A FIFO between the two threads, preallocated for every item that can be in flight.
struct Queue<T> {
    state: Mutex<(VecDeque<T>, bool)>,
    cv: Condvar,
}

impl<T> Queue<T> {
    fn new(cap: usize) -> Self {
        Queue {
            state: Mutex::new((VecDeque::with_capacity(cap), false)),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (VecDeque<T>, bool)> {
        // A panic while holding the lock leaves the queue itself consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, item: T) {
        self.lock().0.push_back(item);
        self.cv.notify_one();
    }

    /// The next item, waiting for one; `None` once closed and empty.
    fn pop(&self) -> Option<T> {
        let mut g = self.lock();
        loop {
            if let Some(item) = g.0.pop_front() {
                return Some(item);
            }
            if g.1 {
                return None;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn close(&self) {
        self.lock().1 = true;
        self.cv.notify_all();
    }
}

/// The file-backed store with its ring of layer buffers.
pub struct OffloadStore {
    geom: LayerGeom,
    n_layers: usize,
    ring: usize,
    /// The layer being computed and its buffer (between `begin_layer` and `end_layer`).
    current: Option<(usize, Vec<f16>)>,
    jobs: Arc<Queue<Job>>,
    ready: Arc<Queue<Ready>>,
    worker: Option<JoinHandle<()>>,
    /// An I/O error or an interrupted pass broke the ring.
    failed: bool,
}

impl OffloadStore {
    /// A store of `n_layers` layers of `geom` on disk with a ring of `ring` buffers in RAM
    /// (`2 <= ring < n_layers`).
    pub fn new(geom: LayerGeom, n_layers: usize, ring: usize) -> Result<Self, OffloadError> {
        let path =
            std::env::temp_dir().join(format!("kiln-kv-{}-{}.bin", std::process::id(), unique()));
        let io = |source| OffloadError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        // Unlinked now: the space is released when the file is closed, even on a crash.
        std::fs::remove_file(&path).map_err(io)?;
        file.set_len((n_layers * geom.bytes()) as u64).map_err(io)?;
        Self::with_file(file, geom, n_layers, ring).map_err(io)
    }

    /// [`OffloadStore::new`] over `file`, which holds `n_layers * geom.bytes()` bytes.
    fn with_file(
        file: File,
        geom: LayerGeom,
        n_layers: usize,
        ring: usize,
    ) -> std::io::Result<Self> {
        assert!(
            ring >= 2 && ring < n_layers,
            "ring {ring} for {n_layers} layers"
        );
        assert!(geom.bytes().is_multiple_of(2));
        let jobs = Arc::new(Queue::<Job>::new(ring));
        let ready = Arc::new(Queue::<Ready>::new(ring));
        let layer_bytes = geom.bytes();
        let worker = {
            let (jobs, ready) = (Arc::clone(&jobs), Arc::clone(&ready));
            std::thread::Builder::new()
                .name("kiln-kv-offload".into())
                .spawn(move || {
                    // However the loop ends (closed, or a panic), the compute side must not
                    // wait forever: close its queue.
                    struct CloseOnExit(Arc<Queue<Ready>>);
                    impl Drop for CloseOnExit {
                        fn drop(&mut self) {
                            self.0.close();
                        }
                    }
                    let ready = CloseOnExit(ready);
                    while let Some(job) = jobs.pop() {
                        ready.0.push(run_job(&file, &geom, layer_bytes, job));
                    }
                })?
        };
        let store = OffloadStore {
            geom,
            n_layers,
            ring,
            current: None,
            jobs,
            ready,
            worker: Some(worker),
            failed: false,
        };
        // Prime the ring with layers 0..ring (nothing to read yet).
        for l in 0..ring {
            let buf = zeroed_f16(layer_bytes / 2);
            store.send(Job {
                buf,
                write: None,
                load: (l, 0),
            });
        }
        Ok(store)
    }

    /// Bytes of the ring buffers held in RAM.
    pub fn ram_bytes(&self) -> usize {
        self.ring * self.geom.bytes()
    }

    /// Bytes of the file.
    pub fn file_bytes(&self) -> usize {
        self.n_layers * self.geom.bytes()
    }

    pub fn ring(&self) -> usize {
        self.ring
    }

    fn send(&self, job: Job) {
        self.jobs.push(job);
    }

    /// Wait until `layer` is in a buffer and make it current. An I/O error of the background
    /// thread comes back here; after one (or after a pass that stopped with another layer
    /// open) the store is lost and every call fails.
    pub fn begin_layer(&mut self, layer: usize) -> Result<(), OffloadFault> {
        if let Some((l, _)) = &self.current {
            if *l == layer {
                return Ok(());
            }
            // A pass ended early (another sequence's error) with this layer open.
            self.failed = true;
        }
        if self.failed {
            return Err(OffloadFault::Lost);
        }
        let got = self.ready.pop().unwrap_or(Err(OffloadFault::Stopped));
        match got {
            Ok((l, buf)) => {
                assert_eq!(l, layer, "KV offload: ring out of order");
                self.current = Some((layer, buf));
                Ok(())
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    /// Finish `layer`, whose positions `new` were written: write them back and load the layer
    /// `ring` ahead (its positions `0..len`, where `len` is the cache length after this pass
    /// for layers already done in it, `new.start` for the others).
    pub fn end_layer(&mut self, layer: usize, new: Range<usize>) {
        let (l, buf) = self.current.take().expect("KV offload: no layer open");
        assert_eq!(
            l, layer,
            "KV offload: closing layer {layer} but {l} is open"
        );
        let next = (layer + self.ring) % self.n_layers;
        let rows = if next > layer { new.start } else { new.end };
        self.send(Job {
            buf,
            write: Some((layer, new)),
            load: (next, rows),
        });
    }

    /// The open layer's buffer (`[K][V]` bytes, as `f16` words).
    pub fn current(&self, layer: usize) -> &[f16] {
        match &self.current {
            Some((l, buf)) if *l == layer => buf,
            _ => panic!("KV offload: layer {layer} is not open"),
        }
    }

    /// The open layer's buffer, mutable.
    pub fn current_mut(&mut self, layer: usize) -> &mut [f16] {
        match &mut self.current {
            Some((l, buf)) if *l == layer => buf,
            _ => panic!("KV offload: layer {layer} is not open"),
        }
    }

    pub fn geom(&self) -> &LayerGeom {
        &self.geom
    }
}

impl Drop for OffloadStore {
    fn drop(&mut self) {
        // Closing the job queue ends the worker's loop once the queued jobs are done.
        self.jobs.close();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn run_job(file: &File, geom: &LayerGeom, layer_bytes: usize, mut job: Job) -> Ready {
    let fail = |op: &'static str, layer: usize, e: std::io::Error| OffloadFault::Io {
        op,
        layer,
        kind: e.kind(),
        message: e.to_string(),
    };
    if let Some((l, rows)) = job.write.take() {
        let base = (l * layer_bytes) as u64;
        let bytes = job.buf.as_bytes();
        for (off, len) in geom.spans(rows) {
            file.write_all_at(&bytes[off..off + len], base + off as u64)
                .map_err(|e| fail("writing", l, e))?;
        }
    }
    let (l, rows) = job.load;
    let base = (l * layer_bytes) as u64;
    let bytes = job.buf.as_mut_bytes();
    for (off, len) in geom.spans(0..rows) {
        file.read_exact_at(&mut bytes[off..off + len], base + off as u64)
            .map_err(|e| fail("reading", l, e))?;
    }
    Ok((l, job.buf))
}

/// A number unique within the process (several caches may be offloaded at once).
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_each_heads_rows() {
        let g = LayerGeom {
            n_kv_heads: 2,
            max_len: 10,
            row_k: 4,
            row_v: 6,
        };
        assert_eq!(g.bytes(), 2 * 10 * 10);
        let s: Vec<_> = g.spans(3..5).collect();
        assert_eq!(s, vec![(12, 8), (52, 8), (80 + 18, 12), (80 + 78, 12)]);
        assert_eq!(g.spans(0..0).count(), 0);
    }

    /// Round trip through the file: what is written back is what a later pass loads.
    #[test]
    fn ring_streams_layers_in_order_and_persists_writes() {
        let g = LayerGeom {
            n_kv_heads: 1,
            max_len: 4,
            row_k: 2,
            row_v: 2,
        };
        let n_layers = 5;
        let mut s = OffloadStore::new(g, n_layers, 2).unwrap();
        assert_eq!(s.ram_bytes(), 2 * 16);
        // Pass 1 writes position 0 of every layer: the layer number in K and V.
        for l in 0..n_layers {
            s.begin_layer(l).unwrap();
            let buf = s.current_mut(l);
            buf[0] = f16::from_f32(l as f32); // K row, head 0, position 0 (2 bytes)
            buf[4] = f16::from_f32(-(l as f32)); // V row
            s.end_layer(l, 0..1);
        }
        // Pass 2 sees them, writes position 1.
        for l in 0..n_layers {
            s.begin_layer(l).unwrap();
            let buf = s.current_mut(l);
            assert_eq!(buf[0].to_f32(), l as f32, "layer {l}");
            assert_eq!(buf[4].to_f32(), -(l as f32), "layer {l}");
            buf[1] = f16::from_f32(10.0 + l as f32);
            s.end_layer(l, 1..2);
        }
        for l in 0..n_layers {
            s.begin_layer(l).unwrap();
            assert_eq!(s.current(l)[1].to_f32(), 10.0 + l as f32, "layer {l}");
            assert_eq!(s.current(l)[0].to_f32(), l as f32, "layer {l}");
            s.end_layer(l, 2..2);
        }
    }

    /// Layers 0..5 of the small geometry over `file`, ring of 2.
    fn store_over(file: File) -> OffloadStore {
        let g = LayerGeom {
            n_kv_heads: 1,
            max_len: 4,
            row_k: 2,
            row_v: 2,
        };
        OffloadStore::with_file(file, g, 5, 2).unwrap()
    }

    /// A file of the right size, reopened with `opts`.
    fn scratch_file(opts: &std::fs::OpenOptions) -> File {
        let path = std::env::temp_dir().join(format!(
            "kiln-kv-test-{}-{}.bin",
            std::process::id(),
            unique()
        ));
        File::create(&path).unwrap().set_len(5 * 16).unwrap();
        let f = opts.open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    /// A write-back that fails (the file is read-only) comes back as an error from the
    /// `begin_layer` that waits for that buffer, not a panic; the store is lost from then on
    /// and is dropped without hanging.
    #[test]
    fn write_errors_are_returned() {
        let mut s = store_over(scratch_file(std::fs::OpenOptions::new().read(true)));
        // Layers 0 and 1 were primed without I/O.
        s.begin_layer(0).unwrap();
        s.end_layer(0, 0..1); // write-back fails on the I/O thread
        s.begin_layer(1).unwrap();
        s.end_layer(1, 0..1);
        let err = s.begin_layer(2).unwrap_err();
        match &err {
            OffloadFault::Io { op, layer, .. } => assert_eq!((*op, *layer), ("writing", 0)),
            e => panic!("unexpected {e:?}"),
        }
        assert!(err.to_string().contains("writing layer 0"), "{err}");
        assert_eq!(s.begin_layer(2), Err(OffloadFault::Lost));
        assert_eq!(s.begin_layer(0), Err(OffloadFault::Lost));
    }

    /// A load that fails (the file cannot be read) is an error too, from the `begin_layer`
    /// that needs the layer.
    #[test]
    fn read_errors_are_returned() {
        let mut s = store_over(scratch_file(std::fs::OpenOptions::new().write(true)));
        // Pass 1 writes position 0 of every layer; closing layers 3 and 4 loads layers 0 and 1
        // (their position 0) for the next pass.
        for l in 0..5 {
            s.begin_layer(l).unwrap();
            s.end_layer(l, 0..1);
        }
        match s.begin_layer(0) {
            Err(OffloadFault::Io { op, layer, .. }) => assert_eq!((op, layer), ("reading", 0)),
            r => panic!("unexpected {r:?}"),
        }
        assert_eq!(s.begin_layer(1), Err(OffloadFault::Lost));
    }

    /// A pass that stopped with a layer open (another sequence's error) loses the store
    /// instead of tripping an assertion on the next pass.
    #[test]
    fn an_interrupted_pass_loses_the_store() {
        let mut s = store_over(scratch_file(
            std::fs::OpenOptions::new().read(true).write(true),
        ));
        s.begin_layer(0).unwrap();
        s.end_layer(0, 0..1);
        s.begin_layer(1).unwrap();
        assert_eq!(s.begin_layer(0), Err(OffloadFault::Lost));
    }
}
