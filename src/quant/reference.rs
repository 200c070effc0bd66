//! Scalar reference code for every format: dequantization, quantization and the dot product of
//! a weight row with its activation partner. This is the definition the SIMD kernels are tested
//! against, written for clarity, with the arithmetic order of ggml's reference C code where
//! the exact bits matter (dequantization, quantization).

use super::blocks::*;
use super::types::GgmlType;

/// Accumulates the terms of a reference dot product in f64, together with the sum of their
/// magnitudes (the scale against which a float-accumulated kernel's rounding error is judged).
#[derive(Clone, Copy, Debug, Default)]
pub struct DotAcc {
    pub sum: f64,
    pub mag: f64,
}

impl DotAcc {
    #[inline]
    pub(super) fn add(&mut self, term: f64, mag: f64) {
        self.sum += term;
        self.mag += mag;
    }
}

/// A block format with a scalar reference implementation.
pub trait BlockFormat: RawBlock {
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK: usize;
    /// The activation format this weight format is multiplied with (ggml's `vec_dot_type`).
    type Dot: RawBlock;
    /// `out.len()` must be `blocks.len() * BLOCK`.
    fn dequantize(blocks: &[Self], out: &mut [f32]);
    /// Dot product of one weight row with one activation row (same number of elements).
    fn vec_dot_acc(w: &[Self], x: &[Self::Dot], acc: &mut DotAcc);
    fn vec_dot_ref(w: &[Self], x: &[Self::Dot]) -> f32 {
        let mut acc = DotAcc::default();
        Self::vec_dot_acc(w, x, &mut acc);
        acc.sum as f32
    }
}

/// A format with a reference quantizer (`out.len() * BLOCK == x.len()`).
pub trait Quantize: BlockFormat {
    fn quantize(x: &[f32], out: &mut [Self]);
}

pub(super) fn check_lengths(nblocks: usize, block: usize, out: usize) {
    assert_eq!(nblocks * block, out, "block/element count mismatch");
}

// ---------------------------------------------------------------------------------------------
// Float formats (one element per "block").

/// `BlockFormat` and `Quantize` for float formats `$t` of `GgmlType::$ty`: one element a
/// "block", dequantized by widening to f32, quantized by `$t::from_f32`, multiplied with
/// itself in f64.
macro_rules! float_format {
    ($($t:ident: $ty:ident),*) => {$(
        impl BlockFormat for $t {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK: usize = 1;
            type Dot = $t;
            fn dequantize(blocks: &[Self], out: &mut [f32]) {
                check_lengths(blocks.len(), 1, out.len());
                for (o, b) in out.iter_mut().zip(blocks) {
                    *o = b.to_f32();
                }
            }
            fn vec_dot_acc(w: &[Self], x: &[Self], acc: &mut DotAcc) {
                assert_eq!(w.len(), x.len());
                for (a, b) in w.iter().zip(x) {
                    let t = a.to_f32() as f64 * b.to_f32() as f64;
                    acc.add(t, t.abs());
                }
            }
        }

        impl Quantize for $t {
            fn quantize(x: &[f32], out: &mut [Self]) {
                check_lengths(out.len(), 1, x.len());
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = $t::from_f32(v);
                }
            }
        }
    )*};
}

float_format!(F32Le: F32, F16Le: F16, Bf16Le: BF16);

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats.

/// Element j of a 4-bit block: low nibbles hold elements 0..16, high nibbles 16..32.
#[inline]
pub(super) fn nibble(qs: &[u8; 16], j: usize) -> i32 {
    if j < 16 {
        (qs[j] & 0xF) as i32
    } else {
        (qs[j - 16] >> 4) as i32
    }
}

/// Fifth bit of element j of a Q5 block.
#[inline]
pub(super) fn bit5(qh: &[u8; 4], j: usize) -> i32 {
    ((u32::from_le_bytes(*qh) >> j) & 1) as i32
}

/// Integer dot of 32 weight quants with 32 activation quants, and the sum of |products|.
#[inline]
pub(super) fn idot32(q: impl Fn(usize) -> i32, y: &[i8; 32]) -> (i32, i32) {
    let (mut s, mut m) = (0i32, 0i32);
    for (j, &yj) in y.iter().enumerate() {
        let p = q(j) * yj as i32;
        s += p;
        m += p.abs();
    }
    (s, m)
}

