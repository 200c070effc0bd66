use super::super::f16ops::{expf_approx, F16Ops, ScoreScale};
use super::*;

/// The deterministic inputs of the reference-engine fixtures (a 64-bit LCG), generated
/// in the same order by the C harness that produced the expected hashes.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// One attention problem: inputs in kiln's layouts.
struct Case {
    shape: AttnShape<'static>,
    /// Attention sinks (one logit per query head), if any.
    sinks: Option<Vec<f32>>,
    /// ALiBi's slopes (one per query head), if any.
    alibi: Option<Vec<f32>>,
    n_tokens: usize,
    pos0: usize,
    q: Vec<f32>,
    keys: Vec<f16>,
    values: Vec<f16>,
}

/// Keys `3·u`, values `u`, queries `2·u` (u uniform in [-1, 1)), positions past the
/// filled ones zero; `kv_stride` is the filled length rounded up to 256.
fn make_case(
    dk: usize,
    h: usize,
    hkv: usize,
    n_tokens: usize,
    pos0: usize,
    window: usize,
    seed: u64,
) -> Case {
    let len = pos0 + n_tokens;
    let kv_stride = len.next_multiple_of(256);
    let mut rng = Lcg(seed);
    let mut fill = |mul: f32| {
        let mut v = vec![f16::ZERO; hkv * kv_stride * dk];
        for hh in 0..hkv {
            for p in 0..kv_stride {
                for d in 0..dk {
                    let x = rng.next() * mul;
                    if p < len {
                        v[(hh * kv_stride + p) * dk + d] = f16::from_f32(x);
                    }
                }
            }
        }
        v
    };
    let keys = fill(3.0);
    let values = fill(1.0);
    let q = (0..n_tokens * h * dk).map(|_| rng.next() * 2.0).collect();
    let shape = AttnShape {
        n_heads: h,
        n_kv_heads: hkv,
        head_dim_k: dk,
        head_dim_v: dk,
        scale: 1.0 / (dk as f32).sqrt(),
        softcap: None,
        window: (window > 0).then_some(window),
        causal: true,
        kv_stride,
        ring: None,
        sinks: None,
        alibi: None,
    };
    Case {
        shape,
        sinks: None,
        alibi: None,
        n_tokens,
        pos0,
        q,
        keys,
        values,
    }
}

fn run(c: &Case, ops: &F16Ops, threads: usize) -> Vec<f32> {
    let s = &AttnShape {
        sinks: c.sinks.as_deref(),
        alibi: c.alibi.as_deref(),
        ..c.shape
    };
    let pool = ThreadPool::new(threads);
    let mut scratch =
        AttnScratch::new(s.n_heads, s.n_kv_heads, s.head_dim_k, s.head_dim_v, threads);
    let mut out = vec![f32::NAN; c.n_tokens * s.n_heads * s.head_dim_v];
    attention(
        &pool,
        ops,
        s,
        &c.q,
        c.n_tokens,
        c.pos0,
        &c.keys,
        &c.values,
        &mut out,
        &mut scratch,
    );
    out
}

