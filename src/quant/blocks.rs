//! Byte layouts of every block format, exactly as ggml stores them.
//!
//! # Why every struct has alignment 1
//!
//! Weight blocks are read in place from the memory-mapped GGUF file. A tensor starts on a
//! 32-byte boundary, but its blocks are 18, 20, 22, ... bytes long, so block `i` of a Q4_0
//! row lives at an arbitrary (often odd) address. A struct with a `u16` field would have
//! alignment 2 and casting such bytes to it would be undefined behaviour. Instead every
//! multi-byte field is a little-endian byte array ([`F16Le`], [`F32Le`], [`I16Le`]) read with
//! `from_le_bytes`, which makes every block struct `align_of == 1`, padding-free, and valid for
//! any bit pattern. That is what [`RawBlock`] promises and what makes [`cast`] / [`cast_mut`]
//! sound for any byte slice whose length is a whole number of blocks.
//!
//! The SIMD kernels do not use these structs: they read the same bytes through raw pointers with
//! unaligned loads, at the offsets these structs define (checked by the size asserts below).

use half::{bf16, f16};
use std::mem::{align_of, size_of};

/// An IEEE half float stored as two little-endian bytes (ggml's `ggml_half`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    #[inline]
    pub fn to_f32(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }
    /// Round to nearest even, as `GGML_FP32_TO_FP16` (F16C `vcvtps2ph` with imm 0) does.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F16Le(f16::from_f32(x).to_bits().to_le_bytes())
    }
}

/// A bfloat16 stored as two little-endian bytes.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct Bf16Le(pub [u8; 2]);

impl Bf16Le {
    #[inline]
    pub fn to_f32(self) -> f32 {
        bf16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }
    /// Round to nearest even, as `GGML_FP32_TO_BF16` does.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        Bf16Le(bf16::from_f32(x).to_bits().to_le_bytes())
    }
}

/// An `f32` stored as four little-endian bytes.
#[derive(Clone, Copy, Default, PartialEq, Debug)]
#[repr(transparent)]
pub struct F32Le(pub [u8; 4]);

impl F32Le {
    #[inline]
    pub fn to_f32(self) -> f32 {
        f32::from_le_bytes(self.0)
    }
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F32Le(x.to_le_bytes())
    }
}

/// An `i16` stored as two little-endian bytes.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct I16Le(pub [u8; 2]);

impl I16Le {
    #[inline]
    pub fn get(self) -> i16 {
        i16::from_le_bytes(self.0)
    }
    #[inline]
    pub fn new(v: i16) -> Self {
        I16Le(v.to_le_bytes())
    }
}

/// Elements per block of the legacy formats.
pub const QK: usize = 32;
/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

/// Q4_0: `x = d * (q - 8)`, q in 0..16. `qs[j]` holds element j (low nibble) and j+16 (high).
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; QK / 2],
}

/// Q4_1: `x = d * q + m`, q in 0..16.
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; QK / 2],
}

/// Q5_0: `x = d * (q - 16)`, q in 0..32; bit 4 of element j is bit j of `qh` (LE u32).
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: `x = d * q + m`, q in 0..32.
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: `x = d * q`, q in -127..=127 (the weight format may hold -128).
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; QK],
}

/// Q8_1 (activations only): like Q8_0 plus `s = d * sum(qs)`, which lets a Q4_1/Q5_1 dot
/// add the weight block's offset `m` as one product `m * s`.
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Le,
    pub s: F16Le,
    pub qs: [i8; QK],
}

/// Q2_K: 16 sub-blocks of 16; `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q in 0..4.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Le,
    pub dmin: F16Le,
}

/// Q3_K: 16 sub-blocks of 16; `x = d * (sc - 32) * (q - 4 * !hbit)`, 6-bit scales packed in 12 bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16Le,
}

/// Q4_K: 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, 6-bit sc/m packed in 12 bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as Q4_K with a fifth bit per element in `qh`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16; `x = d * sc * (q - 32)`, q in 0..64 (4 low bits in `ql`, 2 in `qh`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Le,
}

/// Q8_K (activations only): f32 scale, 256 quants, and the sum of each group of 16 quants
/// (`bsums`), which the k-quant dots use to apply sub-block minimums/offsets in one product.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: F32Le,
    pub qs: [i8; QK_K],
    pub bsums: [I16Le; QK_K / 16],
}

/// IQ4_NL: `x = d * KVALUES_IQ4NL[q]`, q in 0..16, nibbles laid out as Q4_0's.
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockIq4Nl {
    pub d: F16Le,
    pub qs: [u8; QK / 2],
}

