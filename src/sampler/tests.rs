use super::*;

fn cfg(temperature: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed: 42,
        logit_bias: Vec::new(),
    }
}

fn ids(c: &[(u32, f32)]) -> Vec<u32> {
    let mut v: Vec<u32> = c.iter().map(|c| c.0).collect();
    v.sort();
    v
}

fn cands(logits: &[f32]) -> Vec<(u32, f32)> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect()
}

#[test]
fn defaults_match_llama_cpp() {
    let d = SamplerConfig::default();
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p),
        (0.8, 40, 0.95, 0.05)
    );
    assert_eq!((d.repeat_penalty, d.repeat_last_n), (1.0, 64));
    assert_eq!((d.frequency_penalty, d.presence_penalty), (0.0, 0.0));
    // Random seeds: two defaults differ.
    assert_ne!(d.seed, SamplerConfig::default().seed);
    assert!(d.validate().is_ok());
}

#[test]
fn rng_matches_reference_xoshiro256starstar() {
    // Reference: state [1, 2, 3, 4] gives 11520, 0, 1509978240, 1215971899390074240
    // (the first outputs of the C reference implementation).
    let mut r = Rng { s: [1, 2, 3, 4] };
    assert_eq!(r.next_u64(), 11520);
    assert_eq!(r.next_u64(), 0);
    assert_eq!(r.next_u64(), 1509978240);
    assert_eq!(r.next_u64(), 1215971899390074240);
    let mut a = Rng::new(7);
    let mut b = Rng::new(7);
    for _ in 0..100 {
        let x = a.next_f64();
        assert!((0.0..1.0).contains(&x));
        assert_eq!(x.to_bits(), b.next_f64().to_bits());
    }
}

#[test]
fn argmax_first_max_and_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 5.0]), 3);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY, -1.0]), 2);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
    assert_eq!(argmax(&[-0.0, 0.0]), 0);
    assert_eq!(argmax(&[0.0, -0.0]), 0);
}

/// The vectorized argmax against the one-pass definition (first strict maximum, NaN
/// skipped) on random rows with ties, NaNs, infinities and every tail length.
#[test]
fn argmax_matches_scalar_definition() {
    fn scalar(x: &[f32]) -> u32 {
        let (mut best, mut val, mut found) = (0, f32::NEG_INFINITY, false);
        for (i, &v) in x.iter().enumerate() {
            if !v.is_nan() && (!found || v > val) {
                (best, val, found) = (i, v, true);
            }
        }
        best as u32
    }
    let mut rng = Rng::new(11);
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 7.0];
    for len in 0..100 {
        for _ in 0..20 {
            let x: Vec<f32> = (0..len)
                .map(|_| match rng.next_u64() % 8 {
                    0 => special[(rng.next_u64() % 6) as usize],
                    1 => 7.0,
                    _ => (rng.next_f64() * 10.0 - 5.0) as f32,
                })
                .collect();
            assert_eq!(argmax(&x), scalar(&x), "{x:?}");
        }
    }
}

#[test]
fn softmax_basic_and_stable() {
    let mut x = [1.0f32, 2.0, 3.0];
    softmax_in_place(&mut x);
    let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let s: f32 = e.iter().sum();
    for (a, b) in x.iter().zip(e.iter()) {
        assert!((a - b / s).abs() < 1e-6);
    }
    // Huge logits do not overflow.
    let mut y = [1000.0f32, 1000.0, -1000.0];
    softmax_in_place(&mut y);
    assert!((y[0] - 0.5).abs() < 1e-6 && (y[1] - 0.5).abs() < 1e-6 && y[2] == 0.0);
}

#[test]
fn softmax_all_masked_is_uniform_never_nan() {
    let mut x = [f32::NEG_INFINITY; 4];
    softmax_in_place(&mut x);
    assert_eq!(x, [0.25; 4]);
    let mut y = [f32::NAN, f32::NEG_INFINITY];
    softmax_in_place(&mut y);
    assert_eq!(y, [0.5; 2]);
    let mut z = [f32::NAN, 0.0, f32::INFINITY, 3.0, f32::INFINITY];
    softmax_in_place(&mut z);
    assert_eq!(z, [0.0, 0.0, 0.5, 0.0, 0.5]);
    let mut w = [f32::NAN, 0.0];
    softmax_in_place(&mut w);
    assert_eq!(w, [0.0, 1.0]);
}

