//! The 2-bit i-quants IQ2_XXS, IQ2_XS and IQ2_S: their sub-block decoding (shared by the
//! scalar code and the SIMD kernels), scalar dequantizers bit for bit as ggml's
//! `dequantize_row_iq2_*`, and the reference dot products against Q8_K (exact, in f64, like
//! the other formats' in `reference`).
//!
//! A super-block of 256 weights is 32 groups of 8. Each group is an index into a grid of
//! magnitude vectors (`iq2_grids`: every byte one of 8, 25, 43) and 8 signs; each 16 weights
//! share a 4-bit scale `ls` (IQ2_XXS: each 32), and the weight is
//! `d · (0.5 + ls) / 4 · magnitude · sign`, i.e. `d / 8 · (2 ls + 1) · ±magnitude`: an integer
//! `(2 ls + 1) · ±magnitude` (at most 31 · 43) under one float scale `d / 8`. That is how the
//! reference engine's dot products take them (`d · d_y` per super-block, and `0.125 ·` the
//! sum at the end, or `d / 8` up front in its tiled kernel: the same bits, a power of two), and
//! how `kquant_order` does.
//!
//! Quantizing into these formats is not implemented: the reference's quantizers for IQ2_XXS
//! and IQ2_XS need an importance matrix, and IQ2_S's grid search is not ported
//! ([`super::quantize_row`] refuses all three by name).
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::iq2_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::iq_signs::{KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::reference::{check_lengths, BlockFormat, DotAcc};
use super::types::GgmlType;

/// One 32-element sub-block, decoded: four groups of 8 (their grid magnitudes, as ggml's `u64`
/// grid entries, and their sign masks, bit `j` set for a negative element `j`) and the 4-bit
/// scales of its two halves of 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sub {
    pub grid: [u64; 4],
    pub signs: [u8; 4],
    pub ls: [u8; 2],
}

impl Sub {
    /// The magnitude of element `i` (0..32).
    #[inline]
    pub fn magnitude(&self, i: usize) -> u8 {
        (self.grid[i / 8] >> (8 * (i % 8))) as u8
    }

    /// Whether element `i` (0..32) is negative.
    #[inline]
    pub fn negative(&self, i: usize) -> bool {
        self.signs[i / 8] & KMASK_IQ2XS[i % 8] != 0
    }

    /// The integer weight of element `i`: `(2 ls + 1) · ±magnitude`.
    #[inline]
    pub fn value(&self, i: usize) -> i32 {
        let m = self.magnitude(i) as i32;
        let v = if self.negative(i) { -m } else { m };
        self.scale(i / 16) * v
    }

    /// The odd integer scale `2 ls + 1` of half `h` (0 or 1).
    #[inline]
    pub fn scale(&self, h: usize) -> i32 {
        2 * self.ls[h] as i32 + 1
    }
}

/// A 2-bit i-quant block: its f16 scale and its 8 sub-blocks.
pub(crate) trait Iq2Block: BlockFormat<Dot = BlockQ8K> {
    /// Sub-block `ib` (0..8).
    fn sub(&self, ib: usize) -> Sub;
    /// `d` in f32.
    fn d(&self) -> f32;
}

#[inline]
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

impl Iq2Block for BlockIq2Xxs {
    /// ggml's `aux32[0]` (four grid indices) and `aux32[1]` (four 7-bit sign indices, `ls`).
    #[inline]
    fn sub(&self, ib: usize) -> Sub {
        let (idx, aux) = (u32_at(&self.qs, 8 * ib), u32_at(&self.qs, 8 * ib + 4));
        let ls = (aux >> 28) as u8;
        Sub {
            grid: core::array::from_fn(|l| IQ2XXS_GRID[(idx >> (8 * l)) as usize & 0xFF]),
            signs: core::array::from_fn(|l| KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127]),
            ls: [ls, ls],
        }
    }
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
}

impl Iq2Block for BlockIq2Xs {
    /// Each group's `u16`: the grid index in its low 9 bits, the sign index in its top 7.
    #[inline]
    fn sub(&self, ib: usize) -> Sub {
        let q =
            |l: usize| u16::from_le_bytes([self.qs[8 * ib + 2 * l], self.qs[8 * ib + 2 * l + 1]]);
        Sub {
            grid: core::array::from_fn(|l| IQ2XS_GRID[(q(l) & 511) as usize]),
            signs: core::array::from_fn(|l| KSIGNS_IQ2XS[(q(l) >> 9) as usize]),
            ls: [self.scales[ib] & 0xF, self.scales[ib] >> 4],
        }
    }
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
}

