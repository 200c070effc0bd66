//! The non-linear 4-bit formats IQ4_NL and IQ4_XS: scalar dequantizers, the reference dot
//! products (exact, in f64, like the other formats' in `reference`) and ggml's quantizer
//! `quantize_row_iq4_nl_impl` as `llama-quantize` runs it without an importance matrix
//! (`quantize_iq4_nl` / `quantize_iq4_xs` with `quant_weights = NULL`, 7 trial scales each
//! side), byte-identical to its output.
//!
//! As in `kquant_quantize`, the quantizer's arithmetic follows the C statement by statement:
//! f32 throughout, `w*q*x` as `(w*q)*x`, divisions where the C divides, no fused multiply-add
//! (ggml-base is compiled for baseline x86-64).
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::reference::{
    check_lengths, idot32, legacy_format, nearest_int, super_block_format, BlockFormat, DotAcc,
    Quantize,
};
use super::types::GgmlType;

/// ggml's `GROUP_MAX_EPS`: a block whose largest magnitude is below it is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Trial scales each side of the first guess (`ntry` of `quantize_iq4_nl` / `_xs`).
const NTRY: i32 = 7;

/// The `grid` value of the nibble of element `j` (0..32) of a 16-byte block of nibbles laid
/// out as Q4_0's (IQ4_NL's and IQ4_XS's grid, MXFP4's).
#[inline]
pub(super) fn grid_value(grid: &[i8; 16], qs: &[u8], j: usize) -> i32 {
    let q = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
    grid[q as usize] as i32
}

/// IQ4_NL's grid value of element `j` ([`grid_value`]).
#[inline]
pub(super) fn iq4_value(qs: &[u8], j: usize) -> i32 {
    grid_value(&KVALUES_IQ4NL, qs, j)
}

/// 32 elements `d · grid[q]` from a 16-byte block of nibbles laid out as Q4_0's.
#[inline]
pub(super) fn dequantize_grid(grid: &[i8; 16], qs: &[u8], d: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * grid[(qs[j] & 0xF) as usize] as f32;
        y[j + 16] = d * grid[(qs[j] >> 4) as usize] as f32;
    }
}

/// ggml's `best_index_int8`: the index of the grid value nearest `x` (the upper one on a tie).
#[inline]
fn best_index(x: f32) -> u8 {
    let val = &KVALUES_IQ4NL;
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < (val[mu] as f32) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The first pass of `quantize_row_iq4_nl_impl` over one 32-element block `xb` (weights
/// `x²`): the least-squares scale of the best of `2·NTRY + 1` trial grids (0 for an all-zero
/// block).
fn block_scale(xb: &[f32]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let mut weight = [0f32; 32];
    for j in 0..32 {
        weight[j] = xb[j] * xb[j];
    }
    let (mut amax, mut max) = (0f32, 0f32);
    for j in 0..32 {
        let ax = xb[j].abs();
        if ax > amax {
            amax = ax;
            max = xb[j];
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    // Σ w·q·x and Σ w·q² over the block, `q` the grid value nearest `id · x`.
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let al = id * xb[j];
            let q = values[best_index(al) as usize] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let mut d = -max / values[0] as f32;
    let (sumqx, sumq2) = sums(1.0 / d);
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums((itry + values[0] as i32) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 grid indices of a block as Q4_0 packs its nibbles.
#[inline]
fn pack(l: &[u8; 32], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[16 + j] << 4);
    }
}

// A 32-element format as Q4_0 but for its grid: `d · grid[q]`, and the dot `d·dy·Σ grid[q]·y`.
legacy_format!(BlockIq4Nl: IQ4NL, BlockQ8_0, |b, j| iq4_value(&b.qs, j));

super_block_format!(BlockIq4Xs: IQ4XS,
    |b, y| {
        let d = b.d.to_f32();
        for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
            let dl = d * b.scale(ib) as f32;
            dequantize_grid(&KVALUES_IQ4NL, &b.qs[16 * ib..16 * ib + 16], dl, ys);
        }
    },
    |b, y, acc| {
        let (mut s, mut m) = (0i64, 0i64);
        for (i, &yi) in y.qs.iter().enumerate() {
            let ib = i / 32;
            let p = b.scale(ib) * iq4_value(&b.qs[16 * ib..], i % 32) * yi as i32;
            s += p as i64;
            m += p.unsigned_abs() as i64;
        }
        let d = (b.d.to_f32() * y.d.to_f32()) as f64;
        acc.add(d * s as f64, d.abs() * m as f64);
    }
);

impl Quantize for BlockIq4Nl {
    /// `quantize_iq4_nl` without an importance matrix.
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK, x.len());
        for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let d = block_scale(xb);
            b.d = F16Le::from_f32(d);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let l: [u8; 32] = core::array::from_fn(|j| best_index(id * xb[j]));
            pack(&l, &mut b.qs);
        }
    }
}

