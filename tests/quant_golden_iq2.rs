//! IQ2_XXS, IQ2_XS and IQ2_S against llama.cpp at the block level (no fixture model holds them:
//! the reference's `llama-quantize` wants an importance matrix for two of them).
//! `tests/golden/iq2_blocks.json` (scripts/make-fixtures.py `--only-iq2-blocks`) holds, per
//! format, super-blocks written by ggml's own quantizer and super-blocks of random bytes, and
//! every value ggml's `to_float` makes of them: kiln's dequantizers must give the same bits, on
//! every kernel table, and every table's products must be the reference engine's order, and
//! equal, bit for bit, its CPU backend's own `vec_dot` of them with its Q8_K activations.

mod common;

use kiln::quant::kquant_order::row_dot;
use kiln::quant::{dequantize_row, kernels_for, GemmArgs, GgmlType, Isa};

struct Case {
    ty: GgmlType,
    n: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
    /// Two Q8_K rows of 512 made by the reference's `from_float`.
    acts: Vec<u8>,
    /// The reference's `vec_dot` of weight row `i` (512 elements) with activation row `j`.
    dots: Vec<Vec<f32>>,
    /// Nine Q8_K rows of 512 (the reference's `from_float`), and its `ggml_mul_mat` of the
    /// weight rows by them: `batch[j][i]` (a batch the reference takes through its tiled
    /// kernel).
    batch_acts: Vec<u8>,
    batch: Vec<Vec<f32>>,
}

