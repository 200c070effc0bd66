//! IQ2_XXS, IQ2_XS and IQ2_S against llama.cpp at the block level (no fixture model holds them:
//! the reference's `llama-quantize` wants an importance matrix for two of them).
//! `tests/golden/iq2_blocks.json` (scripts/make-fixtures.py `--only-iq2-blocks`) holds, per
//! format, super-blocks written by ggml's own quantizer and super-blocks of random bytes, and
//! every value ggml's `to_float` makes of them: kiln's dequantizers must give the same bits, on
//! every kernel table, and every table's products must be the reference engine's order.

mod common;

use kiln::quant::kquant_order::row_dot;
use kiln::quant::{dequantize_row, kernels_for, GgmlType, Isa};

struct Case {
    ty: GgmlType,
    n: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn cases() -> Vec<Case> {
    let path = common::golden_dir().join("iq2_blocks.json");
    let text = std::fs::read_to_string(&path).expect("iq2_blocks.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("iq2_blocks.json is JSON");
    let mut out = Vec::new();
    for (name, t) in json.as_object().expect("object of formats") {
        let ty = GgmlType::from_name(name).expect("known type");
        let n = t["n"].as_u64().unwrap() as usize;
        let bytes = hex(t["bytes"].as_str().unwrap());
        assert_eq!(ty.row_bytes(n), Some(bytes.len()), "{name}: size");
        let values: Vec<f32> = hex(t["values"].as_str().unwrap())
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(values.len(), n, "{name}: values");
        out.push(Case {
            ty,
            n,
            bytes,
            values,
        });
    }
    out
}

fn check(case: &Case, got: &[f32], how: &str) {
    for (i, (g, w)) in got.iter().zip(&case.values).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{} ({how}): element {i}: {g} vs {w}",
            case.ty
        );
    }
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
            (k.gemm)(n, &case.bytes, row_w, rows, &xq, row_x, nx, &mut out, rows);
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
