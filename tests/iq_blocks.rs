//! IQ3_XXS, IQ3_S, IQ1_S and IQ1_M against llama.cpp, block by block, on blocks its own
//! quantizer wrote (`ggml_quantize_chunk`, with an importance matrix for the 1-bit formats,
//! which no random model holds) from random rows: `tests/golden/iq_blocks.json` holds the blocks and the
//! reference's `to_float` of them (scripts/make-fixtures.py, `iq_blocks_golden`). kiln's
//! dequantizers must give the same bits; every tier's products must agree with the exact dot
//! of the dequantized rows.

mod common;

use kiln::quant::{dequantize_row, kernels_for, quantize_row, GemmArgs, GgmlType, Isa};

struct Case {
    ty: GgmlType,
    n_per_row: usize,
    blocks: Vec<u8>,
    values: Vec<f32>,
    /// The rows the blocks were made from, for the formats made without an importance matrix.
    input: Option<Vec<f32>>,
}

fn cases() -> Vec<Case> {
    let path = common::golden_dir().join("iq_blocks.json");
    let text = std::fs::read_to_string(&path).expect("iq_blocks.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("iq_blocks.json is JSON");
    let mut out = Vec::new();
    for (name, c) in json.as_object().expect("object of formats") {
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("{name}: unknown format"));
        let nrows = c["nrows"].as_u64().unwrap() as usize;
        let n_per_row = c["n_per_row"].as_u64().unwrap() as usize;
        let blocks = common::hex(c["blocks"].as_str().unwrap());
        assert_eq!(
            Some(blocks.len()),
            ty.row_bytes(nrows * n_per_row),
            "{name}: block bytes"
        );
        let values = common::f32s_le(c["values_f32le"].as_str().unwrap());
        let input = c
            .get("input_f32le")
            .map(|v| common::f32s_le(v.as_str().unwrap()));
        assert_eq!(values.len(), nrows * n_per_row, "{name}: values");
        out.push(Case {
            ty,
            n_per_row,
            blocks,
            values,
            input,
        });
    }
    out
}

fn check_bits(case: &Case, got: &[f32], how: &str) {
    common::assert_bits_eq(got, &case.values, &format!("{} ({how})", case.ty));
}

#[test]
fn dequantize_matches_llama_cpp() {
    let cases = cases();
    let types: Vec<GgmlType> = cases.iter().map(|c| c.ty).collect();
    for ty in [
        GgmlType::IQ3XXS,
        GgmlType::IQ3S,
        GgmlType::IQ1S,
        GgmlType::IQ1M,
    ] {
        assert!(types.contains(&ty), "{ty} has no golden blocks");
    }
    for case in &cases {
        let mut v = vec![0f32; case.values.len()];
        dequantize_row(case.ty, &case.blocks, &mut v).unwrap();
        check_bits(case, &v, "dequantize_row");
        // The zero block of the second row: zeros, never NaN.
        let n = case.n_per_row;
        assert!(v[n + 256..2 * n].iter().all(|&x| x == 0.0), "{}", case.ty);
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            let mut v = vec![0f32; case.values.len()];
            (k.dequantize)(&case.blocks, &mut v);
            check_bits(case, &v, isa.name());
        }
    }
}

/// Every tier's `vec_dot` and `gemm` on the reference's blocks: within float-accumulation
/// noise of the exact dot of the dequantized rows, for single rows and a batch of 9 (the
/// tiled order).
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
        let n = case.n_per_row;
        let row_bytes = case.ty.row_bytes(n).unwrap();
        let rows = case.blocks.len() / row_bytes;
        let xs: Vec<Vec<f32>> = (0..9)
            .map(|_| (0..n).map(|_| uniform()).collect())
            .collect();
        for isa in Isa::available() {
            let k = kernels_for(case.ty, isa).unwrap();
            let act = k.act.row_bytes(n).unwrap();
            let mut xq = vec![0u8; 9 * act];
            for (x, q) in xs.iter().zip(xq.chunks_exact_mut(act)) {
                (k.quantize_act)(x, q);
            }
            let mut out = vec![0f32; 9 * rows];
            (k.gemm)(GemmArgs::new(
                n,
                (&case.blocks, row_bytes, rows),
                (&xq, act, 9),
                (&mut out, rows),
            ));
            for r in 0..rows {
                let w = &case.blocks[r * row_bytes..(r + 1) * row_bytes];
                let wd = &case.values[r * n..(r + 1) * n];
                for (j, q) in xq.chunks_exact(act).enumerate() {
                    let mut xd = vec![0f32; n];
                    dequantize_row(k.act, q, &mut xd).unwrap();
                    let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = wd
                        .iter()
                        .zip(&xd)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let tol = 2e-5 * mag + 1e-12;
                    let what = format!("{} row {r} x {j} on {}", case.ty, isa.name());
                    let single = (k.vec_dot)(n, w, q);
                    let batched = out[j * rows + r];
                    for (how, got) in [("vec_dot", single), ("gemm", batched)] {
                        assert!(
                            (got as f64 - exact).abs() <= tol,
                            "{what}: {how} {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}

/// IQ3_XXS and IQ3_S, which `llama-quantize` makes without an importance matrix: kiln's
/// quantizer writes the reference's blocks byte for byte (a zero sub-block included); IQ1_S
/// and IQ1_M are refused by name.
#[test]
fn quantize_matches_llama_cpp() {
    let mut checked = Vec::new();
    for case in cases() {
        let Some(x) = &case.input else {
            let mut out = vec![0u8; case.blocks.len()];
            let n = case.values.len();
            let err = quantize_row(case.ty, &vec![0.0; n], &mut out).unwrap_err();
            assert!(err.to_string().contains(case.ty.name()), "{err}");
            continue;
        };
        let mut out = vec![0u8; case.blocks.len()];
        let row = case.ty.row_bytes(case.n_per_row).unwrap();
        for (xr, o) in x
            .chunks_exact(case.n_per_row)
            .zip(out.chunks_exact_mut(row))
        {
            quantize_row(case.ty, xr, o).unwrap();
        }
        for (b, (got, want)) in out
            .chunks_exact(case.ty.type_size())
            .zip(case.blocks.chunks_exact(case.ty.type_size()))
            .enumerate()
        {
            assert_eq!(got, want, "{} block {b}", case.ty);
        }
        checked.push(case.ty);
    }
    assert_eq!(checked, [GgmlType::IQ3XXS, GgmlType::IQ3S]);
}