impl Iq2Block for BlockIq2S {
    /// Group `4 ib + l`: index `qs[4 ib + l] | (qh[ib] << (8 - 2 l)) & 0x300`, signs
    /// `qs[32 + 4 ib + l]`.
    #[inline]
    fn sub(&self, ib: usize) -> Sub {
        let qh = self.qh[ib] as usize;
        Sub {
            grid: core::array::from_fn(|l| {
                IQ2S_GRID[self.qs[4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300)]
            }),
            signs: core::array::from_fn(|l| self.qs[32 + 4 * ib + l]),
            ls: [self.scales[ib] & 0xF, self.scales[ib] >> 4],
        }
    }
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
}

/// ggml's `dequantize_row_iq2_*` for one block: `db = d · (0.5 + ls) · 0.25` per half of 16,
/// then `db · magnitude · (±1)`, in f32 and in that order.
fn dequantize_block<B: Iq2Block>(b: &B, y: &mut [f32]) {
    let d = b.d();
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let s = b.sub(ib);
        let db = s.ls.map(|ls| d * (0.5 + ls as f32) * 0.25);
        for (i, v) in ys.iter_mut().enumerate() {
            let sign = if s.negative(i) { -1.0f32 } else { 1.0 };
            *v = db[i / 16] * s.magnitude(i) as f32 * sign;
        }
    }
}

/// The exact dot of a row of blocks with its Q8_K partner (`d/8 · d_y · Σ value · y`).
fn dot_acc<B: Iq2Block>(w: &[B], x: &[BlockQ8K], acc: &mut DotAcc) {
    assert_eq!(w.len(), x.len());
    for (b, y) in w.iter().zip(x) {
        let (mut s, mut m) = (0i64, 0i64);
        for ib in 0..8 {
            let sub = b.sub(ib);
            for i in 0..32 {
                let p = sub.value(i) * y.qs[32 * ib + i] as i32;
                s += p as i64;
                m += p.unsigned_abs() as i64;
            }
        }
        let d = (b.d() * y.d.to_f32()) as f64 * 0.125;
        acc.add(d * s as f64, d.abs() * m as f64);
    }
}

macro_rules! iq2_format {
    ($($b:ty = $ty:expr),*) => {$(
        impl BlockFormat for $b {
            const TYPE: GgmlType = $ty;
            const BLOCK: usize = QK_K;
            type Dot = BlockQ8K;
            fn dequantize(blocks: &[Self], out: &mut [f32]) {
                check_lengths(blocks.len(), QK_K, out.len());
                for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
                    dequantize_block(b, y);
                }
            }
            fn vec_dot_acc(w: &[Self], x: &[BlockQ8K], acc: &mut DotAcc) {
                dot_acc(w, x, acc);
            }
        }
    )*};
}

iq2_format!(
    BlockIq2Xxs = GgmlType::IQ2XXS,
    BlockIq2Xs = GgmlType::IQ2XS,
    BlockIq2S = GgmlType::IQ2S
);

