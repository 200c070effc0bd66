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
//! **Q6_K × 16**, the same idea; super-block `b` of the 16 rows is one 3360-byte block
//! ([`Q6K_X16_BYTES`]). Element `i = 32c + 4l + e` (chunk `c` < 8, dword `l` < 8, byte `e` < 4)
//! has the 6-bit value `u` (the signed quant + 32):
//!
//! | offset | bytes | content |
//! | ---: | ---: | --- |
//! | 0 | 32 | `d` of rows 0..16 (f16) |
//! | 32 | 256 | scales: `[scales[2l], scales[2l+1]]` (i8) of row `r` at `32 + 32l + 2r` |
//! | 288 | 3072 | quant bits in the order a kernel reads them ([`q6k_x16_low`], [`q6k_x16_high`]): for `c'` < 2 and `l` < 8, a 64-byte line of low bits of chunk `c'` then one of high bits of `c'`; then the low bits of chunks 2 and 3, `l` = 0..8 |
//!
//! A low-bit line `(c', l)` holds, in byte `4r + e`, `u & 15` of row `r`'s element `32c' + 4l + e`
//! in its low nibble and of element `32(c' + 4) + 4l + e` in its high nibble. A high-bit line
//! `(c', l)` holds, in byte `4r + e`, `u >> 4` of element `32(c' + 2k) + 4l + e` in bits
//! `2k, 2k + 1` (`k` < 4). A kernel taking chunks `c'` and `c' + 4` together first touches the
//! super-block's lines front to back (read chunk by chunk out of that order, the lines came from
//! memory at a third of the speed on a Zen 4).
//!
//! **Q4_0, Q4_1, Q5_0, Q5_1 × 16** ([`Nib32`]): block `b` (32 elements) of the 16 rows is one
//! block of 16 plain blocks' bytes (288, 320, 352, 384). Lane `l` of the reference's 8-lane
//! dot is elements `4l .. 4l + 4`; here it is one register of 16 rows:
//!
//! | offset | bytes | content |
//! | ---: | ---: | --- |
//! | 0 | 32 | `d` of rows 0..16 (f16) |
//! | 32 | 32 | Q4_1, Q5_1: `m` of rows 0..16 (f16) |
//! | 32 or 64 | 64 | Q5_0, Q5_1: fifth bits, one 64-bit mask per lane `l`: bit `4r + e` is row `r`'s element `4l + e` |
//! | then | 256 | nibbles: `qs[4j .. 4j + 4]` of row `r` at `+64j + 4r` (low nibbles: lane `j`, high: lane `j + 4`) |
//!
//! The tiers without AVX-512 VNNI read the fifth bits as bit planes instead ([`Nib32::planes`],
//! the same 64 bytes): byte `32h + 4r' + e` holds, in bit `l`, the fifth bit of row
//! `8h + r'`'s element `4l + e`, so that one 32-byte load serves the 8 lanes of a half and
//! a lane's bits reach bit 4 of each byte by one shift. Q5_0's are stored inverted (`1 − bit`):
//! its signed quant is then `nibble − 16 · bit'`.
//!
//! **Q8_0 × 16**: block `b` of the 16 rows is one 544-byte block ([`Q8_0_X16_BYTES`]): `d` of
//! rows 0..16 (f16) at 0, then lane `l`'s quants `q[4l .. 4l + 4]` of row `r`, stored as
//! `q ^ 0x80` (unsigned, `q + 128`), at `32 + 64l + 4r`.
//!
//! **MXFP4 × 16**: block `b` of the 16 rows is one 272-byte block ([`MXFP4_X16_BYTES`]): the
//! 16 rows' E8M0 scale bytes at 0, then the nibbles as Q4_0's, `qs[4j .. 4j + 4]` of row `r` at
//! `16 + 64j + 4r` (low nibbles: elements `4j ..`, high: `16 + 4j ..`).
//!
//! Rows after the last whole group (`rows % 16`) keep the plain layout. The kernels of a
//! repacked matrix must be called on tiles that start at a multiple of 16 rows
//! ([`super::Kernels::group`]).

use super::blocks::{BlockQ4K, BlockQ6K, BlockQ8_0, QK_K};

