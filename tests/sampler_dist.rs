//! Statistical and property checks of the sampler. Every run uses fixed seeds, so these tests are
//! deterministic: the thresholds were chosen with margin, but a given build either always passes
//! or always fails.

use kiln::sampler::{argmax, log_softmax, softmax_in_place, Sampler, SamplerConfig};
use proptest::prelude::*;

fn plain(temperature: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed,
        logit_bias: Vec::new(),
    }
}

/// Pearson's chi-square statistic of observed counts against expected probabilities.
fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> f64 {
    counts
        .iter()
        .zip(probs)
        .filter(|(_, &p)| p > 0.0)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

fn frequencies(s: &mut Sampler, logits: &[f32], n: u64) -> Vec<u64> {
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]) as usize] += 1;
    }
    counts
}

#[test]
fn frequencies_match_softmax_chi_square() {
    let logits = [1.0f32, 0.2, -0.5, 2.0, 0.0, -1.5, 1.2, 0.7];
    let mut p = logits;
    softmax_in_place(&mut p);
    let probs: Vec<f64> = p.iter().map(|&x| x as f64).collect();
    let n = 200_000;
    for seed in [1u64, 2, 3] {
        let counts = frequencies(
            &mut Sampler::new(plain(1.0, seed), logits.len()),
            &logits,
            n,
        );
        let chi = chi_square(&counts, &probs, n);
        // df = 7: the 99.9% quantile is 24.32.
        assert!(
            chi < 24.32,
            "seed {seed}: chi-square {chi:.2}, counts {counts:?}"
        );
    }
}

#[test]
fn frequencies_match_truncated_tempered_distribution() {
    // top-k 3 at temperature 0.5: the three best tokens, renormalized, with logits doubled.
    let logits = [1.0f32, 0.2, -0.5, 2.0, 0.0, -1.5, 1.2, 0.7];
    let kept = [0usize, 3, 6];
    let mut expected = vec![0.0f64; logits.len()];
    let z: f64 = kept.iter().map(|&i| (logits[i] as f64 / 0.5).exp()).sum();
    for &i in &kept {
        expected[i] = (logits[i] as f64 / 0.5).exp() / z;
    }
    let cfg = SamplerConfig {
        top_k: 3,
        ..plain(0.5, 11)
    };
    let n = 100_000;
    let counts = frequencies(&mut Sampler::new(cfg, logits.len()), &logits, n);
    for (i, &c) in counts.iter().enumerate() {
        if !kept.contains(&i) {
            assert_eq!(c, 0, "token {i} was filtered out but drawn");
        }
    }
    let chi = chi_square(&counts, &expected, n);
    // df = 2: the 99.9% quantile is 13.82.
    assert!(chi < 13.82, "chi-square {chi:.2}, counts {counts:?}");
}

#[test]
fn frequencies_match_nucleus_plus_min_p() {
    // probs 0.4, 0.3, 0.15, 0.1, 0.05: top-p 0.8 keeps {0, 1, 2} (mass 0.85); min-p 0.4 then
    // drops token 2 (0.15 < 0.4 * 0.4 = 0.16); the draw renormalizes over {0, 1}.
    let p = [0.4f32, 0.3, 0.15, 0.1, 0.05];
    let logits: Vec<f32> = p.iter().map(|x| x.ln()).collect();
    let cfg = SamplerConfig {
        top_p: 0.8,
        min_p: 0.4,
        ..plain(1.0, 5)
    };
    let n = 100_000;
    let counts = frequencies(&mut Sampler::new(cfg, 5), &logits, n);
    assert_eq!(&counts[2..], &[0, 0, 0], "{counts:?}");
    let expected = [4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0, 0.0];
    let chi = chi_square(&counts, &expected, n);
    // df = 1: the 99.9% quantile is 10.83.
    assert!(chi < 10.83, "chi-square {chi:.2}, counts {counts:?}");
}

