use super::*;

/// One path per tier this CPU runs (the tiers share paths: scalar, AVX2, AVX-512).
fn all_paths() -> Vec<F16Ops> {
    let mut v: Vec<F16Ops> = Vec::new();
    for isa in Isa::available() {
        let p = F16Ops::for_isa(isa);
        if v.iter().all(|q| q.name != p.name) {
            v.push(p);
        }
    }
    v
}

#[test]
fn a_tier_runs_no_wider_paths_than_its_own() {
    // `KILN_ISA=avx2` on an AVX-512 CPU must measure what an AVX2-only CPU runs.
    assert_eq!(F16Ops::for_isa(Isa::Scalar).name, "scalar");
    for isa in Isa::available() {
        let want = match isa {
            Isa::Avx2 => "avx2",
            Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => "avx512",
            _ => "scalar",
        };
        assert_eq!(F16Ops::for_isa(isa).name, want, "{isa:?}");
    }
    assert_eq!(F16Ops::detect().name, F16Ops::for_isa(Isa::detect()).name);
}

struct Rng(u32);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
        (self.0 >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
    }
    fn f16s(&mut self, n: usize) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(self.next())).collect()
    }
}

/// Every SIMD path gives the scalar path's bits, at every length (blocks and leftovers).
#[test]
fn simd_paths_are_bit_identical_to_scalar() {
    let mut rng = Rng(1);
    let scalar = F16Ops::scalar();
    for n in [
        0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 256, 300,
    ] {
        let q: Vec<f32> = rng.f16s(n).iter().map(|x| x.to_f32()).collect();
        let k = rng.f16s(n);
        let y0: Vec<f32> = rng.f16s(n).iter().map(|x| x.to_f32()).collect();
        let w = rng.next();
        let want_dot = (scalar.dot)(&q, &k);
        let mut want_mad = y0.clone();
        (scalar.mad)(&mut want_mad, &k, w);
        let mut want_scale = y0.clone();
        (scalar.scale)(&mut want_scale, w);
        let p: Vec<f32> = (0..5).map(|_| rng.next().abs()).collect();
        let vrows = rng.f16s(5 * n);
        let acc0: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let mut want_vkq = acc0.clone();
        (scalar.vkq_acc)(&mut want_vkq, &p, &vrows);
        for ops in all_paths() {
            assert_eq!(
                (ops.dot)(&q, &k).to_bits(),
                want_dot.to_bits(),
                "{} dot n={n}",
                ops.name
            );
            let mut y = y0.clone();
            (ops.mad)(&mut y, &k, w);
            assert_eq!(y, want_mad, "{} mad n={n}", ops.name);
            let mut y = y0.clone();
            (ops.scale)(&mut y, w);
            assert_eq!(y, want_scale, "{} scale n={n}", ops.name);
            let mut a = acc0.clone();
            (ops.vkq_acc)(&mut a, &p, &vrows);
            assert_eq!(a, want_vkq, "{} vkq n={n}", ops.name);
        }
    }
    for dk in [1, 32, 64, 256] {
        for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9] {
            let q: Vec<f32> = (0..rows * dk).map(|_| rng.next()).collect();
            let kt: Vec<f32> = (0..dk * KV_TILE).map(|_| rng.next()).collect();
            let mut want = vec![0.0f32; rows * KV_TILE];
            (scalar.kq_tile)(&q, &kt, &mut want);
            for ops in all_paths() {
                let mut got = vec![1.0f32; rows * KV_TILE];
                (ops.kq_tile)(&q, &kt, &mut got);
                assert_eq!(got, want, "{} kq_tile dk={dk} rows={rows}", ops.name);
                // Each row as its own call.
                for r in 0..rows {
                    let mut one = vec![1.0f32; KV_TILE];
                    (ops.kq_tile)(&q[r * dk..(r + 1) * dk], &kt, &mut one);
                    assert_eq!(
                        one[..],
                        want[r * KV_TILE..(r + 1) * KV_TILE],
                        "{}",
                        ops.name
                    );
                }
            }
        }
    }
    // Softmax through every regime of `expf`: results below f32's normal range (subnormal
    // and zero), near 1, past the overflow, with NaN and ±∞ among them.
    for round in 0..40 {
        let mut s: [f32; KV_TILE] =
            std::array::from_fn(|j| -110.0 + 0.37 * (round * KV_TILE + j) as f32 * 0.3);
        s[(round * 7) % KV_TILE] = f32::NAN;
        s[(round * 11 + 3) % KV_TILE] = f32::INFINITY;
        s[(round * 13 + 5) % KV_TILE] = f32::NEG_INFINITY;
        let mut want = s;
        let want_sum = (scalar.softmax_tile)(&mut want, 0.0);
        for ops in all_paths() {
            let mut got = s;
            let sum = (ops.softmax_tile)(&mut got, 0.0);
            for (a, b) in got.iter().zip(&want) {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} expf regimes {round}",
                    ops.name
                );
            }
            assert_eq!(sum.is_nan(), want_sum.is_nan(), "{}", ops.name);
        }
    }
    // Softmax over scores spanning the whole range, with masked (−∞) keys.
    for round in 0..50 {
        let mut s = [0.0f32; KV_TILE];
        for (j, x) in s.iter_mut().enumerate() {
            *x = if (j + round) % 7 == 0 {
                f32::NEG_INFINITY
            } else {
                rng.next() * (round as f32 + 1.0) * 4.0
            };
        }
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut want = s;
        let want_sum = (scalar.softmax_tile)(&mut want, m);
        for ops in all_paths() {
            let mut got = s;
            let sum = (ops.softmax_tile)(&mut got, m);
            assert_eq!(got, want, "{} softmax round {round}", ops.name);
            assert_eq!(
                sum.to_bits(),
                want_sum.to_bits(),
                "{} softmax sum",
                ops.name
            );
        }
    }
}

