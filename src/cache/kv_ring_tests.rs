//! The sliding-window ring against a full cache written with the same data.

use super::*;
use crate::kernels::ThreadPool;

const HEADS: usize = 2;
const HD: usize = 32;

/// 3 layers, the middle one a ring: window 10, passes of up to 4 tokens, so the ring has
/// 64 rows (10 + 4 − 1 rounded up) in a context of 300.
fn layouts() -> (KvLayout, KvLayout) {
    let full = KvLayout::full(3, HEADS, HD, HD, 300);
    let ring = full.clone().with_window(10, &[false, true, false], 4);
    assert_eq!(ring.ring_rows(1), Some(64));
    assert_eq!(ring.ring_rows(0), None);
    assert_eq!(ring.window.as_ref().unwrap().max_pass(), 55);
    (full, ring)
}

/// Deterministic rows for position `pos` of `layer` (`salt` varies the sequence).
fn rows(layer: usize, pos: usize, salt: u64) -> (Vec<f32>, Vec<f32>) {
    let mut x = (pos as u64 * 131 + layer as u64 * 7 + salt).wrapping_mul(0x9e3779b97f4a7c15);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    let k = (0..HEADS * HD).map(|_| next()).collect();
    let v = (0..HEADS * HD).map(|_| next()).collect();
    (k, v)
}

/// Append positions `len..len+n` to `c` as a forward pass would.
fn pass(c: &mut KvCache, n: usize, salt: u64) {
    c.check_window(n).unwrap();
    let pos0 = c.len();
    for layer in 0..3 {
        c.begin_layer(layer).unwrap();
        for p in pos0..pos0 + n {
            let (k, v) = rows(layer, p, salt);
            c.write(layer, p, &k, &v);
        }
        c.end_layer(layer, pos0..pos0 + n);
    }
    c.advance(n).unwrap();
}

/// Keys and values of `pos` (every head) of `layer`, dequantized to f32.
fn read(c: &KvCache, layer: usize, pos: usize) -> Vec<f32> {
    let rows = c.layout().rows(layer);
    let r = c.layout().row_of(layer, pos);
    let l = c.layer(layer);
    let mut buf = vec![f16::ZERO; HD];
    let mut out = Vec::new();
    for h in 0..HEADS {
        let row = h * rows + r;
        out.extend(
            l.rows_f16(KvSide::Keys, row..row + 1, HD, &mut buf)
                .iter()
                .map(|x| x.to_f32()),
        );
        out.extend(
            l.rows_f16(KvSide::Values, row..row + 1, HD, &mut buf)
                .iter()
                .map(|x| x.to_f32()),
        );
    }
    out
}

/// Every position a pass from `len` can see is what the full cache holds: all of them in
/// full layers, the window before `len` in the ring.
fn assert_same_view(full: &KvCache, ring: &KvCache) {
    assert_eq!(full.len(), ring.len());
    let len = ring.len();
    assert!(ring.can_resume_at(len));
    for layer in 0..3 {
        let lo = if layer == 1 {
            (len + 1).saturating_sub(10)
        } else {
            0
        };
        for p in lo..len {
            assert_eq!(
                read(full, layer, p),
                read(ring, layer, p),
                "layer {layer} pos {p}"
            );
        }
    }
}

/// A cache of `ty` over [`layouts`]' full layout and one over its ring layout.
fn full_and_ring(ty: KvType) -> (KvCache, KvCache) {
    let (lf, lr) = layouts();
    let cache = |l| KvCache::with_type(l, ty).unwrap();
    (cache(lf), cache(lr))
}

#[test]
fn ring_wraps_and_holds_the_window() {
    for ty in [KvType::F16, KvType::Q8_0] {
        let (mut full, mut ring) = full_and_ring(ty);
        assert_eq!(
            ring.bytes(),
            2 * HEADS * 300 * 2 * ty.row_bytes(HD) + HEADS * 64 * 2 * ty.row_bytes(HD)
        );
        // 1, 2, 3, 4 tokens per pass, round and round the ring (three times over).
        let mut n = 1;
        while ring.len() + n <= 200 {
            pass(&mut full, n, 1);
            pass(&mut ring, n, 1);
            assert_same_view(&full, &ring);
            assert_eq!(ring.kept_from(), ring.len().saturating_sub(64));
            n = n % 4 + 1;
        }
        assert!(ring.len() > 3 * 64);
    }
}

