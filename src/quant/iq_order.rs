//! The float arithmetic of the 3-bit and 1-bit i-quants' dot products against Q8_K (IQ3_XXS,
//! IQ3_S, IQ1_S, IQ1_M), in plain scalar code: the definition their SIMD kernels and the scalar
//! tier are tested against bit for bit, as `kquant_order` is for the k-quants.
//!
//! Every one of them is, per super-block, an exact integer part and a float step. An element
//! `i` has a signed grid value `q`, an odd scale `sc` (per 32 elements, IQ1_M's per 16) and,
//! for the 1-bit formats, a shift sign `δ = ±1` (the `±1/8` added to the grid value). The
//! reference engine (ggml-cpu, x86, AVX-512 VNNI build) computes:
//!
//! - **Single rows and batches under [`TILED_MIN_ROWS`]**: its AVX2 `ggml_vec_dot_*_q8_K`, 8
//!   integer lanes (lane `l`: `Σ sc·q·y` over elements `4l .. 4l + 4` of every 32), each
//!   converted and fused-multiply-added with `d_w·d_y` per super-block and reduced at the end
//!   ([`hsum8`]); IQ3_XXS then multiplies by 1/4. IQ1_S sums `Σ sc·δ·y` (through the `bsums`)
//!   as one integer per super-block, fused-multiply-added with `d_w·d_y` into a scalar, which
//!   is added after the lanes times 1/8; IQ1_M keeps those sums in 8 lanes of their own, reduced
//!   and added times 1/8. See [`dot_lanes`].
//! - **Batches of [`TILED_MIN_ROWS`] rows or more**: its tiled kernel (`ggml-cpu/tiled`), whose
//!   weight codes are `q` (IQ3) or `8q + δ` (IQ1) and whose scale is `d_w` times 1/4 (IQ3_XXS),
//!   1 (IQ3_S) or 1/8 (IQ1): per super-block the whole exact integer `Σ sc·code·y`, converted,
//!   times that scale, fused-multiply-added with `d_y`. See [`dot_tiled`].
//!
//! [`TILED_MIN_ROWS`]: super::kquant_order::TILED_MIN_ROWS

use super::blocks::{cast, BlockIq1M, BlockIq1S, BlockIq3S, BlockIq3Xxs, BlockQ8K, RawBlock};
use super::reference::hsum8;
use super::reference::DotAcc;
use super::GgmlType;

/// Where a format keeps its shifts' part of the dot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Shift {
    /// No shift (IQ3).
    None,
    /// One integer per super-block, into a scalar sum (IQ1_S).
    Scalar,
    /// 8 lanes of their own, as the grid part's (IQ1_M).
    Lanes,
}

/// A super-block of one of these formats, decoded element by element.
pub(super) trait IqBlock: RawBlock {
    /// The tiled kernel's factor on `d_w` (its codes' scale).
    const FACTOR: f32 = 1.0;
    /// The factor on the reduced lanes of [`dot_lanes`] (IQ3_XXS's 1/4).
    const LANE_FACTOR: f32 = 1.0;
    /// The shifts' part of the dot (the 1-bit formats).
    const SHIFT: Shift = Shift::None;
    /// The super-block scale `d_w`.
    fn d(&self) -> f32;
    /// The signed grid value of element `i`.
    fn q(&self, i: usize) -> i32;
    /// The (odd) scale of element `i`'s sub-block.
    fn scale(&self, i: usize) -> i32;
    /// The shift sign of element `i` (±1), 0 for a format without shifts.
    fn shift(&self, _i: usize) -> i32 {
        0
    }
}

/// `-1` for a negative element, else `1`.
#[inline]
pub(super) fn sign(negative: bool) -> i32 {
    if negative {
        -1
    } else {
        1
    }
}

/// The weight code of element `i` in the tiled kernel's terms: `q`, or `8q + δ`.
#[inline]
fn code<B: IqBlock>(b: &B, i: usize) -> i32 {
    match B::SHIFT {
        Shift::None => b.q(i),
        _ => 8 * b.q(i) + b.shift(i),
    }
}

/// The exact integers of one super-block against its Q8_K partner, in 8 lanes (lane `l`:
/// elements `4l .. 4l + 4` of every 32): `Σ sc·q·y` and `Σ sc·δ·y`.
pub(super) fn lanes<B: IqBlock>(b: &B, y: &BlockQ8K) -> ([i32; 8], [i32; 8]) {
    let (mut s, mut m) = ([0i32; 8], [0i32; 8]);
    for (i, &yi) in y.qs.iter().enumerate() {
        let l = (i % 32) / 4;
        s[l] += b.scale(i) * b.q(i) * yi as i32;
        m[l] += b.scale(i) * b.shift(i) * yi as i32;
    }
    (s, m)
}