/// `BlockFormat` for a 32-element format `$t` of `GgmlType::$ty` multiplied with `$dot`,
/// whose element j is the integer `$q` (of block `$b`): `d·q`, and the dot `d·dy·Σ q·y`.
/// With `min`, the block also holds `m`: each element adds `m`, and the dot `m·s` (`s` the
/// activation block's scaled sum).
macro_rules! legacy_format {
    ($t:ident: $ty:ident, $dot:ident, |$b:ident, $j:ident| $q:expr $(, $min:ident)?) => {
        impl BlockFormat for $t {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK: usize = QK;
            type Dot = $dot;
            fn dequantize(blocks: &[Self], out: &mut [f32]) {
                check_lengths(blocks.len(), QK, out.len());
                for ($b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                    let d = $b.d.to_f32();
                    let m: Option<f32> = legacy_format!(@m $b $(, $min)?);
                    for ($j, v) in y.iter_mut().enumerate() {
                        *v = match m {
                            None => ($q) as f32 * d,
                            Some(m) => ($q) as f32 * d + m,
                        };
                    }
                }
            }
            fn vec_dot_acc(w: &[Self], x: &[$dot], acc: &mut DotAcc) {
                assert_eq!(w.len(), x.len());
                for ($b, y) in w.iter().zip(x) {
                    let (s, m) = idot32(|$j| $q, &y.qs);
                    let d = ($b.d.to_f32() * y.d.to_f32()) as f64;
                    let ms: Option<f64> = legacy_format!(@ms $b, y $(, $min)?);
                    match ms {
                        None => acc.add(d * s as f64, d.abs() * m as f64),
                        Some(ms) => acc.add(d * s as f64 + ms, d.abs() * m as f64 + ms.abs()),
                    }
                }
            }
        }
    };
    (@m $b:ident) => {
        None
    };
    (@m $b:ident, min) => {
        Some($b.m.to_f32())
    };
    (@ms $b:ident, $y:ident) => {
        None
    };
    (@ms $b:ident, $y:ident, min) => {
        Some($b.m.to_f32() as f64 * $y.s.to_f32() as f64)
    };
}

pub(super) use legacy_format;

legacy_format!(BlockQ4_0: Q4_0, BlockQ8_0, |b, j| nibble(&b.qs, j) - 8);
legacy_format!(BlockQ4_1: Q4_1, BlockQ8_1, |b, j| nibble(&b.qs, j), min);
legacy_format!(BlockQ5_0: Q5_0, BlockQ8_0, |b, j| (nibble(&b.qs, j) | (bit5(&b.qh, j) << 4)) - 16);
legacy_format!(BlockQ5_1: Q5_1, BlockQ8_1, |b, j| nibble(&b.qs, j) | (bit5(&b.qh, j) << 4), min);
legacy_format!(BlockQ8_0: Q8_0, BlockQ8_0, |b, j| b.qs[j] as i32);
// Q8_1 only ever appears as an activation; its "dot" partner is itself (unused by models).
legacy_format!(BlockQ8_1: Q8_1, BlockQ8_1, |b, j| b.qs[j] as i32);

/// Quantizes `x` a block of `n` values at a time: `block(xb, b)` fills `b` from its values
/// `xb`.
pub(super) fn quantize_blocks<B>(
    x: &[f32],
    out: &mut [B],
    n: usize,
    block: impl Fn(&[f32], &mut B),
) {
    check_lengths(out.len(), n, x.len());
    for (xb, b) in x.chunks_exact(n).zip(out.iter_mut()) {
        block(xb, b);
    }
}

/// `1/d`, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The 32 quants `q(j)` of a Q4 block, two to a byte: element j in the low nibble of byte j,
/// element j + 16 in its high nibble.
fn pack_q4(qs: &mut [u8; 16], q: impl Fn(usize) -> u8) {
    for (j, b) in qs.iter_mut().enumerate() {
        *b = q(j) | (q(j + 16) << 4);
    }
}