#[test]
fn pass_longer_than_the_ring_allows_is_refused() {
    let (_, lr) = layouts();
    let c = KvCache::new(lr);
    assert_eq!(
        c.check_window(56),
        Err(KvWindowError::PassTooLong {
            n: 56,
            max: 55,
            rows: 64
        })
    );
    assert_eq!(c.check_window(55), Ok(()));
}

#[test]
fn rollback_within_the_ring_is_exact_and_past_it_empties() {
    let (lf, lr) = layouts();
    let mut full = KvCache::new(lf);
    let mut ring = KvCache::new(lr);
    for _ in 0..40 {
        pass(&mut full, 4, 2);
        pass(&mut ring, 4, 2);
    }
    // len 160: the ring keeps 96..160; going back to p needs p − 9 .. p.
    assert_eq!(ring.kept_from(), 96);
    assert!(ring.can_resume_at(105) && !ring.can_resume_at(104));
    assert!(ring.can_resume_at(0));
    // Back 50, then forward again with other tokens: the same as the full cache.
    assert_eq!(ring.rollback(110), 110);
    full.rollback(110);
    assert_same_view(&full, &ring);
    for _ in 0..30 {
        pass(&mut full, 3, 3);
        pass(&mut ring, 3, 3);
        assert_same_view(&full, &ring);
    }
    // len 200, keeps 136..: rolling back to 145 is exact, to 144 is not: the cache empties.
    assert_eq!(ring.len(), 200);
    assert_eq!(ring.kept_from(), 136);
    let mut probe = KvCache::new(ring.layout().clone());
    probe.copy_prefix_from(&ring, 200).unwrap();
    assert_eq!(probe.rollback(145), 145);
    assert_eq!(ring.rollback(144), 0);
    assert!(ring.is_empty());
    assert_eq!(ring.kept_from(), 0);
    // Refilled from scratch, it agrees with a fresh full cache again.
    let (lf, _) = layouts();
    let mut fresh = KvCache::new(lf);
    for _ in 0..20 {
        pass(&mut fresh, 4, 4);
        pass(&mut ring, 4, 4);
    }
    assert_same_view(&fresh, &ring);
    ring.reset();
    assert_eq!((ring.len(), ring.kept_from()), (0, 0));
    // A rollback past the ring with the window before it: not lost when nothing was.
    let mut short = KvCache::new(layouts().1);
    pass(&mut short, 4, 5);
    assert_eq!(short.rollback(1), 1);
}

#[test]
fn prefix_copy_from_a_ring_equals_the_full_prefix_or_nothing() {
    let (lf, lr) = layouts();
    for ty in [KvType::F16, KvType::Q8_0] {
        let (mut full, mut src) = full_and_ring(ty);
        for _ in 0..45 {
            pass(&mut full, 4, 6);
            pass(&mut src, 4, 6);
        }
        // len 180, keeps 116..180: prefixes of 125..=180 can be copied.
        let mut dst = KvCache::with_type(lr.clone(), ty).unwrap();
        pass(&mut dst, 3, 7);
        for n in [180, 150, 125] {
            assert_eq!(dst.copy_prefix_from(&src, n).unwrap(), n);
            let mut reference = KvCache::with_type(lf.clone(), ty).unwrap();
            reference.copy_prefix_from(&full, n).unwrap();
            assert_same_view(&reference, &dst);
            // And it goes on like the full cache.
            for _ in 0..25 {
                pass(&mut reference, 4, 8);
                pass(&mut dst, 4, 8);
                assert_same_view(&reference, &dst);
            }
        }
        assert_eq!(dst.copy_prefix_from(&src, 124).unwrap(), 0);
        assert!(dst.is_empty());
        assert_eq!(dst.copy_prefix_from(&src, 0).unwrap(), 0);
    }
}

