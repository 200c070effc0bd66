//! Property test: mutated real GGUF headers (flipped bytes, splices, truncations, length fields
//! overwritten with huge values) parse to `Ok` or `Err`, never a panic, and never allocate much
//! more than the file's own size.
//!
//! The allocation bound is checked with a counting global allocator armed only on the thread
//! doing the parse.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;

use kiln::gguf::writer::{write_string, write_value};
use kiln::gguf::{GgufFile, Value};
use proptest::prelude::*;
use proptest::sample::Index;

// ---- Allocation accounting ------------------------------------------------------------------

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(delta: i64) {
    // `try_with`: thread-locals may be gone while a thread shuts down.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let live = LIVE.get() + delta;
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; the bookkeeping only touches
// const-initialized thread-locals (no allocation, no re-entrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64));
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as i64 - layout.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak heap growth (bytes) while running `f` on this thread.
fn peak_heap<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LIVE.set(0);
    PEAK.set(0);
    ARMED.set(true);
    let r = f();
    ARMED.set(false);
    (r, PEAK.get().max(0) as usize)
}

/// The parser's in-memory form of a header is a few times its encoded size (a `String` is
/// 24 bytes for an 8-byte encoded length, plus hash-map indexes). A count bug would allocate
/// gigabytes; this bound catches that with room to spare.
fn heap_budget(file_len: usize) -> usize {
    8 * file_len + (64 << 10)
}

// ---- Seeds ------------------------------------------------------------------------------------

struct Seed {
    /// The whole file.
    bytes: Vec<u8>,
    /// Where the data section starts: mutations land before it.
    header_len: usize,
    /// Where the tensor infos start (after the metadata), to aim half the mutations at them.
    infos_start: usize,
    /// Every count, length, type and offset field of the header: (position, width in bytes).
    fields: Vec<(usize, usize)>,
}

fn seeds() -> &'static [Seed] {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        // (gpt-oss's: the MXFP4 type and the sliding-window, expert and bias entries.)
        [
            "random-llama-q4_0",
            "random-qwen3-q4_k_m",
            "random-gpt-oss-mxfp4",
        ]
        .iter()
        .map(|stem| {
            let bytes = std::fs::read(common::random_model(stem)).unwrap();
            let f = GgufFile::from_bytes(bytes.clone()).unwrap();
            let header_len = f.data_offset();
            let mut kvs = Vec::new();
            for (k, v) in f.metadata() {
                write_string(&mut kvs, k);
                write_value(&mut kvs, v);
            }
            let infos_start = 24 + kvs.len();
            let fields = header_fields(&f);
            Seed {
                bytes,
                header_len,
                infos_start,
                fields,
            }
        })
        .collect()
    })
}

/// Walk the parsed header, recording where each numeric field was encoded.
fn header_fields(f: &GgufFile) -> Vec<(usize, usize)> {
    let mut out = vec![(4, 4), (8, 8), (16, 8)]; // version, tensor count, kv count
    let mut pos = 24;
    for (k, v) in f.metadata() {
        out.push((pos, 8)); // key length
        pos += 8 + k.len();
        out.push((pos, 4)); // value type
        match v {
            Value::String(_) => out.push((pos + 4, 8)),
            Value::Array(a) => {
                out.push((pos + 4, 4)); // element type
                out.push((pos + 8, 8)); // count
                if let Some(strings) = a.as_strings() {
                    let mut p = pos + 16;
                    for s in strings {
                        out.push((p, 8));
                        p += 8 + s.len();
                    }
                }
            }
            _ => {}
        }
        let mut enc = Vec::new();
        write_value(&mut enc, v);
        pos += enc.len();
    }
    for t in f.tensors() {
        out.push((pos, 8)); // name length
        pos += 8 + t.name.len();
        out.push((pos, 4)); // n_dims
        pos += 4;
        for _ in &t.shape {
            out.push((pos, 8));
            pos += 8;
        }
        out.push((pos, 4)); // ggml type
        out.push((pos + 4, 8)); // offset
        pos += 12;
    }
    assert_eq!(pos.div_ceil(f.alignment()) * f.alignment(), f.data_offset());
    out
}

