//! Attention throughput over the f16 KV cache: one decode row (the split tiled path past 512
//! positions, the vector path below) and a prefill batch, for SmolLM2's, Gemma-3's and
//! Llama-3.2-1B's head layouts, single-threaded, as nanoseconds per (query head × key).
//!
//! `cargo bench --bench attention`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use kiln::kernels::attention::{attention, AttnScratch, AttnShape};
use kiln::kernels::f16ops::F16Ops;
use kiln::kernels::ThreadPool;

/// xorshift64*, values in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn bench(c: &mut Criterion) {
    let ops = F16Ops::detect();
    let pool = ThreadPool::new(1);
    let mut g = c.benchmark_group("attention");
    g.sample_size(20);
    // (name, heads, kv heads, head dim)
    for (name, h, hkv, hd) in [
        ("smollm2", 9, 3, 64),
        ("gemma3", 4, 1, 256),
        ("llama1b", 32, 8, 64),
    ] {
        for (n_tokens, depth) in [(1, 256), (1, 1024), (1, 4096), (64, 1024)] {
            let stride = depth + n_tokens;
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let kv: Vec<f16> = (0..hkv * stride * hd)
                .map(|_| f16::from_f32(rng.next()))
                .collect();
            let q: Vec<f32> = (0..n_tokens * h * hd).map(|_| rng.next()).collect();
            let shape = AttnShape {
                n_heads: h,
                n_kv_heads: hkv,
                head_dim_k: hd,
                head_dim_v: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                softcap: None,
                window: None,
                causal: true,
                kv_stride: stride,
                ring: None,
                sinks: None,
                alibi: None,
            };
            let mut scratch = AttnScratch::new(h, hkv, hd, hd, 1);
            let mut out = vec![0.0f32; n_tokens * h * hd];
            let pairs = (n_tokens * h * (depth + n_tokens)) as u64;
            g.throughput(Throughput::Elements(pairs));
            let id = BenchmarkId::new(name, format!("{n_tokens}x{depth}"));
            g.bench_function(id, |b| {
                b.iter(|| {
                    attention(
                        &pool,
                        &ops,
                        &shape,
                        black_box(&q),
                        n_tokens,
                        depth,
                        &kv,
                        &kv,
                        &mut out,
                        &mut scratch,
                    );
                    black_box(&out);
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