fn fnv1a(out: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in out.iter().flat_map(|x| x.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The scalar path and, where this CPU has one, its SIMD tier's.
fn paths() -> Vec<F16Ops> {
    let mut paths = vec![F16Ops::scalar()];
    if F16Ops::detect().name != "scalar" {
        paths.push(F16Ops::detect());
    }
    paths
}

/// Whether `got` has `want`'s bits, element by element.
fn same_bits(got: &[f32], want: &[f32]) -> bool {
    got.iter()
        .zip(want)
        .all(|(a, b)| a.to_bits() == b.to_bits())
}

/// Every path on 1, 2 and 3 threads gives `want`'s bits.
fn assert_every_path_gives(c: &Case, paths: &[F16Ops], want: &[f32], what: &str) {
    for threads in [1, 2, 3] {
        for ops in paths {
            let got = run(c, ops, threads);
            assert!(same_bits(&got, want), "{} {what} thr {threads}", ops.name);
        }
    }
}

/// `got` is within `tol` of exact attention, element by element.
fn assert_near_exact(got: &[f32], exact: &[f64], tol: f64, what: &str) {
    for (i, (a, b)) in got.iter().zip(exact).enumerate() {
        assert!((*a as f64 - b).abs() < tol, "{what} i {i}: {a} vs {b}");
    }
}

/// Bit-exact agreement with the reference engine. Each hash is FNV-1a over the output
/// bits of ggml's `ggml_flash_attn_ext` (CPU backend, AVX-512 build, F32 precision, f16
/// K/V, causal mask with the window) on the inputs of `make_case(.., seed 5)`, computed
/// with `n_threads` threads. (A decode row over 512 or more padded positions is ours, not
/// the reference's: the tiled arithmetic in chunks that do not depend on the thread count;
/// `matches_plain_algorithm_and_exact_attention` pins it.)
#[test]
fn bit_exact_with_reference_engine() {
    // (head_dim, heads, kv heads, tokens, pos0, window, threads, hash)
    type Fixture = (usize, usize, usize, usize, usize, usize, usize, u64);
    let cases: &[Fixture] = &[
        (64, 4, 2, 5, 100, 0, 2, 0x2a003c4d4ce80d7a), // short prompt: vector path
        (64, 4, 2, 1, 100, 0, 2, 0x4486885bb45acdd9), // decode, unsplit
        (64, 4, 2, 70, 10, 0, 2, 0x25d161fbb50990a4), // tiled path
        (64, 9, 3, 64, 0, 0, 2, 0x68f99a2b2bf7b496),  // tiled, SmolLM2's head layout
        (64, 4, 2, 130, 300, 0, 2, 0x9c91cd903be54452), // tiled after a cached prefix
        (64, 4, 2, 130, 300, 50, 2, 0x2fa60a82b6313608), // tiled, sliding window
        (64, 4, 2, 7, 300, 50, 2, 0x6a8a80836cf2fb1d), // vector, sliding window
        (32, 4, 2, 5, 100, 0, 2, 0x211a0e6dc0993ef0), // head_dim < 64: dot leftovers only
        (32, 4, 2, 70, 100, 0, 2, 0xa1820569019f510c),
        (80, 2, 1, 3, 100, 0, 2, 0x6af9c560835a0e49), // head_dim 64 + 16
        (80, 2, 1, 66, 100, 0, 2, 0x33a42dc197da3f54),
        (256, 4, 1, 3, 100, 0, 2, 0x8a51d8beb2aa65fc), // Gemma-3's head layout
        (256, 4, 1, 80, 100, 0, 2, 0x3ae094c031f9ec9c),
    ];
    let paths = paths();
    for &(dk, h, hkv, n, pos0, win, threads, want) in cases {
        let c = make_case(dk, h, hkv, n, pos0, win, 5);
        for ops in &paths {
            let got = fnv1a(&run(&c, ops, threads));
            assert_eq!(
                got, want,
                "{} dk {dk} heads {h}/{hkv} n {n} pos0 {pos0} window {win} threads {threads}: {got:#x}",
                ops.name
            );
        }
    }
}

/// The positions row `t` of the pass sees, `first..=last`: up to its own (causal) or the
/// pass's last (bidirectional), from the window's start.
fn visible(c: &Case, t: usize) -> (usize, usize) {
    let last = if c.shape.causal {
        c.pos0 + t
    } else {
        c.pos0 + c.n_tokens - 1
    };
    (
        c.shape.window.map_or(0, |w| (last + 1).saturating_sub(w)),
        last,
    )
}

/// The reference engine's algorithm written plainly, one query row at a time (no work
/// items, no GQA sharing, no threads), on the scalar primitives.
fn reference_rows(c: &Case) -> Vec<f32> {
    let s = &c.shape;
    let ops = F16Ops::scalar();
    let (hdk, hdv, group) = (s.head_dim_k, s.head_dim_v, s.n_heads / s.n_kv_heads);
    // The reference's `scale /= softcap`, then `softcap·tanhf(s·scale)`.
    let score = ScoreScale::new(s.scale, s.softcap);
    let mut out = vec![0.0f32; c.n_tokens * s.n_heads * hdv];
    let len = c.pos0 + c.n_tokens;
    let n_kv = len
        .next_multiple_of(256)
        .min(s.kv_stride.next_multiple_of(256));
    for t in 0..c.n_tokens {
        let (first, p) = visible(c, t);
        let seen = |pos: usize| pos >= first && pos <= p;
        for h in 0..s.n_heads {
            let kvh = h / group;
            let key = |pos: usize| &c.keys[(kvh * s.kv_stride + pos) * hdk..][..hdk];
            let val = |pos: usize| &c.values[(kvh * s.kv_stride + pos) * hdv..][..hdv];
            let qh = &c.q[(t * s.n_heads + h) * hdk..][..hdk];
            let o = &mut out[(t * s.n_heads + h) * hdv..][..hdv];
            let long_decode = c.n_tokens == 1 && n_kv >= LONG_KV;
            // The tiled arithmetic over key tiles `tiles`: (max, sum, accumulator).
            let tile_run = |tiles: std::ops::Range<usize>| {
                let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                let mut acc = vec![0.0f32; hdv];
                for c0 in tiles.map(|t| t * KV_TILE) {
                    let mut sc = [f32::NEG_INFINITY; KV_TILE];
                    for (j, x) in sc.iter_mut().enumerate() {
                        if seen(c0 + j) {
                            let k = key(c0 + j);
                            // Prompt rows: one chain over d per key (keys transposed);
                            // a long decode row: the lane-split dot, keys read in place.
                            *x = score.apply(if long_decode {
                                (ops.dot)(qh, k)
                            } else {
                                qh.iter()
                                    .zip(k)
                                    .fold(0.0f32, |a, (&q, &k)| k.to_f32().mul_add(q, a))
                            });
                        }
                    }
                    let tmax = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if tmax == f32::NEG_INFINITY {
                        continue;
                    }
                    let m_new = m.max(tmax);
                    if m_new > m {
                        let r = (m - m_new).exp();
                        acc.iter_mut().for_each(|a| *a *= r);
                        sum *= r;
                    }
                    m = m_new;
                    let mut tile_sum = 0.0f64;
                    for blk in sc.chunks_exact_mut(16) {
                        let e: Vec<f32> = blk.iter().map(|&x| expf_approx(x - m)).collect();
                        blk.copy_from_slice(&e);
                        // the reference's 16-lane tree
                        let t8: Vec<f32> = (0..8).map(|i| e[i + 8] + e[i]).collect();
                        let u: Vec<f32> = (0..4).map(|i| t8[i + 4] + t8[i]).collect();
                        tile_sum += ((u[0] + u[2]) + (u[1] + u[3])) as f64;
                    }
                    sum = (sum as f64 + tile_sum) as f32;
                    for (j, &pj) in sc.iter().enumerate() {
                        if seen(c0 + j) {
                            for (a, &v) in acc.iter_mut().zip(val(c0 + j)) {
                                *a = v.to_f32().mul_add(pj, *a);
                            }
                        }
                    }
                }
                (m, sum, acc)
            };
            if c.n_tokens >= TILE_Q || long_decode {
                // A long decode row: chunks of max(⌈tiles / 16⌉, min(32, ⌈tiles / 2⌉))
                // tiles from the first visible one, merged in order in f32 (unfused).
                let (t_first, t_end) = (first / KV_TILE, (p + 1).div_ceil(KV_TILE));
                let per = if long_decode {
                    chunk_tiles(t_end - t_first)
                } else {
                    t_end
                };
                let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                let mut acc = vec![0.0f32; hdv];
                let mut t0 = t_first;
                while t0 < t_end {
                    let (pm, ps, pa) = tile_run(t0..(t0 + per).min(t_end));
                    t0 += per;
                    if ps == 0.0 {
                        continue;
                    }
                    if !long_decode {
                        (m, sum, acc) = (pm, ps, pa);
                        continue;
                    }
                    let m_new = m.max(pm);
                    let (so, sn) = ((m - m_new).exp(), (pm - m_new).exp());
                    for (a, &b) in acc.iter_mut().zip(&pa) {
                        *a = *a * so + b * sn;
                    }
                    sum = sum * so + ps * sn;
                    m = m_new;
                }
                if let Some(sinks) = &c.sinks {
                    join_sink(sinks[h], m, &mut sum, &mut acc);
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                for (o, a) in o.iter_mut().zip(&acc) {
                    *o = a * inv;
                }
            } else {
                let q16: Vec<f32> = qh.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
                let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                let mut acc = vec![0.0f32; hdv];
                for pos in (0..n_kv).filter(|&pos| seen(pos)) {
                    let sc = score.apply((ops.dot)(&q16, key(pos)));
                    let (mut ms, mut vs) = (1.0f32, 1.0f32);
                    if sc > m {
                        ms = (m - sc).exp();
                        m = sc;
                        (ops.scale)(&mut acc, ms);
                    } else {
                        vs = (sc - m).exp();
                    }
                    (ops.mad)(&mut acc, val(pos), vs);
                    sum = sum.mul_add(ms, vs);
                }
                if let Some(sinks) = &c.sinks {
                    join_sink(sinks[h], m, &mut sum, &mut acc);
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                for (o, a) in o.iter_mut().zip(&acc) {
                    *o = a * inv;
                }
            }
        }
    }
    out
}

/// Exact attention in f64 (full softmax over the visible positions).
fn exact(c: &Case) -> Vec<f64> {
    let s = &c.shape;
    let group = s.n_heads / s.n_kv_heads;
    let mut out = vec![0.0f64; c.n_tokens * s.n_heads * s.head_dim_v];
    for t in 0..c.n_tokens {
        let (first, p) = visible(c, t);
        for h in 0..s.n_heads {
            let kvh = h / group;
            let qh = &c.q[(t * s.n_heads + h) * s.head_dim_k..][..s.head_dim_k];
            // ALiBi: `−slope·|i − j|` for query position i, key position j.
            let slope = c.alibi.as_ref().map_or(0.0, |k| k[h] as f64);
            let qpos = c.pos0 + t;
            let sc: Vec<f64> = (first..=p)
                .map(|pos| {
                    let k = &c.keys[(kvh * s.kv_stride + pos) * s.head_dim_k..][..s.head_dim_k];
                    let x = qh
                        .iter()
                        .zip(k)
                        .map(|(&a, &b)| a as f64 * b.to_f64())
                        .sum::<f64>()
                        * s.scale as f64;
                    s.softcap
                        .map_or(x, |cap| cap as f64 * (x / cap as f64).tanh())
                        - slope * qpos.abs_diff(pos) as f64
                })
                .collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            // A sink joins the denominator only.
            let sink = c.sinks.as_ref().map_or(0.0, |k| (k[h] as f64 - m).exp());
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum::<f64>() + sink;
            let o = &mut out[(t * s.n_heads + h) * s.head_dim_v..][..s.head_dim_v];
            for (i, pos) in (first..=p).enumerate() {
                let w = (sc[i] - m).exp() / z;
                let v = &c.values[(kvh * s.kv_stride + pos) * s.head_dim_v..][..s.head_dim_v];
                for (a, &b) in o.iter_mut().zip(v) {
                    *a += w * b.to_f64();
                }
            }
        }
    }
    out
}

/// Every path, thread count and work split gives the plain per-row algorithm's bits;
/// and that algorithm is close to exact attention (f16 accumulation: ~1e-3; f32: ~1e-6).
#[test]
fn matches_plain_algorithm_and_exact_attention() {
    let paths = paths();
    let mut seed = 11;
    for (dk, h, hkv) in [(16, 4, 2), (64, 9, 3), (48, 2, 2), (256, 4, 1)] {
        for window in [0, 5, 200] {
            for (n, pos0) in [
                (1, 0),
                (1, 1),
                (1, 280),
                (1, 530),
                (1, 1500),
                (1, 4200),
                (7, 0),
                (16, 100),
                (64, 3),
                (100, 450),
            ] {
                seed += 1;
                let c = make_case(dk, h, hkv, n, pos0, window, seed);
                let want = reference_rows(&c);
                let what = format!("dk {dk} h {h}/{hkv} win {window} n {n} pos0 {pos0}");
                assert_every_path_gives(&c, &paths, &want, &what);
                let tol = if n >= TILE_Q { 1e-5 } else { 4e-3 };
                assert_near_exact(&want, &exact(&c), tol, &what);
            }
        }
    }
}

/// Attention sinks (gpt-oss): on every path (vector, tiled, a long decode split in chunks),
/// thread count and SIMD tier, the plain per-row algorithm's bits with the sink joined after
/// the last key, and close to exact attention whose denominator holds `exp(sink)`; sinks
/// above every score (the rescaling branch), below them, and far below (no effect).
#[test]
fn sinks_match_plain_algorithm_and_exact_attention() {
    let paths = paths();
    let mut seed = 301;
    for (dk, h, hkv) in [(64, 8, 2), (32, 4, 4)] {
        for window in [0, 5, 130] {
            for (n, pos0) in [(1, 0), (1, 40), (1, 1500), (3, 9), (64, 3), (100, 450)] {
                seed += 1;
                let mut c = make_case(dk, h, hkv, n, pos0, window, seed);
                let mut rng = Lcg(seed);
                let sinks: Vec<f32> = (0..h)
                    .map(|i| match i % 4 {
                        0 => 30.0,
                        1 => -30.0,
                        _ => rng.next() * 2.0,
                    })
                    .collect();
                c.sinks = Some(sinks);
                let want = reference_rows(&c);
                let what = format!("dk {dk} h {h}/{hkv} win {window} n {n} pos0 {pos0}");
                assert_every_path_gives(&c, &paths, &want, &what);
                let tol = if n >= TILE_Q { 1e-5 } else { 4e-3 };
                assert_near_exact(&want, &exact(&c), tol, &what);
                // A sink far above every score leaves almost nothing; far below, nothing.
                for t in 0..n {
                    let row = |hh: usize| &want[(t * h + hh) * dk..][..dk];
                    assert!(
                        row(0).iter().all(|v| v.abs() < 1e-6),
                        "sink 30: {:?}",
                        row(0)
                    );
                }
            }
        }
    }
}

/// The sink's two branches against the reference's own statements.
#[test]
fn join_sink_follows_the_reference_steps() {
    // Below the maximum: the sum takes expf(sink − m), the values stay.
    let (mut sum, mut acc) = (2.5f32, [1.0f32, -2.0]);
    join_sink(0.5, 1.0, &mut sum, &mut acc);
    assert_eq!(sum, 2.5 + (-0.5f32).exp());
    assert_eq!(acc, [1.0, -2.0]);
    // Above: values and sum rescaled by expf(m − sink), then one more unit for the sink.
    let (mut sum, mut acc) = (2.5f32, [1.0f32, -2.0]);
    join_sink(3.0, 1.0, &mut sum, &mut acc);
    let ms = (-2.0f32).exp();
    assert_eq!(sum, 2.5f32.mul_add(ms, 1.0));
    assert_eq!(acc, [ms, -2.0 * ms]);
    // No key at all (m = −inf): the sink alone, weight 1, output zero.
    let (mut sum, mut acc) = (0.0f32, [0.0f32; 2]);
    join_sink(-3.0, f32::NEG_INFINITY, &mut sum, &mut acc);
    assert_eq!((sum, acc), (1.0, [0.0, 0.0]));
}

/// Soft-capped scores (Gemma-2's `c·tanh(s/c)` before the mask and softmax) on every path:
/// vector, tiled, long decode split in chunks, with and without a window, every thread count
/// and SIMD tier give the plain per-row algorithm's bits; that is close to exact capped
/// attention, and differs from the uncapped result (a cap small enough to saturate scores).
#[test]
fn soft_capped_matches_plain_algorithm_and_exact_attention() {
    let paths = paths();
    let mut seed = 71;
    for (dk, h, hkv) in [(16, 4, 2), (64, 8, 2), (256, 4, 1)] {
        for (cap, window) in [(1.5f32, 0), (50.0, 0), (1.5, 7), (0.25, 200)] {
            for (n, pos0) in [
                (1, 0),
                (1, 40),
                (1, 1500),
                (7, 0),
                (16, 100),
                (64, 3),
                (90, 450),
            ] {
                seed += 1;
                let mut c = make_case(dk, h, hkv, n, pos0, window, seed);
                let plain = run(&c, &paths[0], 2);
                c.shape.softcap = Some(cap);
                let want = reference_rows(&c);
                let what = format!("dk {dk} h {h}/{hkv} cap {cap} win {window} n {n} pos0 {pos0}");
                assert_every_path_gives(&c, &paths, &want, &what);
                let tol = if n >= TILE_Q || (n == 1 && pos0 >= 512) {
                    1e-5
                } else {
                    4e-3
                };
                assert_near_exact(&want, &exact(&c), tol, &what);
                if cap < 2.0 && pos0 + n > 1 {
                    let moved = want.iter().zip(&plain).map(|(a, b)| (a - b).abs());
                    assert!(
                        moved.fold(0.0f32, f32::max) > 1e-3,
                        "{what}: the cap changed nothing"
                    );
                }
            }
        }
    }
}

/// The (tokens, first position) of the encoder passes the bidirectional tests run: one token,
/// a few, around one query tile, and past it from a later position.
const ENCODER_PASSES: [(usize, usize); 8] = [
    (1, 0),
    (2, 0),
    (7, 0),
    (30, 0),
    (63, 0),
    (64, 0),
    (100, 0),
    (130, 20),
];

/// Bidirectional attention (an encoder's): every row of the pass sees every key of it, on
/// both paths, every thread count and SIMD tier, close to exact attention; on the vector path
/// each row has the bits of a causal decode row at the pass's last position (the same
/// arithmetic over the same keys), and a pass of one token is the causal one.
#[test]
fn bidirectional_matches_exact_attention() {
    let paths = paths();
    let mut seed = 101;
    for (dk, h, hkv) in [(16, 4, 2), (64, 12, 12), (32, 4, 4)] {
        for (n, pos0) in ENCODER_PASSES {
            seed += 1;
            let mut c = make_case(dk, h, hkv, n, pos0, 0, seed);
            c.shape.causal = false;
            let want_exact = exact(&c);
            // The plain per-row algorithm (every key of the pass visible to every row).
            let plain = reference_rows(&c);
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 2, 3] {
                for ops in &paths {
                    let got = run(&c, ops, threads);
                    // Every path, thread count and tier: the plain algorithm's bits.
                    assert!(
                        same_bits(&got, &plain),
                        "{} dk {dk} n {n} thr {threads}",
                        ops.name
                    );
                    first.get_or_insert(got.clone());
                    // The vector path's f16 accumulator rounds once per key: its error grows
                    // with the keys a row sees (~1e-3 per 16 of them).
                    let tol = match n {
                        TILE_Q.. => 1e-5,
                        0..=16 => 4e-3,
                        _ => 1e-2,
                    };
                    assert_near_exact(
                        &got,
                        &want_exact,
                        tol,
                        &format!("dk {dk} n {n} pos0 {pos0}"),
                    );
                }
            }
            let got = first.expect("ran");
            let row = h * dk;
            if n < TILE_Q {
                // Row t = a causal decode of query t at the last position.
                for t in 0..n {
                    let mut d = make_case(dk, h, hkv, n, pos0, 0, seed);
                    d.n_tokens = 1;
                    d.pos0 = pos0 + n - 1;
                    d.q = c.q[t * row..(t + 1) * row].to_vec();
                    let want = run(&d, &F16Ops::scalar(), 1);
                    assert_eq!(
                        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        got[t * row..(t + 1) * row]
                            .iter()
                            .map(|x| x.to_bits())
                            .collect::<Vec<_>>(),
                        "dk {dk} n {n} row {t}"
                    );
                }
            }
            if n == 1 {
                let mut d = make_case(dk, h, hkv, n, pos0, 0, seed);
                d.shape.causal = true;
                assert_eq!(run(&d, &F16Ops::scalar(), 1), got);
            }
            // And it is not the causal result (the first row sees later keys).
            if n > 1 {
                let d = make_case(dk, h, hkv, n, pos0, 0, seed);
                let causal = run(&d, &F16Ops::scalar(), 1);
                assert_ne!(causal[..row], got[..row], "dk {dk} n {n}");
            }
        }
    }
}

/// ALiBi's slopes are the reference's: `2^(−8(h+1)/n)` for a power-of-two head count `n`,
/// and the odd powers of `2^(−4/n)` for the heads past the largest power of two.
#[test]
fn alibi_slopes_follow_the_reference() {
    for h in 0..8 {
        assert_eq!(
            alibi_slope(8.0, 8, h),
            2f32.powi(-(h as i32 + 1)),
            "head {h}"
        );
    }
    // 12 heads: 8 of slope 2^-(h+1), then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    for h in 0..12 {
        let want = if h < 8 {
            2f32.powi(-(h as i32 + 1))
        } else {
            2f32.powf(-0.5 * (2 * (h - 8) + 1) as f32)
        };
        let got = alibi_slope(8.0, 12, h);
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "head {h}: {got} vs {want}"
        );
    }
}

/// Bidirectional attention with ALiBi (Jina-BERT-v2): every path and thread count gives the
/// same bits (always the tiled arithmetic), within 1e-5 of exact attention with the bias;
/// and the bias changes the result.
#[test]
fn alibi_matches_exact_attention() {
    let paths = paths();
    let mut seed = 71;
    for (dk, h, hkv) in [(16, 4, 2), (64, 12, 12), (32, 9, 3)] {
        for (n, pos0) in ENCODER_PASSES {
            seed += 1;
            let mut c = make_case(dk, h, hkv, n, pos0, 0, seed);
            c.shape.causal = false;
            let plain = run(&c, &F16Ops::scalar(), 1);
            c.alibi = Some(alibi_slopes(8.0, h));
            let want_exact = exact(&c);
            let first = run(&c, &F16Ops::scalar(), 1);
            for threads in [1, 2, 3] {
                for ops in &paths {
                    let got = run(&c, ops, threads);
                    assert!(
                        same_bits(&got, &first),
                        "{} dk {dk} n {n} thr {threads}",
                        ops.name
                    );
                    let what = format!("dk {dk} heads {h} n {n} pos0 {pos0}");
                    assert_near_exact(&got, &want_exact, 1e-5, &what);
                }
            }
            if n > 1 {
                assert_ne!(plain, first, "dk {dk} n {n}: the bias changed nothing");
            }
        }
    }
}

#[test]
fn scratch_size_formula_matches() {
    let s = AttnScratch::new(9, 3, 64, 64, 2);
    assert_eq!(s.bytes(), AttnScratch::bytes_for(9, 3, 64, 64, 2));
    let s = AttnScratch::new(4, 1, 256, 128, 3);
    assert_eq!(s.bytes(), AttnScratch::bytes_for(4, 1, 256, 128, 3));
    let s = AttnScratch::with_kv(4, 1, 256, 128, 3, KvType::Q8_0);
    assert_eq!(
        s.bytes(),
        AttnScratch::bytes_for_kv(4, 1, 256, 128, 3, KvType::Q8_0)
    );
    assert_eq!(
        s.bytes() - AttnScratch::bytes_for(4, 1, 256, 128, 3),
        3 * KV_TILE * (256 + 128) * 2
    );
}

/// A Q8_0 cache is attended exactly as an f16 cache holding its dequantized values: same
/// bits on both paths, with windows, splits, any thread count and every SIMD tier.
#[test]
fn q8_0_cache_is_f16_arithmetic_on_dequantized_values() {
    use crate::kernels::kv_type::dequant_q8_0_f16;
    use crate::quant::blocks::BlockQ8_0;
    use crate::quant::reference::Quantize;
    // (head_dim, heads, kv heads, tokens, pos0, window, threads)
    let cases = [
        (64, 4, 2, 5, 100, 0, 2),
        (64, 4, 2, 1, 600, 0, 3),
        (64, 4, 2, 1, 600, 100, 2),
        (64, 9, 3, 70, 10, 0, 2),
        (64, 4, 2, 130, 300, 50, 1),
        (32, 4, 2, 5, 100, 0, 2),
        (256, 4, 1, 80, 100, 0, 2),
        (256, 4, 1, 1, 700, 512, 2),
    ];
    let paths = paths();
    for (dk, h, hkv, n, pos0, win, threads) in cases {
        let mut c = make_case(dk, h, hkv, n, pos0, win, 11);
        let quant = |x: &[f16]| {
            let f: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
            let mut b = vec![BlockQ8_0::default(); f.len() / 32];
            BlockQ8_0::quantize(&f, &mut b);
            b
        };
        let (kq, vq) = (quant(&c.keys), quant(&c.values));
        dequant_q8_0_f16(&kq, &mut c.keys);
        dequant_q8_0_f16(&vq, &mut c.values);
        let s = &c.shape;
        let pool = ThreadPool::new(threads);
        for ops in &paths {
            let want = run(&c, ops, threads);
            let mut scratch = AttnScratch::with_kv(
                s.n_heads,
                s.n_kv_heads,
                s.head_dim_k,
                s.head_dim_v,
                threads,
                KvType::Q8_0,
            );
            let mut got = vec![f32::NAN; want.len()];
            attention_kv(
                &pool,
                ops,
                s,
                &c.q,
                c.n_tokens,
                c.pos0,
                KvLayer::Q8_0 {
                    keys: &kq,
                    values: &vq,
                },
                &mut got,
                &mut scratch,
            );
            assert!(
                same_bits(&got, &want),
                "{} dk {dk} heads {h}/{hkv} n {n} pos0 {pos0} window {win} threads {threads}",
                ops.name
            );
        }
    }
}

/// Work items take 64 tokens while that leaves four items a thread, else fewer, never under 16.
#[test]
fn item_tokens_keep_every_thread_busy() {
    assert_eq!(item_tokens(512, 1, 2), 64); // 8 items for 2 threads
    assert_eq!(item_tokens(512, 8, 16), 64); // Llama's 8 kv heads: 64 items
    assert_eq!(item_tokens(512, 1, 4), 32);
    assert_eq!(item_tokens(512, 3, 16), 16); // SmolLM2 on 16 threads
    assert_eq!(item_tokens(512, 1, 16), 16); // Gemma-3: 32 items, the floor
    assert_eq!(item_tokens(64, 1, 1), 16);
}