#[test]
fn log_softmax_matches_softmax_and_is_stable() {
    let logits = [0.5f32, -1.0, 2.0, 0.0];
    let mut p = logits;
    softmax_in_place(&mut p);
    for t in 0..4 {
        assert!((log_softmax(&logits, t) - (p[t as usize] as f64).ln()).abs() < 1e-6);
    }
    // Large logits: no overflow, exact-ish answer.
    let big = [10000.0f32, 10000.0];
    assert!((log_softmax(&big, 0) + std::f64::consts::LN_2).abs() < 1e-12);
    assert_eq!(log_softmax(&[f32::NEG_INFINITY; 4], 1), -(4f64).ln());
    assert_eq!(log_softmax(&[f32::NAN, 1.0], 0), f64::NEG_INFINITY);
    assert_eq!(
        log_softmax(&[f32::INFINITY, 1.0, f32::INFINITY], 2),
        -(2f64).ln()
    );
    assert_eq!(log_softmax(&[f32::INFINITY, 1.0], 1), f64::NEG_INFINITY);
}

#[test]
fn penalties_repeat_frequency_presence() {
    let c = SamplerConfig {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..cfg(1.0)
    };
    let mut cs = cands(&[4.0, -4.0, 1.0, 3.0]);
    let mut counts = vec![0; 4];
    // token 0 twice, token 1 once, 9 out of range (ignored).
    apply_penalties(&mut cs, &mut counts, &[0, 1, 0, 9], &c);
    assert_eq!(cs[0].1, 4.0 / 2.0 - 2.0 * 0.5 - 0.25);
    assert_eq!(cs[1].1, -4.0 * 2.0 - 0.5 - 0.25);
    assert_eq!(cs[2].1, 1.0);
    assert_eq!(cs[3].1, 3.0);
    assert!(counts.iter().all(|&c| c == 0), "counts are reset");
}

#[test]
fn penalties_change_the_greedy_choice() {
    let logits = [1.0f32, 3.0, 2.5, 0.0];
    let base = Sampler::new(cfg(0.0), 4).sample(&logits, &[1, 1]);
    assert_eq!(base, 1, "no penalties: argmax");
    let mut s = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.5,
            ..cfg(0.0)
        },
        4,
    );
    assert_eq!(s.sample(&logits, &[1]), 2, "3/1.5 = 2 < 2.5");
    let mut s = Sampler::new(
        SamplerConfig {
            presence_penalty: 1.0,
            ..cfg(0.0)
        },
        4,
    );
    assert_eq!(s.sample(&logits, &[1, 1, 1]), 2);
    let mut s = Sampler::new(
        SamplerConfig {
            frequency_penalty: 0.3,
            ..cfg(0.0)
        },
        4,
    );
    assert_eq!(s.sample(&logits, &[1]), 1, "3 - 0.3 > 2.5");
    assert_eq!(s.sample(&logits, &[1, 1]), 2, "3 - 0.6 < 2.5");
    // Only the last repeat_last_n tokens count.
    let mut s = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: 1,
            ..cfg(0.0)
        },
        4,
    );
    assert_eq!(s.sample(&logits, &[1, 3]), 1);
    // repeat_last_n = 0 turns penalties off.
    let mut s = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: 0,
            ..cfg(0.0)
        },
        4,
    );
    assert_eq!(s.sample(&logits, &[1]), 1);
}

#[test]
fn top_k_keeps_k_best_without_sorting_all() {
    let mut cs = cands(&[0.1, 5.0, 3.0, 4.0, -1.0, 4.0]);
    top_k(&mut cs, 3);
    assert_eq!(ids(&cs), vec![1, 3, 5]);
    // Ties at the boundary go to the lower id.
    let mut cs = cands(&[1.0, 2.0, 2.0, 2.0]);
    top_k(&mut cs, 2);
    assert_eq!(ids(&cs), vec![1, 2]);
    let mut cs = cands(&[1.0, 2.0]);
    top_k(&mut cs, 10);
    assert_eq!(cs.len(), 2);
}