/// IQ4_XS: 8 sub-blocks of 32 on IQ4_NL's grid; sub-block `j`'s 6-bit scale `ls` has its low
/// nibble in `scales_l[j / 2]` (low half for even `j`) and its top two bits at bits `2j` of
/// `scales_h` (LE u16); `x = d * (ls - 32) * KVALUES_IQ4NL[q]`. `qs` holds each sub-block's
/// 16 bytes as Q4_0 does.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq4Xs {
    pub d: F16Le,
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// IQ3_XXS: `qs[..64]` are 2 grid indices (into `IQ3XXS_GRID`, 4 magnitudes each) per 8
/// elements; `qs[64..]` holds one LE u32 per sub-block of 32: four 7-bit sign indices
/// (`KSIGNS_IQ2XS`) in bits 0..28 and the 4-bit scale `ls` in bits 28..32;
/// `x = d · (0.5 + ls) · 0.5 · grid · sign`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq3Xxs {
    pub d: F16Le,
    pub qs: [u8; 3 * QK_K / 8],
}

/// IQ3_S: 9-bit grid indices (into `IQ3S_GRID`), the low 8 bits in `qs`, the ninth in `qh`
/// (bit `k` of `qh[j]`: index `8j + k`); one sign bit per element in `signs`; a 4-bit scale
/// `ls` per 32 (two per byte of `scales`, low nibble first); `x = d · (1 + 2·ls) · grid · sign`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq3S {
    pub d: F16Le,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// IQ1_S: 11-bit indices into `IQ1S_GRID` (8 values in -1..=1 each), the low 8 bits in `qs`;
/// per sub-block of 32 one LE u16 of `qh`: the indices' top 3 bits (bits `3l..3l+3`), the
/// 3-bit scale `ls` (bits 12..15) and the shift's sign (bit 15);
/// `x = d · (2·ls + 1) · (grid ± 0.125)`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq1S {
    pub d: F16Le,
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
}

/// IQ1_M: IQ1_S's grid; per 8 elements the index's top 3 bits and the shift's sign (bit 3) in
/// a nibble of `qh`; a 3-bit scale per 16 in `scales` (read as 4 LE u16, 12 bits each), whose
/// top nibbles together hold the f16 super-block scale.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}

/// The 16 values of the IQ4_NL / IQ4_XS grid (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ2_XXS: 8 sub-blocks of 32, each four `u16` of `qs` (LE): the low 32 bits are four bytes,
/// each an index into `IQ2XXS_GRID` (8 magnitudes); the high 32 bits hold four 7-bit sign
/// indices (`KSIGNS_IQ2XS`) and, in bits 28..32, the sub-block's scale `ls`:
/// `x = d * (0.5 + ls) / 4 * grid * sign`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2Xxs {
    pub d: F16Le,
    pub qs: [u8; QK_K / 4],
}

/// IQ2_XS: 32 groups of 8, each a `u16` of `qs` (LE): a 9-bit index into `IQ2XS_GRID` and a
/// 7-bit sign index; a 4-bit scale per 16 elements in `scales` (low nibble first).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2Xs {
    pub d: F16Le,
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}

/// IQ2_S: 32 groups of 8, each a 10-bit index into `IQ2S_GRID` (the low 8 bits in `qs[g]`,
/// the top 2 in `qh[g / 4]` at bit `2 (g % 4)`) with 8 free signs in `qs[32 + g]`; a 4-bit
/// scale per 16 elements in `scales` (low nibble first).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2S {
    pub d: F16Le,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// MXFP4 (OCP microscaling): `x = 2^(e - 127) * E2M1[q]`, held as ggml holds it: the E2M1
/// values doubled ([`KVALUES_MXFP4`]) and the scale halved ([`e8m0_to_f32_half`]). Nibbles are
/// laid out as Q4_0's (element `j < 16` in the low half of `qs[j]`, `j + 16` in the high half).
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}

/// The 16 E2M1 values doubled, so that they are integers (ggml's `kvalues_mxfp4`): codes 8..16
/// are the negatives of 0..8 (code 8 is -0).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the value of an E8M0 scale byte, `2^(e - 128)`, bit for bit as ggml's
/// `ggml_e8m0_to_fp32_half`: `e` 0 and 1 give the subnormals `2^-128` and `2^-127`, and 255
/// gives `2^127` (ggml does not treat 255 as NaN).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

