//! The quant module's basics: rounding, the kernel tables' checks, block layouts, the tiers.

use super::*;

#[test]
fn nearest_int_rounds_half_to_even() {
    assert_eq!(nearest_int(0.5), 0);
    assert_eq!(nearest_int(1.5), 2);
    assert_eq!(nearest_int(-0.5), 0);
    assert_eq!(nearest_int(-1.5), -2);
    assert_eq!(nearest_int(126.6), 127);
    assert_eq!(nearest_int(-127.0), -127);
}

#[test]
fn act_quantizer_rounds_ties_to_even_ref_rounds_away() {
    // amax 127 makes id = 1 exactly: 2.5 is a tie.
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    let mut act = [BlockQ8_0::default()];
    quantize_q8_0_act(&x, &mut act);
    assert_eq!(&act[0].qs[..3], &[127, 2, -4]);
    let mut r = [BlockQ8_0::default()];
    BlockQ8_0::quantize(&x, &mut r);
    assert_eq!(&r[0].qs[..3], &[127, 3, -4]);
}

#[test]
fn dot_types_match_ggml() {
    assert_eq!(dot_type(GgmlType::Q4_1), GgmlType::Q8_1);
    assert_eq!(dot_type(GgmlType::Q5_0), GgmlType::Q8_0);
    assert_eq!(dot_type(GgmlType::Q6K), GgmlType::Q8K);
    assert_eq!(dot_type(GgmlType::BF16), GgmlType::BF16);
}

#[test]
fn kernel_table_rejects_activation_formats() {
    assert!(matches!(
        kernels(GgmlType::Q8K),
        Err(QuantError::Unsupported { .. })
    ));
    assert!(matches!(
        kernels(GgmlType::Q8_1),
        Err(QuantError::Unsupported { .. })
    ));
    for t in GgmlType::ALL.into_iter().filter(|t| !t.is_internal()) {
        let k = kernels(t).unwrap();
        assert_eq!(k.act, dot_type(t));
    }
}

#[test]
fn row_api_checks_lengths() {
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out),
        Err(QuantError::ByteLength { .. })
    ));
    let mut out33 = [0f32; 33];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out33),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out).is_ok());
    let mut bytes = [0u8; 144];
    assert!(quantize_row(GgmlType::Q4K, &[0.0; 256], &mut bytes).is_ok());
    assert!(matches!(
        quantize_row(GgmlType::Q4K, &[0.0; 32], &mut bytes),
        Err(QuantError::NotBlockMultiple { block: 256, .. })
    ));
}

#[test]
fn cast_requires_whole_blocks() {
    let bytes = [0u8; 37];
    assert!(cast::<BlockQ4_0>(&bytes[..36]).is_some());
    assert!(cast::<BlockQ4_0>(&bytes).is_none());
    // Odd addresses are fine: the blocks have alignment 1.
    assert_eq!(cast::<BlockQ4_0>(&bytes[1..37]).unwrap().len(), 2);
}

/// Every block's default is all zero bytes, the formats with arrays past `derive(Default)`'s
/// 32 elements among them.
#[test]
fn block_defaults_are_zero_bytes() {
    fn zero<B: RawBlock>() -> bool {
        as_bytes(&[B::default()]).iter().all(|&b| b == 0)
    }
    let blocks = [
        ("Q4_0", zero::<BlockQ4_0>()),
        ("Q8_1", zero::<BlockQ8_1>()),
        ("Q2_K", zero::<BlockQ2K>()),
        ("Q3_K", zero::<BlockQ3K>()),
        ("Q4_K", zero::<BlockQ4K>()),
        ("Q5_K", zero::<BlockQ5K>()),
        ("Q6_K", zero::<BlockQ6K>()),
        ("Q8_K", zero::<BlockQ8K>()),
        ("IQ4_XS", zero::<BlockIq4Xs>()),
        ("IQ3_XXS", zero::<BlockIq3Xxs>()),
        ("IQ3_S", zero::<BlockIq3S>()),
        ("IQ1_S", zero::<BlockIq1S>()),
        ("IQ1_M", zero::<BlockIq1M>()),
        ("IQ2_XXS", zero::<BlockIq2Xxs>()),
        ("IQ2_XS", zero::<BlockIq2Xs>()),
        ("IQ2_S", zero::<BlockIq2S>()),
    ];
    for (name, zero) in blocks {
        assert!(zero, "{name}");
    }
}