#[test]
fn top_p_smallest_prefix_reaching_p() {
    // probabilities 0.5, 0.25, 0.125, 0.125
    let l = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
    let mut cs = cands(&l);
    top_p(&mut cs, 0.5);
    assert_eq!(ids(&cs), vec![0]);
    let mut cs = cands(&l);
    top_p(&mut cs, 0.7);
    assert_eq!(ids(&cs), vec![0, 1]);
    let mut cs = cands(&l);
    top_p(&mut cs, 0.0);
    assert_eq!(ids(&cs), vec![0], "p = 0 keeps the best");
    let mut cs = cands(&l);
    top_p(&mut cs, 0.99);
    assert_eq!(cs.len(), 4);
    assert!(cs.windows(2).all(|w| w[0].1 >= w[1].1), "sorted best first");
}

#[test]
fn top_p_large_vocab_probe_and_fallback() {
    // Peaked: the probe of 256 suffices.
    let mut l = vec![0.0f32; 5000];
    l[4321] = 20.0;
    let mut cs = cands(&l);
    top_p(&mut cs, 0.9);
    assert_eq!(ids(&cs), vec![4321]);
    // Flat: needs 4500 of 5000, beyond the probe.
    let l = vec![0.0f32; 5000];
    let mut cs = cands(&l);
    top_p(&mut cs, 0.9);
    assert_eq!(cs.len(), 4500);
    assert_eq!(
        ids(&cs),
        (0..4500).collect::<Vec<u32>>(),
        "ties go to lower ids"
    );
}

#[test]
fn min_p_relative_threshold() {
    // probabilities proportional to 1, 0.5, 0.1, 0.01
    let l = [0.0f32, 0.5f32.ln(), 0.1f32.ln(), 0.01f32.ln()];
    let mut cs = cands(&l);
    min_p(&mut cs, 0.2, false);
    assert_eq!(ids(&cs), vec![0, 1]);
    let mut cs = cands(&l);
    min_p(&mut cs, 1.0, false);
    assert_eq!(ids(&cs), vec![0], "min_p = 1 keeps only the best");
    let mut cs = cands(&[f32::NEG_INFINITY; 3]);
    min_p(&mut cs, 0.5, false);
    assert_eq!(cs.len(), 3, "all masked: nothing to prefer");
}

#[test]
fn temperature_sharpens_and_flattens() {
    // With two tokens at logits 0 and 1, P(1) = sigmoid(1/t).
    let logits = [0.0f32, 1.0];
    let freq = |t: f32| {
        let mut s = Sampler::new(cfg(t), 2);
        (0..20000).filter(|_| s.sample(&logits, &[]) == 1).count() as f64 / 20000.0
    };
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    for t in [0.25f32, 1.0, 4.0] {
        let f = freq(t);
        assert!((f - sig(1.0 / t as f64)).abs() < 0.015, "t={t}: {f}");
    }
}

#[test]
fn tiny_temperatures_are_the_greedy_limit() {
    // 7.5 / 1e-38 and 5.0 / 1e-38 both overflow f32: dividing first would draw token 1 as
    // often as token 2.
    let logits = [1.0f32, 5.0, 7.5, -3.0, f32::NEG_INFINITY];
    let subnormals = [1e-40f32, f32::from_bits(1), f32::MIN_POSITIVE / 2.0];
    for t in [1e-38f32, 1e-30, f32::MIN_POSITIVE]
        .into_iter()
        .chain(subnormals)
    {
        assert!(t > 0.0);
        for seed in 0..200 {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg(t) }, 5);
            assert_eq!(s.sample(&logits, &[]), 2, "t={t:e} seed={seed}");
        }
        // All negative, and huge magnitudes.
        let mut s = Sampler::new(cfg(t), 3);
        assert_eq!(s.sample(&[-5.0, -1.0, -2.0], &[]), 1, "t={t:e}");
        assert_eq!(s.sample(&[-3e38, 3e38, 2.9e38], &[]), 1, "t={t:e}");
        // Tied best logits: the limit is uniform over the tie, never another token.
        let mut s = Sampler::new(cfg(t), 4);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[s.sample(&[7.5, 0.0, 7.5, 7.0], &[]) as usize] += 1;
        }
        assert_eq!(seen[1] + seen[3], 0, "t={t:e}: {seen:?}");
        assert!(seen[0] > 100 && seen[2] > 100, "t={t:e}: {seen:?}");
    }
}