#[test]
fn same_seed_same_sequence_and_reseed() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 / 200.0)
        .collect();
    let run = |seed| {
        let mut s = Sampler::new(
            SamplerConfig {
                seed,
                ..SamplerConfig::default()
            },
            1000,
        );
        (0..64)
            .map(|_| s.sample(&logits, &[]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(1234), run(1234));
    assert_ne!(run(1234), run(4321));
    let mut s = Sampler::new(
        SamplerConfig {
            seed: 77,
            ..SamplerConfig::default()
        },
        1000,
    );
    let first: Vec<u32> = (0..32).map(|_| s.sample(&logits, &[])).collect();
    s.reseed(77);
    let again: Vec<u32> = (0..32).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(first, again);
}

#[test]
fn seeded_stream_is_stable_across_versions() {
    // Pinned output: if this changes, seeded generations change for users. Only update it for a
    // deliberate change of the RNG or pipeline, and say so in the changelog.
    let logits = [0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
    let mut s = Sampler::new(plain(1.0, 2024), 8);
    let got: Vec<u32> = (0..16).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(got, PINNED);
}

/// Cross-checked against an independent Python model of the same pipeline (splitmix64 seeding,
/// xoshiro256**, 53-bit uniform, f64 softmax, inverse CDF).
const PINNED: [u32; 16] = [2, 7, 3, 4, 7, 5, 6, 5, 6, 2, 7, 7, 7, 6, 7, 4];

#[test]
fn penalties_steer_away_from_repeats() {
    // Token 5 is best; after repeating it the penalized sampler must pick another.
    let logits = [0.0f32, 1.0, 2.0, 2.9, 1.0, 3.0];
    let mut g = Sampler::new(plain(0.0, 0), 6);
    assert_eq!(g.sample(&logits, &[5, 5, 5]), 5);
    let mut p = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.1,
            ..plain(0.0, 0)
        },
        6,
    );
    assert_eq!(p.sample(&logits, &[5, 5, 5]), 3);
    // 3.0/1.1 = 2.73 still beats 2.9/1.1 = 2.64 and 2.0 ...
    assert_eq!(p.sample(&logits, &[5, 3]), 5);
    // ... but 3.0/1.6 = 1.88 and 2.9/1.6 = 1.81 fall below token 2's 2.0.
    let mut p = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.6,
            ..plain(0.0, 0)
        },
        6,
    );
    assert_eq!(p.sample(&logits, &[5, 3]), 2);
}

#[test]
fn all_masked_row_is_valid() {
    for cfg in [
        plain(0.0, 0),
        plain(1.0, 0),
        SamplerConfig {
            seed: 0,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            top_p: 0.0,
            min_p: 1.0,
            top_k: 1,
            ..plain(1.0, 0)
        },
    ] {
        let mut s = Sampler::new(cfg, 10);
        for row in [[f32::NEG_INFINITY; 10], [f32::NAN; 10]] {
            let t = s.sample(&row, &[1, 2, 3]);
            assert!(t < 10);
        }
    }
    let mut p = [f32::NEG_INFINITY; 10];
    softmax_in_place(&mut p);
    assert!(p.iter().all(|x| x.is_finite()));
    assert!(log_softmax(&[f32::NEG_INFINITY; 10], 3).is_finite());
}

fn any_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => -30.0f32..30.0,
        1 => Just(f32::NAN),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
    ]
}

fn any_config() -> impl Strategy<Value = SamplerConfig> {
    (
        -0.5f32..3.0,
        0usize..12,
        0.0f32..=1.0,
        0.0f32..=1.0,
        0.5f32..2.0,
        0usize..8,
        -1.0f32..1.0,
        -1.0f32..1.0,
        any::<u64>(),
        // Biases on ids in and past small rows, bans among them.
        proptest::collection::vec(
            (
                0u32..40,
                prop_oneof![-100.0f32..100.0, Just(f32::NEG_INFINITY)],
            ),
            0..4,
        ),
    )
        .prop_map(
            |(temperature, top_k, top_p, min_p, rp, n, f, pr, seed, logit_bias)| SamplerConfig {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty: rp,
                repeat_last_n: n,
                frequency_penalty: f,
                presence_penalty: pr,
                seed,
                logit_bias,
            },
        )
}

proptest! {
    #[test]
    fn output_is_always_a_valid_id(
        logits in prop::collection::vec(any_logit(), 1..300),
        history in prop::collection::vec(0u32..400, 0..20),
        cfg in any_config(),
    ) {
        let mut s = Sampler::new(cfg, logits.len());
        for _ in 0..4 {
            let t = s.sample(&logits, &history) as usize;
            prop_assert!(t < logits.len());
            // A NaN or -inf token is only possible when nothing better exists.
            let has_finite = logits.iter().any(|x| x.is_finite() || *x == f32::INFINITY);
            if has_finite && s.config().repeat_last_n == 0 {
                prop_assert!(!logits[t].is_nan() && logits[t] != f32::NEG_INFINITY);
            }
        }
    }

    #[test]
    fn greedy_equals_argmax(
        logits in prop::collection::vec(any_logit(), 1..300),
        seed in any::<u64>(),
        top_k in 0usize..10,
    ) {
        let cfg = SamplerConfig { top_k, seed, ..plain(0.0, 0) };
        let mut s = Sampler::new(cfg, logits.len());
        prop_assert_eq!(s.sample(&logits, &[1, 2, 3]), argmax(&logits));
    }

    #[test]
    fn softmax_sums_to_one(logits in prop::collection::vec(any_logit(), 1..300)) {
        let mut p = logits.clone();
        softmax_in_place(&mut p);
        let sum: f64 = p.iter().map(|&x| x as f64).sum();
        prop_assert!(p.iter().all(|x| x.is_finite() && *x >= 0.0));
        prop_assert!((sum - 1.0).abs() < 1e-4, "sum {}", sum);
        for (t, &pt) in p.iter().enumerate() {
            let l = log_softmax(&logits, t as u32);
            prop_assert!(!l.is_nan());
            if pt > 1e-30 {
                prop_assert!((l - (pt as f64).ln()).abs() < 1e-3, "{} vs {}", l, pt);
            }
        }
    }
}
