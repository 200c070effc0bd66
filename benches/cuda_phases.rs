//! What one dependent phase of a decode step costs on the GPU apart from its work
//! (`src/backend/cuda/kernels/probe.cu`): a kernel boundary in a replayed graph, with and
//! without programmatic dependent launch, against a grid-wide barrier inside one kernel. A
//! small model's decode is about 150 such phases a token (docs/gpu.md: 6-7 µs each on an
//! H100/H200), so this says what a persistent kernel could save before one is written.
//!
//! `cargo bench --bench cuda_phases` on a machine with a GPU (`scripts/gpu-check.sh` runs it
//! with `KILN_PHASES=1`); elsewhere it says why it skips.

use std::time::Instant;

use kiln::backend::cuda::gpu::{Arena, Arg, Gpu, Layout, Stream};

/// Phases per measurement.
const PHASES: usize = 1000;
/// Blocks of a phase: one per SM of an H100/H200 (132), co-resident on any GPU of 17 SMs or
/// more (eight blocks of 256 threads fit an SM), as the persistent kernel needs.
const BLOCKS: u32 = 132;
const THREADS: u32 = 256;

/// Microseconds per phase of a graph of `PHASES` launches (`launch(i)` issues the i-th), best
/// of five replays after a first one.
fn per_phase_in_graph(gpu: &Gpu, s: &Stream, launch: &dyn Fn(usize)) -> f64 {
    gpu.begin_capture(s).expect("capture");
    for i in 0..PHASES {
        launch(i);
    }
    let g = gpu.end_capture(s).expect("capture");
    gpu.replay(&g).expect("replay");
    gpu.synchronize(s).expect("sync");
    (0..5)
        .map(|_| {
            let t = Instant::now();
            gpu.replay(&g).expect("replay");
            gpu.synchronize(s).expect("sync");
            t.elapsed().as_secs_f64() * 1e6 / PHASES as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let gpu = match Gpu::open() {
        Ok(g) if !g.is_emulated() => g,
        Ok(_) => return println!("cuda_phases: skipped (the software GPU times nothing)"),
        Err(e) => return println!("cuda_phases: skipped ({e})"),
    };
    let n = (BLOCKS * THREADS) as usize;
    let mut l = Layout::default();
    let (a, b, count) = (l.take(n * 4), l.take(n * 4), l.take(4));
    let mut arena = Arena::new(&gpu, l.bytes).expect("device memory");
    let s = gpu.stream().expect("stream");
    let s_in_order = gpu.stream_in_order().expect("stream");
    let ones = vec![1.0f32; n];
    arena
        .write(&s, a, zerocopy::IntoBytes::as_bytes(&ones[..]))
        .expect("copy");
    let (pa, pb, pc) = (arena.ptr(a), arena.ptr(b), arena.ptr(count));
    let step_args = |i: usize| {
        let (x, y) = if i.is_multiple_of(2) {
            (pa, pb)
        } else {
            (pb, pa)
        };
        [Arg::P(x), Arg::P(y), Arg::I(n as i32)]
    };
    let mut rows: Vec<(String, f64)> = Vec::new();
    for (s, how) in [(&s, "programmatic"), (&s_in_order, "not programmatic")] {
        let go = |name: &str, grid: u32, block: u32, args: &[Arg]| {
            gpu.launch(s, name, grid, block, args).expect("launch");
        };
        let empty = per_phase_in_graph(&gpu, s, &|_| go("probe_empty", 1, 32, &[]));
        rows.push((format!("empty kernel, graph, {how}"), empty));
        let step = per_phase_in_graph(&gpu, s, &|i| {
            go("probe_step", BLOCKS, THREADS, &step_args(i))
        });
        rows.push((
            format!("{BLOCKS} blocks reading all {n} floats of the phase before, graph, {how}"),
            step,
        ));
    }
    let zero = [0u8; 4];
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        arena.write(&s, count, &zero).expect("copy");
        gpu.synchronize(&s).expect("sync");
        let args = [
            Arg::P(pa),
            Arg::P(pb),
            Arg::I(n as i32),
            Arg::I(PHASES as i32),
            Arg::P(pc),
        ];
        let t = Instant::now();
        gpu.launch(&s_in_order, "probe_persistent", BLOCKS, THREADS, &args)
            .expect("launch");
        // (Its own stream: waiting on the other would time the launch alone.)
        gpu.synchronize(&s_in_order).expect("sync");
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / PHASES as f64);
    }
    rows.push((
        "the same phases in one kernel, a grid-wide barrier between them".into(),
        best,
    ));
    println!("cuda_phases on {} ({PHASES} phases, best of 5):", gpu.name);
    println!("| phase | µs each |\n| --- | ---: |");
    for (what, us) in rows {
        println!("| {what} | {us:.2} |");
    }
}