/// The reference engine's AVX2 `vec_dot` of these formats (single rows, small batches).
pub(super) fn dot_lanes<B: IqBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), x.len());
    let (mut acc, mut acc_m) = ([0f32; 8], [0f32; 8]);
    let mut acc_s = 0f32;
    for (b, y) in w.iter().zip(x) {
        let d = b.d() * y.d.to_f32();
        let (s, m) = lanes(b, y);
        for l in 0..8 {
            acc[l] = d.mul_add(s[l] as f32, acc[l]);
        }
        match B::SHIFT {
            Shift::None => {}
            Shift::Scalar => acc_s = d.mul_add(m.iter().sum::<i32>() as f32, acc_s),
            Shift::Lanes => {
                for l in 0..8 {
                    acc_m[l] = d.mul_add(m[l] as f32, acc_m[l]);
                }
            }
        }
    }
    match B::SHIFT {
        Shift::None => B::LANE_FACTOR * hsum8(acc),
        Shift::Scalar => hsum8(acc) + 0.125 * acc_s,
        Shift::Lanes => hsum8(acc) + 0.125 * hsum8(acc_m),
    }
}

/// The whole exact integer `Σ sc·code·y` of one super-block (the tiled kernel's).
pub(super) fn tiled_int<B: IqBlock>(b: &B, y: &BlockQ8K) -> i32 {
    (0..y.qs.len())
        .map(|i| b.scale(i) * code(b, i) * y.qs[i] as i32)
        .sum()
}

/// The reference engine's tiled kernel of these formats (batches of 8 rows or more).
pub(super) fn dot_tiled<B: IqBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = 0f32;
    for (b, y) in w.iter().zip(x) {
        let r = tiled_int(b, y) as f32 * (b.d() * B::FACTOR);
        acc = r.mul_add(y.d.to_f32(), acc);
    }
    acc
}

/// The exact dot (in f64) for [`BlockFormat::vec_dot_acc`](super::reference::BlockFormat):
/// `Σ d_w·d_y·FACTOR·Σ sc·code·y`.
pub(super) fn exact_dot<B: IqBlock>(w: &[B], x: &[BlockQ8K], acc: &mut DotAcc) {
    assert_eq!(w.len(), x.len());
    for (b, y) in w.iter().zip(x) {
        let (mut s, mut m) = (0i64, 0i64);
        for (i, &yi) in y.qs.iter().enumerate() {
            let p = b.scale(i) as i64 * code(b, i) as i64 * yi as i64;
            s += p;
            m += p.abs();
        }
        let d = b.d() as f64 * y.d.to_f32() as f64 * B::FACTOR as f64;
        acc.add(d * s as f64, d.abs() * m as f64);
    }
}

/// Whether `ty` is one of these formats.
pub fn handles(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::IQ3XXS | GgmlType::IQ3S | GgmlType::IQ1S | GgmlType::IQ1M
    )
}