impl Quantize for BlockIq4Xs {
    /// `quantize_iq4_xs` without an importance matrix.
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK_K, x.len());
        for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            let mut scales = [0f32; 8];
            let (mut max_scale, mut amax_scale) = (0f32, 0f32);
            for ib in 0..8 {
                let d = block_scale(&xs[32 * ib..32 * ib + 32]);
                scales[ib] = d;
                if d.abs() > amax_scale {
                    amax_scale = d.abs();
                    max_scale = d;
                }
            }
            let d = -max_scale / 32.0;
            b.d = F16Le::from_f32(d);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut scales_h = 0u16;
            b.scales_l = [0; 4];
            for ib in 0..8 {
                let l = nearest_int(id * scales[ib]).clamp(-32, 31);
                let dl = d * l as f32;
                let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
                let xb = &xs[32 * ib..32 * ib + 32];
                let lb: [u8; 32] = core::array::from_fn(|j| best_index(idl * xb[j]));
                pack(&lb, &mut b.qs[16 * ib..16 * ib + 16]);
                let l = (l + 32) as u8;
                b.scales_l[ib / 2] |= (l & 0xF) << (4 * (ib % 2));
                scales_h |= ((l >> 4) as u16) << (2 * ib);
            }
            b.scales_h = scales_h.to_le_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_the_nearest_grid_value() {
        for (i, &v) in KVALUES_IQ4NL.iter().enumerate() {
            assert_eq!(best_index(v as f32) as usize, i);
        }
        assert_eq!(best_index(-1e9), 0);
        assert_eq!(best_index(1e9), 15);
        // Between -10 and 1: 0 is 1 away from 1 and 10 from -10.
        assert_eq!(best_index(0.0), 8);
        assert_eq!(best_index(-5.0), 7);
        // A tie between 1 and 13 goes up, as in ggml (`<`, not `<=`).
        assert_eq!(best_index(7.0), 9);
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for ty in [GgmlType::IQ4NL, GgmlType::IQ4XS] {
            let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            super::super::quantize_row(ty, &x, &mut q).unwrap();
            let mut y = vec![0f32; x.len()];
            super::super::dequantize_row(ty, &q, &mut y).unwrap();
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= 0.1 * amax, "{ty}: {a} -> {b}");
            }
        }
    }

    #[test]
    fn zero_blocks_quantize_to_zero() {
        let x = vec![0f32; 256];
        let mut nl = [BlockIq4Nl::default(); 8];
        BlockIq4Nl::quantize(&x, &mut nl);
        let mut xs = [BlockIq4Xs::default(); 1];
        BlockIq4Xs::quantize(&x, &mut xs);
        for b in &nl {
            assert_eq!(b.d.to_f32(), 0.0);
            assert!(b.qs.iter().all(|&q| q == 0x88));
        }
        // ggml's `-max_scale / 32` of an all-zero block is -0.0.
        assert_eq!(u16::from_le_bytes(xs[0].d.0), 0x8000);
        assert!(xs[0].qs.iter().all(|&q| q == 0x88));
        assert!((0..8).all(|j| xs[0].scale(j) == 0));
    }

    #[test]
    fn xs_scales_unpack_as_ggml() {
        let mut b = BlockIq4Xs::default();
        // ls of sub-block j = 8 * j + 3 (all within 6 bits).
        for j in 0..8 {
            let ls = 8 * j as u16 + 3;
            b.scales_l[j / 2] |= ((ls & 0xF) as u8) << (4 * (j % 2));
            let h = u16::from_le_bytes(b.scales_h) | ((ls >> 4) << (2 * j));
            b.scales_h = h.to_le_bytes();
        }
        for j in 0..8 {
            assert_eq!(b.scale(j), 8 * j as i32 + 3 - 32);
        }
    }
}