#[test]
fn huge_temperatures_are_uniform() {
    let logits = [1.0f32, 5.0, 7.5, -3.0];
    for t in [1e30f32, f32::MAX, f32::INFINITY] {
        let mut s = Sampler::new(cfg(t), 4);
        let mut seen = [0usize; 4];
        for _ in 0..4000 {
            seen[s.sample(&logits, &[]) as usize] += 1;
        }
        for n in seen {
            assert!((900..1100).contains(&n), "t={t:e}: {seen:?}");
        }
    }
    // A +inf logit still wins at any temperature.
    let mut s = Sampler::new(cfg(1e-38), 3);
    assert_eq!(s.sample(&[1.0, f32::INFINITY, 2.0], &[]), 1);
}

#[test]
fn greedy_is_argmax_and_ignores_seed() {
    let logits = [0.3f32, -2.0, 7.5, 7.5, 1.0];
    for seed in 0..5 {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg(0.0) }, 5);
        assert_eq!(s.sample(&logits, &[]), 2);
    }
    let mut s = Sampler::new(
        SamplerConfig {
            temperature: -1.0,
            ..cfg(0.0)
        },
        5,
    );
    assert_eq!(s.sample(&logits, &[]), 2);
    let mut s = Sampler::new(
        SamplerConfig {
            temperature: f32::NAN,
            ..cfg(0.0)
        },
        5,
    );
    assert_eq!(
        s.sample(&logits, &[]),
        2,
        "NaN temperature is sanitized to greedy"
    );
}

#[test]
fn edge_cases_give_valid_ids() {
    // Vocab of 1.
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 5,
            ..cfg(1.0)
        },
        1,
    );
    assert_eq!(s.sample(&[0.3], &[0, 0]), 0);
    // top_k larger than vocab; top_p = 0; min_p = 1.
    let logits = [1.0f32, 2.0, 0.5];
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 100,
            ..cfg(1.0)
        },
        3,
    );
    assert!(s.sample(&logits, &[]) < 3);
    let only_the_best = [
        SamplerConfig {
            top_p: 0.0,
            ..cfg(1.0)
        },
        SamplerConfig {
            min_p: 1.0,
            ..cfg(1.0)
        },
    ];
    for c in only_the_best {
        let mut s = Sampler::new(c, 3);
        for _ in 0..50 {
            assert_eq!(s.sample(&logits, &[]), 1);
        }
    }
    // NaN logits are never drawn; +inf logits win.
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 2,
            top_p: 0.9,
            ..cfg(1.0)
        },
        4,
    );
    for _ in 0..50 {
        let t = s.sample(&[f32::NAN, 0.0, f32::NAN, 0.0], &[]);
        assert!(t == 1 || t == 3);
        let t = s.sample(&[f32::INFINITY, 0.0, f32::NAN, f32::INFINITY], &[]);
        assert!(t == 0 || t == 3);
    }
}

