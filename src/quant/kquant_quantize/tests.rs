//! Unit tests of the K-quant reference quantizers. Byte-exactness against `llama-quantize` is
//! pinned by per-block hashes of its output; the rest checks properties ggml's algorithm
//! guarantees (every quant is the nearest point of the grid the block stores), edge cases, and
//! the size of the errors.

use super::super::tests::Rng;
use super::super::{dequantize_row, quantize_row, GgmlType, QuantError};
use super::*;

const KQUANTS: [GgmlType; 5] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quantize_row(ty, x, &mut bytes).unwrap();
    bytes
}

fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// Roughly Gaussian values (a sum of four uniforms) times `scale`.
fn gaussian(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (0..4).map(|_| rng.uniform()).sum::<f32>() * scale)
        .collect()
}

/// The input of the golden test: four super-blocks (Gaussian; negative-only with an outlier;
/// 32-element sub-blocks of magnitudes 1e-4..1e3 with one all-zero sub-block; positive-only).
fn golden_row() -> Vec<f32> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut x = Vec::with_capacity(4 * QK_K);
    for _ in 0..QK_K {
        x.push((0..4).map(|_| rng.uniform()).sum::<f32>());
    }
    for i in 0..QK_K {
        x.push(if i == 77 {
            -9.0
        } else {
            -0.5 * rng.uniform().abs()
        });
    }
    for i in 0..QK_K {
        let g = (i / 32) as i32;
        x.push(if g == 3 {
            0.0
        } else {
            rng.uniform() * 10f32.powi(g - 4)
        });
    }
    for _ in 0..QK_K {
        x.push(0.25 + rng.uniform().abs());
    }
    x
}

/// FNV-1a, 64-bit.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `llama-quantize --pure` (the reference engine's build, no imatrix) wrote these blocks for
/// [`golden_row`] (placed as the first four rows of an F32 model's 256-wide matrix).
#[test]
fn blocks_match_llama_quantize() {
    let golden: [(GgmlType, [u64; 4]); 5] = [
        (
            GgmlType::Q2K,
            [
                0x1a2594bb631d7ad7,
                0xc1194af29ecd2fae,
                0x6def32d2fe276cbc,
                0x8f81fbfc18b756a7,
            ],
        ),
        (
            GgmlType::Q3K,
            [
                0xdeef9d0f8c56b49f,
                0xd8a4796a318e8706,
                0x148cf0c32ed64f0d,
                0x7574a10fcb44706e,
            ],
        ),
        (
            GgmlType::Q4K,
            [
                0xbb4ce964f3755faa,
                0x246c3c4a2f4c3908,
                0xca044ecc0ea98532,
                0x09bc44aa151d04b8,
            ],
        ),
        (
            GgmlType::Q5K,
            [
                0x16b42f97475b5109,
                0x5d9b4daa88226038,
                0xf1eb5e058e09e3ae,
                0x41ad4882de83bdb4,
            ],
        ),
        (
            GgmlType::Q6K,
            [
                0xeb554676545a9b48,
                0xe8f6cc4fc48371d9,
                0xbb57032f504cdd07,
                0x7dace32fa6938609,
            ],
        ),
    ];
    let x = golden_row();
    for (ty, hashes) in golden {
        let bytes = quantize(ty, &x);
        for (b, (block, want)) in bytes.chunks(ty.type_size()).zip(hashes).enumerate() {
            assert_eq!(
                fnv1a(block),
                want,
                "{ty} block {b} differs from llama-quantize"
            );
        }
    }
}

