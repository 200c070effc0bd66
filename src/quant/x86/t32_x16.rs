//! The 32-element formats (Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1) over a
//! matrix repacked into 16-row groups (`quant::repack`), AVX-512 VNNI: each 32-bit lane of a
//! 512-bit register is one weight row.
//!
//! The reference engine's dot of these formats keeps 8 lanes per row: lane `l` takes, per
//! block, the exact integer `Σ q·y` over elements `4l .. 4l + 4`, converted to f32 and
//! fused-multiply-added with the block's `d_w · d_x`; the lanes are added at the end as
//! `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))` (`avx2::hsum_ps`). Lane `l` is one register of
//! this layout, so the 8 lanes become 8 registers of 16 rows and the same operations run on
//! all 16 rows at once. The weights are
//! unsigned, `v = q + OFFSET` (Q4_0: the nibbles, offset 8; Q5_0: the 5-bit values, offset 16;
//! Q8_0: stored as `q ^ 0x80`, offset 128); each lane's dot starts from `−OFFSET · Σ y` of its
//! four activations, so the integer is the signed one exactly. Q4_1 and Q5_1 are unsigned with
//! no offset; their minimum adds `m · s` (the activation block's `s = d · Σ y`) into a 16-row
//! register of its own, fused, block by block, as the reference's separate sum does, and it
//! is added after the lanes. Every output has the bits of the row-major kernels (`avx2::T32`,
//! `avx512::t32_rows4`, `avx512::t32_gemm_pairs`).

use super::avx2::{f16x2_at, prefetch_ahead, Gemm};
use crate::quant::repack::{Nib32, Q8_0_X16_BYTES};
use core::arch::x86_64::*;
use core::mem::MaybeUninit;

/// Longest row, in blocks, the kernel takes (8192 elements): a batch decodes the group's
/// weights once into a stack buffer of this many blocks. `quant::repacking` keeps longer rows
/// in the plain layout.
pub(crate) const MAX_BLOCKS: usize = 256;
/// Stack [`batch`] takes for the decoded weights: 8 value registers, `d` and `m` per block.
pub(crate) const STACK_BYTES: usize = 10 * 64 * MAX_BLOCKS;

/// One 16-row group (`w`) against `nx` activation rows: `out[j * out_stride + r]` for rows
/// `r < 16`. `n` is a multiple of 32, at most `32 · MAX_BLOCKS`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL and VNNI; `w` holds `n / 32` repacked blocks, each of the
/// `nx` rows at `x + j·x_stride` holds `n / 32` activation blocks (Q8_0, or Q8_1 for a format
/// with a minimum), and `out` has room for every output written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub(super) unsafe fn gemm_tf<F: Lanes512>(g: Gemm) {
    let (n, w, _, _, x, _, nx, out, _) = g.parts();
    let nb = n / 32;
    debug_assert!(nb <= MAX_BLOCKS);
    if nx == 1 {
        let (acc, ms) = row::<F>(nb, w, x);
        _mm512_storeu_ps(out, finish::<F>(&acc, ms));
    } else {
        batch::<F>(g);
    }
}

/// One activation row (decode): the group streamed once, each block decoded in registers.
///
/// # Safety
/// As [`gemm_tf`] with `nx = 1`: `w` holds `nb` blocks of the layout, `x` `nb` activation
/// blocks.
#[inline(always)]
unsafe fn row<F: Lanes512>(nb: usize, w: *const u8, x: *const u8) -> ([__m512; 8], __m512) {
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut ms = _mm512_setzero_ps();
    for b in 0..nb {
        let sb = w.add(b * F::BYTES);
        prefetch_ahead(sb, F::BYTES);
        let xp = x.add(b * F::XB);
        let prod = _mm512_mul_ps(F::d(sb), dx(xp));
        let corr = corrections::<F>(xp);
        for j in 0..4 {
            let [lo, hi] = F::values(sb, j);
            acc[j] = lane::<F>(acc[j], prod, lo, xp, corr, j);
            acc[j + 4] = lane::<F>(acc[j + 4], prod, hi, xp, corr, j + 4);
        }
        if F::MIN {
            ms = _mm512_fmadd_ps(m16(sb), sx(xp), ms);
        }
    }
    (acc, ms)
}