/// `scale_max` gives the scalar definition's scores and maximum on every path, for every
/// visible range of a tile (empty, partial at either end, whole), with special scores
/// (±∞, NaN, ±0) at moving positions: the maximum's lane order and NaN rule included; plain,
/// and through soft caps (Gemma-2's 50, a small one that saturates most scores).
#[test]
fn scale_max_paths_agree() {
    let mut rng = Rng(9);
    let scalar = F16Ops::scalar();
    let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0];
    for round in 0..40 {
        let mut s = [0.0f32; KV_TILE];
        for x in s.iter_mut() {
            *x = rng.next() * 50.0;
        }
        if round % 4 != 0 {
            for (k, &v) in specials.iter().enumerate().take(round % 6) {
                s[(round * 7 + 13 * k) % KV_TILE] = v;
            }
        }
        if round % 5 == 0 {
            // Every score equal but the zeros' signs: the fold must keep the first.
            s.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = if j % 3 == 0 { -0.0 } else { 0.0 });
        }
        let scale = if round % 2 == 0 { 0.125 } else { -0.37 };
        let cap = [None, Some(50.0), Some(2.5)][round % 3];
        let sc = ScoreScale::new(scale, cap);
        for (lo, hi) in [
            (0, KV_TILE),
            (0, 0),
            (0, 1),
            (5, 37),
            (17, KV_TILE),
            (63, 64),
            (40, 20),
        ] {
            let mut want = s;
            let want_max = (scalar.scale_max)(&mut want, sc, lo, hi);
            for ops in all_paths() {
                let mut got = s;
                let max = (ops.scale_max)(&mut got, sc, lo, hi);
                let bits = |a: &[f32]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{} round {round} {lo}..{hi} cap {cap:?}",
                    ops.name
                );
                assert_eq!(
                    max.to_bits(),
                    want_max.to_bits(),
                    "{} max round {round} {lo}..{hi}",
                    ops.name
                );
            }
        }
    }
}