impl BlockIq4Xs {
    /// The scale of sub-block `j` (0..8) with its offset removed (`ls - 32`, in -32..=31).
    #[inline]
    pub fn scale(&self, j: usize) -> i32 {
        let h = u16::from_le_bytes(self.scales_h);
        let ls = ((self.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) as i32
            | ((((h >> (2 * j)) & 3) as i32) << 4);
        ls - 32
    }
}

/// A block field whose default is all zeros, at any array length (`derive(Default)` takes
/// arrays of at most 32 elements).
trait Zero: Copy {
    const ZERO: Self;
}

impl Zero for u8 {
    const ZERO: Self = 0;
}
impl Zero for i8 {
    const ZERO: Self = 0;
}
impl Zero for F16Le {
    const ZERO: Self = F16Le([0; 2]);
}
impl Zero for F32Le {
    const ZERO: Self = F32Le([0; 4]);
}
impl Zero for I16Le {
    const ZERO: Self = I16Le([0; 2]);
}
impl<T: Zero, const N: usize> Zero for [T; N] {
    const ZERO: Self = [T::ZERO; N];
}

/// `Default` for blocks with longer arrays: every named field (all of them) zero.
macro_rules! zero_default {
    ($($t:ident { $($f:ident),* })*) => {$(
        impl Default for $t {
            fn default() -> Self {
                $t { $($f: Zero::ZERO),* }
            }
        }
    )*};
}

zero_default! {
    BlockQ2K { scales, qs, d, dmin }
    BlockQ3K { hmask, qs, scales, d }
    BlockQ4K { d, dmin, scales, qs }
    BlockQ5K { d, dmin, scales, qh, qs }
    BlockQ6K { ql, qh, scales, d }
    BlockQ8K { d, qs, bsums }
    BlockIq4Xs { d, scales_h, scales_l, qs }
    BlockIq3Xxs { d, qs }
    BlockIq3S { d, qs, qh, signs, scales }
    BlockIq1S { d, qs, qh }
    BlockIq1M { qs, qh, scales }
    BlockIq2Xxs { d, qs }
    BlockIq2Xs { d, qs, scales }
    BlockIq2S { d, qs, qh, scales }
}

/// A block type that may be viewed in place over raw bytes.
///
/// # Safety
/// Implementors must have `align_of == 1`, no padding, and no invalid bit patterns
/// (every field a byte array or a `repr(transparent)` wrapper of one).
pub unsafe trait RawBlock: Copy + Default + 'static {}

macro_rules! raw_block {
    ($($t:ty = $size:expr),* $(,)?) => {$(
        const _: () = assert!(size_of::<$t>() == $size);
        const _: () = assert!(align_of::<$t>() == 1);
        // SAFETY: the asserts above check size (so no padding, given the byte-array fields sum
        // to it) and alignment 1; every field is a byte array or a transparent byte-array newtype.
        unsafe impl RawBlock for $t {}
    )*};
}

raw_block! {
    F32Le = 4,
    F16Le = 2,
    Bf16Le = 2,
    BlockQ4_0 = 18,
    BlockQ4_1 = 20,
    BlockQ5_0 = 22,
    BlockQ5_1 = 24,
    BlockQ8_0 = 34,
    BlockQ8_1 = 36,
    BlockQ2K = 84,
    BlockQ3K = 110,
    BlockQ4K = 144,
    BlockQ5K = 176,
    BlockQ6K = 210,
    BlockQ8K = 292,
    BlockIq4Nl = 18,
    BlockIq4Xs = 136,
    BlockMxfp4 = 17,
    BlockIq2Xxs = 66,
    BlockIq2Xs = 74,
    BlockIq2S = 82,
    BlockIq3Xxs = 98,
    BlockIq3S = 110,
    BlockIq1S = 50,
    BlockIq1M = 56,
}

/// View bytes as blocks; `None` unless the length is a whole number of blocks.
pub fn cast<B: RawBlock>(bytes: &[u8]) -> Option<&[B]> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: `B: RawBlock` has alignment 1 and accepts any bit pattern; the length is a whole
    // number of blocks, so the new slice covers exactly the same bytes with the same lifetime.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Mutable view of bytes as blocks; `None` unless the length is a whole number of blocks.
pub fn cast_mut<B: RawBlock>(bytes: &mut [u8]) -> Option<&mut [B]> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: as in `cast`; the exclusive borrow of `bytes` is moved into the result.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size)
    })
}

/// The bytes of a block slice (for writing quantized rows into byte buffers, or tests).
pub fn as_bytes<B: RawBlock>(blocks: &[B]) -> &[u8] {
    // SAFETY: `RawBlock` types have no padding, so every byte is initialized.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// Unpack the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block
/// (ggml's `get_scale_min_k4`).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Unpack the sixteen 6-bit Q3_K scales to their signed values (`raw - 32`, in -32..=31).
#[inline]
pub fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0xF
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = ((low | (high << 4)) as i8) - 32;
    }
    out
}