/// kiln's result for a row of `ty` (`x.len()` super-blocks in `w`) against `x`: the tiled
/// kernel's order (`tiled`) or the `vec_dot`'s; `None` for the other formats.
pub fn row_dot(ty: GgmlType, w: &[u8], x: &[BlockQ8K], tiled: bool) -> Option<f32> {
    fn go<B: IqBlock>(w: &[u8], x: &[BlockQ8K], tiled: bool) -> Option<f32> {
        let w = cast::<B>(&w[..x.len() * core::mem::size_of::<B>()])?;
        Some(if tiled {
            dot_tiled(w, x)
        } else {
            dot_lanes(w, x)
        })
    }
    match ty {
        GgmlType::IQ3XXS => go::<BlockIq3Xxs>(w, x, tiled),
        GgmlType::IQ3S => go::<BlockIq3S>(w, x, tiled),
        GgmlType::IQ1S => go::<BlockIq1S>(w, x, tiled),
        GgmlType::IQ1M => go::<BlockIq1M>(w, x, tiled),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::super::{kernels_for, GemmArgs, Isa};
    use super::*;
    use crate::quant::blocks::F16Le;

    const TYPES: [GgmlType; 4] = [
        GgmlType::IQ3XXS,
        GgmlType::IQ3S,
        GgmlType::IQ1S,
        GgmlType::IQ1M,
    ];

    /// A Q8_K row of `nb` blocks with quants from `q(i)` (kept in -127..=127, as ggml's
    /// quantizer makes them) and scale `d`.
    fn act_row(nb: usize, d: f32, mut q: impl FnMut(usize) -> i8) -> Vec<u8> {
        let mut out = Vec::new();
        for b in 0..nb {
            let qs: Vec<i8> = (0..QK).map(|i| q(b * QK + i)).collect();
            out.extend_from_slice(&d.to_le_bytes());
            out.extend(qs.iter().map(|&v| v as u8));
            for g in qs.chunks(16) {
                let s: i16 = g.iter().map(|&v| v as i16).sum();
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        out
    }
    const QK: usize = 256;

    /// A weight row of `nb` blocks: every byte `fill`, the f16 scale `d` (IQ1_M: spread over
    /// its scale words' top nibbles).
    fn weight_row(ty: GgmlType, nb: usize, fill: u8, d: f32) -> Vec<u8> {
        let mut w = vec![fill; ty.row_bytes(nb * QK).unwrap()];
        let bits = u16::from_le_bytes(F16Le::from_f32(d).0);
        for blk in w.chunks_mut(ty.type_size()) {
            if ty == GgmlType::IQ1M {
                for k in 0..4 {
                    let b = &mut blk[49 + 2 * k];
                    *b = (*b & 0x0F) | (((bits >> (4 * k)) & 0xF) as u8) << 4;
                }
            } else {
                blk[..2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        w
    }

    /// Extreme blocks (every scale at its maximum, every sign negative, the largest grid
    /// indices; the f16 maximum as `d`; activations all ±127): every tier's `vec_dot` and
    /// `gemm` (the tiled order from 8 rows) equal to this module's orders bit for bit, and
    /// within float noise of the exact dot.
    #[test]
    fn kernels_are_exact_on_extreme_blocks() {
        let mut rng = Rng(0x1d3);
        for ty in TYPES {
            for nb in [1, 5] {
                for (fill, d) in [(0xFF, 65504.0), (0xFF, -1.0), (0x00, 0.5), (0xA5, 3.0e-5)] {
                    let w = weight_row(ty, nb, fill, d);
                    let xs = [
                        act_row(nb, 1.0, |_| 127),
                        act_row(nb, 2.5, |_| -127),
                        act_row(nb, 1e-3, |i| if i % 3 == 0 { 127 } else { -127 }),
                        act_row(nb, 0.25, |_| ((rng.next() % 255) as i32 - 127) as i8),
                    ];
                    for isa in Isa::available() {
                        let k = kernels_for(ty, isa).unwrap();
                        let n = nb * QK;
                        for x in &xs {
                            let xb = cast::<BlockQ8K>(x).unwrap();
                            let lanes = row_dot(ty, &w, xb, false).unwrap();
                            let tiled = row_dot(ty, &w, xb, true).unwrap();
                            let got = (k.vec_dot)(n, &w, x);
                            let what = format!("{ty} {isa:?} nb={nb} fill={fill:#x} d={d}");
                            assert_eq!(got.to_bits(), lanes.to_bits(), "{what}: {got} vs {lanes}");
                            let want = super::super::tests::reference_dot(ty, n, &w, x);
                            let tol = 1e-5 * want.mag + 1e-30;
                            for v in [lanes, tiled] {
                                assert!(
                                    (v as f64 - want.sum).abs() <= tol,
                                    "{what}: {v} vs {}",
                                    want.sum
                                );
                            }
                            // 9 activation rows: the tiled order for every one of them.
                            let xx: Vec<u8> = (0..9).flat_map(|_| x.iter().copied()).collect();
                            let mut out = vec![0f32; 9];
                            (k.gemm)(GemmArgs::new(
                                n,
                                (&w, w.len(), 1),
                                (&xx, x.len(), 9),
                                (&mut out, 1),
                            ));
                            for v in out {
                                assert_eq!(
                                    v.to_bits(),
                                    tiled.to_bits(),
                                    "{what} tiled: {v} vs {tiled}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// An all-negative IQ3_XXS sign index (127) negates all 8 elements; IQ3_S's sign bytes
    /// 0xFF likewise: the dot of an all-0xFF block is minus that of the same block with
    /// positive signs.
    #[test]
    fn all_negative_signs_negate_the_dot() {
        let x = act_row(1, 1.0, |i| (i % 200) as i8 - 100);
        let xb = cast::<BlockQ8K>(&x).unwrap();
        let neg = weight_row(GgmlType::IQ3S, 1, 0xFF, 1.0);
        let mut pos = neg.clone();
        pos[74..106].fill(0);
        let (a, b) = (
            row_dot(GgmlType::IQ3S, &neg, xb, true).unwrap(),
            row_dot(GgmlType::IQ3S, &pos, xb, true).unwrap(),
        );
        assert!(a != 0.0 && a == -b, "{a} vs {b}");
        let b3 = cast::<BlockIq3Xxs>(&weight_row(GgmlType::IQ3XXS, 1, 0xFF, 1.0)).unwrap()[0];
        assert!((0..QK).all(|i| b3.q(i) < 0));
    }
}
