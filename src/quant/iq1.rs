//! The 1-bit i-quants IQ1_S and IQ1_M: scalar dequantizers (bit for bit ggml's
//! `dequantize_row_iq1_s` / `_iq1_m`), element decoders for the dot products, and the exact
//! reference dots against Q8_K. Each group of 8 elements is one entry of a ternary grid
//! ([`IQ1S_GRID`], values -1, 0, 1) shifted by ±1/8; IQ1_S keeps a 3-bit scale and the shift's
//! sign per 32 elements, IQ1_M a 3-bit scale per 16 and the shift's sign per 8, with its f16
//! super-block scale spread over the top nibbles of its scale words. `llama-quantize` makes
//! them only with an importance matrix; kiln reads them only (no quantizer).
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::iq_grids::IQ1S_GRID;
use super::iq_order::{exact_dot, sign, IqBlock, Shift};
use super::reference::{check_lengths, super_block_format, BlockFormat, DotAcc};
use super::types::GgmlType;

/// The shift of the grid values, ggml's `IQ1S_DELTA` (and `IQ1M_DELTA`).
const DELTA: f32 = 0.125;

/// Element `j` (0..8) of grid entry `index`: -1, 0 or 1.
#[inline]
pub(super) fn grid_value(index: usize, j: usize) -> i32 {
    (IQ1S_GRID[index] >> (8 * j)) as u8 as i8 as i32
}

impl BlockIq1S {
    /// The LE u16 of sub-block `ib` (0..8): the indices' top bits, the scale, the shift's sign.
    #[inline]
    pub(super) fn qh(&self, ib: usize) -> u16 {
        u16::from_le_bytes([self.qh[2 * ib], self.qh[2 * ib + 1]])
    }

    /// The 11-bit grid index of the group of 8 elements `8g .. 8g + 8` (g in 0..32).
    #[inline]
    pub(super) fn index(&self, g: usize) -> usize {
        let h = (self.qh(g / 4) >> (3 * (g % 4))) & 7;
        self.qs[g] as usize | (h as usize) << 8
    }

    /// The 3-bit scale `ls` of sub-block `ib`.
    #[inline]
    fn ls(&self, ib: usize) -> i32 {
        ((self.qh(ib) >> 12) & 7) as i32
    }
}

impl IqBlock for BlockIq1S {
    const FACTOR: f32 = DELTA;
    const SHIFT: Shift = Shift::Scalar;
    #[inline]
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    #[inline]
    fn q(&self, i: usize) -> i32 {
        grid_value(self.index(i / 8), i % 8)
    }
    #[inline]
    fn scale(&self, i: usize) -> i32 {
        2 * self.ls(i / 32) + 1
    }
    #[inline]
    fn shift(&self, i: usize) -> i32 {
        sign(self.qh(i / 32) & 0x8000 != 0)
    }
}

super_block_format!(BlockIq1S: IQ1S, |b, y| { dequantize_iq1(b, y) }, rows exact_dot);

impl BlockIq1M {
    /// Scale word `k` (0..4), a LE u16.
    #[inline]
    fn sc(&self, k: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]])
    }

    /// The f16 super-block scale: the top nibbles of the four scale words, first word lowest.
    #[inline]
    pub(super) fn d_bits(&self) -> u16 {
        (self.sc(0) >> 12)
            | ((self.sc(1) >> 8) & 0x00f0)
            | ((self.sc(2) >> 4) & 0x0f00)
            | (self.sc(3) & 0xf000)
    }

    /// The nibble of `qh` of the group of 8 elements `8g .. 8g + 8` (g in 0..32): the index's
    /// top 3 bits and (bit 3) the shift's sign.
    #[inline]
    pub(super) fn qh_nibble(&self, g: usize) -> u8 {
        (self.qh[g / 2] >> (4 * (g % 2))) & 0xF
    }

    /// The 11-bit grid index of group `g`.
    #[inline]
    pub(super) fn index(&self, g: usize) -> usize {
        self.qs[g] as usize | ((self.qh_nibble(g) & 7) as usize) << 8
    }
}