/// Rows per repacked group (every layout here).
pub const GROUP: usize = 16;
/// Bytes of one super-block of a group: 16 plain blocks' worth.
pub const Q4K_X16_BYTES: usize = GROUP * BQ;
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
pub fn repack_q4k_x16(src: &[u8], rows: usize, n: usize, out: &mut [u8]) {
    repack_groups(src, rows, n, out, QK_K, BQ, |r, blk, sb| {
        // Every 4-byte piece of the block (d and dmin are 2 bytes) moves as a whole.
        for i in [0, 2].into_iter().chain((4..BQ).step_by(4)) {
            let len = if i < 4 { 2 } else { 4 };
            let at = slot(r, i);
            sb[at..at + len].copy_from_slice(&blk[i..i + len]);
        }
    })
}

/// A signature shared by the repacking functions: `(matrix, rows, n, out)`, the repacked
/// matrix written to `out` (as long as the matrix).
pub type RepackFn = fn(&[u8], usize, usize, &mut [u8]);

/// The matrix `src` (`rows` rows of `n` elements in `bq`-byte blocks of `qk` elements,
/// row-major) into `out`, each whole group of 16 rows rebuilt by `place(r, block,
/// super_block)`: block `b` of row `r` placed into the group's zeroed super-block `b` (16
/// blocks' worth); the rows after the last whole group are copied. Panics if `src` is not
/// exactly that matrix (the loader checked the shape) or `out` is not as long.
#[allow(clippy::too_many_arguments)]
fn repack_groups(
    src: &[u8],
    rows: usize,
    n: usize,
    out: &mut [u8],
    qk: usize,
    bq: usize,
    place: impl Fn(usize, &[u8], &mut [u8]),
) {
    assert!(
        n.is_multiple_of(qk),
        "row of {n} elements in blocks of {qk}"
    );
    let nb = n / qk;
    let row_bytes = nb * bq;
    assert_eq!(src.len(), rows * row_bytes, "quantized matrix bytes");
    let whole = rows / GROUP * GROUP * row_bytes;
    out[whole..].copy_from_slice(&src[whole..]);
    for g in 0..rows / GROUP {
        let base = g * GROUP * row_bytes;
        out[base..base + GROUP * row_bytes].fill(0);
        for r in 0..GROUP {
            for b in 0..nb {
                let blk = &src[base + r * row_bytes + b * bq..][..bq];
                place(r, blk, &mut out[base + b * GROUP * bq..][..GROUP * bq]);
            }
        }
    }
}

/// Block `b` of row `r` of the repacked group starting at `group` (whose rows hold `nb`
/// super-blocks), in the plain Q4_K byte order.
pub fn q4k_x16_block(group: &[u8], r: usize, b: usize) -> [u8; BQ] {
    let sb = &group[b * Q4K_X16_BYTES..(b + 1) * Q4K_X16_BYTES];
    std::array::from_fn(|i| sb[slot(r, i)])
}

/// Bytes of one super-block of a Q6_K group: 16 plain blocks' worth.
pub const Q6K_X16_BYTES: usize = GROUP * B6;
/// Bytes of one plain Q6_K block.
const B6: usize = std::mem::size_of::<BlockQ6K>();

/// Element `i`'s 6-bit value in a plain Q6_K block (`ql` at 0, `qh` at 128).
#[cfg(test)]
fn q6k_get(blk: &[u8], i: usize) -> u8 {
    let (half, r) = (i / 128, i % 128);
    let (c, l) = (r / 32, r % 32);
    let ql = blk[64 * half + 32 * (c % 2) + l];
    let low = if c < 2 { ql & 0xF } else { ql >> 4 };
    let high = (blk[128 + 32 * half + l] >> (2 * c)) & 3;
    low | (high << 4)
}

/// The 256 6-bit values of a plain Q6_K block, in element order.
fn q6k_values(blk: &[u8]) -> [u8; QK_K] {
    let mut u = [0u8; QK_K];
    for half in 0..2 {
        for c in 0..4 {
            for l in 0..32 {
                let ql = blk[64 * half + 32 * (c % 2) + l];
                let low = if c < 2 { ql & 0xF } else { ql >> 4 };
                let high = (blk[128 + 32 * half + l] >> (2 * c)) & 3;
                u[128 * half + 32 * c + l] = low | (high << 4);
            }
        }
    }
    u
}

/// Sets element `i`'s 6-bit value in a plain Q6_K block whose quant bytes start zeroed.
fn q6k_set(blk: &mut [u8], i: usize, u: u8) {
    let (half, r) = (i / 128, i % 128);
    let (c, l) = (r / 32, r % 32);
    let shift = if c < 2 { 0 } else { 4 };
    blk[64 * half + 32 * (c % 2) + l] |= (u & 0xF) << shift;
    blk[128 + 32 * half + l] |= (u >> 4) << (2 * c);
}