/// The 32 5-bit quants `q(j)` of a Q5 block: their low nibbles as [`pack_q4`]'s, the fifth
/// bit of element j as bit j of `qh` (a little-endian u32).
fn pack_q5(qs: &mut [u8; 16], qh: &mut [u8; 4], q: impl Fn(usize) -> u8) {
    let mut h = 0u32;
    for (j, b) in qs.iter_mut().enumerate() {
        let (x0, x1) = (q(j), q(j + 16));
        *b = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        h |= (((x0 & 0x10) >> 4) as u32) << j;
        h |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

/// The scale of a block of a symmetric legacy format, ggml's: the signed absmax maps to
/// `-half_levels`. Returns it and its inverse.
fn sym_scale(xb: &[f32], half_levels: f32) -> (f32, f32) {
    let d = signed_absmax(xb) / -half_levels;
    (d, inverse(d))
}

/// The minimum and scale of a block of an offset legacy format, ggml's: `levels` steps span
/// the block's range. Returns the minimum, the scale and its inverse.
fn min_scale(xb: &[f32], levels: f32) -> (f32, f32, f32) {
    let (min, max) = min_max(xb);
    let d = (max - min) / levels;
    (min, d, inverse(d))
}

/// ggml's `quantize_row_q4_0_ref`: the scale maps the signed absmax to -8.
impl Quantize for BlockQ4_0 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            let (d, id) = sym_scale(xb, 8.0);
            b.d = F16Le::from_f32(d);
            pack_q4(&mut b.qs, |j| ((xb[j] * id + 8.5) as i8).min(15) as u8);
        });
    }
}

/// ggml's `quantize_row_q4_1_ref`.
impl Quantize for BlockQ4_1 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            let (min, d, id) = min_scale(xb, 15.0);
            (b.d, b.m) = (F16Le::from_f32(d), F16Le::from_f32(min));
            pack_q4(&mut b.qs, |j| {
                (((xb[j] - min) * id + 0.5) as i8).min(15) as u8
            });
        });
    }
}

/// ggml's `quantize_row_q5_0_ref`.
impl Quantize for BlockQ5_0 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            let (d, id) = sym_scale(xb, 16.0);
            b.d = F16Le::from_f32(d);
            pack_q5(&mut b.qs, &mut b.qh, |j| {
                ((xb[j] * id + 16.5) as i8).min(31) as u8
            });
        });
    }
}

/// ggml's `quantize_row_q5_1_ref`.
impl Quantize for BlockQ5_1 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            let (min, d, id) = min_scale(xb, 31.0);
            (b.d, b.m) = (F16Le::from_f32(d), F16Le::from_f32(min));
            pack_q5(&mut b.qs, &mut b.qh, |j| ((xb[j] - min) * id + 0.5) as u8);
        });
    }
}

/// The quants of a block of 32 as ggml's Q8 quantizers: `d = amax/127`, `q = round(x·id)`.
/// The `_ref` form (model files, `act` false) has `id = 1/d` and rounds half away from zero;
/// the x86 activation form has `id = 127/amax` and rounds half to even. Returns `d`.
fn q8_block(xb: &[f32], qs: &mut [i8; QK], act: bool) -> f32 {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    if act {
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = (v * id).round_ties_even() as i8;
        }
    } else {
        let id = inverse(d);
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
    d
}

/// The sum of a block's quants (Q8_1's `s` is it times `d`).
fn qsum(qs: &[i8]) -> i32 {
    qs.iter().map(|&q| q as i32).sum()
}

/// ggml's `quantize_row_q8_0_ref` (model files): `q = roundf(x * (1/d))`, `d = amax/127`.
impl Quantize for BlockQ8_0 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            b.d = F16Le::from_f32(q8_block(xb, &mut b.qs, false));
        });
    }
}

/// ggml's `quantize_row_q8_1_ref`.
impl Quantize for BlockQ8_1 {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK, |xb, b| {
            let d = q8_block(xb, &mut b.qs, false);
            (b.d, b.s) = (F16Le::from_f32(d), F16Le::from_f32(qsum(&b.qs) as f32 * d));
        });
    }
}

