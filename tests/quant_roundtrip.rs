//! Quantize-then-dequantize round trips of the activation formats (Q8_0, Q8_1, Q8_K) and the
//! float conversions, through both the reference quantizers (`quantize_row`) and every available
//! kernel table's `quantize_act`. Each element must come back within half a quantization step.

use kiln::quant::{dequantize_row, kernels_for, quantize_row, GgmlType, Isa, QuantizeFn};

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Rows exercising the edge cases: random, all zero, one block, a zero block between random
/// ones, huge and tiny magnitudes, a lone spike, exact ties.
fn test_rows(block: usize) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut rows = Vec::new();
    let mut random =
        |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| rng.uniform() * scale).collect() };
    rows.push(("one block".to_string(), random(block, 1.0)));
    rows.push(("seven blocks".to_string(), random(7 * block, 3.0)));
    rows.push(("all zero".to_string(), vec![0.0; 2 * block]));
    let mut mixed = random(3 * block, 1.0);
    mixed[block..2 * block].fill(0.0);
    rows.push(("zero block in the middle".to_string(), mixed));
    rows.push(("huge".to_string(), random(2 * block, 1.0e6)));
    rows.push(("tiny".to_string(), random(2 * block, 1.0e-6)));
    rows.push(("subnormal-scale".to_string(), random(block, 1.0e-9)));
    let mut spike = vec![1.0e-3; block];
    spike[block / 2] = -50.0;
    rows.push(("negative spike".to_string(), spike));
    let ties: Vec<f32> = (0..block)
        .map(|i| if i == 0 { 127.0 } else { (i as f32) - 0.5 })
        .collect();
    rows.push(("ties".to_string(), ties));
    rows
}

/// Per-block scale as the format stores it, and the f32 scale the quantizer divided by.
fn block_scales(ty: GgmlType, bytes: &[u8], x: &[f32], block: usize) -> Vec<(f32, f32)> {
    x.chunks(block)
        .enumerate()
        .map(|(b, xb)| {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let exact = amax / 127.0;
            let stored = match ty {
                GgmlType::Q8_0 | GgmlType::Q8_1 => {
                    let off = b * ty.type_size();
                    half::f16::from_bits(u16::from_le_bytes([bytes[off], bytes[off + 1]])).to_f32()
                }
                GgmlType::Q8K => {
                    let off = b * ty.type_size();
                    f32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()).abs()
                }
                _ => unreachable!(),
            };
            (stored, exact)
        })
        .collect()
}

fn check_round_trip(ty: GgmlType, quantize: QuantizeFn, how: &str) {
    let block = ty.block_size();
    for (name, x) in test_rows(block) {
        let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        quantize(&x, &mut bytes);
        let mut back = vec![0f32; x.len()];
        dequantize_row(ty, &bytes, &mut back).unwrap();
        let scales = block_scales(ty, &bytes, &x, block);
        for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
            let (stored, exact) = scales[i / block];
            // Half a step of the scale the quantizer used, plus what storing the scale in
            // fp16 moved the largest code (127) by.
            let bound =
                exact / 2.0 * (1.0 + 1e-6) + 127.0 * (stored - exact).abs() + f32::MIN_POSITIVE;
            assert!(
                (a - b).abs() <= bound,
                "{ty} {how} {name}: element {i}: {a} -> {b}, error {} > bound {bound}",
                (a - b).abs()
            );
            assert!(b.is_finite(), "{ty} {how} {name}: element {i} is {b}");
        }
        if let GgmlType::Q8_1 = ty {
            check_q8_1_sums(&bytes, &x);
        }
        if let GgmlType::Q8K = ty {
            check_q8k_bsums(&bytes);
        }
    }
}