/// Offset in a Q6_K group's super-block of the 64-byte line of low bits `l < 8` of chunk
/// `c < 4` (its low nibbles; its high nibbles are chunk `c + 4`'s).
#[inline(always)]
pub const fn q6k_x16_low(c: usize, l: usize) -> usize {
    debug_assert!(c < 4 && l < 8);
    if c < 2 {
        288 + 1024 * c + 128 * l
    } else {
        288 + 2048 + 512 * (c - 2) + 64 * l
    }
}

/// Offset in a Q6_K group's super-block of the 64-byte line of high bits `l < 8` of chunk
/// `c < 2` (also chunks `c + 2`, `c + 4`, `c + 6`): right after the low bits' line `(c, l)`.
#[inline(always)]
pub const fn q6k_x16_high(c: usize, l: usize) -> usize {
    debug_assert!(c < 2);
    q6k_x16_low(c, l) + 64
}

/// Where the low and high bits of element `i = 32c + 4l + e` of row `r` go in its group's
/// super-block: `(low byte, low shift, high byte, high shift)`.
fn q6k_slots(r: usize, i: usize) -> (usize, u32, usize, u32) {
    let (c, l, e) = (i / 32, i % 32 / 4, i % 4);
    let low = q6k_x16_low(c % 4, l) + 4 * r + e;
    let high = q6k_x16_high(c % 2, l) + 4 * r + e;
    (low, 4 * (c / 4) as u32, high, 2 * (c / 2) as u32)
}

/// The Q6_K matrix `src` (`rows` rows of `n` elements, row-major) in the 16-row layout.
/// Panics if `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_q6k_x16(src: &[u8], rows: usize, n: usize, out: &mut [u8]) {
    repack_groups(src, rows, n, out, QK_K, B6, |r, blk, sb| {
        sb[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
        for l in 0..8 {
            sb[32 + 32 * l + 2 * r] = blk[192 + 2 * l];
            sb[32 + 32 * l + 2 * r + 1] = blk[192 + 2 * l + 1];
        }
        let u = q6k_values(blk);
        for c in 0..8 {
            let (ls, hs) = (4 * (c / 4), 2 * (c / 2));
            for l in 0..8 {
                let lo = q6k_x16_low(c % 4, l) + 4 * r;
                let hi = q6k_x16_high(c % 2, l) + 4 * r;
                for e in 0..4 {
                    let v = u[32 * c + 4 * l + e];
                    sb[lo + e] |= (v & 0xF) << ls;
                    sb[hi + e] |= (v >> 4) << hs;
                }
            }
        }
    })
}

/// Block `b` of row `r` of the repacked Q6_K group starting at `group`, in the plain byte order.
pub fn q6k_x16_block(group: &[u8], r: usize, b: usize) -> [u8; B6] {
    let sb = &group[b * Q6K_X16_BYTES..(b + 1) * Q6K_X16_BYTES];
    let mut blk = [0u8; B6];
    blk[208..210].copy_from_slice(&sb[2 * r..2 * r + 2]);
    for l in 0..8 {
        blk[192 + 2 * l] = sb[32 + 32 * l + 2 * r];
        blk[192 + 2 * l + 1] = sb[32 + 32 * l + 2 * r + 1];
    }
    for i in 0..QK_K {
        let (lo, ls, hi, hs) = q6k_slots(r, i);
        let u = ((sb[lo] >> ls) & 0xF) | (((sb[hi] >> hs) & 3) << 4);
        q6k_set(&mut blk, i, u);
    }
    blk
}

/// The layout of a 4-bit legacy format's group (Q4_0, Q4_1, Q5_0, Q5_1): whether its blocks
/// carry a minimum `m` (Q4_1, Q5_1) and fifth bits `qh` (Q5_0, Q5_1), and how a group keeps
/// those bits. A plain block is `d`, then `m`, then `qh`, then the 16 nibble bytes `qs`, each
/// part present or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nib32 {
    pub min: bool,
    pub fifth: bool,
    /// The fifth bits as bit planes (Q5_0's inverted) rather than one mask per lane (see the
    /// module's table).
    pub planes: bool,
}