// ---- Mutations --------------------------------------------------------------------------------

/// A position in the header; `infos` aims it at the tensor-info region.
#[derive(Debug, Clone)]
struct At {
    index: Index,
    infos: bool,
}

fn at() -> impl Strategy<Value = At> {
    (any::<Index>(), any::<bool>()).prop_map(|(index, infos)| At { index, infos })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: At,
        xor: u8,
    },
    SetU32 {
        at: At,
        value: u32,
    },
    SetU64 {
        at: At,
        value: u64,
    },
    /// Overwrite a known count / length / type / offset field.
    SetField {
        which: Index,
        value: u64,
    },
    /// Set a field to the bytes remaining after it, shifted right: the largest counts a
    /// too-loose bound would still accept.
    SetFieldToRemaining {
        which: Index,
        shift: u32,
    },
    /// Copy `len` header bytes from `from` over `to`.
    Splice {
        from: Index,
        to: Index,
        len: usize,
    },
    /// Remove `len` header bytes at `at` (shifts everything after it).
    Delete {
        at: Index,
        len: usize,
    },
    /// Cut the file at a point in the header or in the data section.
    Truncate {
        at: Index,
        in_header: bool,
    },
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1u64),
        Just(u32::MAX as u64 + 1), // truncates to 0 in a u32 field
        Just(u64::MAX),
        Just(1u64 << 60),
        Just(1u64 << 32),
        Just(u32::MAX as u64),
        Just(0u64),
        0u64..10_000,
        any::<u64>(),
    ]
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(u32::MAX),
        Just(0u32),
        0u32..40, // value types / ggml type ids / n_dims around the valid range
        any::<u32>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (at(), prop_oneof![(0u32..8).prop_map(|k| 1u8 << k), 1u8..=255])
            .prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        2 => (at(), interesting_u32()).prop_map(|(at, value)| Mutation::SetU32 { at, value }),
        2 => (at(), interesting_u64()).prop_map(|(at, value)| Mutation::SetU64 { at, value }),
        3 => (any::<Index>(), interesting_u64())
            .prop_map(|(which, value)| Mutation::SetField { which, value }),
        2 => (any::<Index>(), 0u32..5)
            .prop_map(|(which, shift)| Mutation::SetFieldToRemaining { which, shift }),
        1 => (any::<Index>(), any::<Index>(), 1usize..64)
            .prop_map(|(from, to, len)| Mutation::Splice { from, to, len }),
        1 => (any::<Index>(), 1usize..32).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => (any::<Index>(), any::<bool>())
            .prop_map(|(at, in_header)| Mutation::Truncate { at, in_header }),
    ]
}

