//! The KV cache (seed 004): allocated once for the configured context, head-major per layer,
//! f16, with a cursor that advances, rolls back and resets without touching the data.
//!
//! Layout of one layer's keys (values alike):
//! ```text
//! k[layer]: [n_kv_heads, max_len, head_dim]   f16
//! offset(h, p, d) = h * max_len * head_dim + p * head_dim + d
//! ```
//! Head-major keeps every head's history contiguous, so attention over positions `0..len`
//! of one head is one sequential read.
//!
//! Invariant: positions `>= len` hold stale or zero data and are never read. A forward pass
//! writes the K/V of its new tokens at `len..len+n`, attends over `0..len+n`, then `advance(n)`.

use half::f16;

/// Geometry of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    /// Key head dimension.
    pub head_dim_k: usize,
    /// Value head dimension (equal to the key's for every architecture we run so far).
    pub head_dim_v: usize,
    /// Maximum number of positions (the context size).
    pub max_len: usize,
}

impl KvLayout {
    /// Elements of one layer's keys.
    pub fn k_elems_per_layer(&self) -> usize {
        self.n_kv_heads * self.max_len * self.head_dim_k
    }

    /// Elements of one layer's values.
    pub fn v_elems_per_layer(&self) -> usize {
        self.n_kv_heads * self.max_len * self.head_dim_v
    }

    /// Bytes of the whole cache: `n_layers · n_kv_heads · max_len · (head_dim_k + head_dim_v) · 2`.
    pub fn bytes(&self) -> usize {
        self.n_layers
            * (self.k_elems_per_layer() + self.v_elems_per_layer())
            * std::mem::size_of::<f16>()
    }
}

/// Error when a sequence would not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the KV cache holds {capacity} positions: {current} used + {requested} new would overflow it"
)]
pub struct KvOverflow {
    pub capacity: usize,
    pub current: usize,
    pub requested: usize,
}

/// `n` zero f16 values from a zeroed allocation: the OS maps zero pages lazily, so only the
/// positions actually written become resident (`vec![f16::ZERO; n]` would memset them all).
fn zeroed_f16(n: usize) -> Vec<f16> {
    use half::vec::HalfBitsVecExt;
    vec![0u16; n].reinterpret_into()
}

/// One sequence's KV cache.
pub struct KvCache {
    layout: KvLayout,
    /// Per layer, `[n_kv_heads, max_len, head_dim_k]`.
    k: Vec<Vec<f16>>,
    /// Per layer, `[n_kv_heads, max_len, head_dim_v]`.
    v: Vec<Vec<f16>>,
    /// Positions written so far (`current_length` in the seed).
    len: usize,
}