impl Nib32 {
    /// Bytes of one plain block.
    pub const fn block_bytes(self) -> usize {
        2 + 2 * self.min as usize + 4 * self.fifth as usize + 16
    }
    /// Bytes of one block of a group: 16 plain blocks' worth.
    pub const fn group_bytes(self) -> usize {
        GROUP * self.block_bytes()
    }
    /// Offset of the 16 rows' `m` in a group's block (when `min`).
    pub const M_AT: usize = 32;
    /// Offset of the fifth-bit masks in a group's block (when `fifth`).
    pub const fn masks_at(self) -> usize {
        32 + 32 * self.min as usize
    }
    /// Offset of the fifth-bit plane byte of row `r`'s elements `4l + e` (every lane `l`),
    /// when `planes`.
    pub const fn plane_at(self, r: usize, e: usize) -> usize {
        self.masks_at() + 32 * (r / 8) + 4 * (r % 8) + e
    }
    /// What the planes XOR `qh` with: all of Q5_0's bits (stored inverted), none of Q5_1's.
    const fn plane_inversion(self) -> u32 {
        if self.planes && !self.min {
            u32::MAX
        } else {
            0
        }
    }
    /// Offset of the nibbles in a group's block.
    pub const fn nibbles_at(self) -> usize {
        self.masks_at() + 64 * self.fifth as usize
    }
    /// Offset of `qh` in a plain block (when `fifth`).
    const fn qh_at(self) -> usize {
        2 + 2 * self.min as usize
    }
    /// Offset of `qs` in a plain block.
    const fn qs_at(self) -> usize {
        self.qh_at() + 4 * self.fifth as usize
    }
    /// Which layout `ty` has, if it is one of these formats (`planes`: the bit-plane form of
    /// the fifth bits, for a format that has them).
    pub fn of(ty: super::GgmlType, planes: bool) -> Option<Nib32> {
        use super::GgmlType as T;
        let (min, fifth) = match ty {
            T::Q4_0 => (false, false),
            T::Q4_1 => (true, false),
            T::Q5_0 => (false, true),
            T::Q5_1 => (true, true),
            _ => return None,
        };
        Some(Nib32 {
            min,
            fifth,
            planes: planes && fifth,
        })
    }
}