/// The scalar definition of a capped score is the reference's: `scale / c` first, then
/// `c·tanhf`; capped logits stay within `±c` and keep their order, and a cap changes them.
#[test]
fn soft_capped_scores_follow_the_reference() {
    let mut rng = Rng(21);
    let (scale, c) = (0.125f32, 5.0f32);
    let sc = ScoreScale::new(scale, Some(c));
    assert_eq!(sc.scale, scale / c);
    let mut s = [0.0f32; KV_TILE];
    for x in s.iter_mut() {
        *x = rng.next() * 400.0;
    }
    s[3] = f32::INFINITY;
    s[4] = f32::NEG_INFINITY;
    let raw = s;
    let max = scale_max_scalar(&mut s, sc, 0, KV_TILE);
    for (j, (&got, &x)) in s.iter().zip(&raw).enumerate() {
        assert_eq!(
            got.to_bits(),
            (c * (x * (scale / c)).tanh()).to_bits(),
            "column {j}"
        );
        assert!(got.abs() <= c, "column {j}: {got}");
        assert_eq!(got.to_bits(), sc.apply(x).to_bits());
    }
    assert_eq!((s[3], s[4]), (c, -c));
    assert_eq!(max, c);
    let mut plain = raw;
    scale_max_scalar(&mut plain, ScoreScale::plain(scale), 0, KV_TILE);
    assert!(plain.iter().zip(&s).any(|(a, b)| a != b));
    for (i, j) in [(0, 1), (5, 9), (10, 40)] {
        if raw[i] < raw[j] {
            assert!(s[i] <= s[j]);
        }
    }
}

/// The fused vector-path loop gives the scalar loop's bits on every path (head dims with
/// and without leftovers, new maxima early and late), plain and soft-capped.
#[test]
fn vec_keys_paths_agree() {
    let mut rng = Rng(5);
    for (group, hdk, hdv) in [
        (1, 64, 64),
        (3, 64, 64),
        (4, 256, 256),
        (2, 80, 48),
        (2, 32, 8),
    ] {
        for cap in [None, Some(50.0), Some(0.75)] {
            check_vec_keys(&mut rng, group, hdk, hdv, ScoreScale::new(0.3, cap));
        }
    }
}

fn check_vec_keys(rng: &mut Rng, group: usize, hdk: usize, hdv: usize, sc: ScoreScale) {
    {
        let n = 37;
        let q16: Vec<f32> = rng.f16s(group * hdk).iter().map(|x| x.to_f32()).collect();
        let keys: Vec<f16> = (0..n * hdk)
            .map(|_| f16::from_f32(rng.next() * 2.0))
            .collect();
        let values = rng.f16s(n * hdv);
        let mut m_s0 = vec![0.0f32; 2 * group];
        for st in m_s0.chunks_exact_mut(2) {
            st[0] = f32::NEG_INFINITY;
        }
        let mut want_ms = m_s0.clone();
        let mut want_acc = vec![0.0f32; group * hdv];
        // Two runs continue the state as two chunks of keys would.
        for (a, b) in [(0, 20), (20, n)] {
            vec_keys_scalar(
                &q16,
                KeyRun::single(&keys[a * hdk..b * hdk], &values[a * hdv..b * hdv], b - a),
                sc,
                &mut want_ms,
                &mut want_acc,
            );
        }
        for ops in all_paths() {
            let mut m_s = m_s0.clone();
            let mut acc = vec![0.0f32; group * hdv];
            for (a, b) in [(0, 20), (20, n)] {
                (ops.vec_keys)(
                    &q16,
                    KeyRun::single(&keys[a * hdk..b * hdk], &values[a * hdv..b * hdv], b - a),
                    sc,
                    &mut m_s,
                    &mut acc,
                );
            }
            assert_eq!(m_s, want_ms, "{} group {group} hdk {hdk} {sc:?}", ops.name);
            assert_eq!(acc, want_acc, "{} group {group} hdk {hdk} {sc:?}", ops.name);
            assert!(
                acc.iter().all(|&v| f16::from_f32(v).to_f32() == v),
                "accumulator holds f16 values"
            );
        }
    }
}