fn cases() -> Vec<Case> {
    let path = common::golden_dir().join("iq2_blocks.json");
    let text = std::fs::read_to_string(&path).expect("iq2_blocks.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("iq2_blocks.json is JSON");
    let mut out = Vec::new();
    for (name, t) in json.as_object().expect("object of formats") {
        let ty = GgmlType::from_name(name).expect("known type");
        let n = t["n"].as_u64().unwrap() as usize;
        let bytes = common::hex(t["bytes"].as_str().unwrap());
        assert_eq!(ty.row_bytes(n), Some(bytes.len()), "{name}: size");
        let values = common::f32s_le(t["values"].as_str().unwrap());
        assert_eq!(values.len(), n, "{name}: values");
        let f32_hex = |v: &serde_json::Value| {
            let b = common::hex(v.as_str().unwrap());
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        let matrix = |key: &str| -> Vec<Vec<f32>> {
            (t[key].as_array().unwrap().iter())
                .map(|r| r.as_array().unwrap().iter().map(f32_hex).collect())
                .collect()
        };
        let dots = matrix("dots");
        let batch = matrix("batch");
        out.push(Case {
            ty,
            n,
            bytes,
            values,
            acts: common::hex(t["acts"].as_str().unwrap()),
            dots,
            batch_acts: common::hex(t["batch_acts"].as_str().unwrap()),
            batch,
        });
    }
    out
}

fn check(case: &Case, got: &[f32], how: &str) {
    common::assert_bits_eq(got, &case.values, &format!("{} ({how})", case.ty));
}

#[test]
fn dequantize_matches_llama_cpp_bit_for_bit() {
    let cases = cases();
    let seen: std::collections::BTreeSet<GgmlType> = cases.iter().map(|c| c.ty).collect();
    let all = [GgmlType::IQ2XXS, GgmlType::IQ2XS, GgmlType::IQ2S];
    assert_eq!(seen, all.into_iter().collect(), "every 2-bit i-quant");
    for case in &cases {
        let mut v = vec![0f32; case.n];
        dequantize_row(case.ty, &case.bytes, &mut v).unwrap();
        check(case, &v, "dequantize_row");
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            let mut v = vec![0f32; case.n];
            (k.dequantize)(&case.bytes, &mut v);
            check(case, &v, isa.name());
        }
    }
}

/// Every tier's single-row product is the reference CPU backend's `vec_dot`, bit for bit.
#[test]
fn vec_dot_equals_the_reference_backend() {
    let n = 512;
    for case in cases() {
        let row_w = case.ty.row_bytes(n).unwrap();
        let row_x = GgmlType::Q8K.row_bytes(n).unwrap();
        assert_eq!(case.dots.len(), case.n / n, "{}: a dot per row", case.ty);
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            for (i, want) in case.dots.iter().enumerate() {
                for (j, &want) in want.iter().enumerate() {
                    let w = &case.bytes[i * row_w..(i + 1) * row_w];
                    let x = &case.acts[j * row_x..(j + 1) * row_x];
                    let got = (k.vec_dot)(n, w, x);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {} row {i} act {j}: {got} vs {want}",
                        case.ty,
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Every tier's gemm of a batch of 9 is the reference backend's matrix product (its tiled
/// kernel), bit for bit.
#[test]
fn gemm_equals_the_reference_backend_batch() {
    let n = 512;
    for case in cases() {
        let rows = case.n / n;
        let row_w = case.ty.row_bytes(n).unwrap();
        let row_x = GgmlType::Q8K.row_bytes(n).unwrap();
        let nx = case.batch.len();
        assert_eq!(nx, 9, "{}: the batch", case.ty);
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            let mut out = vec![0f32; rows * nx];
            let x = &case.batch_acts;
            (k.gemm)(GemmArgs::new(
                n,
                (&case.bytes, row_w, rows),
                (x, row_x, nx),
                (&mut out, rows),
            ));
            for (j, want) in case.batch.iter().enumerate() {
                for (i, &want) in want.iter().enumerate() {
                    let got = out[j * rows + i];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {} row {i} act {j}: {got} vs {want}",
                        case.ty,
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Every tier's products of the reference's blocks with random activations: the reference
/// engine's order bit for bit (single rows and a tiled batch), and the exact dot of the
/// dequantized rows to float-accumulation noise.
#[test]
fn kernels_on_llama_cpp_blocks() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    for case in cases() {
        let n = 512; // two super-blocks a row
        let rows = case.n / n;
        let row_w = case.ty.row_bytes(n).unwrap();
        let nx = 9;
        let x: Vec<f32> = (0..n * nx).map(|_| uniform()).collect();
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            let row_x = k.act.row_bytes(n).unwrap();
            let mut xq = vec![0u8; row_x * nx];
            for (xr, q) in x.chunks_exact(n).zip(xq.chunks_exact_mut(row_x)) {
                (k.quantize_act)(xr, q);
            }
            let mut out = vec![0f32; rows * nx];
            (k.gemm)(GemmArgs::new(
                n,
                (&case.bytes, row_w, rows),
                (&xq, row_x, nx),
                (&mut out, rows),
            ));
            for j in 0..nx {
                let xr = &xq[j * row_x..(j + 1) * row_x];
                let mut xd = vec![0f32; n];
                dequantize_row(k.act, xr, &mut xd).unwrap();
                for i in 0..rows {
                    let wr = &case.bytes[i * row_w..(i + 1) * row_w];
                    let what = format!("{} {} row {i} act {j}", case.ty, isa.name());
                    let single = (k.vec_dot)(n, wr, xr);
                    let lanes = row_dot(case.ty, wr, xr, n, 1, 0).unwrap();
                    assert_eq!(single.to_bits(), lanes.to_bits(), "{what}: vec_dot");
                    let tiled = row_dot(case.ty, wr, xr, n, nx, j).unwrap();
                    let got = out[j * rows + i];
                    assert_eq!(got.to_bits(), tiled.to_bits(), "{what}: gemm");
                    let wv = &case.values[i * n..(i + 1) * n];
                    let (exact, mag) = wv.iter().zip(&xd).fold((0f64, 0f64), |(s, m), (&a, &b)| {
                        let p = a as f64 * b as f64;
                        (s + p, m + p.abs())
                    });
                    for v in [single, got] {
                        assert!(
                            (v as f64 - exact).abs() <= 1e-5 * mag,
                            "{what}: {v} vs exact {exact}"
                        );
                    }
                }
            }
        }
    }
}