fn apply(seed: &Seed, mutations: &[Mutation]) -> Vec<u8> {
    let mut b = seed.bytes.clone();
    let mut header_len = seed.header_len;
    for m in mutations {
        if b.is_empty() {
            break;
        }
        let h = header_len.min(b.len()).max(1);
        let pos = |at: &At| {
            let lo = if at.infos {
                seed.infos_start.min(h - 1)
            } else {
                0
            };
            lo + at.index.index(h - lo)
        };
        match *m {
            Mutation::Flip { ref at, xor } => b[pos(at)] ^= xor,
            Mutation::SetU32 { ref at, value } => {
                let p = pos(at);
                let end = (p + 4).min(b.len());
                b[p..end].copy_from_slice(&value.to_le_bytes()[..end - p]);
            }
            Mutation::SetU64 { ref at, value } => {
                let p = pos(at);
                let end = (p + 8).min(b.len());
                b[p..end].copy_from_slice(&value.to_le_bytes()[..end - p]);
            }
            Mutation::SetField { ref which, value } => {
                let (p, width) = seed.fields[which.index(seed.fields.len())];
                if p + width <= b.len() {
                    b[p..p + width].copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            Mutation::SetFieldToRemaining { ref which, shift } => {
                let (p, width) = seed.fields[which.index(seed.fields.len())];
                if p + width <= b.len() {
                    let value = ((b.len() - p - width) as u64) >> shift;
                    b[p..p + width].copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            Mutation::Splice {
                ref from,
                ref to,
                len,
            } => {
                let (f, t) = (from.index(h), to.index(h));
                let len = len.min(b.len() - f).min(b.len() - t);
                b.copy_within(f..f + len, t);
            }
            Mutation::Delete { ref at, len } => {
                let p = at.index(h);
                let len = len.min(b.len() - p);
                b.drain(p..p + len);
                header_len = header_len.saturating_sub(len);
            }
            Mutation::Truncate { ref at, in_header } => {
                let cut = if in_header {
                    at.index(h)
                } else {
                    at.index(b.len())
                };
                b.truncate(cut);
            }
        }
    }
    b
}

/// Parse, and if that succeeds, use everything the way a loader would.
fn exercise(bytes: Vec<u8>) -> Result<usize, kiln::gguf::GgufError> {
    let f = GgufFile::from_bytes(bytes)?;
    let mut touched = 0usize;
    for t in f.tensors() {
        let data = f.tensor_bytes(t);
        assert_eq!(data.len(), t.n_bytes, "{}", t.name);
        assert!(data.file_offset() + data.len() <= f.file_size());
        // First and last byte: the whole range must be readable.
        touched += data[0] as usize + data[data.len() - 1] as usize;
        assert!(std::ptr::eq(f.tensor_info(&t.name).unwrap(), t));
    }
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some());
        let _ = v.to_string();
    }
    let _ = f
        .architecture()
        .map(|_| f.get_u32(&f.arch_key("block_count")));
    Ok(touched)
}

/// 3000 cases (about a second); `PROPTEST_CASES` overrides for long runs.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_headers_never_panic(
        which in 0usize..2,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let seed = &seeds()[which];
        let bytes = apply(seed, &mutations);
        let len = bytes.len();
        let (result, peak) = peak_heap(|| exercise(bytes));
        prop_assert!(peak <= heap_budget(len), "peak heap {peak} for a {len}-byte file");
        if let Err(e) = result {
            // Errors render, and say where (all but the magic check name a byte offset).
            let msg = e.to_string();
            prop_assert!(msg.contains("byte") || msg.contains("magic") || msg.contains("GGUF"),
                "{msg}");
        }
    }
}

#[test]
fn unmutated_seeds_parse_within_budget() {
    for seed in seeds() {
        assert!(seed.fields.len() > 500, "{}", seed.fields.len());
        let (r, peak) = peak_heap(|| exercise(seed.bytes[..].to_vec()));
        r.unwrap();
        // The copy of the file itself is counted here too.
        assert!(peak <= heap_budget(seed.bytes.len()) + seed.bytes.len());
    }
}

#[test]
fn every_header_truncation_is_an_error() {
    for seed in seeds() {
        for len in 0..seed.header_len {
            let bytes = seed.bytes[..len].to_vec();
            let (r, peak) = peak_heap(|| GgufFile::from_bytes(bytes));
            assert!(r.is_err(), "truncated to {len} parsed");
            // Allow for the copy of the input itself being freed inside.
            assert!(peak <= heap_budget(len), "len {len}: peak {peak}");
        }
    }
}

#[test]
fn huge_value_in_every_field() {
    for seed in seeds() {
        for &(p, width) in &seed.fields {
            let rest = (seed.bytes.len() - p - width) as u64;
            // Near the largest key/value (rest / 13) and tensor (rest / 32) counts the bound allows.
            for value in [
                u64::MAX,
                1 << 60,
                1 << 31,
                rest,
                rest / 2,
                rest / 8,
                rest / 14,
                rest / 16,
                rest / 40,
            ] {
                let mut b = seed.bytes.clone();
                b[p..p + width].copy_from_slice(&value.to_le_bytes()[..width]);
                let len = b.len();
                let (r, peak) = peak_heap(|| exercise(b));
                // A huge dim or offset can still describe a valid file only by accident; what
                // matters is no panic and a bounded heap.
                let _ = r;
                assert!(peak <= heap_budget(len), "field at {p}: peak {peak}");
            }
        }
    }
}