/// Super-block `b` of a row of `ty` (a 2-bit i-quant) as `kquant_order`'s lanes take it: the
/// float scale `d / 8` (exact: a power of two), and each element's integer weight and each
/// 16 elements' scale folded into it (so the per-16 scale is 1).
pub(super) fn lanes_parts(ty: GgmlType, w: &[u8], b: usize) -> (f32, [i32; QK_K]) {
    fn go<B: Iq2Block>(w: &[u8], b: usize) -> (f32, [i32; QK_K]) {
        let size = core::mem::size_of::<B>();
        let blk = &cast::<B>(&w[b * size..(b + 1) * size]).expect("whole blocks")[0];
        let subs: [Sub; 8] = core::array::from_fn(|ib| blk.sub(ib));
        (
            blk.d() * 0.125,
            core::array::from_fn(|i| subs[i / 32].value(i % 32)),
        )
    }
    match ty {
        GgmlType::IQ2XXS => go::<BlockIq2Xxs>(w, b),
        GgmlType::IQ2XS => go::<BlockIq2Xs>(w, b),
        GgmlType::IQ2S => go::<BlockIq2S>(w, b),
        _ => panic!("{ty}: not a 2-bit i-quant"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_weight_row, reference_dot, Rng, Scales};
    use super::super::{dequantize_row, kernels_for, GemmArgs, Isa};
    use super::*;

    const TYPES: [GgmlType; 3] = [GgmlType::IQ2XXS, GgmlType::IQ2XS, GgmlType::IQ2S];

    /// A hand-built IQ2_XXS sub-block decodes as ggml's layout says.
    #[test]
    fn xxs_sub_block_layout() {
        let mut b = BlockIq2Xxs::default();
        // Grid indices 0, 1, 2, 255; sign indices 1, 0, 127, 3; ls 15.
        b.qs[..4].copy_from_slice(&[0, 1, 2, 255]);
        let aux: u32 = 1 | (127 << 14) | (3 << 21) | (15 << 28);
        b.qs[4..8].copy_from_slice(&aux.to_le_bytes());
        let s = b.sub(0);
        assert_eq!(
            s.grid,
            [
                IQ2XXS_GRID[0],
                IQ2XXS_GRID[1],
                IQ2XXS_GRID[2],
                IQ2XXS_GRID[255]
            ]
        );
        // 1 has odd parity: bit 7 joins it; 127 odd too; 3 even.
        assert_eq!(s.signs, [0x81, 0, 0xFF, 3]);
        assert_eq!(s.ls, [15, 15]);
        assert_eq!(s.value(0), -31 * 8);
        assert_eq!(s.value(7), -31 * (IQ2XXS_GRID[0] >> 56) as i32);
        assert_eq!(s.value(8), 31 * (IQ2XXS_GRID[1] & 0xFF) as i32);
    }

    /// IQ2_S's high index bits: group `l` of sub-block `ib` takes bits `2l, 2l + 1` of `qh[ib]`.
    #[test]
    fn s_high_index_bits() {
        let mut b = BlockIq2S::default();
        b.qs[4..8].copy_from_slice(&[7, 7, 7, 7]);
        b.qh[1] = 0b11_10_01_00;
        b.qs[36..40].copy_from_slice(&[0, 0xFF, 0x0F, 0x80]);
        b.scales[1] = 0x3A;
        let s = b.sub(1);
        assert_eq!(s.grid, [7, 7 | 256, 7 | 512, 7 | 768].map(|i| IQ2S_GRID[i]));
        assert_eq!(s.signs, [0, 0xFF, 0x0F, 0x80]);
        assert_eq!((s.scale(0), s.scale(1)), (21, 7));
        assert!(s.negative(8) && !s.negative(0) && s.negative(31) && !s.negative(30));
    }

    /// The dequantized row times a dequantized activation is the reference dot (every scale,
    /// sign and index pattern of random bytes, and the extremes).
    #[test]
    fn dequantize_agrees_with_the_reference_dot() {
        let mut rng = Rng(0x1a2b);
        for ty in TYPES {
            let k = kernels_for(ty, Isa::Scalar).unwrap();
            for nb in [1, 4] {
                let n = 256 * nb;
                for w in [
                    random_weight_row(ty, n, &mut rng, Scales::Normal),
                    extreme_row(ty, n, 0xFF),
                    extreme_row(ty, n, 0x00),
                ] {
                    let x = super::super::tests::random_act_row(&k, n, &mut rng);
                    let (mut wf, mut xf) = (vec![0f32; n], vec![0f32; n]);
                    dequantize_row(ty, &w, &mut wf).unwrap();
                    dequantize_row(GgmlType::Q8K, &x, &mut xf).unwrap();
                    let direct: f64 = wf.iter().zip(&xf).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let r = reference_dot(ty, n, &w, &x);
                    assert!(
                        (direct - r.sum).abs() <= 1e-6 * r.mag,
                        "{ty} n={n}: dequantized {direct} vs reference {}",
                        r.sum
                    );
                }
            }
        }
    }

    /// Every byte but the scale `fill`: all-ones gives the largest scales, every sign negative
    /// (IQ2_S; the 7-bit sign indices 127 of the others) and the last grid entries.
    pub(in crate::quant) fn extreme_row(ty: GgmlType, n: usize, fill: u8) -> Vec<u8> {
        let mut w = vec![fill; ty.row_bytes(n).unwrap()];
        for b in w.chunks_mut(ty.type_size()) {
            b[..2].copy_from_slice(&F16Le::from_f32(-0.0371).0);
        }
        w
    }

    /// Q8_K activations all at `q` (±127: the largest products), with consistent sums.
    fn flat_act(n: usize, q: i8) -> Vec<u8> {
        let mut blocks = vec![BlockQ8K::default(); n / QK_K];
        for b in &mut blocks {
            b.d = F32Le::from_f32(0.0123);
            b.qs = [q; QK_K];
            b.bsums = [I16Le::new(16 * q as i16); 16];
        }
        as_bytes(&blocks).to_vec()
    }

    /// Every tier's single-row and batched products are the reference engine's order bit for
    /// bit on the extreme blocks (largest scales, every sign negative, the last grid entries;
    /// and all-zero bytes) against the extreme activations, one block and many.
    #[test]
    fn kernels_are_exact_on_extreme_blocks() {
        let mut rng = Rng(0x5eed);
        for ty in TYPES {
            for nb in [1, 5] {
                let n = QK_K * nb;
                let rows = [
                    extreme_row(ty, n, 0xFF),
                    extreme_row(ty, n, 0x00),
                    random_weight_row(ty, n, &mut rng, Scales::Huge),
                ];
                let acts = [flat_act(n, 127), flat_act(n, -127)];
                let row_w = ty.row_bytes(n).unwrap();
                let w: Vec<u8> = rows.concat();
                for isa in Isa::available() {
                    let k = kernels_for(ty, isa).unwrap();
                    // Nine activation rows: the reference tiles that batch.
                    let mut x = Vec::new();
                    for j in 0..9 {
                        x.extend_from_slice(&acts[j % 2]);
                    }
                    let row_x = acts[0].len();
                    let mut out = vec![0f32; 3 * 9];
                    (k.gemm)(GemmArgs::new(
                        n,
                        (&w, row_w, 3),
                        (&x, row_x, 9),
                        (&mut out, 3),
                    ));
                    for (i, wr) in w.chunks_exact(row_w).enumerate() {
                        for j in 0..9 {
                            let xr = &x[j * row_x..(j + 1) * row_x];
                            let what = format!("{ty} {} n={n} row {i} act {j}", isa.name());
                            let lanes = super::super::kquant_order::row_dot(ty, wr, xr, n, 1, 0);
                            let tiled = super::super::kquant_order::row_dot(ty, wr, xr, n, 9, j);
                            let single = (k.vec_dot)(n, wr, xr);
                            assert_eq!(Some(single.to_bits()), lanes.map(f32::to_bits), "{what}");
                            let got = out[j * 3 + i];
                            assert_eq!(Some(got.to_bits()), tiled.map(f32::to_bits), "{what}");
                            let want = reference_dot(ty, n, wr, xr);
                            assert!(
                                (single as f64 - want.sum).abs() <= 1e-5 * want.mag + 1e-30,
                                "{what}: {single} vs {}",
                                want.sum
                            );
                        }
                    }
                }
            }
        }
    }

    /// All-ones blocks: each element `-d/8 · 31 · magnitude` (every sign negative, ls 15).
    #[test]
    fn all_ones_blocks_are_all_negative_at_full_scale() {
        for ty in TYPES {
            let w = extreme_row(ty, 256, 0xFF);
            let mut y = vec![0f32; 256];
            dequantize_row(ty, &w, &mut y).unwrap();
            let d = F16Le::from_f32(-0.0371).to_f32();
            let db = d * 15.5 * 0.25;
            let grid = match ty {
                GgmlType::IQ2XXS => IQ2XXS_GRID[255],
                GgmlType::IQ2XS => IQ2XS_GRID[511],
                _ => IQ2S_GRID[1023],
            };
            for (i, &v) in y.iter().enumerate() {
                let m = (grid >> (8 * (i % 8))) as u8 as f32;
                assert_eq!(v.to_bits(), (-(db * m)).to_bits(), "{ty} element {i}");
            }
        }
    }
}