impl IqBlock for BlockIq1M {
    const FACTOR: f32 = DELTA;
    const SHIFT: Shift = Shift::Lanes;
    #[inline]
    fn d(&self) -> f32 {
        half::f16::from_bits(self.d_bits()).to_f32()
    }
    #[inline]
    fn q(&self, i: usize) -> i32 {
        grid_value(self.index(i / 8), i % 8)
    }
    /// The 3-bit scale of the 16 elements holding `i`, as `2·ls + 1`.
    #[inline]
    fn scale(&self, i: usize) -> i32 {
        let s = i / 16;
        2 * ((self.sc(s / 4) >> (3 * (s % 4))) & 7) as i32 + 1
    }
    #[inline]
    fn shift(&self, i: usize) -> i32 {
        sign(self.qh_nibble(i / 8) & 8 != 0)
    }
}

super_block_format!(BlockIq1M: IQ1M, |b, y| { dequantize_iq1(b, y) }, rows exact_dot);

/// `dequantize_row_iq1_s` / `_iq1_m`: `dl = d · (2·ls + 1)` (per 32 / per 16 elements), then
/// `dl · (grid ± 0.125)`.
fn dequantize_iq1<B: IqBlock>(b: &B, y: &mut [f32]) {
    let d = b.d();
    for i in 0..QK_K {
        let dl = d * b.scale(i) as f32;
        let delta = DELTA * b.shift(i) as f32;
        y[i] = dl * (b.q(i) as f32 + delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_matches_the_reference_table_ends() {
        assert_eq!(IQ1S_GRID[0], 0xffffffffffffffff);
        assert_eq!(IQ1S_GRID[2047], 0x0101010101010101);
        assert_eq!(IQ1S_GRID[1], 0xffffffffffffff01);
        assert_eq!((grid_value(1, 0), grid_value(1, 1)), (1, -1));
        for e in 0..IQ1S_GRID.len() {
            assert!((0..8).all(|j| (-1..=1).contains(&grid_value(e, j))), "{e}");
        }
    }

    #[test]
    fn s_fields_decode_as_ggml() {
        let mut b = BlockIq1S::default();
        // Sub-block 1: group 5 (its second) has top bits 0b111, scale 5, negative shift.
        let qh: u16 = 0x8000 | (5 << 12) | (7 << 3);
        b.qh[2..4].copy_from_slice(&qh.to_le_bytes());
        b.qs[5] = 0xFF;
        assert_eq!(b.index(5), 2047);
        assert_eq!((b.scale(32), b.shift(32), b.shift(31)), (11, -1, 1));
        assert_eq!(b.q(40), 1);
        b.d = F16Le::from_f32(0.5);
        let mut y = [0f32; QK_K];
        BlockIq1S::dequantize(&[b], &mut y);
        assert_eq!(y[40], 0.5 * 11.0 * (1.0 - 0.125));
    }

    #[test]
    fn m_fields_decode_as_ggml() {
        let mut b = BlockIq1M::default();
        // The f16 1.0 (0x3c00) spread over the words' top nibbles: 0, 0, 0xc, 0x3.
        let d = 0x3c00u16;
        let words = [
            (d & 0xF) << 12 | 0o7654,
            (d >> 4 & 0xF) << 12,
            (d >> 8 & 0xF) << 12,
            (d >> 12) << 12,
        ];
        for (k, w) in words.iter().enumerate() {
            b.scales[2 * k..2 * k + 2].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(b.d(), 1.0);
        // Word 0, octal digits 4, 5, 6, 7: the scales of elements 0.., 16.., 32.., 48...
        assert_eq!(
            (
                b.scale(0),
                b.scale(16),
                b.scale(32),
                b.scale(48),
                b.scale(64)
            ),
            (9, 11, 13, 15, 1)
        );
        b.qh[1] = 0xA3; // group 3: top bits 0b010, negative shift; group 2: 0b011, positive
        assert_eq!((b.shift(24), b.shift(16)), (-1, 1));
        b.qs[3] = 7;
        assert_eq!(b.index(3), 0x207);
        assert_eq!(b.index(2), 0x300);
    }
}
