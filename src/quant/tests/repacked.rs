//! Matrices repacked into 16-row groups: the reference engine's bits for every row of every
//! batch, extreme quants, and the rows that stay plain.

use super::*;

/// Q4_K, Q6_K, IQ4_XS and the 32-element formats' matrices repacked into 16-row groups (where
/// this CPU has kernels for that layout) give every row of every batch the reference engine's
/// bits, group rows and tail rows alike, and their rows dequantize as before.
#[test]
fn repacked_kquants_match_reference_order() {
    let mut rng = Rng(0x005e_ed4b);
    let mut tested = 0;
    for (ty, isa) in [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4XS,
        GgmlType::MXFP4,
    ]
    .into_iter()
    .flat_map(|ty| Isa::available().into_iter().map(move |isa| (ty, isa)))
    {
        let Ok(k) = kernels_for(ty, isa) else {
            continue;
        };
        let shapes: &[(usize, usize)] = if ty.block_size() == 32 {
            &[(16, 32), (37, 640), (48, 2048), (16, 8192)]
        } else {
            &[(16, 256), (37, 768), (48, 2048)]
        };
        for &(rows, n) in shapes {
            for scales in [
                Scales::Normal,
                Scales::Huge,
                Scales::Subnormal,
                Scales::Zero,
            ] {
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| random_weight_row(ty, n, &mut rng, scales))
                    .collect();
                let label = format!("{scales:?}");
                for logits in [false, true] {
                    let mut acts = |_: usize| random_act_row(&k, n, &mut rng);
                    let label = format!("{label}, logits {logits}");
                    let m = repacked_rows_match(&k, isa, rows, n, &w, &mut acts, &label, logits);
                    tested += usize::from(m);
                }
            }
        }
    }
    // Every x86 tier from AVX2 up repacks Q4_K (3 shapes and 4 scale regimes) and the
    // 32-element formats (5 of them, 4 shapes and 4 scale regimes each), AVX-512 VNNI and AMX
    // Q6_K and IQ4_XS (3 shapes) too, and every tier MXFP4 (4 shapes); elsewhere this test
    // checks nothing.
    let avail = Isa::available();
    let x86_tiers = avail
        .iter()
        .filter(|isa| matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx))
        .count();
    let q6k = avail
        .iter()
        .filter(|isa| matches!(isa, Isa::Avx512Vnni | Isa::Amx))
        .count();
    // Each twice: as a layer's matrix and as the output matrix.
    let expect = 2 * (x86_tiers * (3 * 4 + 5 * 4 * 4) + 2 * q6k * 3 * 4 + x86_tiers * 4 * 4);
    assert_eq!(tested, expect, "repacked kernels missing on this machine");
}

/// Whether `w` (`rows` rows of `n` elements of `k`'s format) repacks on `isa`; if it does, its
/// rows dequantize as before and every row of every batch (activation rows from `acts(j)`)
/// gets the reference engine's bits; with `logits`, as the output matrix
/// (`repacking_for_logits`: the 32-element formats' groups in the block-sum order).
#[allow(clippy::too_many_arguments)]
fn repacked_rows_match(
    k: &Kernels,
    isa: Isa,
    rows: usize,
    n: usize,
    w: &[u8],
    acts: &mut dyn FnMut(usize) -> Vec<u8>,
    label: &str,
    logits: bool,
) -> bool {
    let ty = k.weight;
    let rw = ty.row_bytes(n).unwrap();
    let choice = if logits {
        crate::quant::repacking_for_logits(k, rows, n)
    } else {
        crate::quant::repacking(k, rows, n)
    };
    let Some((packed, kp)) = crate::quant::repacked_by(choice, w, rows, n) else {
        return false;
    };
    assert_eq!(packed.len(), w.len());
    let g = kp.group;
    // Rows dequantize to the same values through the repacked layout.
    for i in [0, 5, g - 1, rows - 1] {
        let mut want = vec![0f32; n];
        (k.dequantize)(&w[i * rw..(i + 1) * rw], &mut want);
        let mut got = vec![0f32; n];
        if i < rows / g * g {
            let group = &packed[i / g * g * rw..(i / g + 1) * g * rw];
            crate::quant::repack::dequantize_row(&kp, group, i % g, &mut got);
        } else {
            (kp.dequantize)(&packed[i * rw..(i + 1) * rw], &mut got);
        }
        assert_eq!(got, want, "row {i}");
    }
    for nx in [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 19] {
        let rx = k.act.row_bytes(n).unwrap();
        let x_stride = rx + 3;
        let mut x = vec![0u8; nx * x_stride];
        for j in 0..nx {
            let r = acts(j);
            x[j * x_stride..j * x_stride + rx].copy_from_slice(&r);
        }
        let out_stride = rows + 2;
        let mut out = vec![f32::NAN; nx * out_stride];
        // Tiles of whole groups, then the plain rows after them.
        let mut i0 = 0;
        while i0 < rows {
            let nw = (rows - i0).min(g);
            let (w, o) = ((&packed[i0 * rw..], rw, nw), (&mut out[i0..], out_stride));
            (kp.gemm)(GemmArgs::new(n, w, (&x, x_stride, nx), o));
            i0 += nw;
        }
        for j in 0..nx {
            for i in 0..rows {
                let (wi, xj) = (&w[i * rw..(i + 1) * rw], &x[j * x_stride..]);
                // The k-quants' order (the 32-element formats' groups may sum whole blocks).
                let want = match crate::quant::kquant_order::gemm_dot(ty, wi, xj, n, nx, j) {
                    Some(v) => v,
                    // Groups that sum whole blocks' integer dots, and MXFP4 in every layout.
                    None if (crate::quant::sums_whole_blocks(isa, ty, logits)
                        && i < rows / g * g)
                        || ty == GgmlType::MXFP4 =>
                    {
                        crate::quant::kquant_order::t32_dot_blocks(ty, wi, xj, n)
                    }
                    // The 32-element formats: the plain layout's kernel, and the
                    // reference's 8-lane order written out in scalar code.
                    None => {
                        let mut o = [0f32];
                        (k.gemm)(GemmArgs::new(
                            n,
                            (wi, rw, 1),
                            (xj, x_stride, 1),
                            (&mut o, 1),
                        ));
                        let lanes = crate::quant::kquant_order::t32_dot_lanes(ty, wi, xj, n);
                        assert_eq!(o[0].to_bits(), lanes.to_bits(), "plain kernel");
                        o[0]
                    }
                };
                let got = out[j * out_stride + i];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} {isa:?} {rows}x{n} nx={nx} ({i},{j}) {label}: {got} vs {want}"
                );
            }
            for p in rows..out_stride {
                assert!(out[j * out_stride + p].is_nan(), "wrote padding");
            }
        }
    }
    true
}