/// The matrix `src` of the 4-bit legacy format `MIN`/`FIFTH` ([`Nib32`]; `rows` rows of `n`
/// elements, row-major) in the 16-row layout, its fifth bits as planes when `PLANES`. Panics if
/// `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_nib32_x16<const MIN: bool, const FIFTH: bool, const PLANES: bool>(
    src: &[u8],
    rows: usize,
    n: usize,
    out: &mut [u8],
) {
    let f = Nib32 {
        min: MIN,
        fifth: FIFTH,
        planes: PLANES && FIFTH,
    };
    repack_groups(src, rows, n, out, 32, f.block_bytes(), |r, blk, sb| {
        sb[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
        if MIN {
            let at = Nib32::M_AT + 2 * r;
            sb[at..at + 2].copy_from_slice(&blk[2..4]);
        }
        if FIFTH {
            let q = f.qh_at();
            let qh = u32::from_le_bytes(blk[q..q + 4].try_into().expect("4 bytes"));
            if f.planes {
                let qh = qh ^ f.plane_inversion();
                for e in 0..4 {
                    let plane = (0..8).fold(0u8, |p, l| p | (((qh >> (4 * l + e)) & 1) << l) as u8);
                    sb[f.plane_at(r, e)] = plane;
                }
            } else {
                for l in 0..8 {
                    let nib = u64::from((qh >> (4 * l)) & 0xF) << (4 * r);
                    let at = f.masks_at() + 8 * l;
                    let mask =
                        u64::from_le_bytes(sb[at..at + 8].try_into().expect("8 bytes")) | nib;
                    sb[at..at + 8].copy_from_slice(&mask.to_le_bytes());
                }
            }
        }
        for j in 0..4 {
            let at = f.nibbles_at() + 64 * j + 4 * r;
            let from = f.qs_at() + 4 * j;
            sb[at..at + 4].copy_from_slice(&blk[from..from + 4]);
        }
    })
}

/// Block `b` of row `r` of a repacked group of layout `f` starting at `group`, in the plain
/// byte order (the first `f.block_bytes()` bytes of the result).
pub fn nib32_x16_block(f: Nib32, group: &[u8], r: usize, b: usize) -> [u8; 24] {
    let sb = &group[b * f.group_bytes()..(b + 1) * f.group_bytes()];
    let mut blk = [0u8; 24];
    blk[..2].copy_from_slice(&sb[2 * r..2 * r + 2]);
    if f.min {
        blk[2..4].copy_from_slice(&sb[Nib32::M_AT + 2 * r..Nib32::M_AT + 2 * r + 2]);
    }
    if f.fifth {
        let mut qh = 0u32;
        for l in 0..8 {
            for e in 0..4 {
                let bit = if f.planes {
                    sb[f.plane_at(r, e)] >> l & 1
                } else {
                    (sb[f.masks_at() + 8 * l + (4 * r + e) / 8] >> ((4 * r + e) % 8)) & 1
                };
                qh |= u32::from(bit) << (4 * l + e);
            }
        }
        let qh = qh ^ f.plane_inversion();
        blk[f.qh_at()..f.qh_at() + 4].copy_from_slice(&qh.to_le_bytes());
    }
    for j in 0..4 {
        let at = f.nibbles_at() + 64 * j + 4 * r;
        let to = f.qs_at() + 4 * j;
        blk[to..to + 4].copy_from_slice(&sb[at..at + 4]);
    }
    blk
}

/// Bytes of one block of a Q8_0 group: 16 plain blocks' worth.
pub const Q8_0_X16_BYTES: usize = GROUP * B8;
/// Bytes of one plain Q8_0 block: `d` (f16), 32 quants.
const B8: usize = std::mem::size_of::<BlockQ8_0>();

/// The Q8_0 matrix `src` (`rows` rows of `n` elements, row-major) in the 16-row layout.
/// Panics if `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_q8_0_x16(src: &[u8], rows: usize, n: usize, out: &mut [u8]) {
    repack_groups(src, rows, n, out, 32, B8, |r, blk, sb| {
        sb[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
        for l in 0..8 {
            let at = 32 + 64 * l + 4 * r;
            let q = u32::from_le_bytes(blk[2 + 4 * l..6 + 4 * l].try_into().expect("4 bytes"));
            sb[at..at + 4].copy_from_slice(&(q ^ 0x8080_8080).to_le_bytes());
        }
    })
}

/// Block `b` of row `r` of the repacked Q8_0 group starting at `group`, in the plain byte order.
pub fn q8_0_x16_block(group: &[u8], r: usize, b: usize) -> [u8; B8] {
    let sb = &group[b * Q8_0_X16_BYTES..(b + 1) * Q8_0_X16_BYTES];
    let mut blk = [0u8; B8];
    blk[..2].copy_from_slice(&sb[2 * r..2 * r + 2]);
    for (i, q) in blk[2..].iter_mut().enumerate() {
        *q = sb[32 + 64 * (i / 4) + 4 * r + i % 4] ^ 0x80;
    }
    blk
}

/// Bytes of one block of an MXFP4 group: 16 plain blocks' worth.
pub const MXFP4_X16_BYTES: usize = GROUP * BM;
/// Bytes of one plain MXFP4 block: the E8M0 scale byte, 16 bytes of indices.
const BM: usize = 17;
/// Where an MXFP4 group's block keeps its nibbles, after the 16 scale bytes.
pub const MXFP4_X16_QS: usize = GROUP;

/// The MXFP4 matrix `src` (`rows` rows of `n` elements, row-major) in the 16-row layout.
/// Panics if `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_mxfp4_x16(src: &[u8], rows: usize, n: usize, out: &mut [u8]) {
    repack_groups(src, rows, n, out, 32, BM, |r, blk, sb| {
        sb[r] = blk[0];
        for j in 0..4 {
            let at = MXFP4_X16_QS + 64 * j + 4 * r;
            sb[at..at + 4].copy_from_slice(&blk[1 + 4 * j..5 + 4 * j]);
        }
    })
}

/// Block `b` of row `r` of the repacked MXFP4 group starting at `group`, in the plain byte
/// order.
pub fn mxfp4_x16_block(group: &[u8], r: usize, b: usize) -> [u8; BM] {
    let sb = &group[b * MXFP4_X16_BYTES..(b + 1) * MXFP4_X16_BYTES];
    let mut blk = [0u8; BM];
    blk[0] = sb[r];
    for j in 0..4 {
        let at = MXFP4_X16_QS + 64 * j + 4 * r;
        blk[1 + 4 * j..5 + 4 * j].copy_from_slice(&sb[at..at + 4]);
    }
    blk
}

