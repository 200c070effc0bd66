//! Attention over a sliding-window ring gives the same bits as over a full cache, on every path
//! of the kernel (vector, tiled, split long decode; f16 and q8_0; 1 and 2 threads), with the
//! ring wrapped many times over and its stale rows holding other positions' data; plain and
//! with Gemma-2's soft-capped scores.

use kiln::cache::{KvCache, KvLayout, KvType};
use kiln::kernels::attention::{attention_kv, AttnScratch, AttnShape};
use kiln::kernels::f16ops::F16Ops;
use kiln::kernels::pool::ThreadPool;

const H: usize = 4;
const HKV: usize = 2;
const HD: usize = 64;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// Output bits of the attention of `n` queries at `pos0..pos0+n` over `c`'s layer 0.
#[allow(clippy::too_many_arguments)]
fn attend(
    c: &KvCache,
    pool: &ThreadPool,
    ops: &F16Ops,
    window: usize,
    softcap: Option<f32>,
    q: &[f32],
    n: usize,
    pos0: usize,
    ty: KvType,
) -> Vec<u32> {
    let shape = AttnShape {
        n_heads: H,
        n_kv_heads: HKV,
        head_dim_k: HD,
        head_dim_v: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        softcap,
        window: Some(window),
        causal: true,
        kv_stride: c.capacity(),
        ring: c.ring_rows(0),
        sinks: None,
        alibi: None,
    };
    let mut scratch = AttnScratch::with_kv(H, HKV, HD, HD, pool.n_threads(), ty);
    let mut out = vec![0.0f32; n * H * HD];
    attention_kv(
        pool,
        ops,
        &shape,
        q,
        n,
        pos0,
        c.layer(0),
        &mut out,
        &mut scratch,
    );
    out.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn ring_attention_is_bit_identical_to_full_cache() {
    let ops = F16Ops::detect();
    let mut cases = 0;
    // (context, window, tokens of the pass, position of the pass)
    for &(ctx, window, n, pos0) in &[
        (256, 7, 1, 200),   // short decode: vector path
        (256, 100, 5, 190), // short prompt: vector path, wraps
        (256, 100, 63, 150),
        (2048, 512, 1, 1500), // long decode: tiled, split in chunks
        (2048, 512, 1, 700),
        (2048, 100, 1, 1999),
        (2048, 512, 64, 1300), // prompt tiles
        (2048, 512, 100, 1700),
        (2048, 37, 70, 900),
        (2048, 512, 3, 1000), // vector prompt rows beside a wrapped ring
    ] {
        for ty in [KvType::F16, KvType::Q8_0] {
            let full = KvLayout::full(1, HKV, HD, HD, ctx);
            let ringed = full.clone().with_window(window, &[true], n);
            let rows = ringed
                .ring_rows(0)
                .expect("a ring smaller than the context");
            assert!(rows.is_multiple_of(64) && rows + 1 >= window + n);
            let mut a = KvCache::with_type(full, ty).unwrap();
            let mut b = KvCache::with_type(ringed, ty).unwrap();
            let mut rng = Rng(ctx as u64 * 31 + window as u64 * 7 + n as u64);
            // Positions 0..pos0 in passes of at most n (the ring turns over many times), then
            // the pass itself at pos0..pos0+n.
            let mut write = |a: &mut KvCache, b: &mut KvCache, pos: usize| {
                let k = rng.vec(HKV * HD, 3.0);
                let v = rng.vec(HKV * HD, 1.0);
                a.write(0, pos, &k, &v);
                b.write(0, pos, &k, &v);
            };
            let mut p = 0;
            while p < pos0 {
                let m = n.min(pos0 - p);
                for pos in p..p + m {
                    write(&mut a, &mut b, pos);
                }
                a.advance(m).unwrap();
                b.advance(m).unwrap();
                p += m;
            }
            for pos in pos0..pos0 + n {
                write(&mut a, &mut b, pos);
            }
            assert_eq!(b.len(), pos0);
            b.check_window(n).unwrap();
            let q = rng.vec(n * H * HD, 2.0);
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                for cap in [None, Some(1.5)] {
                    let want = attend(&a, &pool, &ops, window, cap, &q, n, pos0, ty);
                    let got = attend(&b, &pool, &ops, window, cap, &q, n, pos0, ty);
                    assert!(
                        want == got,
                        "ctx {ctx} window {window} n {n} pos0 {pos0} {ty} threads {threads} cap {cap:?}"
                    );
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 80);
}