/// The value with the largest magnitude, keeping its sign (the first one on ties).
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers with the arithmetic of ggml's CPU backend on x86 (what llama.cpp runs on
// this machine), which differs from the `_ref` functions above in two details: the multiplier
// is `127/amax` instead of `1/(amax/127)`, and rounding is to nearest *even*
// (`_mm256_round_ps(_MM_ROUND_NEAREST)`) instead of `roundf`'s half-away-from-zero.

/// Q8_0 activations as ggml-cpu's x86 `quantize_row_q8_0`.
pub fn quantize_q8_0_act(x: &[f32], out: &mut [BlockQ8_0]) {
    quantize_blocks(x, out, QK, |xb, b| {
        b.d = F16Le::from_f32(q8_block(xb, &mut b.qs, true));
    });
}

/// Q8_1 activations as ggml-cpu's x86 `quantize_row_q8_1`.
pub fn quantize_q8_1_act(x: &[f32], out: &mut [BlockQ8_1]) {
    quantize_blocks(x, out, QK, |xb, b| {
        let d = q8_block(xb, &mut b.qs, true);
        (b.d, b.s) = (F16Le::from_f32(d), F16Le::from_f32(d * qsum(&b.qs) as f32));
    });
}

/// ggml's `nearest_int`: round to nearest even via the 1.5*2^23 trick (valid for |x| < 2^22).
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `BlockFormat` for a format `$t` of `GgmlType::$ty` in super-blocks of `QK_K` multiplied
/// with Q8_K: `$deq` fills the 256 values `$y` of block `$b`; `$dot` adds the dot of weight
/// block `$w` with activation block `$x` (and its magnitude) to `$acc`, or, given as
/// `rows $row`, the function `$row(w, x, acc)` takes the whole rows.
macro_rules! super_block_format {
    ($t:ident: $ty:ident, |$b:ident, $y:ident| $deq:block, |$w:ident, $x:ident, $acc:ident| $dot:block) => {
        super_block_format!(@impl $t: $ty, |$b, $y| $deq, |w, x, $acc| {
            assert_eq!(w.len(), x.len());
            for ($w, $x) in w.iter().zip(x) $dot
        });
    };
    ($t:ident: $ty:ident, |$b:ident, $y:ident| $deq:block, rows $row:path) => {
        super_block_format!(@impl $t: $ty, |$b, $y| $deq, |w, x, acc| { $row(w, x, acc) });
    };
    (@impl $t:ident: $ty:ident, |$b:ident, $y:ident| $deq:block,
        |$wr:ident, $xr:ident, $acc:ident| $dot:block) => {
        impl BlockFormat for $t {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK: usize = QK_K;
            type Dot = BlockQ8K;
            fn dequantize(blocks: &[Self], out: &mut [f32]) {
                check_lengths(blocks.len(), QK_K, out.len());
                for ($b, $y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) $deq
            }
            fn vec_dot_acc($wr: &[Self], $xr: &[BlockQ8K], $acc: &mut DotAcc) $dot
        }
    };
}
pub(super) use super_block_format;

/// ggml's `quantize_row_q8_K_ref` (also what ggml-cpu uses on x86): the scale maps the signed
/// absmax to -127, quants are clamped above at 127, and `bsums` hold sums of 16 quants.
impl Quantize for BlockQ8K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK_K, x.len());
        for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                *b = BlockQ8K::default();
                continue;
            }
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(xb) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (j, s) in b.bsums.iter_mut().enumerate() {
                let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                *s = I16Le::new(sum as i16);
            }
            b.d = F32Le::from_f32(1.0 / iscale);
        }
    }
}

super_block_format!(BlockQ8K: Q8K,
    |b, y| {
        let d = b.d.to_f32();
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = d * q as f32;
        }
    },
    |b, y, acc| {
        let (mut s, mut m) = (0i64, 0i64);
        for (&a, &c) in b.qs.iter().zip(&y.qs) {
            let p = a as i64 * c as i64;
            s += p;
            m += p.abs();
        }
        let d = (b.d.to_f32() * y.d.to_f32()) as f64;
        acc.add(d * s as f64, d.abs() * m as f64);
    }
);