/// Bytes of one super-block of an IQ4_XS group: 16 plain blocks' worth.
pub const IQ4XS_X16_BYTES: usize = GROUP * BX;
/// Bytes of one plain IQ4_XS block: `d` (f16), `scales_h` (u16), `scales_l` (u32), 128 bytes of
/// indices.
const BX: usize = 136;
/// Where an IQ4_XS group's super-block keeps its 16 rows' `scales_l` (a u32 per row), after
/// their 16 `d`s.
pub const IQ4XS_X16_SL: usize = 32;
/// ... their `scales_h` (a u16 per row).
pub const IQ4XS_X16_SH: usize = 96;
/// ... and their indices: the 4 bytes `16·ib + 4·k ..` of row `r` (sub-block `ib`, elements
/// `4k .. 4k + 4` and `16 + 4k .. 16 + 4k + 4`) at `QS + 64·(4·ib + k) + 4·r`.
pub const IQ4XS_X16_QS: usize = 128;

/// Where byte `i` (0..136) of row `r`'s IQ4_XS block lands inside its group's super-block (every
/// field moves as a whole: 2, 2, 4, then 4-byte pieces).
#[inline]
fn iq4xs_slot(r: usize, i: usize) -> usize {
    match i {
        0..2 => 2 * r + i,
        2..4 => IQ4XS_X16_SH + 2 * r + (i - 2),
        4..8 => IQ4XS_X16_SL + 4 * r + (i - 4),
        _ => IQ4XS_X16_QS + 64 * ((i - 8) / 4) + 4 * r + (i - 8) % 4,
    }
}

/// The IQ4_XS matrix `src` (`rows` rows of `n` elements, row-major) in the 16-row layout.
/// Panics if `src` is not exactly that matrix (the loader checked the shape).
pub fn repack_iq4xs_x16(src: &[u8], rows: usize, n: usize, out: &mut [u8]) {
    repack_groups(src, rows, n, out, QK_K, BX, |r, blk, sb| {
        for (i, &v) in blk.iter().enumerate() {
            sb[iq4xs_slot(r, i)] = v;
        }
    })
}

/// Block `b` of row `r` of the repacked IQ4_XS group starting at `group`, in the plain byte
/// order.
pub fn iq4xs_x16_block(group: &[u8], r: usize, b: usize) -> [u8; BX] {
    let sb = &group[b * IQ4XS_X16_BYTES..(b + 1) * IQ4XS_X16_BYTES];
    core::array::from_fn(|i| sb[iq4xs_slot(r, i)])
}

