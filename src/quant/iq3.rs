//! The 3-bit i-quants IQ3_XXS and IQ3_S: scalar dequantizers (bit for bit ggml's
//! `dequantize_row_iq3_xxs` / `_iq3_s`), element decoders for the dot products, and the exact
//! reference dots against Q8_K. Each group of 4 elements is one entry of a grid of unsigned
//! magnitudes ([`IQ3XXS_GRID`], [`IQ3S_GRID`]), each element with its own sign; a 4-bit scale
//! `ls` per 32 elements. `llama-quantize` makes both without an importance matrix; their
//! quantizers are in `iq3_quantize`.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::iq_order::{exact_dot, sign, IqBlock};
use super::iq_signs::{KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::reference::{check_lengths, super_block_format, BlockFormat, DotAcc};
use super::types::GgmlType;

/// Byte `j` (0..4) of a grid entry: the magnitude of element `j` of its group of 4.
#[inline]
fn grid_byte(entry: u32, j: usize) -> i32 {
    ((entry >> (8 * j)) & 0xFF) as i32
}

impl BlockIq3Xxs {
    /// The LE u32 of sub-block `ib` (0..8): four 7-bit sign indices, then the scale nibble.
    #[inline]
    pub(super) fn aux(&self, ib: usize) -> u32 {
        let o = QK_K / 4 + 4 * ib;
        u32::from_le_bytes([self.qs[o], self.qs[o + 1], self.qs[o + 2], self.qs[o + 3]])
    }

    /// The 8-bit sign mask of the 8 elements `8g .. 8g + 8` (bit `j`: element `8g + j` is
    /// negative).
    #[inline]
    pub(super) fn signs8(&self, g: usize) -> u8 {
        KSIGNS_IQ2XS[((self.aux(g / 4) >> (7 * (g % 4))) & 127) as usize]
    }

    /// The grid magnitude of element `i` (0..256).
    #[inline]
    pub(super) fn magnitude(&self, i: usize) -> i32 {
        grid_byte(IQ3XXS_GRID[self.qs[i / 4] as usize], i % 4)
    }
}

impl IqBlock for BlockIq3Xxs {
    const FACTOR: f32 = 0.25;
    const LANE_FACTOR: f32 = 0.25;
    #[inline]
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    #[inline]
    fn q(&self, i: usize) -> i32 {
        sign(self.signs8(i / 8) & KMASK_IQ2XS[i % 8] != 0) * self.magnitude(i)
    }
    #[inline]
    fn scale(&self, i: usize) -> i32 {
        2 * (self.aux(i / 32) >> 28) as i32 + 1
    }
}

// `dequantize_row_iq3_xxs`: `db = d · (0.5 + ls) · 0.5`, then `db · grid · ±1`.
super_block_format!(BlockIq3Xxs: IQ3XXS,
    |b, y| {
        let d = b.d.to_f32();
        for ib in 0..8 {
            let db = d * (0.5 + (b.aux(ib) >> 28) as f32) * 0.5;
            for i in 32 * ib..32 * ib + 32 {
                let sign = if b.signs8(i / 8) & KMASK_IQ2XS[i % 8] != 0 {
                    -1.0
                } else {
                    1.0
                };
                y[i] = db * b.magnitude(i) as f32 * sign;
            }
        }
    },
    rows exact_dot
);

impl BlockIq3S {
    /// The 9-bit grid index of the group of 4 elements `4k .. 4k + 4` (k in 0..64).
    #[inline]
    pub(super) fn index(&self, k: usize) -> usize {
        let high = (self.qh[k / 8] >> (k % 8)) & 1;
        self.qs[k] as usize | (high as usize) << 8
    }

    /// The grid magnitude of element `i` (0..256).
    #[inline]
    pub(super) fn magnitude(&self, i: usize) -> i32 {
        grid_byte(IQ3S_GRID[self.index(i / 4)], i % 4)
    }

    /// Whether element `i` is negative.
    #[inline]
    pub(super) fn negative(&self, i: usize) -> bool {
        self.signs[i / 8] & KMASK_IQ2XS[i % 8] != 0
    }
}

impl IqBlock for BlockIq3S {
    #[inline]
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    #[inline]
    fn q(&self, i: usize) -> i32 {
        sign(self.negative(i)) * self.magnitude(i)
    }
    #[inline]
    fn scale(&self, i: usize) -> i32 {
        let ib = i / 32;
        1 + 2 * ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32
    }
}

// `dequantize_row_iq3_s`: `db = d · (1 + 2·ls)`, then `db · grid · ±1`.
super_block_format!(BlockIq3S: IQ3S,
    |b, y| {
        let d = b.d.to_f32();
        for i in 0..QK_K {
            let db = d * b.scale(i) as f32;
            let sign = if b.negative(i) { -1.0 } else { 1.0 };
            y[i] = db * b.magnitude(i) as f32 * sign;
        }
    },
    rows exact_dot
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_match_the_reference_table_ends() {
        assert_eq!(IQ3XXS_GRID[0], 0x04040404);
        assert_eq!(IQ3XXS_GRID[255], 0x3e341c04);
        assert_eq!(IQ3S_GRID[0], 0x01010101);
        assert_eq!(IQ3S_GRID[511], 0x0f0f0101);
        // Every magnitude is small enough for a pair of products with a Q8_K quant to stay
        // within i16 (the kernels' `vpmaddubsw`).
        for &e in IQ3XXS_GRID.iter().chain(IQ3S_GRID.iter()) {
            assert!(
                (0..4).all(|j| (1..=62).contains(&grid_byte(e, j))),
                "{e:#x}"
            );
        }
    }

    #[test]
    fn xxs_fields_decode_as_ggml() {
        let mut b = BlockIq3Xxs::default();
        b.qs[0] = 255; // group 0: grid entry 255
        let aux: u32 = (11 << 28) | 5; // scale 11, signs of group 0: index 5 -> 0b0000_0101
        b.qs[64..68].copy_from_slice(&aux.to_le_bytes());
        assert_eq!(b.scale(0), 23);
        assert_eq!(b.signs8(0), KSIGNS_IQ2XS[5]);
        assert_eq!(b.q(0), -0x04);
        assert_eq!(b.q(1), 0x1c);
        assert_eq!(b.q(2), -0x34);
        assert_eq!(b.q(3), 0x3e);
        let mut y = [0f32; QK_K];
        b.d = F16Le::from_f32(2.0);
        BlockIq3Xxs::dequantize(&[b], &mut y);
        assert_eq!(y[3], 2.0 * 11.5 * 0.5 * 62.0);
    }

    #[test]
    fn s_fields_decode_as_ggml() {
        let mut b = BlockIq3S::default();
        b.qs[9] = 255;
        b.qh[1] = 0b10; // the ninth bit of group 9
        b.signs[4] = 0x80; // element 39
        b.scales[0] = 0x3 << 4; // sub-block 1: 1 + 2·3
        assert_eq!(b.index(9), 511);
        assert_eq!(b.q(36), 0x01);
        assert_eq!(b.q(37), 0x01);
        assert_eq!(b.q(38), 0x0f);
        assert_eq!(b.q(39), -0x0f);
        assert_eq!((b.scale(0), b.scale(32)), (1, 7));
    }
}