/// A batch: the group's weights decoded once (8 registers and the 16 `d` per block, on the
/// stack), then the activation rows run over them two at a time.
///
/// # Safety
/// As [`gemm_tf`], with `nb ≤ MAX_BLOCKS` (the buffers' size: only blocks `< nb` are written,
/// and only those are read).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
unsafe fn batch<F: Lanes512>(g: Gemm) {
    let (_, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = g.n / 32;
    let mut vals = [const { MaybeUninit::<__m512i>::uninit() }; 8 * MAX_BLOCKS];
    let mut ds = [const { MaybeUninit::<__m512>::uninit() }; MAX_BLOCKS];
    let mut mins = [const { MaybeUninit::<__m512>::uninit() }; MAX_BLOCKS];
    for b in 0..nb {
        let sb = w.add(b * F::BYTES);
        prefetch_ahead(sb, F::BYTES);
        ds[b].write(F::d(sb));
        if F::MIN {
            mins[b].write(m16(sb));
        }
        for j in 0..4 {
            let [lo, hi] = F::values(sb, j);
            vals[8 * b + j].write(lo);
            vals[8 * b + j + 4].write(hi);
        }
    }
    let vals = vals.as_ptr().cast::<__m512i>();
    let ds = ds.as_ptr().cast::<__m512>();
    let mins = mins.as_ptr().cast::<__m512>();
    let xr = |j: usize| x.add(j * x_stride);
    let mut j = 0;
    while j < nx {
        let t = (nx - j).min(2);
        let mut acc = [[_mm512_setzero_ps(); 8]; 2];
        let mut ms = [_mm512_setzero_ps(); 2];
        for b in 0..nb {
            let d = *ds.add(b);
            for (i, a) in acc.iter_mut().enumerate().take(t) {
                let xp = xr(j + i).add(b * F::XB);
                let prod = _mm512_mul_ps(d, dx(xp));
                let corr = corrections::<F>(xp);
                for (l, al) in a.iter_mut().enumerate() {
                    *al = lane::<F>(*al, prod, *vals.add(8 * b + l), xp, corr, l);
                }
                if F::MIN {
                    ms[i] = _mm512_fmadd_ps(*mins.add(b), sx(xp), ms[i]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(t) {
            _mm512_storeu_ps(out.add((j + i) * out_stride), finish::<F>(a, ms[i]));
        }
        j += t;
    }
}

/// The activation block's `d` in f32, in every lane.
///
/// # Safety
/// `xp` points to a whole activation block; AVX-512 F and F16C.
#[inline(always)]
pub(super) unsafe fn dx(xp: *const u8) -> __m512 {
    _mm512_broadcastss_ps(f16x2_at(xp))
}

/// The Q8_1 activation block's `s` in f32, in every lane.
///
/// # Safety
/// `xp` points to a whole Q8_1 block; AVX-512 F and F16C.
#[inline(always)]
pub(super) unsafe fn sx(xp: *const u8) -> __m512 {
    _mm512_broadcastss_ps(_mm_movehdup_ps(f16x2_at(xp)))
}

/// The 16 rows' `m` of block `sb` of a format with a minimum, in f32.
///
/// # Safety
/// `sb` points to a whole block of such a layout; AVX-512 F.
#[inline(always)]
pub(super) unsafe fn m16(sb: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(sb.add(Nib32::M_AT).cast()))
}

/// The 16 rows' results: the lanes added in the reference's order, then the minimum's sum.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn finish<F: Group32>(acc: &[__m512; 8], ms: __m512) -> __m512 {
    if F::MIN {
        _mm512_add_ps(tree(acc), ms)
    } else {
        tree(acc)
    }
}

/// `−OFFSET · Σ y` over each dword of the activation block's quants (lane `l`'s start value in
/// dword `l`).
///
/// # Safety
/// `xp` points to a whole activation block; AVX-512 VL and VNNI.
#[inline(always)]
pub(super) unsafe fn corrections<F: Group32>(xp: *const u8) -> __m512i {
    if F::OFFSET == 0 {
        return _mm512_setzero_si512();
    }
    let y = _mm256_loadu_si256(xp.add(F::XQ).cast());
    let off = _mm256_set1_epi8(F::OFFSET as i8);
    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, y);
    _mm512_castsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), s))
}

/// The 16 rows' `d` of block `sb`, in f32.
///
/// # Safety
/// `sb` points to a whole block of the layout; AVX-512 F.
#[inline(always)]
pub(super) unsafe fn d16(sb: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(sb.cast()))
}

/// A 32-element format in the 16-row layout: `d` of the 16 rows (f16) at the start of each
/// block, then (formats with a minimum) their `m` (f16), then its unsigned values.
pub(super) trait Group32 {
    /// Bytes of one block of 16 rows.
    const BYTES: usize;
    /// `v − OFFSET` is the signed quant (0: unsigned quants, with a minimum).
    const OFFSET: u8;
    /// The blocks carry a minimum `m` at [`Nib32::M_AT`] and pair with Q8_1 activations.
    const MIN: bool = false;
    /// Bytes of one activation block (Q8_0: `d`, 32 quants; Q8_1: `d`, `s`, 32 quants).
    const XB: usize = if Self::MIN { 36 } else { 34 };
    /// Offset of the quants in an activation block.
    const XQ: usize = if Self::MIN { 4 } else { 2 };
}