impl KvCache {
    /// Allocate the whole cache. Zeroed allocations are lazily backed by the OS, so resident
    /// memory grows as positions are written; the plan counts the full size.
    pub fn new(layout: KvLayout) -> KvCache {
        let k = (0..layout.n_layers)
            .map(|_| zeroed_f16(layout.k_elems_per_layer()))
            .collect();
        let v = (0..layout.n_layers)
            .map(|_| zeroed_f16(layout.v_elems_per_layer()))
            .collect();
        KvCache {
            layout,
            k,
            v,
            len: 0,
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maximum positions.
    pub fn capacity(&self) -> usize {
        self.layout.max_len
    }

    /// Would `additional` more positions exceed the capacity?
    pub fn would_overflow(&self, additional: usize) -> bool {
        self.len
            .checked_add(additional)
            .is_none_or(|n| n > self.layout.max_len)
    }

    /// Check that `additional` positions fit.
    pub fn check_fits(&self, additional: usize) -> Result<(), KvOverflow> {
        if self.would_overflow(additional) {
            Err(KvOverflow {
                capacity: self.layout.max_len,
                current: self.len,
                requested: additional,
            })
        } else {
            Ok(())
        }
    }

    /// Commit `count` positions written by the last forward pass.
    pub fn advance(&mut self, count: usize) -> Result<(), KvOverflow> {
        self.check_fits(count)?;
        self.len += count;
        Ok(())
    }

    /// Move the cursor back to `to_len` (no-op if already shorter). Data past it becomes stale.
    pub fn rollback(&mut self, to_len: usize) {
        self.len = self.len.min(to_len);
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Store the keys and values of position `pos` for `layer`, converting to f16.
    /// `k_row` is `[n_kv_heads * head_dim_k]`, `v_row` is `[n_kv_heads * head_dim_v]`.
    pub fn write(&mut self, layer: usize, pos: usize, k_row: &[f32], v_row: &[f32]) {
        let l = &self.layout;
        assert!(
            pos < l.max_len,
            "KV write at {pos} past capacity {}",
            l.max_len
        );
        let (hk, hv) = (l.head_dim_k, l.head_dim_v);
        for h in 0..l.n_kv_heads {
            let dst = &mut self.k[layer][(h * l.max_len + pos) * hk..][..hk];
            for (d, &s) in dst.iter_mut().zip(&k_row[h * hk..(h + 1) * hk]) {
                *d = f16::from_f32(s);
            }
            let dst = &mut self.v[layer][(h * l.max_len + pos) * hv..][..hv];
            for (d, &s) in dst.iter_mut().zip(&v_row[h * hv..(h + 1) * hv]) {
                *d = f16::from_f32(s);
            }
        }
    }

    /// Make this cache hold the first `n` positions of `src` (same layout): the keys and
    /// values are copied head by head and the cursor set to `n`. This is how a sequence reuses
    /// a prefix another sequence has already computed (prefix caching across slots).
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<(), KvOverflow> {
        assert_eq!(
            self.layout, src.layout,
            "copying between caches of another shape"
        );
        let n = n.min(src.len);
        self.len = 0;
        self.check_fits(n)?;
        let l = self.layout;
        for layer in 0..l.n_layers {
            for h in 0..l.n_kv_heads {
                let ks = h * l.max_len * l.head_dim_k..(h * l.max_len + n) * l.head_dim_k;
                self.k[layer][ks.clone()].copy_from_slice(&src.k[layer][ks]);
                let vs = h * l.max_len * l.head_dim_v..(h * l.max_len + n) * l.head_dim_v;
                self.v[layer][vs.clone()].copy_from_slice(&src.v[layer][vs]);
            }
        }
        self.len = n;
        Ok(())
    }

    /// All of `layer`'s keys, `[n_kv_heads, max_len, head_dim_k]`.
    pub fn keys(&self, layer: usize) -> &[f16] {
        &self.k[layer]
    }

    /// All of `layer`'s values, `[n_kv_heads, max_len, head_dim_v]`.
    pub fn values(&self, layer: usize) -> &[f16] {
        &self.v[layer]
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.layout.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            n_layers: 2,
            n_kv_heads: 2,
            head_dim_k: 4,
            head_dim_v: 4,
            max_len: 8,
        }
    }

    #[test]
    fn cursor_operations() {
        let mut c = KvCache::new(layout());
        assert!(c.is_empty());
        assert!(!c.would_overflow(8));
        assert!(c.would_overflow(9));
        c.advance(5).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(
            c.advance(4),
            Err(KvOverflow {
                capacity: 8,
                current: 5,
                requested: 4
            })
        );
        assert_eq!(c.len(), 5, "a refused advance changes nothing");
        c.rollback(3);
        assert_eq!(c.len(), 3);
        c.rollback(7);
        assert_eq!(c.len(), 3, "rollback never moves forward");
        c.reset();
        assert_eq!(c.len(), 0);
        assert!(c.would_overflow(usize::MAX));
    }

    #[test]
    fn copy_prefix_copies_only_the_prefix() {
        let mut a = KvCache::new(layout());
        for pos in 0..5 {
            let k: Vec<f32> = (0..8).map(|i| (pos * 10 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            for layer in 0..2 {
                a.write(layer, pos, &k, &v);
            }
        }
        a.advance(5).unwrap();
        let mut b = KvCache::new(layout());
        b.advance(7).unwrap();
        b.copy_prefix_from(&a, 3).unwrap();
        assert_eq!(b.len(), 3);
        for layer in 0..2 {
            for h in 0..2 {
                let off = h * 8 * 4;
                assert_eq!(b.keys(layer)[off..off + 12], a.keys(layer)[off..off + 12]);
                assert_eq!(
                    b.values(layer)[off..off + 12],
                    a.values(layer)[off..off + 12]
                );
                assert!(b.keys(layer)[off + 12..off + 32]
                    .iter()
                    .all(|x| x.to_f32() == 0.0));
            }
        }
        // Asking for more than the source holds copies what it has.
        b.copy_prefix_from(&a, 100).unwrap();
        assert_eq!(b.len(), 5);
    }

    #[test]
    fn head_major_layout() {
        let mut c = KvCache::new(layout());
        let k: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..8).map(|i| -(i as f32)).collect();
        c.write(1, 3, &k, &v);
        let keys = c.keys(1);
        // head 0, pos 3 at 3*4; head 1, pos 3 at (8+3)*4
        assert_eq!(
            keys[12..16].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            vec![0.0, 1.0, 2.0, 3.0]
        );
        assert_eq!(
            keys[44..48].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            vec![4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(c.values(1)[44].to_f32(), -4.0);
        assert!(c.keys(0).iter().all(|x| x.to_f32() == 0.0));
        assert_eq!(c.bytes(), 2 * 2 * 8 * 8 * 2);
    }
}