#[test]
fn offloaded_cache_with_rings_reads_like_ram() {
    // 5 layers, 2 of them rings: the 3 full layers stream through 2 buffers.
    let full = KvLayout::full(5, HEADS, HD, HD, 300);
    let lr = full.with_window(10, &[false, true, false, true, false], 4);
    assert_eq!(lr.n_full_layers(), 3);
    assert_eq!(
        lr.offload_ring(
            KvType::F16,
            Some(lr.ring_kv_bytes(KvType::F16) + 2 * lr.layer_kv_bytes(KvType::F16))
        ),
        Ok(Some(2))
    );
    let mut ram = KvCache::new(lr.clone());
    let mut off = KvCache::offloaded(lr.clone(), KvType::F16, 2).unwrap();
    assert_eq!(
        off.bytes(),
        2 * lr.layer_kv_bytes(KvType::F16) + lr.ring_kv_bytes(KvType::F16)
    );
    for step in 0..60 {
        let n = step % 4 + 1;
        let pos0 = ram.len();
        for layer in 0..5 {
            ram.begin_layer(layer).unwrap();
            off.begin_layer(layer).unwrap();
            for p in pos0..pos0 + n {
                let (k, v) = rows(layer, p, 9);
                ram.write(layer, p, &k, &v);
                off.write(layer, p, &k, &v);
            }
            let lo = if lr.ring_rows(layer).is_some() {
                (pos0 + 1).saturating_sub(10)
            } else {
                0
            };
            for p in lo..pos0 + n {
                assert_eq!(
                    read(&ram, layer, p),
                    read(&off, layer, p),
                    "layer {layer} pos {p}"
                );
            }
            ram.end_layer(layer, pos0..pos0 + n);
            off.end_layer(layer, pos0..pos0 + n);
        }
        ram.advance(n).unwrap();
        off.advance(n).unwrap();
    }
}

/// `write_batch` (positions spread over threads, rings wrapped, a batch longer than a ring)
/// stores what `write` stores one position at a time, in RAM and in an offloaded cache.
#[test]
fn write_batch_stores_what_write_stores() {
    let windowed = [false, true, false, false, false];
    let lr = KvLayout::full(5, HEADS, HD, HD, 300).with_window(10, &windowed, 4);
    assert_eq!(lr.ring_rows(1), Some(64));
    let passes = [100, 7, 130, 63];
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for ty in [KvType::F16, KvType::Q8_0] {
            let mut one = KvCache::with_type(lr.clone(), ty).unwrap();
            let mut many = KvCache::with_type(lr.clone(), ty).unwrap();
            let mut off = KvCache::offloaded(lr.clone(), ty, 2).unwrap();
            let mut pos0 = 0;
            for n in passes {
                for layer in 0..5 {
                    let (mut ks, mut vs) = (Vec::new(), Vec::new());
                    for p in pos0..pos0 + n {
                        let (k, v) = rows(layer, p, 5);
                        one.write(layer, p, &k, &v);
                        ks.extend(k);
                        vs.extend(v);
                    }
                    many.write_batch(&pool, layer, pos0, n, &ks, &vs);
                    off.begin_layer(layer).unwrap();
                    off.write_batch(&pool, layer, pos0, n, &ks, &vs);
                    let end = pos0 + n;
                    let lo = if layer == 1 {
                        end.saturating_sub(64)
                    } else {
                        0
                    };
                    for p in lo..end {
                        let want = read(&one, layer, p);
                        let what = format!("{ty:?} {threads} threads layer {layer} pos {p}");
                        assert_eq!(want, read(&many, layer, p), "{what}");
                        assert_eq!(want, read(&off, layer, p), "offloaded {what}");
                    }
                    off.end_layer(layer, pos0..end);
                }
                pos0 += n;
            }
        }
    }
}