/// The dequantization grid of sub-block `s` of a block: values `d * q - m` for `q` in
/// `qmin..=qmax`, as `(d, m, qmin, qmax)`, and the sub-block length.
fn grid(ty: GgmlType, block: &[u8], s: usize) -> (f32, f32, i32, i32) {
    let f16 = |o: usize| F16Le([block[o], block[o + 1]]).to_f32();
    match ty {
        GgmlType::Q2K => {
            let sc = block[s];
            let (d, dmin) = (f16(80), f16(82));
            (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32, 0, 3)
        }
        GgmlType::Q3K => {
            let scales: [u8; 12] = block[96..108].try_into().unwrap();
            (f16(108) * q3k_scales(&scales)[s] as f32, 0.0, -4, 3)
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let scales: [u8; 12] = block[4..16].try_into().unwrap();
            let (sc, m) = scale_min_k4(s, &scales);
            let qmax = if ty == GgmlType::Q4K { 15 } else { 31 };
            (f16(0) * sc as f32, f16(2) * m as f32, 0, qmax)
        }
        GgmlType::Q6K => (f16(208) * (block[192 + s] as i8) as f32, 0.0, -32, 31),
        _ => unreachable!(),
    }
}

fn sub_block_len(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => 32,
        _ => 16,
    }
}

/// Every K quantizer ends by recomputing each quant as `nearest_int((x + m) / d)` clamped to
/// the format's range, against the scales it stored: so every dequantized value is the grid
/// point nearest to the input (an element beyond the grid gets its nearest end), up to float
/// rounding. A wrong bit layout or scale packing breaks this.
fn assert_nearest_on_grid(ty: GgmlType, x: &[f32], bytes: &[u8], what: &str) {
    let back = dequantize(ty, bytes, x.len());
    let sub = sub_block_len(ty);
    for (b, block) in bytes.chunks(ty.type_size()).enumerate() {
        for s in 0..QK_K / sub {
            let (d, m, qmin, qmax) = grid(ty, block, s);
            for i in b * QK_K + s * sub..b * QK_K + (s + 1) * sub {
                let nearest = (qmin..=qmax)
                    .map(|q| (x[i] - (d * q as f32 - m)).abs())
                    .fold(f32::INFINITY, f32::min);
                let slack = 4.0 * f32::EPSILON * (x[i].abs() + d.abs() * 32.0 + m.abs());
                let err = (x[i] - back[i]).abs();
                assert!(
                    back[i].is_finite() && err <= nearest + slack,
                    "{ty} {what}: element {i}: {} -> {}, error {err} but the grid (d {d}, m {m}) \
                     has a point at distance {nearest}",
                    x[i],
                    back[i]
                );
            }
        }
    }
}

/// Rows of one to several super-blocks covering the edge cases.
fn edge_rows() -> Vec<(&'static str, Vec<f32>)> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut outlier = gaussian(&mut rng, QK_K, 0.01);
    outlier[77] = 40.0;
    let mut zero_sub_blocks = gaussian(&mut rng, 2 * QK_K, 1.0);
    zero_sub_blocks[32..64].fill(0.0);
    zero_sub_blocks[QK_K + 128..QK_K + 144].fill(0.0);
    let mut lone = vec![0.0; QK_K];
    lone[100] = -1.0;
    vec![
        ("random", gaussian(&mut rng, QK_K, 1.0)),
        ("seven blocks", gaussian(&mut rng, 7 * QK_K, 3.0)),
        ("all zero", vec![0.0; 2 * QK_K]),
        ("constant positive", vec![0.7; QK_K]),
        ("constant negative", vec![-0.7; QK_K]),
        ("outlier", outlier),
        ("lone value", lone),
        ("zero sub-blocks", zero_sub_blocks),
        (
            "negative only",
            gaussian(&mut rng, QK_K, 1.0)
                .iter()
                .map(|v| -v.abs())
                .collect(),
        ),
        (
            "positive only",
            gaussian(&mut rng, QK_K, 1.0)
                .iter()
                .map(|v| v.abs())
                .collect(),
        ),
        ("large", gaussian(&mut rng, QK_K, 1.0e3)),
        ("fp16-subnormal scales", gaussian(&mut rng, QK_K, 1.0e-4)),
        ("tiny", gaussian(&mut rng, QK_K, 1.0e-6)),
        ("below fp16", gaussian(&mut rng, QK_K, 1.0e-9)),
        ("below GROUP_MAX_EPS", gaussian(&mut rng, QK_K, 1.0e-20)),
        (
            "ties",
            (0..QK_K).map(|i| (i % 9) as f32 * 0.5 - 2.0).collect(),
        ),
    ]
}

