//! MXFP4 (ggml type 39, the OCP microscaling 4-bit float format gpt-oss ships its experts in):
//! the scalar dequantizer, the reference dot product (exact, in f64, like the other formats' in
//! `reference`) and ggml's quantizer `quantize_row_mxfp4_ref`, byte-identical to its output.
//!
//! ggml holds the E2M1 values doubled, as the integers of [`KVALUES_MXFP4`], and halves the
//! E8M0 scale to make up for it ([`e8m0_to_f32_half`]): an element is
//! `KVALUES_MXFP4[q] · 2^(e - 128)`. Every product here keeps that convention, so the integer
//! dots and the float steps are the reference engine's own.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::iquant::{dequantize_grid, grid_value};
use super::reference::{check_lengths, idot32, BlockFormat, DotAcc, Quantize};
use super::types::GgmlType;

/// The grid value of the nibble of element `j` (0..32) of a block's 16 bytes of indices.
#[inline]
pub(super) fn mxfp4_value(qs: &[u8], j: usize) -> i32 {
    grid_value(&KVALUES_MXFP4, qs, j)
}

/// ggml's `best_index_mxfp4`: the code whose value `KVALUES_MXFP4[i] · d` is nearest `x`, the
/// first such on a tie (so +0, code 0, for a zero).
#[inline]
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for i in 1..16 {
        let err = (KVALUES_MXFP4[i] as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// The scale byte `quantize_row_mxfp4_ref` gives a block whose largest magnitude is `amax`:
/// `floor(log2(amax)) - 2 + 127` converted to `uint8_t` (0 for an all-zero block). The C
/// conversion of a value outside 0..=255 is x86's: the low byte of the 32-bit truncation (an
/// infinite `amax` truncates to `0x80000000`, low byte 0).
#[inline]
fn scale_byte(amax: f32) -> u8 {
    if amax <= 0.0 {
        return 0;
    }
    let f = amax.log2().floor() - 2.0 + 127.0;
    if f.is_finite() {
        f as i32 as u8
    } else {
        0
    }
}

impl BlockFormat for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK: usize = QK;
    type Dot = BlockQ8_0;
    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_lengths(blocks.len(), QK, out.len());
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
            dequantize_grid(&KVALUES_MXFP4, &b.qs, e8m0_to_f32_half(b.e), y);
        }
    }
    fn vec_dot_acc(w: &[Self], x: &[BlockQ8_0], acc: &mut DotAcc) {
        assert_eq!(w.len(), x.len());
        for (b, y) in w.iter().zip(x) {
            let (s, m) = idot32(|j| mxfp4_value(&b.qs, j), &y.qs);
            // Both scales are exact in f64: the product is the true one.
            let d = e8m0_to_f32_half(b.e) as f64 * y.d.to_f32() as f64;
            acc.add(d * s as f64, d.abs() * m as f64);
        }
    }
}