/// Every tier's kernels of each 32-element format.
fn t32_kernels() -> impl Iterator<Item = (GgmlType, Isa, Kernels)> {
    let formats = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ];
    formats.into_iter().flat_map(|ty| {
        Isa::available()
            .into_iter()
            .filter_map(move |isa| Some((ty, isa, kernels_for(ty, isa).ok()?)))
    })
}

/// The 32-element formats' repacked kernels add pairs of integer products in 16 bits (and
/// whole blocks' pairs, where they sum blocks) before widening, which must never wrap: quants
/// at both ends of their range, against activations of ±127 (all one sign, or alternating by
/// block and row), give the reference's bits.
#[test]
fn repacked_kernels_are_exact_on_extreme_quants() {
    let mut tested = 0;
    for (ty, isa, k) in t32_kernels() {
        let (rows, n) = (37, 640);
        // All quant bits set or clear (Q8_0: +127 or −127), scales of one.
        let fills: [u8; 2] = if ty == GgmlType::Q8_0 {
            [0x7f, 0x81]
        } else {
            [0xff, 0x00]
        };
        for fill in fills {
            let mut row = vec![fill; ty.row_bytes(n).unwrap()];
            for blk in row.chunks_mut(ty.type_size()) {
                for &off in scale_offsets(ty) {
                    blk[off..off + 2].copy_from_slice(&F16Le::from_f32(1.0).0);
                }
            }
            let w: Vec<u8> = (0..rows).flat_map(|_| row.clone()).collect();
            for sign in [1.0f32, -1.0, 0.0] {
                let mut acts = |j: usize| {
                    // sign 0: the sign alternates every block, and from row to row.
                    let x: Vec<f32> = (0..n)
                        .map(|e| match sign {
                            0.0 if (e / 32 + j).is_multiple_of(2) => 1.0,
                            0.0 => -1.0,
                            s => s,
                        })
                        .collect();
                    let mut out = vec![0u8; k.act.row_bytes(n).unwrap()];
                    (k.quantize_act)(&x, &mut out);
                    out
                };
                for logits in [false, true] {
                    let label = format!("fill {fill:#x}, activations {sign}, logits {logits}");
                    let m = repacked_rows_match(&k, isa, rows, n, &w, &mut acts, &label, logits);
                    tested += usize::from(m);
                }
            }
        }
    }
    let x86_tiers = Isa::available()
        .iter()
        .filter(|isa| matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx))
        .count();
    assert_eq!(
        tested,
        x86_tiers * 5 * 2 * 3 * 2,
        "repacked kernels missing on this machine"
    );
}

/// 32-element rows longer than the group kernel's stack buffer keep the plain layout; rows up
/// to it are repacked where the CPU has the kernel.
#[test]
fn long_rows_stay_plain() {
    for (ty, isa, k) in t32_kernels() {
        assert!(
            crate::quant::repacking(&k, 16, 8192 + 32).is_none(),
            "{ty} {isa:?}"
        );
        let fits = crate::quant::repacking(&k, 16, 8192).is_some();
        let x86 = matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx);
        assert_eq!(fits, x86, "{ty} {isa:?}");
    }
}