// ---------------------------------------------------------------------------------------------
// K-quants. Each dot is written in the form the kernels use: an exact integer sum of
// `scale * q * y` per super-block, plus the sub-block minimums/offsets applied through the
// activation's `bsums`; the magnitude counts both parts.

/// Sum of `scale(i/16) * q(i) * y(i)` over a super-block and of its magnitudes.
#[inline]
fn kdot(q: impl Fn(usize) -> i32, scale: impl Fn(usize) -> i32, y: &[i8; QK_K]) -> (i64, i64) {
    let (mut s, mut m) = (0i64, 0i64);
    for (i, &yi) in y.iter().enumerate() {
        let p = (scale(i / 16) * q(i) * yi as i32) as i64;
        s += p;
        m += p.abs();
    }
    (s, m)
}

/// `sum_s coef(s) * bsums[s]` over the 16 groups and its magnitude.
#[inline]
fn kbsum(coef: impl Fn(usize) -> i32, y: &BlockQ8K) -> (i64, i64) {
    let (mut s, mut m) = (0i64, 0i64);
    for (g, b) in y.bsums.iter().enumerate() {
        let p = (coef(g) * b.get() as i32) as i64;
        s += p;
        m += p.abs();
    }
    (s, m)
}

/// A super-block's `d·s − dmin·m` (both scales times the activation's) and its magnitude: the
/// dot of a k-quant with sub-block minimums.
#[inline]
fn add_dmin(acc: &mut DotAcc, (d, dmin): (f32, f32), y: &BlockQ8K, s: (i64, i64), m: (i64, i64)) {
    let yd = y.d.to_f32();
    let (d, dmin) = ((d * yd) as f64, (dmin * yd) as f64);
    acc.add(
        d * s.0 as f64 - dmin * m.0 as f64,
        d.abs() * s.1 as f64 + dmin.abs() * m.1 as f64,
    );
}

/// A super-block's `d·(s − m)` (`d` times the activation's) and its magnitude: the dot of a
/// k-quant whose offset `m` is a multiple of its scales.
#[inline]
fn add_offset(acc: &mut DotAcc, d: f32, y: &BlockQ8K, s: (i64, i64), m: (i64, i64)) {
    let d = (d * y.d.to_f32()) as f64;
    acc.add(d * (s.0 - m.0) as f64, d.abs() * (s.1 + m.1) as f64);
}

/// Q2_K element i: 2 bits from `qs[32*(i/128) + i%32]` at shift `2*((i%128)/32)`.
#[inline]
pub(super) fn q2k_q(b: &BlockQ2K, i: usize) -> i32 {
    let (half, r) = (i / 128, i % 128);
    ((b.qs[32 * half + r % 32] >> (2 * (r / 32))) & 3) as i32
}

super_block_format!(BlockQ2K: Q2K,
    |b, y| {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (i, v) in y.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            let dl = d * (sc & 0xF) as f32;
            let ml = min * (sc >> 4) as f32;
            *v = dl * q2k_q(b, i) as f32 - ml;
        }
    },
    |b, y, acc| {
        let s = kdot(|i| q2k_q(b, i), |g| (b.scales[g] & 0xF) as i32, &y.qs);
        let m = kbsum(|g| (b.scales[g] >> 4) as i32, y);
        add_dmin(acc, (b.d.to_f32(), b.dmin.to_f32()), y, s, m);
    }
);

/// Q3_K element i as an unsigned 0..8 value (`q + 4*hbit`; the signed value is this minus 4).
#[inline]
pub(super) fn q3k_u(b: &BlockQ3K, i: usize) -> i32 {
    let (half, r) = (i / 128, i % 128);
    let low = (b.qs[32 * half + r % 32] >> (2 * (r / 32))) & 3;
    let high = (b.hmask[i % 32] >> (i / 32)) & 1;
    (low | (high << 2)) as i32
}

