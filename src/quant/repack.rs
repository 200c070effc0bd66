//! Weight layouts rearranged at load for a kernel that reads sixteen rows at once.
//!
//! **Q4_K × 16.** A row-major Q4_K matrix makes a kernel keep each row's partial sums in its
//! own register and add the lanes up at the end of every pair of sub-blocks. Stored instead as
//! groups of 16 rows, interleaved so that one 64-byte load holds the same 4 quant bytes of all
//! 16 rows, every 32-bit lane of a 512-bit register is one weight row, and the sums never need
//! a horizontal step (llama.cpp repacks Q4_K into 8-row groups for the same reason).
//!
//! Group `g` (rows `16g .. 16g + 16`) takes exactly the bytes rows `16g ..` took before, so
//! a tile of rows is still `rows × row_bytes` at offset `first_row × row_bytes`; within it,
//! super-block `b` of the 16 rows is one 2304-byte block ([`Q4K_X16_BYTES`]):
//!
//! | offset | bytes | content |
//! | ---: | ---: | --- |
//! | 0 | 32 | `d` of rows 0..16 (f16) |
//! | 32 | 32 | `dmin` of rows 0..16 (f16) |
//! | 64 | 192 | the 12 packed scale bytes as three 32-bit words `w`: word `w` of row `r` at `64 + 64w + 4r` |
//! | 256 | 2048 | quant bytes: `qs[32p + 4k .. 32p + 4k + 4]` of row `r` at `256 + 64(8p + k) + 4r` |
//!
//! Rows after the last whole group (`rows % 16`) keep the plain layout. The kernels of a
//! repacked matrix must be called on tiles that start at a multiple of 16 rows
//! ([`super::Kernels::group`]).

use super::blocks::{BlockQ4K, QK_K};

/// Rows per repacked Q4_K group.
pub const Q4K_GROUP: usize = 16;
/// Bytes of one super-block of a group: 16 plain blocks' worth.
pub const Q4K_X16_BYTES: usize = Q4K_GROUP * BQ;
/// Bytes of one plain Q4_K block.
const BQ: usize = std::mem::size_of::<BlockQ4K>();

/// Where byte `i` (0..144) of row `r`'s block lands inside its group's super-block.
#[inline]
fn slot(r: usize, i: usize) -> usize {
    match i {
        0..2 => 2 * r + i,
        2..4 => 32 + 2 * r + (i - 2),
        4..16 => {
            let (w, k) = ((i - 4) / 4, (i - 4) % 4);
            64 + 64 * w + 4 * r + k
        }
        _ => {
            let q = i - 16;
            let (chunk, k) = (q / 4, q % 4);
            256 + 64 * chunk + 4 * r + k
        }
    }
}

/// The Q4_K matrix `src` (`rows` rows of `n` elements, row-major) in the 16-row layout.
/// Panics if `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_q4k_x16(src: &[u8], rows: usize, n: usize) -> Vec<u8> {
    assert!(n.is_multiple_of(QK_K), "Q4_K row of {n} elements");
    let nb = n / QK_K;
    let row_bytes = nb * BQ;
    assert_eq!(src.len(), rows * row_bytes, "Q4_K matrix bytes");
    let mut out = src.to_vec();
    for g in 0..rows / Q4K_GROUP {
        let base = g * Q4K_GROUP * row_bytes;
        for r in 0..Q4K_GROUP {
            for b in 0..nb {
                let from = base + r * row_bytes + b * BQ;
                let to = base + b * Q4K_X16_BYTES;
                for i in 0..BQ {
                    out[to + slot(r, i)] = src[from + i];
                }
            }
        }
    }
    out
}

/// Block `b` of row `r` of the repacked group starting at `group` (whose rows hold `nb`
/// super-blocks), in the plain Q4_K byte order.
pub fn q4k_x16_block(group: &[u8], r: usize, b: usize) -> [u8; BQ] {
    let sb = &group[b * Q4K_X16_BYTES..(b + 1) * Q4K_X16_BYTES];
    std::array::from_fn(|i| sb[slot(r, i)])
}

/// Row `r` of a repacked group (`group`: the group's bytes) dequantized into `out` (the row's
/// `n` elements), for a matrix with kernels `k` (`k.group > 1`).
pub fn dequantize_row(k: &super::Kernels, group: &[u8], r: usize, out: &mut [f32]) {
    assert_eq!(k.group, Q4K_GROUP, "only Q4_K is repacked");
    for (b, o) in out.chunks_exact_mut(QK_K).enumerate() {
        (k.dequantize)(&q4k_x16_block(group, r, b), o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_a_permutation_of_the_group() {
        let mut seen = vec![false; Q4K_X16_BYTES];
        for r in 0..Q4K_GROUP {
            for i in 0..BQ {
                let s = slot(r, i);
                assert!(!seen[s], "slot {s} taken twice");
                seen[s] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn repack_round_trips_and_keeps_the_tail() {
        let (rows, n) = (37, 512);
        let row_bytes = n / QK_K * BQ;
        let src: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        let out = repack_q4k_x16(&src, rows, n);
        assert_eq!(out.len(), src.len());
        for row in 0..32 {
            let (g, r) = (row / 16, row % 16);
            let group = &out[g * 16 * row_bytes..(g + 1) * 16 * row_bytes];
            for b in 0..n / QK_K {
                let blk = q4k_x16_block(group, r, b);
                let at = row * row_bytes + b * BQ;
                assert_eq!(&blk[..], &src[at..at + BQ], "row {row} block {b}");
            }
        }
        assert_eq!(&out[32 * row_bytes..], &src[32 * row_bytes..]);
    }
}
