//! Dot products and batched products: every kernel table on every ISA this CPU has, against
//! the f64 reference and the reference engine's accumulation order.

use super::*;

/// The reference dot itself against an independent computation: dequantize both rows and sum
/// the products in f64 (exact for formats without Q8_1's rounded block sums).
#[test]
fn reference_dot_equals_dequantized_dot() {
    let mut rng = Rng(7);
    for ty in WEIGHT_TYPES {
        let k = kernels_for(ty, Isa::Scalar).unwrap();
        let n = 3 * ty.block_size().max(32);
        let w = random_weight_row(ty, n, &mut rng, Scales::Normal);
        let x = random_act_row(&k, n, &mut rng);
        let (mut wf, mut xf) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(ty, &w, &mut wf).unwrap();
        dequantize_row(k.act, &x, &mut xf).unwrap();
        let direct: f64 = wf.iter().zip(&xf).map(|(&a, &b)| a as f64 * b as f64).sum();
        let r = reference_dot(ty, n, &w, &x);
        // Q4_1/Q5_1 use the activation's fp16 block sum `s`: allow its rounding (2^-11).
        let tol = if k.act == GgmlType::Q8_1 {
            2e-3 * r.mag
        } else {
            1e-6 * r.mag
        };
        assert!(
            (direct - r.sum).abs() <= tol,
            "{ty}: dequantized {direct} vs reference {}",
            r.sum
        );
    }
}

#[test]
fn vec_dot_matches_reference_on_every_isa() {
    let mut rng = Rng(0x1234_5678);
    for ty in WEIGHT_TYPES {
        // Float formats: element counts around SIMD widths; block formats: block counts.
        let lengths: Vec<usize> = if ty.block_size() == 1 {
            vec![1, 7, 8, 15, 16, 31, 32, 33, 64, 100, 256, 1000]
        } else {
            BLOCK_COUNTS.iter().map(|b| b * ty.block_size()).collect()
        };
        for (isa, k) in tiers(ty) {
            for &n in &lengths {
                for scales in [
                    Scales::Normal,
                    Scales::Huge,
                    Scales::Subnormal,
                    Scales::Zero,
                ] {
                    if ty.block_size() == 1 && !matches!(scales, Scales::Normal) {
                        continue;
                    }
                    let w = random_weight_row(ty, n, &mut rng, scales);
                    let x = random_act_row(&k, n, &mut rng);
                    let want = reference_dot(ty, n, &w, &x);
                    let got = (k.vec_dot)(n, &w, &x);
                    assert_close(
                        got,
                        &want,
                        &format!("{ty} vec_dot {} n={n} {scales:?}", isa.name()),
                    );
                    // Formats whose reference-engine order is reproduced: bit for bit.
                    if let Some(exact) = exact_order(ty, &w, &x, n, 1, 0) {
                        assert_eq!(
                            got.to_bits(),
                            exact.to_bits(),
                            "{ty} vec_dot {} n={n} {scales:?}: {got} vs reference order {exact}",
                            isa.name()
                        );
                    }
                }
            }
            // All-zero activations and weights: exactly zero, no NaN.
            let n = 2 * ty.block_size().max(32);
            let zw = vec![0u8; ty.row_bytes(n).unwrap()];
            let zx = vec![0u8; k.act.row_bytes(n).unwrap()];
            assert_eq!((k.vec_dot)(n, &zw, &zx), 0.0, "{ty} {} zeros", isa.name());
        }
    }
}

#[test]
fn gemm_matches_reference_on_every_isa() {
    let mut rng = Rng(0xfeed);
    for ty in WEIGHT_TYPES {
        let n = 3 * ty.block_size().max(32);
        for (isa, k) in tiers(ty) {
            for (nw, nx) in [
                (1, 1),
                (1, 9),
                (9, 1),
                (2, 3),
                (5, 4),
                (4, 8),
                (7, 9),
                (3, 5),
                (2, 12),
                (3, 17),
            ] {
                // Padded strides, so row starts are not contiguous.
                let row_w = ty.row_bytes(n).unwrap();
                let row_x = k.act.row_bytes(n).unwrap();
                let (w_stride, x_stride, out_stride) = (row_w + 5, row_x + 3, nw + 2);
                let mut w = vec![0u8; nw * w_stride];
                let mut x = vec![0u8; nx * x_stride];
                for i in 0..nw {
                    let r = random_weight_row(ty, n, &mut rng, Scales::Normal);
                    w[i * w_stride..i * w_stride + row_w].copy_from_slice(&r);
                }
                for j in 0..nx {
                    let r = random_act_row(&k, n, &mut rng);
                    x[j * x_stride..j * x_stride + row_x].copy_from_slice(&r);
                }
                let mut out = vec![f32::NAN; nx * out_stride];
                (k.gemm)(GemmArgs::new(
                    n,
                    (&w, w_stride, nw),
                    (&x, x_stride, nx),
                    (&mut out, out_stride),
                ));
                for j in 0..nx {
                    for i in 0..nw {
                        let want = reference_dot(ty, n, &w[i * w_stride..], &x[j * x_stride..]);
                        let got = out[j * out_stride + i];
                        assert_close(
                            got,
                            &want,
                            &format!("{ty} gemm {} {nw}x{nx} ({i},{j})", isa.name()),
                        );
                        let (wr, xr) = (&w[i * w_stride..], &x[j * x_stride..]);
                        if let Some(exact) = exact_order(ty, wr, xr, n, nx, j) {
                            // The block formats' order, on every tier (Q4_K's and Q6_K's
                            // depend on the row's place in the batch and on its size).
                            assert_eq!(
                                got.to_bits(),
                                exact.to_bits(),
                                "{ty} gemm {} {nw}x{nx} ({i},{j}): {got} vs reference order {exact}",
                                isa.name()
                            );
                        } else {
                            // Batch invariance: a tile gives each row exactly its vec_dot.
                            let single = (k.vec_dot)(n, wr, xr);
                            assert_eq!(
                                got.to_bits(),
                                single.to_bits(),
                                "{ty} gemm {} ({i},{j}) differs from vec_dot",
                                isa.name()
                            );
                        }
                    }
                    // Padding between output rows is untouched.
                    for p in nw..out_stride {
                        assert!(out[j * out_stride + p].is_nan(), "{ty} gemm wrote padding");
                    }
                }
            }
        }
    }
}