super_block_format!(BlockQ3K: Q3K,
    |b, y| {
        let d_all = b.d.to_f32();
        let sc = q3k_scales(&b.scales);
        for (i, v) in y.iter_mut().enumerate() {
            let dl = d_all * sc[i / 16] as f32;
            *v = dl * (q3k_u(b, i) - 4) as f32;
        }
    },
    |b, y, acc| {
        let sc = q3k_scales(&b.scales);
        let s = kdot(|i| q3k_u(b, i), |g| sc[g] as i32, &y.qs);
        let m = kbsum(|g| 4 * sc[g] as i32, y);
        add_offset(acc, b.d.to_f32(), y, s, m);
    }
);

/// Q4_K element i: nibble of `qs[32*(i/64) + i%32]`, low for the first 32 of each 64.
#[inline]
pub(super) fn q4k_q(b: &BlockQ4K, i: usize) -> i32 {
    let byte = b.qs[32 * (i / 64) + i % 32];
    (if (i % 64) < 32 { byte & 0xF } else { byte >> 4 }) as i32
}

/// `BlockFormat` for Q4_K and Q5_K (`$t` of `GgmlType::$ty`, element i `$q(b, i)`): 8
/// sub-blocks of 32 with 6-bit scales and minimums (`scale_min_k4`).
macro_rules! k45_format {
    ($t:ident: $ty:ident, $q:ident) => {
        super_block_format!($t: $ty,
            |b, y| {
                let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
                for (i, v) in y.iter_mut().enumerate() {
                    let (sc, m) = scale_min_k4(i / 32, &b.scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    *v = d1 * $q(b, i) as f32 - m1;
                }
            },
            |b, y, acc| {
                let s = kdot(
                    |i| $q(b, i),
                    |g| scale_min_k4(g / 2, &b.scales).0 as i32,
                    &y.qs,
                );
                let m = kbsum(|g| scale_min_k4(g / 2, &b.scales).1 as i32, y);
                add_dmin(acc, (b.d.to_f32(), b.dmin.to_f32()), y, s, m);
            }
        );
    };
}

k45_format!(BlockQ4K: Q4K, q4k_q);

/// Q5_K element i: the Q4_K nibble plus 16 if bit `i/32` of `qh[i%32]` is set.
#[inline]
pub(super) fn q5k_q(b: &BlockQ5K, i: usize) -> i32 {
    let byte = b.qs[32 * (i / 64) + i % 32];
    let low = if (i % 64) < 32 { byte & 0xF } else { byte >> 4 };
    let high = (b.qh[i % 32] >> (i / 32)) & 1;
    (low | (high << 4)) as i32
}

k45_format!(BlockQ5K: Q5K, q5k_q);

/// Q6_K element i as an unsigned 0..64 value (the signed value is this minus 32):
/// within each 128-half, the 32-element chunk c takes `ql[c%2 * 32 + l]` (low nibble for c < 2)
/// and bits `2c..2c+2` of `qh[l]`.
#[inline]
pub(super) fn q6k_u(b: &BlockQ6K, i: usize) -> i32 {
    let (half, r) = (i / 128, i % 128);
    let (c, l) = (r / 32, r % 32);
    let ql = b.ql[64 * half + 32 * (c % 2) + l];
    let low = if c < 2 { ql & 0xF } else { ql >> 4 };
    let high = (b.qh[32 * half + l] >> (2 * c)) & 3;
    (low | (high << 4)) as i32
}

super_block_format!(BlockQ6K: Q6K,
    |b, y| {
        let d = b.d.to_f32();
        for (i, v) in y.iter_mut().enumerate() {
            *v = d * b.scales[i / 16] as f32 * (q6k_u(b, i) - 32) as f32;
        }
    },
    |b, y, acc| {
        let s = kdot(|i| q6k_u(b, i), |g| b.scales[g] as i32, &y.qs);
        let m = kbsum(|g| 32 * b.scales[g] as i32, y);
        add_offset(acc, b.d.to_f32(), y, s, m);
    }
);

/// ggml's 8-lane horizontal sum: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`, the order in
/// which the reference's AVX2 kernels reduce their lanes (`kquant_order`, `iq_order`).
#[inline]
pub fn hsum8(v: [f32; 8]) -> f32 {
    let s: [f32; 4] = core::array::from_fn(|i| v[i + 4] + v[i]);
    (s[0] + s[2]) + (s[1] + s[3])
}