#[test]
fn quants_are_the_nearest_points_of_the_stored_grid() {
    let mut rng = Rng(7);
    let mut rows = edge_rows();
    for k in 0..8 {
        rows.push((
            "random rows",
            gaussian(&mut rng, 4 * QK_K, 10f32.powi(k - 4)),
        ));
    }
    for ty in KQUANTS {
        for (what, x) in &rows {
            assert_nearest_on_grid(ty, x, &quantize(ty, x), what);
        }
    }
}

#[test]
fn edge_cases_round_trip() {
    let rows = edge_rows();
    let row = |name: &str| rows.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    for ty in KQUANTS {
        let rt = |x: &[f32]| dequantize(ty, &quantize(ty, x), x.len());
        // Zeros (and values too small for any scale) come back as exact zeros.
        for name in ["all zero", "below GROUP_MAX_EPS", "below fp16"] {
            assert!(
                rt(&row(name)).iter().all(|&v| v == 0.0),
                "{ty} {name}: not all zero"
            );
        }
        // Constant rows come back within the precision of the fp16 scale that stores them.
        for c in [0.7f32, -0.7] {
            let back = rt(&vec![c; QK_K]);
            for v in back {
                assert!(
                    (v - c).abs() <= c.abs() / 1024.0,
                    "{ty} constant {c} -> {v}"
                );
            }
        }
        // A single large value sets the scale and is kept to fp16 precision.
        let x = row("outlier");
        let back = rt(&x);
        assert!(
            (back[77] - x[77]).abs() <= x[77] / 1024.0,
            "{ty} outlier {} -> {}",
            x[77],
            back[77]
        );
        let x = row("lone value");
        let back = rt(&x);
        assert!((back[100] + 1.0).abs() <= 1.0 / 1024.0, "{ty} lone value");
        // Values around 1e-5 need scales in fp16's subnormal range; the result stays finite
        // (the grid property above bounds it) and the stored super-scale is subnormal.
        let x = row("fp16-subnormal scales");
        let bytes = quantize(ty, &x);
        let d_at = match ty {
            GgmlType::Q2K => 80,
            GgmlType::Q3K => 108,
            GgmlType::Q6K => 208,
            _ => 0,
        };
        let d = F16Le([bytes[d_at], bytes[d_at + 1]]).to_f32().abs();
        assert!(
            d > 0.0 && d < 6.2e-5,
            "{ty}: super-scale {d} is not an fp16 subnormal"
        );
        assert!(rt(&x).iter().all(|v| v.is_finite()));
    }
}

/// Relative RMS error of a round trip.
fn rel_rmse(ty: GgmlType, x: &[f32]) -> f64 {
    let back = dequantize(ty, &quantize(ty, x), x.len());
    let se: f64 = x
        .iter()
        .zip(&back)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let sx: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    (se / sx).sqrt()
}