#[test]
fn all_masked_row_samples_uniformly() {
    let row = [f32::NEG_INFINITY; 5];
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 0,
            min_p: 0.05,
            ..cfg(0.8)
        },
        5,
    );
    let mut seen = [0u32; 5];
    for _ in 0..5000 {
        seen[s.sample(&row, &[]) as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    let mut g = Sampler::new(cfg(0.0), 5);
    assert_eq!(g.sample(&row, &[]), 0);
}

#[test]
fn validate_rejects_and_sanitize_clamps() {
    let bad = SamplerConfig {
        top_p: 1.5,
        ..cfg(1.0)
    };
    assert!(matches!(
        bad.validate(),
        Err(SamplerConfigError::OutOfRange { name: "top_p", .. })
    ));
    assert_eq!(bad.sanitized().top_p, 1.0);
    let bad = SamplerConfig {
        repeat_penalty: 0.0,
        ..cfg(1.0)
    };
    assert!(bad.validate().is_err());
    assert_eq!(bad.sanitized().repeat_penalty, 1.0);
    assert!(SamplerConfig {
        temperature: f32::INFINITY,
        ..cfg(1.0)
    }
    .validate()
    .is_err());
    assert!(SamplerConfig {
        min_p: -0.1,
        ..cfg(1.0)
    }
    .validate()
    .is_err());
}

#[test]
fn config_serde_roundtrip_and_partial() {
    let c = cfg(0.7);
    let j = serde_json::to_string(&c).unwrap();
    let back: SamplerConfig = serde_json::from_str(&j).unwrap();
    assert_eq!(back, c);
    let partial: SamplerConfig = serde_json::from_str(r#"{"temperature": 0.0}"#).unwrap();
    assert_eq!(partial.temperature, 0.0);
    assert_eq!(partial.top_k, 40);
}

/// A xorshift generator of 64-bit words from `seed` (not zero).
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// `top_k_of` (one pass over the logits) keeps the candidates `top_k` keeps of the whole
/// vocabulary, sorted best first: random logits, many ties, NaN, ±∞, everything masked, rising
/// and falling runs (the floor rising late or never), vocabularies not a multiple of its chunk.
#[test]
fn top_k_of_keeps_what_top_k_keeps() {
    let mut next = xorshift(0x2545f4914f6cdd1du64);
    for case in 0..640 {
        let n: usize = [1, 2, 15, 16, 17, 100, 1000, 5000][case % 8];
        let logits: Vec<f32> = (0..n)
            .map(|i| {
                let r = next();
                match case / 8 % 8 {
                    0 => (r >> 40) as f32 / 1e5,
                    1 => (r % 4) as f32, // ties
                    2 => [f32::NAN, f32::NEG_INFINITY, 1.0, -0.0, 0.0, f32::INFINITY]
                        [(r % 6) as usize],
                    3 => f32::NEG_INFINITY,
                    4 => i as f32,    // rising: every chunk reaches the floor
                    5 => -(i as f32), // falling
                    6 => {
                        if r.is_multiple_of(50) {
                            (r >> 40) as f32
                        } else {
                            f32::NEG_INFINITY
                        }
                    }
                    _ => {
                        if r.is_multiple_of(50) {
                            (r >> 40) as f32
                        } else {
                            f32::NAN
                        }
                    }
                }
            })
            .collect();
        for k in [1, 2, 3, 40, n / 2, n.saturating_sub(1)] {
            if k == 0 || k >= n {
                continue;
            }
            let mut want: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, if l.is_nan() { f32::NEG_INFINITY } else { l }))
                .collect();
            top_k(&mut want, k);
            want.sort_unstable_by(by_logit_desc);
            let mut got = Vec::new();
            top_k_of(&logits, k, &mut got);
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "case {case}, n {n}, k {k}");
        }
    }
}

/// The one-pass maximum: `argmax` is the plain scan (NaN skipped, ±0 equal, the first of
/// equals, 0 when nothing compares), on rows of every length around the 16 lanes, with ties,
/// ±0, NaN and ±∞ at moving places; the greedy sampler picks it, and `best_candidate` too
/// where the candidates hold no NaN.
#[test]
fn one_pass_maxima_match_the_plain_scans() {
    let mut next = xorshift(0x9e3779b97f4a7c15u64);
    let plain_argmax = |l: &[f32]| {
        let mut best: Option<usize> = None;
        for (i, &v) in l.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|b| v > l[b]) {
                best = Some(i);
            }
        }
        best.unwrap_or(0) as u32
    };
    let specials = SPECIAL_LOGITS;
    for case in 0..3000 {
        let n = case % 70 + if case % 7 == 0 { 1000 } else { 0 };
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                let r = next();
                match case / 70 % 4 {
                    0 => specials[(r % 7) as usize],
                    1 => (r % 3) as f32 - 1.0,
                    2 => {
                        if r.is_multiple_of(9) {
                            (r >> 40) as f32
                        } else {
                            f32::NAN
                        }
                    }
                    _ => ((r >> 40) as f32 - 8e6) / 1e3,
                }
            })
            .collect();
        assert_eq!(
            argmax(&logits),
            plain_argmax(&logits),
            "case {case}: {logits:?}"
        );
        if n > 0 {
            let mut greedy = Sampler::new(SamplerConfig::greedy(), n);
            assert_eq!(
                greedy.sample(&logits, &[]),
                argmax(&logits),
                "case {case}: {logits:?}"
            );
            if !logits.iter().any(|l| l.is_nan()) {
                let cands: Vec<(u32, f32)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect();
                assert_eq!(
                    best_candidate(&cands),
                    argmax(&logits),
                    "case {case}: {logits:?}"
                );
            }
        }
    }
}