/// Row `r` of a repacked group (`group`: the group's bytes) dequantized into `out` (the row's
/// `n` elements), for a matrix with kernels `k` (`k.group > 1`).
pub fn dequantize_row(k: &super::Kernels, group: &[u8], r: usize, out: &mut [f32]) {
    let qk = k.weight.block_size();
    let nib = Nib32::of(k.weight, super::fifth_bit_planes(k.isa));
    for (b, o) in out.chunks_exact_mut(qk).enumerate() {
        match (k.weight, nib) {
            (super::GgmlType::Q4K, _) => (k.dequantize)(&q4k_x16_block(group, r, b), o),
            (super::GgmlType::Q6K, _) => (k.dequantize)(&q6k_x16_block(group, r, b), o),
            (_, Some(f)) => (k.dequantize)(&nib32_x16_block(f, group, r, b)[..f.block_bytes()], o),
            (super::GgmlType::Q8_0, _) => (k.dequantize)(&q8_0_x16_block(group, r, b), o),
            (super::GgmlType::IQ4XS, _) => (k.dequantize)(&iq4xs_x16_block(group, r, b), o),
            (super::GgmlType::MXFP4, _) => (k.dequantize)(&mxfp4_x16_block(group, r, b), o),
            (ty, _) => panic!("{ty} is not repacked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq4xs_slots_are_a_permutation_of_the_group() {
        let mut seen = vec![false; IQ4XS_X16_BYTES];
        for r in 0..GROUP {
            for i in 0..BX {
                let s = iq4xs_slot(r, i);
                assert!(!seen[s], "slot {s} taken twice");
                seen[s] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn slots_are_a_permutation_of_the_group() {
        let mut seen = vec![false; Q4K_X16_BYTES];
        for r in 0..GROUP {
            for i in 0..BQ {
                let s = slot(r, i);
                assert!(!seen[s], "slot {s} taken twice");
                seen[s] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// `repack` of a `rows × 512` matrix of `bq`-byte blocks gives back every block of the
    /// whole groups through `block`, and leaves the tail rows as they were.
    fn round_trip(
        rows: usize,
        qk: usize,
        bq: usize,
        repack: RepackFn,
        block: impl Fn(&[u8], usize, usize) -> Vec<u8>,
    ) {
        let n = 512;
        let row_bytes = n / qk * bq;
        let src: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        let mut out = vec![0u8; src.len()];
        repack(&src, rows, n, &mut out);
        let whole = rows / GROUP * GROUP;
        for row in 0..whole {
            let (g, r) = (row / GROUP, row % GROUP);
            let group = &out[g * GROUP * row_bytes..(g + 1) * GROUP * row_bytes];
            for b in 0..n / qk {
                let blk = block(group, r, b);
                let at = row * row_bytes + b * bq;
                assert_eq!(&blk[..], &src[at..at + bq], "row {row} block {b}");
            }
        }
        assert_eq!(&out[whole * row_bytes..], &src[whole * row_bytes..]);
    }

    #[test]
    fn repack_round_trips_and_keeps_the_tail() {
        round_trip(37, QK_K, BQ, repack_q4k_x16, |g, r, b| {
            q4k_x16_block(g, r, b).to_vec()
        });
        round_trip(35, QK_K, B6, repack_q6k_x16, |g, r, b| {
            q6k_x16_block(g, r, b).to_vec()
        });
        round_trip(17, 32, B8, repack_q8_0_x16, |g, r, b| {
            q8_0_x16_block(g, r, b).to_vec()
        });
        round_trip(35, QK_K, BX, repack_iq4xs_x16, |g, r, b| {
            iq4xs_x16_block(g, r, b).to_vec()
        });
        round_trip(35, 32, BM, repack_mxfp4_x16, |g, r, b| {
            mxfp4_x16_block(g, r, b).to_vec()
        });
        use super::super::GgmlType as T;
        let layouts: [(T, bool, RepackFn); 6] = [
            (T::Q4_0, false, repack_nib32_x16::<false, false, false>),
            (T::Q4_1, false, repack_nib32_x16::<true, false, false>),
            (T::Q5_0, false, repack_nib32_x16::<false, true, false>),
            (T::Q5_1, false, repack_nib32_x16::<true, true, false>),
            (T::Q5_0, true, repack_nib32_x16::<false, true, true>),
            (T::Q5_1, true, repack_nib32_x16::<true, true, true>),
        ];
        for (ty, planes, repack) in layouts {
            let f = Nib32::of(ty, planes).unwrap();
            round_trip(33, 32, f.block_bytes(), repack, |g, r, b| {
                nib32_x16_block(f, g, r, b)[..f.block_bytes()].to_vec()
            });
        }
    }

    #[test]
    fn nib32_layouts_match_the_block_structs() {
        use super::super::GgmlType as T;
        for ty in [T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1] {
            for planes in [false, true] {
                let f = Nib32::of(ty, planes).unwrap();
                assert_eq!(f.block_bytes(), ty.type_size(), "{ty}");
                assert_eq!(f.nibbles_at() + 256, f.group_bytes(), "{ty}");
                assert_eq!(f.planes, planes && f.fifth, "{ty}");
            }
        }
        assert_eq!(Nib32::of(T::Q8_0, false), None);
    }

    #[test]
    fn q6k_values_in_element_order() {
        let blk: Vec<u8> = (0..B6).map(|i| (i * 37 % 256) as u8).collect();
        let u = q6k_values(&blk);
        for (i, &v) in u.iter().enumerate() {
            assert_eq!(v, q6k_get(&blk, i), "element {i}");
        }
    }

    #[test]
    fn q6k_slots_fill_the_quant_bits_once() {
        let mut seen = vec![0u8; Q6K_X16_BYTES];
        for r in 0..GROUP {
            for i in 0..QK_K {
                let (lo, ls, hi, hs) = q6k_slots(r, i);
                assert_eq!(seen[lo] & (0xF << ls), 0);
                seen[lo] |= 0xF << ls;
                assert_eq!(seen[hi] & (3 << hs), 0);
                seen[hi] |= 3 << hs;
            }
        }
        assert!(seen[288..].iter().all(|&b| b == 0xFF));
    }
}