/// On Gaussian rows each format stays under its error level (ggml's algorithm gives about
/// 0.29, 0.146, 0.069, 0.035, 0.017: each extra bit roughly halves it) and errors shrink with
/// every bit. On one-signed rows the order holds too, and the formats that store a minimum
/// (Q2_K, Q4_K, Q5_K) do clearly better than on Gaussian rows, spending no level on the
/// absent sign (about 0.18, 0.038, 0.020), while the symmetric Q3_K and Q6_K do not gain.
#[test]
fn errors_are_bounded_and_ordered() {
    let bounds = [0.33, 0.17, 0.08, 0.04, 0.02];
    let mut rng = Rng(11);
    let errors = |x: &[f32]| -> Vec<f64> { KQUANTS.iter().map(|&ty| rel_rmse(ty, x)).collect() };
    let gauss = errors(&gaussian(&mut rng, 64 * QK_K, 1.0));
    let neg: Vec<f32> = gaussian(&mut rng, 64 * QK_K, 1.0)
        .iter()
        .map(|v| -v.abs())
        .collect();
    let neg = errors(&neg);
    for (what, errs) in [("gaussian", &gauss), ("negative only", &neg)] {
        for ((ty, err), bound) in KQUANTS.iter().zip(errs).zip(bounds) {
            assert!(
                *err < bound,
                "{ty} {what}: relative rms error {err} >= {bound}"
            );
        }
        for (i, pair) in errs.windows(2).enumerate() {
            let factor = if what == "gaussian" { 1.6 } else { 1.0 };
            assert!(
                pair[1] * factor < pair[0],
                "{what}: {} error {} is not below {} error {} by {factor}x",
                KQUANTS[i + 1],
                pair[1],
                KQUANTS[i],
                pair[0]
            );
        }
    }
    for (i, ty) in KQUANTS.iter().enumerate() {
        let has_min = matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q5K);
        assert_eq!(
            neg[i] < 0.7 * gauss[i],
            has_min,
            "{ty}: one-signed error {} vs gaussian {}",
            neg[i],
            gauss[i]
        );
    }
}

/// Re-quantizing a dequantized row is not a fixed point of ggml's algorithm in general (the
/// scale search sees a different row: on random rows 1-50% of blocks change, depending on the
/// format), but it is for rows the algorithm represents exactly: zeros, and constant rows in
/// the formats with a minimum (a constant is one end of their grid). Q6_K and Q3_K, symmetric,
/// map a positive constant to -32 (resp. -4) times a negative scale and search again.
#[test]
fn exactly_represented_rows_are_fixed_points() {
    for ty in KQUANTS {
        let mut rows = vec![vec![0.0f32; 2 * QK_K]];
        if matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q5K) {
            rows.push(vec![0.7; QK_K]);
            rows.push(vec![-0.7; QK_K]);
        }
        for x in rows {
            let bytes = quantize(ty, &x);
            let back = dequantize(ty, &bytes, x.len());
            assert_eq!(quantize(ty, &back), bytes, "{ty} row of {}", x[0]);
        }
    }
}

/// Super-blocks are quantized independently: a row is the concatenation of its blocks alone.
#[test]
fn blocks_are_independent() {
    let mut rng = Rng(3);
    let x = gaussian(&mut rng, 7 * QK_K, 2.0);
    for ty in KQUANTS {
        let whole = quantize(ty, &x);
        let parts: Vec<u8> = x.chunks(QK_K).flat_map(|b| quantize(ty, b)).collect();
        assert_eq!(whole, parts, "{ty}");
    }
}

/// The quantizers write every byte of a block, whatever the buffer held before.
#[test]
fn every_byte_is_written() {
    let mut rng = Rng(5);
    let x = gaussian(&mut rng, 2 * QK_K, 1.0);
    let zeros = vec![0.0f32; QK_K];
    for ty in KQUANTS {
        for row in [&x, &zeros] {
            let len = ty.row_bytes(row.len()).unwrap();
            let (mut a, mut b) = (vec![0u8; len], vec![0xA5u8; len]);
            quantize_row(ty, row, &mut a).unwrap();
            quantize_row(ty, row, &mut b).unwrap();
            assert_eq!(a, b, "{ty}");
        }
    }
}

#[test]
fn rows_that_are_not_whole_super_blocks_are_refused() {
    for ty in KQUANTS {
        for n in [1, 32, 255, 257, 288, 511] {
            let x = vec![1.0f32; n];
            let mut out = vec![0u8; 4 * ty.type_size()];
            let err = quantize_row(ty, &x, &mut out).unwrap_err();
            assert_eq!(
                err,
                QuantError::NotBlockMultiple { ty, n, block: 256 },
                "{ty} n {n}"
            );
            assert!(err.to_string().contains("256-element blocks"), "{err}");
        }
        let mut short = vec![0u8; ty.type_size() - 1];
        assert!(matches!(
            quantize_row(ty, &[0.0; 256], &mut short),
            Err(QuantError::ByteLength { .. })
        ));
    }
}