/// Several kv heads run together (interleaved) give each head the bits of its own run.
#[test]
fn vec_keys_streams_match_separate_runs() {
    let mut rng = Rng(9);
    let (streams, group, hdk, hdv, n, stride) = (3, 2, 64, 64, 29, 40);
    let heads = streams * group;
    let q16: Vec<f32> = rng.f16s(heads * hdk).iter().map(|x| x.to_f32()).collect();
    let keys: Vec<f16> = (0..streams * stride * hdk)
        .map(|_| f16::from_f32(rng.next() * 2.0))
        .collect();
    let values = rng.f16s(streams * stride * hdv);
    let fresh = |h: usize| {
        let mut m = vec![0.0f32; 2 * h];
        m.chunks_exact_mut(2)
            .for_each(|st| st[0] = f32::NEG_INFINITY);
        (m, vec![0.0f32; h * hdv])
    };
    for ops in all_paths() {
        let (mut m_s, mut acc) = fresh(heads);
        let run = KeyRun {
            keys: &keys,
            values: &values,
            n,
            streams,
            k_stride: stride,
            v_stride: stride,
        };
        (ops.vec_keys)(&q16, run, ScoreScale::plain(0.3), &mut m_s, &mut acc);
        for s in 0..streams {
            let (mut m1, mut a1) = fresh(group);
            let one = KeyRun::single(
                &keys[s * stride * hdk..(s * stride + n) * hdk],
                &values[s * stride * hdv..(s * stride + n) * hdv],
                n,
            );
            vec_keys_scalar(
                &q16[s * group * hdk..(s + 1) * group * hdk],
                one,
                ScoreScale::plain(0.3),
                &mut m1,
                &mut a1,
            );
            assert_eq!(
                m_s[s * group * 2..(s + 1) * group * 2],
                m1[..],
                "{}",
                ops.name
            );
            assert_eq!(
                acc[s * group * hdv..(s + 1) * group * hdv],
                a1[..],
                "{}",
                ops.name
            );
        }
    }
}

#[test]
fn swiglu_paths_are_bit_identical_to_scalar() {
    let mut rng = Rng(7);
    for n in [0, 1, 15, 16, 17, 100, 1536] {
        // Wide range: large |x| hits the overflow/underflow branches of expf.
        let gate: Vec<f32> = (0..n).map(|_| rng.next() * 60.0).collect();
        let up: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let mut want = gate.clone();
        swiglu_scalar(&mut want, &up);
        for p in all_paths() {
            let mut got = gate.clone();
            (p.swiglu)(&mut got, &up);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{} n={n} i={i}", p.name);
            }
        }
    }
}

