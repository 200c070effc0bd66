//! Dequantization against llama.cpp: for three tensors of every `random-llama-*` model (and two
//! MXFP4 expert tensors of `random-gpt-oss-mxfp4`), the raw
//! bytes at `data_offset` (an absolute file offset) are dequantized and compared with the
//! reference engine's first 64 values (exactly) and whole-tensor sum / sum of squares.
//! The bytes are read directly from the file so this does not depend on the GGUF reader.

mod common;

use kiln::quant::{dequantize_row, kernels_for, GemmArgs, GgmlType, Isa};
use std::io::{Read, Seek, SeekFrom};

struct Case {
    file: String,
    tensor: String,
    ty: GgmlType,
    n: usize,
    first: Vec<f64>,
    sum: f64,
    sum_sq: f64,
    bytes: Vec<u8>,
}

fn cases() -> Vec<Case> {
    let path = common::golden_dir().join("dequant.json");
    let text = std::fs::read_to_string(&path).expect("dequant.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("dequant.json is JSON");
    let mut out = Vec::new();
    for (file, tensors) in json.as_object().expect("object of files") {
        let model = common::random_model(file.trim_end_matches(".gguf"));
        let mut f =
            std::fs::File::open(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        for (tensor, t) in tensors.as_object().expect("object of tensors") {
            let ty = GgmlType::from_name(t["type"].as_str().unwrap()).expect("known type");
            let n = t["n"].as_u64().unwrap() as usize;
            let offset = t["data_offset"].as_u64().unwrap();
            let n_bytes = t["n_bytes"].as_u64().unwrap() as usize;
            assert_eq!(ty.row_bytes(n), Some(n_bytes), "{file}/{tensor}: size");
            let mut bytes = vec![0u8; n_bytes];
            f.seek(SeekFrom::Start(offset)).unwrap();
            f.read_exact(&mut bytes).unwrap();
            out.push(Case {
                file: file.clone(),
                tensor: tensor.clone(),
                ty,
                n,
                first: t["first"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect(),
                sum: t["sum"].as_f64().unwrap(),
                sum_sq: t["sum_sq"].as_f64().unwrap(),
                bytes,
            });
        }
    }
    out
}

fn check(case: &Case, values: &[f32], how: &str) {
    let name = format!("{}/{} ({}, {how})", case.file, case.tensor, case.ty);
    for (i, (&got, &want)) in values.iter().zip(&case.first).enumerate() {
        // The JSON holds up to 17 significant digits (some values printed with 16), always
        // enough to name one f32 uniquely: compare as f32, bit for bit.
        assert_eq!(
            got.to_bits(),
            (want as f32).to_bits(),
            "{name}: element {i}: {got} vs {want}"
        );
    }
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    let sum_sq: f64 = values.iter().map(|&v| v as f64 * v as f64).sum();
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-30);
    // `sum` can be near zero from cancellation: judge it against the sum of magnitudes.
    let abs_sum: f64 = values.iter().map(|&v| (v as f64).abs()).sum();
    assert!(
        (sum - case.sum).abs() <= 1e-6 * abs_sum.max(1e-30),
        "{name}: sum {sum} vs {}",
        case.sum
    );
    assert!(
        rel(sum_sq, case.sum_sq) <= 1e-6,
        "{name}: sum_sq {sum_sq} vs {}",
        case.sum_sq
    );
}

#[test]
fn dequantize_matches_llama_cpp() {
    let cases = cases();
    assert_eq!(cases.len(), 47, "15 files x 3 tensors, and 2 MXFP4 tensors");
    let mut seen = std::collections::BTreeSet::new();
    for case in &cases {
        let mut values = vec![0f32; case.n];
        dequantize_row(case.ty, &case.bytes, &mut values).unwrap();
        check(case, &values, "dequantize_row");
        seen.insert(case.ty);
    }
    assert_eq!(seen.len(), 16, "every weight format covered: {seen:?}");
}

/// The `dequantize` entry of every available kernel table gives the same bits.
#[test]
fn kernel_dequantize_matches_llama_cpp() {
    for case in cases() {
        for isa in Isa::available() {
            let Ok(k) = kernels_for(case.ty, isa) else {
                continue;
            };
            let mut values = vec![0f32; case.n];
            (k.dequantize)(&case.bytes, &mut values);
            check(&case, &values, isa.name());
        }
    }
}

/// Every kernel table on every ISA, on blocks written by llama.cpp's own quantizer (the golden
/// tensors): each row's dot with a random activation agrees with the exact dot of the
/// dequantized row and the dequantized activation, to float-accumulation noise (and, for the
/// Q8_1 partners, the fp16 rounding of the activation block sums).
#[test]
fn kernels_on_llama_cpp_blocks() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    for case in cases() {
        let n = 256; // ne[0] of every golden tensor
        let row_bytes = case.ty.row_bytes(n).unwrap();
        let rows = case.bytes.len() / row_bytes;
        let x: Vec<f32> = (0..n).map(|_| uniform()).collect();
        for isa in Isa::available() {
            let Ok(k) = kernels_for(case.ty, isa) else {
                continue;
            };
            let mut xq = vec![0u8; k.act.row_bytes(n).unwrap()];
            (k.quantize_act)(&x, &mut xq);
            let mut xd = vec![0f32; n];
            dequantize_row(k.act, &xq, &mut xd).unwrap();
            let mut out = vec![0f32; rows];
            let (w, x) = ((&case.bytes[..], row_bytes, rows), (&xq[..], xq.len(), 1));
            (k.gemm)(GemmArgs::new(n, w, x, (&mut out, rows)));
            let mut wd = vec![0f32; n];
            for r in (0..rows).step_by(7) {
                let w = &case.bytes[r * row_bytes..(r + 1) * row_bytes];
                dequantize_row(case.ty, w, &mut wd).unwrap();
                let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wd
                    .iter()
                    .zip(&xd)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let tol = if k.act == GgmlType::Q8_1 { 2e-3 } else { 2e-5 } * mag + 1e-12;
                let got = (k.vec_dot)(n, w, &xq);
                let what = format!("{} {} row {r} on {}", case.file, case.tensor, isa.name());
                assert!(
                    (got as f64 - exact).abs() <= tol,
                    "{what}: vec_dot {got} vs {exact}"
                );
                assert_eq!(
                    out[r].to_bits(),
                    got.to_bits(),
                    "{what}: gemm(nx=1) differs from vec_dot"
                );
            }
        }
    }
}