impl Quantize for BlockMxfp4 {
    /// `quantize_row_mxfp4_ref` (what `quantize_mxfp4` runs, with or without an importance
    /// matrix).
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK, x.len());
        for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let mut amax = 0f32;
            for &v in xb {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let e = scale_byte(amax);
            let d = e8m0_to_f32_half(e);
            b.e = e;
            for j in 0..16 {
                b.qs[j] = best_index(xb[j], d) | (best_index(xb[16 + j], d) << 4);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_ggml_bit_for_bit() {
        // ggml_e8m0_to_fp32_half: 0x00200000 << x below 2, (x - 1) << 23 above.
        assert_eq!(e8m0_to_f32_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_to_f32_half(1).to_bits(), 0x0040_0000);
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        // 255 is no NaN here: 2^127, finite.
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
        for e in 2..=255u8 {
            assert_eq!(e8m0_to_f32_half(e), 2f32.powi(e as i32 - 128), "e = {e}");
        }
    }

    #[test]
    fn values_are_doubled_e2m1() {
        // E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; ggml stores twice the value.
        for q in 0..16u8 {
            let (s, e, m) = (q >> 3, (q >> 1) & 3, q & 1);
            let v = if e == 0 {
                m as f32 * 0.5
            } else {
                (1.0 + m as f32 * 0.5) * 2f32.powi(e as i32 - 1)
            };
            let v = if s == 1 { -v } else { v };
            assert_eq!(KVALUES_MXFP4[q as usize] as f32, 2.0 * v, "code {q}");
        }
    }

    #[test]
    fn dequantize_places_nibbles_as_q4_0() {
        let mut b = BlockMxfp4 {
            e: 128,
            qs: [0; 16],
        };
        b.qs[0] = 0x7F; // element 0: code 15 (-12), element 16: code 7 (12)
        b.qs[15] = 0x21; // element 15: code 1 (1), element 31: code 2 (2)
        let mut y = [0f32; 32];
        BlockMxfp4::dequantize(&[b], &mut y);
        assert_eq!((y[0], y[16], y[15], y[31]), (-12.0, 12.0, 1.0, 2.0));
        assert!(y[1..15].iter().chain(&y[17..31]).all(|&v| v == 0.0));
    }

    #[test]
    fn quantizer_picks_the_scale_and_nearest_codes() {
        // amax 6 -> floor(log2 6) = 2 -> e = 127: d = 0.5, representable magnitudes 0..6.
        let mut x = [0f32; 32];
        x[0] = 6.0;
        x[1] = -0.5;
        x[2] = 2.9; // between 2 (code 4) and 3 (code 5): nearer 3
        x[3] = 0.25; // tie between 0 and 0.5: the first code, 0
        x[17] = -1.4; // nearer -1.5 (code 11) than -1 (code 10)
        let mut b = [BlockMxfp4::default()];
        BlockMxfp4::quantize(&x, &mut b);
        assert_eq!(b[0].e, 127);
        let mut y = [0f32; 32];
        BlockMxfp4::dequantize(&b, &mut y);
        assert_eq!((y[0], y[1], y[2], y[3], y[17]), (6.0, -0.5, 3.0, 0.0, -1.5));
        // The largest magnitude is always within the grid: no clipping past 6·2^(e-127).
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.37)
            .collect();
        let mut q = vec![BlockMxfp4::default(); 8];
        BlockMxfp4::quantize(&x, &mut q);
        let mut y = vec![0f32; 256];
        BlockMxfp4::dequantize(&q, &mut y);
        for (blk, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in xb.iter().zip(yb) {
                // E2M1's relative spacing is at most 1/2 (between 4 and 6): error <= amax/4.
                assert!((a - b).abs() <= 0.25 * amax, "block {blk}: {a} -> {b}");
            }
        }
    }

    #[test]
    fn zero_and_extreme_blocks() {
        let mut b = [BlockMxfp4::default()];
        BlockMxfp4::quantize(&[0f32; 32], &mut b);
        assert_eq!(b[0].e, 0);
        assert!(b[0].qs.iter().all(|&q| q == 0));
        // f32::MAX: log2 is 127.99999..., which rounds to 128 in f32 -> e = 253 (its scale,
        // 2^125, leaves f32::MAX between the grid's 4 and 6).
        let mut x = [0f32; 32];
        x[5] = f32::MAX;
        BlockMxfp4::quantize(&x, &mut b);
        assert_eq!(b[0].e, 253);
        // The smallest subnormal: log2 = -149 -> -24, whose C conversion keeps the low byte.
        x[5] = f32::from_bits(1);
        BlockMxfp4::quantize(&x, &mut b);
        assert_eq!(b[0].e, (-24i32) as u8);
        // An infinite element: the truncation's low byte, 0.
        x[5] = f32::INFINITY;
        BlockMxfp4::quantize(&x, &mut b);
        assert_eq!(b[0].e, 0);
    }
}