/// `s = d * sum(qs)` (in fp16) for every Q8_1 block.
fn check_q8_1_sums(bytes: &[u8], x: &[f32]) {
    for (blk, xb) in bytes.chunks(36).zip(x.chunks(32)) {
        let f16 =
            |o: usize| half::f16::from_bits(u16::from_le_bytes([blk[o], blk[o + 1]])).to_f32();
        let sum: i32 = blk[4..36].iter().map(|&q| q as i8 as i32).sum();
        let s = f16(2);
        // The quantizer multiplies by the f32 scale (not the stored fp16 one) before rounding.
        let d = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        let want = d * sum as f32;
        if want.abs() > 65504.0 {
            // Beyond fp16 range, like ggml the stored sum overflows to infinity.
            assert!(
                s.is_infinite(),
                "Q8_1 s {s} should overflow for d*sum {want}"
            );
            continue;
        }
        let want16 = half::f16::from_f32(want).to_f32();
        assert_eq!(s, want16, "Q8_1 s {s} vs d*sum {want}");
    }
}

/// `bsums[g] = sum(qs[16g..16g+16])` for every Q8_K block.
fn check_q8k_bsums(bytes: &[u8]) {
    for blk in bytes.chunks(292) {
        for g in 0..16 {
            let sum: i32 = blk[4 + 16 * g..4 + 16 * g + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            let off = 4 + 256 + 2 * g;
            let b = i16::from_le_bytes([blk[off], blk[off + 1]]) as i32;
            assert_eq!(b, sum, "Q8_K bsums[{g}]");
        }
    }
}

fn reference_quantizer(ty: GgmlType) -> QuantizeFn {
    match ty {
        GgmlType::Q8_0 => |x, o| quantize_row(GgmlType::Q8_0, x, o).unwrap(),
        GgmlType::Q8_1 => |x, o| quantize_row(GgmlType::Q8_1, x, o).unwrap(),
        GgmlType::Q8K => |x, o| quantize_row(GgmlType::Q8K, x, o).unwrap(),
        _ => unreachable!(),
    }
}

#[test]
fn reference_quantizers_round_trip() {
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
        check_round_trip(ty, reference_quantizer(ty), "reference");
    }
}

/// The activation quantizer of every kernel table, on every ISA this CPU has, round-trips, and
/// all ISAs produce the same bytes as the scalar table.
#[test]
fn activation_quantizers_round_trip_and_agree() {
    for weight in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K] {
        let scalar = kernels_for(weight, Isa::Scalar).unwrap();
        for isa in Isa::available() {
            let Ok(k) = kernels_for(weight, isa) else {
                continue;
            };
            check_round_trip(k.act, k.quantize_act, isa.name());
            for (name, x) in test_rows(k.act.block_size()) {
                let len = k.act.row_bytes(x.len()).unwrap();
                let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                (scalar.quantize_act)(&x, &mut a);
                (k.quantize_act)(&x, &mut b);
                assert!(
                    a == b,
                    "{} quantize_act on {}: {name}: bytes differ from scalar",
                    k.act,
                    isa.name()
                );
            }
        }
    }
}

/// F16 / BF16 conversions round to nearest even, like ggml's.
#[test]
fn float_conversions_round_to_nearest() {
    let x = [
        1.0f32,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        -65504.0,
        1.0e-7,
        3.0e38,
    ];
    let mut h = vec![0u8; 2 * x.len()];
    quantize_row(GgmlType::F16, &x, &mut h).unwrap();
    let mut back = vec![0f32; x.len()];
    dequantize_row(GgmlType::F16, &h, &mut back).unwrap();
    assert_eq!(back[1], 1.0, "tie rounds to even (down)");
    assert_eq!(back[2], 1.0 + 4.0 / 2048.0, "tie rounds to even (up)");
    assert_eq!(back[3], -65504.0);
    assert!(back[5].is_infinite());
    let mut bf = vec![0u8; 2 * x.len()];
    quantize_row(GgmlType::BF16, &x, &mut bf).unwrap();
    dequantize_row(GgmlType::BF16, &bf, &mut back).unwrap();
    assert_eq!(back[0], 1.0);
    assert!((back[5] - 3.0e38).abs() / 3.0e38 < 1.0 / 128.0);
    for weight in [GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        for isa in Isa::available() {
            let Ok(k) = kernels_for(weight, isa) else {
                continue;
            };
            let mut want = vec![0u8; k.act.row_bytes(x.len()).unwrap()];
            let mut got = want.clone();
            quantize_row(k.act, &x, &mut want).unwrap();
            (k.quantize_act)(&x, &mut got);
            assert_eq!(want, got, "{weight} quantize_act on {}", isa.name());
        }
    }
}