#[test]
fn q3k_scale_unpack_round_trips() {
    // Pack 16 known 6-bit values the way ggml's quantizer does, then unpack.
    let vals: [i8; 16] = [
        -32, -31, -1, 0, 1, 31, 5, -7, 12, -20, 30, -30, 2, 3, -4, 17,
    ];
    let mut packed = [0u8; 12];
    for (j, &v) in vals.iter().enumerate() {
        let l = (v as i32 + 32) as u8;
        if j < 8 {
            packed[j] = l & 0xF;
        } else {
            packed[j - 8] |= (l & 0xF) << 4;
        }
        packed[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    assert_eq!(q3k_scales(&packed), vals);
}

/// Every available tier hands out its own kernels (not a silent scalar fallback).
#[test]
fn available_tiers_report_themselves() {
    let avail = Isa::available();
    assert!(avail.contains(&Isa::Scalar));
    for isa in avail.iter().copied() {
        for ty in WEIGHT_TYPES {
            assert_eq!(kernels_for(ty, isa).unwrap().isa, isa, "{ty} on {isa:?}");
        }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        let best = if Isa::Amx.is_available() {
            Isa::Amx
        } else {
            Isa::Avx512Vnni
        };
        assert_eq!(Isa::detect(), best);
    }
    #[cfg(not(target_arch = "aarch64"))]
    assert!(matches!(
        kernels_for(GgmlType::Q4_0, Isa::Neon),
        Err(QuantError::IsaUnavailable(_))
    ));
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Isa::detect(), Isa::Neon);
}

/// Empty shapes are no-ops, not panics: n = 0 dots are 0, nw or nx = 0 gemms write nothing.
#[test]
fn empty_shapes() {
    for isa in Isa::available() {
        for ty in WEIGHT_TYPES {
            let Ok(k) = kernels_for(ty, isa) else {
                continue;
            };
            assert_eq!((k.vec_dot)(0, &[], &[]), 0.0, "{ty} {isa:?}");
            let mut out = [7.0f32; 4];
            (k.gemm)(GemmArgs::new(0, (&[], 0, 2), (&[], 0, 2), (&mut out, 2)));
            assert_eq!(
                out,
                [0.0, 0.0, 0.0, 0.0],
                "{ty} {isa:?}: n = 0 dots are zero"
            );
            let mut out = [7.0f32; 4];
            (k.gemm)(GemmArgs::new(
                32 * 8,
                (&[], 0, 0),
                (&[], 0, 3),
                (&mut out, 1),
            ));
            (k.gemm)(GemmArgs::new(
                32 * 8,
                (&[], 0, 3),
                (&[], 0, 0),
                (&mut out, 3),
            ));
            assert_eq!(out, [7.0; 4], "{ty} {isa:?}: nothing written");
        }
    }
}

/// The kernels read only the bytes of the row: a row that ends exactly at the end of its
/// buffer (the last tensor in a file) works, and bytes after it do not change the result.
#[test]
fn rows_ending_at_buffer_end() {
    let mut rng = Rng(99);
    let every = WEIGHT_TYPES
        .into_iter()
        .flat_map(|ty| tiers(ty).map(move |t| (ty, t)));
    for (ty, (isa, k)) in every {
        let n = 2 * ty.block_size().max(32);
        let w = random_weight_row(ty, n, &mut rng, Scales::Normal);
        let x = random_act_row(&k, n, &mut rng);
        let exact = (k.vec_dot)(n, &w, &x);
        let mut padded = w.clone();
        padded.extend_from_slice(&[0xFF; 64]);
        assert_eq!(
            (k.vec_dot)(n, &padded, &x).to_bits(),
            exact.to_bits(),
            "{ty} {isa:?}"
        );
    }
}

/// `KILN_ISA` names every tier by [`Isa::name`].
#[test]
fn tiers_parse_from_their_names() {
    for isa in Isa::ALL {
        assert_eq!(Isa::from_name(isa.name()), Some(isa));
    }
    assert_eq!(Isa::from_name("sse2"), None);
}
