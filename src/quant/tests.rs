//! Unit tests of the quant module: layouts, reference arithmetic, kernel tables.

use super::blocks::*;
use super::reference::*;
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

// ---------------------------------------------------------------------------------------------
// Dot products: every kernel table on every ISA this CPU has, against the f64 reference.

/// xorshift64*: deterministic test data.
pub(crate) struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// How test blocks choose their scales.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scales {
    /// Random in ±[0.001, 0.1].
    Normal,
    /// fp16 maximum (65504) magnitude.
    Huge,
    /// fp16 subnormals.
    Subnormal,
    /// Scale zero: the block contributes nothing (and must not produce NaN).
    Zero,
}

fn f16_scale(rng: &mut Rng, s: Scales) -> [u8; 2] {
    let v = match s {
        Scales::Normal => {
            let m = 0.001 + 0.099 * (rng.uniform() * 0.5 + 0.5);
            if rng.next() & 1 == 0 {
                m
            } else {
                -m
            }
        }
        Scales::Huge => {
            if rng.next() & 1 == 0 {
                65504.0
            } else {
                -65504.0
            }
        }
        Scales::Subnormal => (rng.uniform()) * 6.0e-5,
        Scales::Zero => 0.0,
    };
    F16Le::from_f32(v).0
}

/// An MXFP4 block's E8M0 scale byte (`2^(e - 128)` times the doubled E2M1 values): normal
/// ones around 2^-10..2^-2, huge ones near 2^40 (the largest whose dots stay finite in f32
/// are tested apart, with 254 and 255), subnormal ones (0 and 1: `2^-128`, `2^-127`); there is
/// no zero scale, so `Zero` takes the smallest.
fn e8m0_scale(rng: &mut Rng, s: Scales) -> u8 {
    match s {
        Scales::Normal => 118 + (rng.next() % 9) as u8,
        Scales::Huge => 160 + (rng.next() % 8) as u8,
        Scales::Subnormal => (rng.next() & 1) as u8,
        Scales::Zero => 0,
    }
}

/// Offsets of the fp16 scale fields within one block of each format.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
        GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S => &[0],
        GgmlType::IQ3XXS | GgmlType::IQ3S | GgmlType::IQ1S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

/// A weight row of `n` elements: random quant bits, scales chosen by `scales`.
pub(crate) fn random_weight_row(ty: GgmlType, n: usize, rng: &mut Rng, scales: Scales) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..ty.row_bytes(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    match ty {
        GgmlType::F32 => {
            for c in bytes.chunks_mut(4) {
                c.copy_from_slice(&rng.uniform().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in bytes.chunks_mut(2) {
                c.copy_from_slice(&F16Le::from_f32(rng.uniform()).0);
            }
        }
        GgmlType::BF16 => {
            for c in bytes.chunks_mut(2) {
                c.copy_from_slice(&Bf16Le::from_f32(rng.uniform()).0);
            }
        }
        GgmlType::MXFP4 => {
            for blk in bytes.chunks_mut(ty.type_size()) {
                blk[0] = e8m0_scale(rng, scales);
            }
        }
        GgmlType::IQ1M => {
            // The f16 scale's nibbles are the top nibbles of the 4 scale words (bytes 49,
            // 51, 53, 55), lowest first.
            for blk in bytes.chunks_mut(ty.type_size()) {
                let d = u16::from_le_bytes(f16_scale(rng, scales));
                for k in 0..4 {
                    let b = &mut blk[49 + 2 * k];
                    *b = (*b & 0x0F) | (((d >> (4 * k)) & 0xF) as u8) << 4;
                }
            }
        }
        _ => {
            // Q4_K/Q5_K min scales (dmin) are positive in real files, but any sign is valid.
            for blk in bytes.chunks_mut(ty.type_size()) {
                for &off in scale_offsets(ty) {
                    blk[off..off + 2].copy_from_slice(&f16_scale(rng, scales));
                }
            }
        }
    }
    bytes
}

/// One row `w` against three copies of `x` through the batched kernel: the three dots.
fn gemm_thrice(k: &Kernels, n: usize, w: &[u8], x: &[u8]) -> [f32; 3] {
    let mut out = [0f32; 3];
    let x3 = [x, x, x].concat();
    (k.gemm)(GemmArgs::new(
        n,
        (w, w.len(), 1),
        (&x3, x.len(), 3),
        (&mut out, 1),
    ));
    out
}

/// A batched product of random rows: `nw` weight rows and `nx` activation rows of `n`
/// elements (drawn from `rng` in that order) and the batched kernel's `nw × nx` dots.
struct RandomGemm {
    w: Vec<u8>,
    x: Vec<u8>,
    rw: usize,
    rx: usize,
    nw: usize,
    nx: usize,
    out: Vec<f32>,
}

impl RandomGemm {
    /// The rows and their product (`out` filled with `fill` before the kernel writes it).
    fn run(
        ty: GgmlType,
        k: &Kernels,
        shape: (usize, usize, usize),
        rng: &mut Rng,
        fill: f32,
    ) -> Self {
        let (n, nw, nx) = shape;
        let (rw, rx) = (ty.row_bytes(n).unwrap(), k.act.row_bytes(n).unwrap());
        let w: Vec<u8> = (0..nw)
            .flat_map(|_| random_weight_row(ty, n, rng, Scales::Normal))
            .collect();
        let x: Vec<u8> = (0..nx).flat_map(|_| random_act_row(k, n, rng)).collect();
        let mut out = vec![fill; nw * nx];
        (k.gemm)(GemmArgs::new(n, (&w, rw, nw), (&x, rx, nx), (&mut out, nw)));
        RandomGemm {
            w,
            x,
            rw,
            rx,
            nw,
            nx,
            out,
        }
    }

    /// Every dot, activation rows outer: `(i, j, weight row i, activation row j, its dot)`.
    fn dots(&self) -> impl Iterator<Item = (usize, usize, &[u8], &[u8], f32)> + '_ {
        (0..self.nx).flat_map(move |j| {
            (0..self.nw).map(move |i| {
                let wi = &self.w[i * self.rw..(i + 1) * self.rw];
                let xj = &self.x[j * self.rx..(j + 1) * self.rx];
                (i, j, wi, xj, self.out[j * self.nw + i])
            })
        })
    }
}

/// The kernels of `ty` on every tier this CPU runs (a tier without them is passed over).
fn tiers(ty: GgmlType) -> impl Iterator<Item = (Isa, Kernels)> {
    Isa::available()
        .into_iter()
        .filter_map(move |isa| Some((isa, kernels_for(ty, isa).ok()?)))
}

/// An activation row: random f32 quantized by the table's own activation quantizer.
pub(crate) fn random_act_row(k: &Kernels, n: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|_| rng.uniform() * 4.0).collect();
    let mut out = vec![0u8; k.act.row_bytes(n).unwrap()];
    (k.quantize_act)(&x, &mut out);
    out
}