/// A greedy step picks the same token whether the host's sampler or an executor's argmax
/// picks it: on rows whose maximum is a ±0 tie, all NaN, all −∞, or NaN beside −∞ (the
/// first of ±0, −∞ above NaN, 0 where nothing compares), with or without a repetition
/// penalty (its candidates, where the row has no NaN).
#[test]
fn greedy_pick_is_argmax_on_zero_ties_nan_and_infinite_rows() {
    let (nan, ninf) = (f32::NAN, f32::NEG_INFINITY);
    for (row, want) in [
        (&[-0.0, 0.0][..], 0),
        (&[0.0, -0.0], 0),
        (&[-1.0, -0.0, 0.0], 1),
        (&[nan, nan, nan], 0),
        (&[nan, ninf], 1),
        (&[ninf, nan], 0),
        (&[ninf, ninf], 0),
        (&[nan, -0.0, 0.0], 1),
    ] {
        assert_eq!(argmax(row), want, "{row:?}");
        let mut s = Sampler::new(SamplerConfig::greedy(), row.len());
        assert_eq!(s.sample(row, &[]), want, "greedy sampler: {row:?}");
        if !row.iter().any(|l| l.is_nan()) {
            let cfg = SamplerConfig {
                repeat_penalty: 1.5,
                ..SamplerConfig::greedy()
            };
            let mut s = Sampler::new(cfg, row.len());
            // (A penalty with no history: the candidates' path, no logit changed.)
            assert_eq!(s.sample(row, &[]), want, "penalized: {row:?}");
        }
    }
}