/// A [`Group32`] layout read 16 rows at a time, by 512-bit registers.
pub(super) trait Lanes512: Group32 {
    /// The values of lanes `j` and `j + 4` of block `sb` (`j < 4`), 4 per row.
    ///
    /// # Safety
    /// `sb` points to a whole block of the layout (`BYTES` readable bytes); AVX-512 F/BW.
    unsafe fn values(sb: *const u8, j: usize) -> [__m512i; 2];

    /// The 16 rows' scales of block `sb` in f32: `d` as f16 at the block's start ([`d16`]).
    ///
    /// # Safety
    /// `sb` points to a whole block of the layout; AVX-512 F.
    #[inline(always)]
    unsafe fn d(sb: *const u8) -> __m512 {
        d16(sb)
    }
}

/// The 4-bit legacy formats × 16 (`quant::repack::Nib32`): nibbles, fifth bits as one 64-bit
/// mask per lane when `FIFTH`, a minimum when `MIN`.
pub(super) struct Nib<const MIN: bool, const FIFTH: bool>;

pub(super) type Q4_0 = Nib<false, false>;
pub(super) type Q4_1 = Nib<true, false>;
pub(super) type Q5_0 = Nib<false, true>;
pub(super) type Q5_1 = Nib<true, true>;

impl<const MIN: bool, const FIFTH: bool> Nib<MIN, FIFTH> {
    /// The layout this format's groups have.
    pub(super) const LAYOUT: Nib32 = Nib32 {
        min: MIN,
        fifth: FIFTH,
        planes: false,
    };
}

impl<const MIN: bool, const FIFTH: bool> Group32 for Nib<MIN, FIFTH> {
    const BYTES: usize = Self::LAYOUT.group_bytes();
    const OFFSET: u8 = match (MIN, FIFTH) {
        (true, _) => 0,
        (false, false) => 8,
        (false, true) => 16,
    };
    const MIN: bool = MIN;
}

impl<const MIN: bool, const FIFTH: bool> Lanes512 for Nib<MIN, FIFTH> {
    #[inline(always)]
    unsafe fn values(sb: *const u8, j: usize) -> [__m512i; 2] {
        let four = _mm512_set1_epi8(0x0F);
        let q = _mm512_loadu_si512(sb.add(Self::LAYOUT.nibbles_at() + 64 * j).cast());
        let lo = _mm512_and_si512(q, four);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), four);
        if !FIFTH {
            return [lo, hi];
        }
        let masks = Self::LAYOUT.masks_at();
        let mask = |l: usize| core::ptr::read_unaligned(sb.add(masks + 8 * l).cast::<u64>());
        let sixteen = _mm512_set1_epi8(16);
        [
            _mm512_mask_add_epi8(lo, mask(j), lo, sixteen),
            _mm512_mask_add_epi8(hi, mask(j + 4), hi, sixteen),
        ]
    }
}

/// Q8_0 × 16: `q ^ 0x80` of lane `l` at `32 + 64l` (`quant::repack`).
pub(super) struct Q8_0;

impl Group32 for Q8_0 {
    const BYTES: usize = Q8_0_X16_BYTES;
    const OFFSET: u8 = 128;
}

impl Lanes512 for Q8_0 {
    #[inline(always)]
    unsafe fn values(sb: *const u8, j: usize) -> [__m512i; 2] {
        let at = |l: usize| _mm512_loadu_si512(sb.add(32 + 64 * l).cast());
        [at(j), at(j + 4)]
    }
}

/// Lane `l` of one block: `acc + prod · (Σ v·y − OFFSET·Σ y)` over elements `4l .. 4l + 4`
/// (`corr` holds the `−OFFSET·Σ y` of every lane).
///
/// # Safety
/// AVX-512 F/VL and VNNI; `xp` points to a whole activation block.
#[inline(always)]
unsafe fn lane<F: Group32>(
    acc: __m512,
    prod: __m512,
    v: __m512i,
    xp: *const u8,
    corr: __m512i,
    l: usize,
) -> __m512 {
    let y = _mm512_set1_epi32(core::ptr::read_unaligned(
        xp.add(F::XQ + 4 * l).cast::<i32>(),
    ));
    let start = if F::OFFSET == 0 {
        _mm512_setzero_si512()
    } else {
        _mm512_permutexvar_epi32(_mm512_set1_epi32(l as i32), corr)
    };
    let dot = _mm512_dpbusd_epi32(start, v, y);
    _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(dot), acc)
}

/// The 8 lanes added in the reference's order.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn tree(acc: &[__m512; 8]) -> __m512 {
    let s: [__m512; 4] = core::array::from_fn(|i| _mm512_add_ps(acc[i], acc[i + 4]));
    _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
}