/// The f64 reference dot and its magnitude scale.
pub(crate) fn reference_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> DotAcc {
    fn go<B: BlockFormat>(n: usize, w: &[u8], x: &[u8]) -> DotAcc {
        let mut acc = DotAcc::default();
        let nb = n / B::BLOCK;
        let w = cast::<B>(&w[..nb * size_of::<B>()]).unwrap();
        let x = cast::<B::Dot>(&x[..nb * size_of::<B::Dot>()]).unwrap();
        B::vec_dot_acc(w, x, &mut acc);
        acc
    }
    assert!(
        !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8K),
        "{ty}: an activation format"
    );
    per_format!(ty, |B| go::<B>(n, w, x))
}

/// Every weight format: the float ones, then the block formats.
pub(crate) const WEIGHT_TYPES: [GgmlType; 23] = {
    let mut t = [GgmlType::F32; 23];
    (t[1], t[2]) = (GgmlType::F16, GgmlType::BF16);
    let mut i = 0;
    while i < super::ORDERED.len() {
        t[3 + i] = super::ORDERED[i];
        i += 1;
    }
    t
};

/// Kernel result within float-accumulation noise of the reference: 1e-5 of the magnitude.
fn assert_close(got: f32, want: &DotAcc, what: &str) {
    let tol = 1e-5 * want.mag + 1e-30;
    assert!(!got.is_nan(), "{what}: NaN (reference {})", want.sum);
    let err = (got as f64 - want.sum).abs();
    assert!(
        err <= tol,
        "{what}: got {got}, reference {} (error {err:e} > tol {tol:e})",
        want.sum
    );
}

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

/// kiln's exact result for row `j` of a batch of `nx` on every tier ([`kquant_order::row_dot`]:
/// the reference engine's x86 order), for the block formats.
///
/// [`kquant_order::row_dot`]: super::kquant_order::row_dot
fn exact_order(ty: GgmlType, w: &[u8], x: &[u8], n: usize, nx: usize, j: usize) -> Option<f32> {
    super::kquant_order::row_dot(ty, w, x, n, nx, j)
}

/// Block counts, including odd ones, for the dot tests.
const BLOCK_COUNTS: [usize; 5] = [1, 3, 7, 8, 33];

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
        super::repacking_for_logits(k, rows, n)
    } else {
        super::repacking(k, rows, n)
    };
    let Some((packed, kp)) = super::repacked_by(choice, w, rows, n) else {
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
            super::repack::dequantize_row(&kp, group, i % g, &mut got);
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
                let want = match super::kquant_order::gemm_dot(ty, wi, xj, n, nx, j) {
                    Some(v) => v,
                    // Groups that sum whole blocks' integer dots, and MXFP4 in every layout.
                    None if (super::sums_whole_blocks(isa, ty, logits) && i < rows / g * g)
                        || ty == GgmlType::MXFP4 =>
                    {
                        super::kquant_order::t32_dot_blocks(ty, wi, xj, n)
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
                        let lanes = super::kquant_order::t32_dot_lanes(ty, wi, xj, n);
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
            super::repacking(&k, 16, 8192 + 32).is_none(),
            "{ty} {isa:?}"
        );
        let fits = super::repacking(&k, 16, 8192).is_some();
        let x86 = matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx);
        assert_eq!(fits, x86, "{ty} {isa:?}");
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
                    if let Some((packed, kp)) = super::repacked(&k, &w16, 16, n) {
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