/// Long rows (beyond the x86 gemm's prepared-scale buffer) and many weight rows (several row
/// chunks) take the other gemm paths; results stay equal to vec_dot (Q4_K: to the reference
/// engine's order for each row of the batch).
#[test]
fn gemm_long_rows_and_many_rows() {
    let mut rng = Rng(0xabc);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
    ] {
        // nx >= 8: the x86 pair kernel (tiles of 16 and of 8 activation rows), with rows
        // longer than its block chunk (32 * 72) and more weight rows than it keeps at once
        // (150), plus leftover activation rows.
        for (n, nw, nx) in [
            (32 * 520, 3, 5),
            (256, 150, 6),
            (256, 150, 1),
            (768, 70, 5),
            (32 * 72, 20, 11),
            (32 * 520, 3, 9),
            (256, 150, 16),
            (256, 40, 24),
            (32 * 72, 20, 35),
        ] {
            for (isa, k) in tiers(ty) {
                let g = RandomGemm::run(ty, &k, (n, nw, nx), &mut rng, 0.0);
                for (i, j, wi, xj, got) in g.dots() {
                    // Q4_K: the reference's order for this row of the batch.
                    let single =
                        exact_order(ty, wi, xj, n, nx, j).unwrap_or_else(|| (k.vec_dot)(n, wi, xj));
                    let msg = || format!("{ty} {isa:?} n={n}");
                    assert_eq!(got.to_bits(), single.to_bits(), "{} ({i},{j})", msg());
                    if i % 17 == 0 {
                        assert_close(got, &reference_dot(ty, n, wi, xj), &msg());
                    }
                }
            }
        }
    }
}

/// The float formats' batched kernel (tiles of several weight and activation rows on the
/// AVX-512 tiers) gives every dot exactly its `vec_dot`, over rows with a 16-element body only,
/// an 8-element tail, a scalar tail, and tiles cut at both edges.
#[test]
fn float_gemm_tiles_match_vec_dot() {
    let mut rng = Rng(0xf10a7);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (n, nw, nx) in [
            (64, 9, 13),
            (72, 4, 6),
            (75, 5, 4),
            (16 * 48 + 8 + 5, 7, 17),
            (3, 3, 5),
            (768, 10, 121),
        ] {
            for (isa, k) in tiers(ty) {
                let g = RandomGemm::run(ty, &k, (n, nw, nx), &mut rng, f32::NAN);
                for (i, j, wi, xj, got) in g.dots() {
                    let single = (k.vec_dot)(n, wi, xj);
                    let what = format!("{ty} {isa:?} n={n} {nw}x{nx} ({i},{j})");
                    assert_eq!(got.to_bits(), single.to_bits(), "{what}");
                    if i == j {
                        assert_close(got, &reference_dot(ty, n, wi, xj), &format!("{ty}"));
                    }
                }
            }
        }
    }
}

/// ggml's x86 dot of one Q4_1 / Q8_0 row (the reference engine's order), written out: per
/// block, 8 lanes of 4-element integer sums, each lane advanced by a fused multiply-add with the
/// block's `dw·dx`; the offset `m·s` summed with fused multiply-adds; then the 8 lanes reduced
/// as `(l0+l4 + l2+l6) + (l1+l5 + l3+l7)` and the offsets added.
fn ggml_order_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    let h = |b: &[u8], o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
    let (wb, xb) = match ty {
        GgmlType::Q4_1 => (20, 36),
        GgmlType::Q8_0 => (34, 34),
        _ => unreachable!(),
    };
    let mut lanes = [0f32; 8];
    let mut summ = 0f32;
    for b in 0..n / 32 {
        let (wk, xk) = (&w[b * wb..(b + 1) * wb], &x[b * xb..(b + 1) * xb]);
        let (wq, xq): (Vec<i32>, &[u8]) = match ty {
            GgmlType::Q4_1 => {
                let q = (0..32).map(|i| if i < 16 { wk[4 + i] & 15 } else { wk[4 + i - 16] >> 4 } as i32);
                summ = h(wk, 2).mul_add(h(xk, 2), summ);
                (q.collect(), &xk[4..])
            }
            _ => (wk[2..].iter().map(|&v| v as i8 as i32).collect(), &xk[2..]),
        };
        let d = h(wk, 0) * h(xk, 0);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4).map(|i| wq[i] * xq[i] as i8 as i32).sum();
            *lane = d.mul_add(s as f32, *lane);
        }
    }
    let s4: Vec<f32> = (0..4).map(|i| lanes[i] + lanes[i + 4]).collect();
    ((s4[0] + s4[2]) + (s4[1] + s4[3])) + summ
}