/// `kq_rows` is `dot` pair by pair, and `vkq_multi` is `vkq_acc` row by row, bit for bit,
/// on every path (head counts past the 4-row register block, head sizes with leftovers).
#[test]
fn multi_head_kernels_equal_their_single_forms() {
    let mut rng = Rng(21);
    for hd in [64, 256, 80, 32] {
        for heads in [1, 3, 4, 5, 9] {
            for n in [1, 7, 16, 64] {
                let q: Vec<f32> = (0..heads * hd).map(|_| rng.next() * 3.0).collect();
                let k: Vec<f16> = (0..n * hd)
                    .map(|_| f16::from_f32(rng.next() * 2.0))
                    .collect();
                let p: Vec<f32> = (0..heads * KV_TILE).map(|_| rng.next().abs()).collect();
                let stride = hd + 2;
                let acc0: Vec<f32> = (0..heads * stride).map(|_| rng.next()).collect();
                for ops in all_paths() {
                    let mut out = vec![f32::NAN; heads * KV_TILE];
                    (ops.kq_rows)(&q, heads, &k, &mut out);
                    let mut acc = acc0.clone();
                    (ops.vkq_multi)(Vkq::new((&mut acc, stride), (&p, KV_TILE), heads, (&k, hd)));
                    for g in 0..heads {
                        let qg = &q[g * hd..][..hd];
                        for j in 0..n {
                            let want = dot_scalar(qg, &k[j * hd..][..hd]);
                            assert_eq!(
                                out[g * KV_TILE + j].to_bits(),
                                want.to_bits(),
                                "{} kq_rows hd {hd} heads {heads} n {n} g {g} j {j}",
                                ops.name
                            );
                        }
                        let mut want = acc0[g * stride..][..hd].to_vec();
                        (ops.vkq_acc)(&mut want, &p[g * KV_TILE..][..n], &k);
                        assert_eq!(
                            &acc[g * stride..][..hd],
                            &want[..],
                            "{} vkq_multi hd {hd} heads {heads} n {n} g {g}",
                            ops.name
                        );
                        // The two columns between rows are left alone.
                        assert_eq!(
                            &acc[g * stride + hd..(g * stride + stride).min(acc.len())],
                            &acc0[g * stride + hd..(g * stride + stride).min(acc.len())]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn key_tile_paths_transpose_exactly() {
    let mut rng = Rng(5);
    for hd in [64, 256, 80, 16, 8] {
        for n in [1, 5, 15, 16, 17, 33, 63, 64] {
            let k: Vec<f16> = (0..n * hd)
                .map(|_| f16::from_f32(rng.next() * 8.0))
                .collect();
            for p in all_paths() {
                let mut kt = vec![f32::NAN; hd * KV_TILE];
                (p.key_tile)(&k, &mut kt);
                for j in 0..n {
                    for d in 0..hd {
                        assert_eq!(
                            kt[d * KV_TILE + j].to_bits(),
                            k[j * hd + d].to_f32().to_bits(),
                            "{} hd={hd} n={n} j={j} d={d}",
                            p.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gelu_paths_are_bit_identical_to_scalar() {
    let mut rng = Rng(11);
    for n in [0, 1, 15, 16, 17, 100, 2048] {
        // Past ±10 (the cut-offs), around 0, and every f16 neighbourhood in between.
        let mut x: Vec<f32> = (0..n).map(|_| rng.next() * 30.0).collect();
        for (i, v) in [10.0, -10.0, 9.999, -9.999, 0.0, -0.0, 65504.0, 1e-8]
            .iter()
            .enumerate()
        {
            if i < n {
                x[i] = *v;
            }
        }
        let up: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let mut want_g = x.clone();
        geglu_scalar(&mut want_g, &up);
        let mut want = x.clone();
        gelu_scalar(&mut want);
        for (i, (&w, &v)) in want.iter().zip(&x).enumerate() {
            let e = crate::kernels::ops::gelu_tanh_exact(f16::from_f32(v).to_f32());
            let expect = if v <= -10.0 {
                0.0
            } else if v >= 10.0 {
                v
            } else {
                f16::from_f32(e).to_f32()
            };
            assert_eq!(w.to_bits(), expect.to_bits(), "scalar i={i} x={v}");
        }
        for p in all_paths() {
            let mut got = x.clone();
            (p.geglu)(&mut got, &up);
            for (i, (a, b)) in got.iter().zip(&want_g).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{} geglu n={n} i={i}", p.name);
            }
            let mut got = x.clone();
            (p.gelu)(&mut got);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{} gelu n={n} i={i}", p.name);
            }
        }
    }
}

/// The approximate exp is close to the true one, exact at 0, and 0 far below.
#[test]
fn expf_approx_is_accurate() {
    assert_eq!(expf_approx(0.0), 1.0);
    assert_eq!(expf_approx(f32::NEG_INFINITY), 0.0);
    assert_eq!(expf_approx(-200.0), 0.0);
    let mut x = -100.0f32;
    while x <= 0.0 {
        let want = (x as f64).exp();
        let got = expf_approx(x) as f64;
        assert!(
            (got - want).abs() <= 4e-7 * want + 1e-44,
            "x={x}: {got} vs {want}"
        );
        x += 0.0137;
    }
}

/// Hand-checkable cases: the f16 accumulate rounds once to f32 and once to f16.
#[test]
fn f16_accumulate_rounds_to_f16() {
    for ops in all_paths() {
        let mut y = vec![1.0f32; 20];
        let x = vec![f16::from_f32(1.0); 20];
        // 1 + 2^-12 is not an f16: rounds back to 1 (ties to even).
        (ops.mad)(&mut y, &x, 1.0 / 4096.0);
        assert!(y.iter().all(|&v| v == 1.0), "{}", ops.name);
        (ops.mad)(&mut y, &x, 3.0 / 2048.0);
        assert!(y.iter().all(|&v| v == 1.0 + 2.0 / 1024.0), "{}", ops.name);
        (ops.scale)(&mut y, 1.0 / 3.0);
        assert!(
            y.iter()
                .all(|&v| v == f16::from_f32((1.0 + 2.0 / 1024.0) / 3.0).to_f32()),
            "{}",
            ops.name
        );
        let q = vec![0.5f32; 70];
        let k = vec![f16::from_f32(2.0); 70];
        assert_eq!((ops.dot)(&q, &k), 70.0, "{}", ops.name);
    }
}
