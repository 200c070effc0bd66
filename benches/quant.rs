//! Kernel throughput: matrix-vector (decode) as GB/s of weights streamed, gemm (prefill) as
//! multiply-accumulates per second, and activation quantization; scalar vs each SIMD tier.
//!
//! `cargo bench --bench quant` (add a filter such as `vec_dot/Q4_K` to run a subset).

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln::quant::{kernels_for, repacked, GemmArgs, GgmlType, Isa, Kernels};
use std::time::Duration;

/// This thread's CPU time (not wall time): the machine is shared, and a kernel's speed is what it
/// does while it runs. Cache and memory contention from other processes still show.
struct CpuTime;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

static WALL: WallTime = WallTime;

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Offsets of the fp16 scale fields in one block (random bytes elsewhere are valid quants).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4NL | GgmlType::IQ4XS | GgmlType::IQ2XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

fn weights(ty: GgmlType, n: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = ty.row_bytes(n).unwrap() * rows;
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    match ty {
        GgmlType::F32 => w
            .chunks_mut(4)
            .for_each(|c| c.copy_from_slice(&rng.uniform().to_le_bytes())),
        GgmlType::F16 => w
            .chunks_mut(2)
            .for_each(|c| c.copy_from_slice(&half::f16::from_f32(rng.uniform()).to_le_bytes())),
        GgmlType::BF16 => w
            .chunks_mut(2)
            .for_each(|c| c.copy_from_slice(&half::bf16::from_f32(rng.uniform()).to_le_bytes())),
        _ => {
            for blk in w.chunks_mut(ty.type_size()) {
                for &o in scale_offsets(ty) {
                    let s = half::f16::from_f32(0.01 * (1.0 + rng.uniform()));
                    blk[o..o + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
        }
    }
    w
}

const TYPES: [GgmlType; 16] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q5K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::IQ2XS,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

fn tiers() -> Vec<Isa> {
    Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Neon)
        .collect()
}

/// `KILN_BENCH_ROWS` overrides the matrix-vector row count (e.g. 16 for an L1-resident matrix).
fn env_rows(default: usize) -> usize {
    std::env::var("KILN_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Matrix-vector: 1024 rows x 2048 (about 1-4 MB of weights: L2 and beyond).
fn vec_dot(c: &mut Criterion<CpuTime>) {
    let (n, rows) = (2048, env_rows(1024));
    let mut rng = Rng(1);
    let mut g = c.benchmark_group("vec_dot");
    for ty in TYPES {
        let w = weights(ty, n, rows, &mut rng);
        let row = ty.row_bytes(n).unwrap();
        g.throughput(Throughput::Bytes(w.len() as u64));
        for isa in tiers() {
            let k = kernels_for(ty, isa).unwrap();
            let xf: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
            let mut x = vec![0u8; k.act.row_bytes(n).unwrap()];
            (k.quantize_act)(&xf, &mut x);
            let mut out = vec![0f32; rows];
            g.bench_function(BenchmarkId::new(ty.name(), isa.name()), |b| {
                b.iter(|| {
                    for (i, o) in out.iter_mut().enumerate() {
                        *o = (k.vec_dot)(n, &w[i * row..], &x);
                    }
                    black_box(&out);
                })
            });
        }
    }
    g.finish();
}

/// Matrix-vector through `gemm` with one activation row (the decode call): as `vec_dot`, plus
/// the activation-side work the gemm shares across weight rows.
fn matvec(c: &mut Criterion<CpuTime>) {
    let (n, rows) = (2048, env_rows(1024));
    let mut rng = Rng(4);
    let mut g = c.benchmark_group("matvec");
    for ty in TYPES {
        let w = weights(ty, n, rows, &mut rng);
        let row = ty.row_bytes(n).unwrap();
        g.throughput(Throughput::Bytes(w.len() as u64));
        for isa in tiers().into_iter().filter(|&i| i != Isa::Scalar) {
            let k = kernels_for(ty, isa).unwrap();
            let xf: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
            let mut x = vec![0u8; k.act.row_bytes(n).unwrap()];
            (k.quantize_act)(&xf, &mut x);
            let mut out = vec![0f32; rows];
            g.bench_function(BenchmarkId::new(ty.name(), isa.name()), |b| {
                b.iter(|| {
                    (k.gemm)(GemmArgs::new(
                        n,
                        (&w, row, rows),
                        (&x, x.len(), 1),
                        (&mut out, rows),
                    ));
                    black_box(&out);
                })
            });
            if let Some((wp, kp)) = repacked(&k, &w, rows, n) {
                let id = BenchmarkId::new(format!("{} x{}", ty.name(), kp.group), isa.name());
                g.bench_function(id, |b| {
                    b.iter(|| {
                        by_groups(&kp, n, &wp, row, rows, &x, x.len(), 1, &mut out);
                        black_box(&out);
                    })
                });
            }
        }
    }
    g.finish();
}

/// A gemm over a repacked matrix, one call per group of rows (as the model's tiles run it).
#[allow(clippy::too_many_arguments)]
fn by_groups(
    k: &Kernels,
    n: usize,
    w: &[u8],
    row: usize,
    rows: usize,
    x: &[u8],
    xr: usize,
    nx: usize,
    out: &mut [f32],
) {
    for i in (0..rows).step_by(k.group) {
        let nw = (rows - i).min(k.group);
        (k.gemm)(GemmArgs::new(
            n,
            (&w[i * row..], row, nw),
            (x, xr, nx),
            (&mut out[i..], rows),
        ));
    }
}

/// Prefill tile: 256 weight rows x 2048 against 32 activation rows (`KILN_BENCH_GEMM=n,rows,nx`
/// sets another shape, e.g. `640,256,64` for Gemma-3's 640-wide products).
fn gemm(c: &mut Criterion<CpuTime>) {
    let shape: Vec<usize> = std::env::var("KILN_BENCH_GEMM")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    let (n, rows, nx) = match shape[..] {
        [n, rows, nx] if n % 32 == 0 && rows > 0 && nx > 0 => (n, rows, nx),
        _ => (2048, 256, 32),
    };
    let mut rng = Rng(2);
    let mut g = c.benchmark_group("gemm");
    for ty in TYPES {
        let Some(row) = ty.row_bytes(n) else {
            continue; // `n` is not whole blocks of this format
        };
        let w = weights(ty, n, rows, &mut rng);
        g.throughput(Throughput::Elements((n * rows * nx) as u64));
        for isa in tiers() {
            let k = kernels_for(ty, isa).unwrap();
            let xr = k.act.row_bytes(n).unwrap();
            let mut x = vec![0u8; xr * nx];
            for j in 0..nx {
                let xf: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                (k.quantize_act)(&xf, &mut x[j * xr..(j + 1) * xr]);
            }
            let mut out = vec![0f32; rows * nx];
            g.bench_function(BenchmarkId::new(ty.name(), isa.name()), |b| {
                b.iter(|| {
                    (k.gemm)(GemmArgs::new(
                        n,
                        (&w, row, rows),
                        (&x, xr, nx),
                        (&mut out, rows),
                    ));
                    black_box(&out);
                })
            });
            if let Some((wp, kp)) = repacked(&k, &w, rows, n) {
                let id = BenchmarkId::new(format!("{} x{}", ty.name(), kp.group), isa.name());
                g.bench_function(id, |b| {
                    b.iter(|| {
                        by_groups(&kp, n, &wp, row, rows, &x, xr, nx, &mut out);
                        black_box(&out);
                    })
                });
            }
        }
    }
    g.finish();
}

/// Activation quantization of 16 rows of 2048.
fn quantize(c: &mut Criterion<CpuTime>) {
    let n = 2048 * 16;
    let mut rng = Rng(3);
    let xf: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
    let mut g = c.benchmark_group("quantize_act");
    g.throughput(Throughput::Elements(n as u64));
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        for isa in tiers() {
            let k = kernels_for(ty, isa).unwrap();
            let mut out = vec![0u8; k.act.row_bytes(n).unwrap()];
            g.bench_function(BenchmarkId::new(k.act.name(), isa.name()), |b| {
                b.iter(|| {
                    (k.quantize_act)(&xf, &mut out);
                    black_box(&out);
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(CpuTime)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800));
    targets = vec_dot, matvec, gemm, quantize
}
criterion_main!(benches);