/// Random logits in [-8, 8) (some NaN and ±∞ where `specials`), and a random bias list over
/// them: duplicates, ids past the row, moderate values, ±100 and -inf.
fn biased_case(
    next: &mut impl FnMut() -> u64,
    n: usize,
    specials: bool,
) -> (Vec<f32>, Vec<(u32, f32)>) {
    let logits: Vec<f32> = (0..n)
        .map(|_| {
            let r = next();
            match (specials, r % 97) {
                (true, 0) => f32::NAN,
                (true, 1) => f32::NEG_INFINITY,
                (true, 2) => f32::INFINITY,
                _ => ((r >> 40) as f32 / (1u64 << 24) as f32) * 16.0 - 8.0,
            }
        })
        .collect();
    let bias = (0..1 + next() % 12)
        .map(|_| {
            let id = (next() % (n as u64 + 3)) as u32;
            let b = match next() % 6 {
                0 => -100.0,
                1 => 100.0,
                2 => f32::NEG_INFINITY,
                _ => ((next() >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0,
            };
            (id, b)
        })
        .collect();
    (logits, bias)
}

/// The scalar definition of the bias stage: the logits with each bias added (`-inf + inf`
/// stays masked).
fn add_bias(logits: &[f32], bias: &[(u32, f32)]) -> Vec<f32> {
    let mut out: Vec<f32> = logits
        .iter()
        .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
        .collect();
    for &(id, b) in bias {
        if let Some(l) = out.get_mut(id as usize) {
            *l += b;
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    out
}

/// A biased sampler draws exactly what an unbiased one draws from the logits with the biases
/// added, seed for seed, for every pipeline shape (greedy, top-k's one pass, top-p, min-p,
/// penalties after the bias).
#[test]
fn logit_bias_is_logits_plus_bias() {
    let mut next = xorshift(0x9e3779b97f4a7c15);
    let shapes = [
        cfg(0.0),
        cfg(1.0),
        SamplerConfig {
            top_k: 5,
            ..cfg(0.8)
        },
        SamplerConfig {
            top_p: 0.9,
            min_p: 0.05,
            ..cfg(1.2)
        },
        SamplerConfig {
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            ..cfg(0.8)
        },
        SamplerConfig {
            repeat_penalty: 1.3,
            frequency_penalty: 0.5,
            presence_penalty: 0.2,
            ..cfg(0.7)
        },
        SamplerConfig {
            repeat_penalty: 1.3,
            ..cfg(0.0)
        },
    ];
    for case in 0..400 {
        let n = [1, 7, 16, 33, 300, 2000][case % 6];
        let (logits, bias) = biased_case(&mut next, n, case % 3 == 0);
        let history: Vec<u32> = (0..(next() % 20))
            .map(|_| (next() % n as u64) as u32)
            .collect();
        let plain_row = add_bias(&logits, &bias);
        for shape in &shapes {
            let biased_cfg = SamplerConfig {
                logit_bias: bias.clone(),
                seed: case as u64,
                ..shape.clone()
            };
            let plain_cfg = SamplerConfig {
                seed: case as u64,
                ..shape.clone()
            };
            let mut biased = Sampler::new(biased_cfg, n);
            let mut plain = Sampler::new(plain_cfg, n);
            assert!(!biased.is_argmax());
            for draw in 0..4 {
                assert_eq!(
                    biased.sample(&logits, &history),
                    plain.sample(&plain_row, &history),
                    "case {case} draw {draw} {shape:?} bias {bias:?}"
                );
            }
        }
    }
}

/// +100 forces a token and -100 (or -inf) bans it, greedy or sampled, whatever the logits in
/// [-8, 8); a masked token (a grammar's -inf) stays masked under +100.
#[test]
fn logit_bias_forces_and_bans() {
    let mut next = xorshift(0xdeadbeefcafef00d);
    for case in 0..200 {
        let n = 1000;
        let (logits, _) = biased_case(&mut next, n, false);
        let want = (next() % n as u64) as u32;
        let best = argmax(&logits);
        for t in [0.0, 0.8, 1.5] {
            let force = SamplerConfig {
                logit_bias: vec![(want, 100.0)],
                seed: case,
                ..SamplerConfig::default()
            };
            let mut s = Sampler::new(
                SamplerConfig {
                    temperature: t,
                    ..force
                },
                n,
            );
            for _ in 0..5 {
                assert_eq!(s.sample(&logits, &[]), want, "case {case} t {t}");
            }
            for ban in [-100.0, f32::NEG_INFINITY] {
                let cfg = SamplerConfig {
                    temperature: t,
                    logit_bias: vec![(best, ban)],
                    seed: case,
                    ..SamplerConfig::default()
                };
                let mut s = Sampler::new(cfg, n);
                for _ in 0..20 {
                    assert_ne!(s.sample(&logits, &[]), best, "case {case} t {t} ban {ban}");
                }
            }
        }
        let mut masked = logits.clone();
        masked[want as usize] = f32::NEG_INFINITY;
        let cfg = SamplerConfig {
            logit_bias: vec![(want, 100.0)],
            ..cfg(1.0)
        };
        let mut s = Sampler::new(cfg, n);
        for _ in 0..20 {
            assert_ne!(s.sample(&masked, &[]), want);
        }
    }
}

/// A moderate bias moves the distribution exactly as softmax(logits + bias) says: +ln 3 on one
/// of two equal tokens makes it 3 times as likely (75 %), measured over 20,000 draws.
#[test]
fn moderate_bias_shifts_the_odds() {
    let cfg = SamplerConfig {
        logit_bias: vec![(1, 3f32.ln())],
        ..cfg(1.0)
    };
    let mut s = Sampler::new(cfg, 2);
    let ones = (0..20_000)
        .filter(|_| s.sample(&[0.5, 0.5], &[]) == 1)
        .count();
    // 0.75 ± 4.5 standard deviations (σ ≈ 0.0031).
    assert!((0.736..0.764).contains(&(ones as f64 / 20_000.0)), "{ones}");
}

#[test]
fn logit_bias_validates_and_sanitizes() {
    let with = |b: f32| SamplerConfig {
        logit_bias: vec![(3, 1.0), (4, b)],
        ..cfg(1.0)
    };
    for bad in [f32::NAN, f32::INFINITY] {
        assert!(matches!(
            with(bad).validate(),
            Err(SamplerConfigError::OutOfRange {
                name: "logit_bias",
                ..
            })
        ));
    }
    assert!(with(f32::NEG_INFINITY).validate().is_ok());
    assert!(with(-100.0).validate().is_ok());
    assert_eq!(with(f32::NAN).sanitized().logit_bias, vec![(3, 1.0)]);
    assert_eq!(
        with(f32::INFINITY).sanitized().logit_bias,
        vec![(3, 1.0), (4, f32::MAX)]
    );
    // Greedy with a bias is not the device's plain argmax.
    assert!(Sampler::new(cfg(0.0), 8).is_argmax());
    assert!(!Sampler::new(
        SamplerConfig {
            temperature: 0.0,
            ..with(1.0)
        },
        8
    )
    .is_argmax());
}