#[test]
fn legacy_simd_dots_follow_ggml_accumulation_order() {
    let n = 576;
    let mut seed = 9u32;
    let mut rnd = || {
        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
        (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    };
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        // Every tier reproduces ggml's x86 order, the scalar code and NEON's too.
        for isa in Isa::available().into_iter().filter(|&i| i.has_kernels()) {
            let k = kernels_for(ty, isa).unwrap();
            for _ in 0..20 {
                let wf: Vec<f32> = (0..n).map(|_| rnd() * 3.0).collect();
                let xf: Vec<f32> = (0..n).map(|_| rnd() * 5.0).collect();
                let mut w = vec![0u8; ty.row_bytes(n).unwrap()];
                quantize_row(ty, &wf, &mut w).unwrap();
                let mut x = vec![0u8; k.act.row_bytes(n).unwrap()];
                (k.quantize_act)(&xf, &mut x);
                let want = ggml_order_dot(ty, n, &w, &x);
                assert_eq!(
                    (k.vec_dot)(n, &w, &x).to_bits(),
                    want.to_bits(),
                    "{ty:?} {isa:?} vec_dot"
                );
                // The prefill tile keeps the same order for every activation row.
                let out = gemm_thrice(&k, n, &w, &x);
                assert!(
                    out.iter().all(|o| o.to_bits() == want.to_bits()),
                    "{ty:?} {isa:?} gemm"
                );
            }
        }
    }
}

/// MXFP4 at its scale byte's ends on every tier, bit for bit against the reference engine's
/// order: 255 (`2^127` halved no further: products overflow to ±inf as the reference's f32
/// ones do, and an inf minus an inf is NaN in both), 254, and the subnormal scales 0 and 1;
/// against activations of ±127 and against random ones, with every index (both zeros, ±12).
#[test]
fn mxfp4_kernels_are_exact_on_extreme_scales() {
    let ty = GgmlType::MXFP4;
    let n = 7 * 32;
    let mut rng = Rng(0x3b_0039);
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for (isa, k) in tiers(ty) {
        for e in [255u8, 254, 200, 1, 0] {
            for fill in [None, Some(0x77u8), Some(0xffu8), Some(0x08u8)] {
                let mut w = random_weight_row(ty, n, &mut rng, Scales::Normal);
                for blk in w.chunks_mut(17) {
                    blk[0] = e;
                    if let Some(f) = fill {
                        blk[1..].fill(f);
                    }
                }
                for sign in [1.0f32, -1.0, 0.0] {
                    let x = if sign == 0.0 {
                        random_act_row(&k, n, &mut rng)
                    } else {
                        let mut out = vec![0u8; k.act.row_bytes(n).unwrap()];
                        (k.quantize_act)(&vec![sign; n], &mut out);
                        out
                    };
                    let want = exact_order(ty, &w, &x, n, 1, 0).unwrap();
                    let got = (k.vec_dot)(n, &w, &x);
                    let what = format!("{} e={e} fill={fill:?} sign={sign}", isa.name());
                    assert!(same(got, want), "{what}: {got} vs reference order {want}");
                    if e >= 200 && fill == Some(0x77) && sign != 0.0 {
                        // Every term 12·127·2^(e-128)·d_x (d_x = 1/127, so 12·2^(e-128)) of
                        // one sign: a block's exceeds f32 from e = 254 (2^126 · 12 · 32).
                        assert_eq!(got.is_infinite(), e >= 254, "{what}: {got}");
                    }
                    let out = gemm_thrice(&k, n, &w, &x);
                    assert!(out.iter().all(|&o| same(o, want)), "{what}: gemm {out:?}");
                    // Sixteen copies of the row repacked into one group (where this tier
                    // repacks MXFP4), against 1 and 3 activation rows.
                    let w16 = w.repeat(16);
                    if let Some((packed, kp)) = crate::quant::repacked(&k, &w16, 16, n) {
                        let x3 = x.repeat(3);
                        for nx in [1, 3] {
                            let mut out = [0f32; 48];
                            (kp.gemm)(GemmArgs::new(
                                n,
                                (&packed, w.len(), 16),
                                (&x3, x.len(), nx),
                                (&mut out, 16),
                            ));
                            let out = &out[..16 * nx];
                            assert!(
                                out.iter().all(|&o| same(o, want)),
                                "{what}: repacked, {nx} rows {out:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
