//! The 32-element formats over a matrix repacked into 16-row groups (`quant::repack`: the
//! layouts `t32_x16` reads), for the tiers without VNNI (AVX2, and AVX-512 without VNNI): a
//! group is read as two halves of 8 rows, each 32-bit lane of a 256-bit register one weight
//! row.
//!
//! The arithmetic is `t32_x16`'s, and so the reference's: lane `l` of the reference's 8-lane
//! dot (elements `4l .. 4l + 4`) is one register of 8 rows; per block its exact integer is
//! converted and fused-multiply-added with `d_w · d_x`; the 8 lanes are added at the end in the
//! reference's tree, then (Q4_1, Q5_1) the minimum's separate sum. The integer comes from
//! `maddubs` (unsigned × signed bytes, adjacent pairs summed in i16) instead of `vpdpbusd`:
//! exact for the 4- and 5-bit values (a pair is at most 2 · 31 · 128), which run as
//! `Σ v·y − OFFSET·Σ y`; Q8_0's values would overflow a pair, so it runs as the row-major
//! kernels do, `Σ |q| · (sign(q)·y)`. Q5_0 and Q5_1 are read from their own layout, fifth bits
//! as bit planes ([`Planes`]); Q5_0's signed quants then take the sign trick too. Every output
//! has the bits of the row-major kernels of the same tier (`avx2::T32`), but for Q4_0's
//! ([`gemm_blocks`]), which sum each block's lanes in integers first, as the reference does over
//! its rearranged Q4_0 (`t32_blocks`).

use super::avx2::{f16x2_at, loadu, loadu128, prefetch_ahead, prefetch_next, Gemm, IDot, Maddubs};
use super::t32_x16::{Group32, Nib, MAX_BLOCKS, Q8_0};
use crate::quant::repack::Nib32;
use core::arch::x86_64::*;
use core::mem::MaybeUninit;

/// Rows of a group read at once.
pub(super) const HALF: usize = 8;

/// One 16-row group (`w`) against `nx` activation rows: `out[j * out_stride + r]` for rows
/// `r < 16`. `n` is a multiple of 32, at most `32 · MAX_BLOCKS`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` holds `n / 32` repacked blocks, each of the `nx`
/// rows at `x + j·x_stride` holds `n / 32` activation blocks (Q8_0, or Q8_1 for a format with a
/// minimum), and `out` has room for every output written.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_tf<F: Half32>(g: Gemm) {
    gemm::<F, false>(g)
}

/// [`gemm_tf`] in the block-sum order (`t32_blocks`; the reference's arithmetic for Q4_0 over
/// its rearranged matrices): per block, the 8 lanes' integers added first, then one
/// conversion and one fused multiply-add.
///
/// # Safety
/// As [`gemm_tf`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_blocks<F: Half32>(g: Gemm) {
    gemm::<F, true>(g)
}

/// [`gemm_tf`] (`WHOLE`: [`gemm_blocks`]).
///
/// # Safety
/// As [`gemm_tf`].
#[inline(always)]
unsafe fn gemm<F: Half32, const WHOLE: bool>(g: Gemm) {
    let (n, w, _, _, x, _, nx, out, _) = g.parts();
    let nb = n / 32;
    debug_assert!(nb <= MAX_BLOCKS);
    let sb = |b: usize| w.add(b * F::BYTES);
    if nx == 1 && WHOLE {
        let r = blocks_row::<F>(
            nb,
            x,
            |b, l, h| F::prepared(sb(b), l, h),
            |b, h| scales::<F>(sb(b), h),
            |b| prefetch_ahead(sb(b), F::BYTES),
        );
        _mm256_storeu_ps(out, r[0]);
        _mm256_storeu_ps(out.add(HALF), r[1]);
    } else if nx == 1 {
        for h in 0..2 {
            let r = half::<F>(
                nb,
                x,
                |b, l| F::prepared(sb(b), l, h),
                |b| scales::<F>(sb(b), h),
                // The first half asks for the weights ahead; the second, which reads the
                // group again from the cache, asks for the next group's (a thread's rows are
                // consecutive groups), so memory is not left idle meanwhile.
                |b| {
                    if h == 0 {
                        prefetch_ahead(sb(b), F::BYTES);
                    } else {
                        prefetch_next(sb(b).wrapping_add(nb * F::BYTES), F::BYTES);
                    }
                },
            );
            _mm256_storeu_ps(out.add(HALF * h), r);
        }
    } else {
        // Through a pointer the optimizer cannot see into: inlined (as it was, despite
        // `inline(never)`), `batch`'s 144 KiB of buffers made every call probe that much stack,
        // a decode row's too (~14% of Gemma-3's AVX2 decode in its 16-row groups).
        type Batch = unsafe fn(Gemm);
        let batch: Batch = core::hint::black_box(batch::<F, WHOLE>);
        batch(g);
    }
}

// The batch's buffers fit the stack the plan gives a worker for a group kernel.
const _: () = assert!((16 + 2 + 2) * 32 * MAX_BLOCKS <= super::t32_x16::STACK_BYTES);

/// A batch: the group's values prepared once (8 lanes × 2 halves, the 16 `d` and `m` per
/// block, on the stack), then every activation row runs over them. A format with
/// [`Half32::SIGNED`] keeps each lane as its signed quants and their magnitudes, two registers
/// in the same buffer (so for at most `MAX_BLOCKS / 2` blocks; longer rows take the prepared
/// form): [`half_signed`] then needs no offset correction, one operation fewer per lane.
///
/// # Safety
/// As [`gemm_tf`], with `nb ≤ MAX_BLOCKS` (the buffers' size: only blocks `< nb` are written,
/// and only those are read).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn batch<F: Half32, const WHOLE: bool>(g: Gemm) {
    let (_, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = g.n / 32;
    let mut vals = [const { MaybeUninit::<__m256i>::uninit() }; 16 * MAX_BLOCKS];
    let mut ds = [const { MaybeUninit::<__m256>::uninit() }; 2 * MAX_BLOCKS];
    let mut mins = [const { MaybeUninit::<__m256>::uninit() }; 2 * MAX_BLOCKS];
    let signed = F::SIGNED && !WHOLE && nb <= MAX_BLOCKS / 2;
    for b in 0..nb {
        let sb = w.add(b * F::BYTES);
        prefetch_ahead(sb, F::BYTES);
        for h in 0..2 {
            let (d, m) = scales::<F>(sb, h);
            ds[2 * b + h].write(d);
            mins[2 * b + h].write(m);
            for l in 0..8 {
                let i = 16 * b + 8 * h + l;
                let p = F::prepared(sb, l, h);
                if signed {
                    let q = F::signed(p);
                    vals[2 * i].write(q);
                    vals[2 * i + 1].write(_mm256_sign_epi8(q, q));
                } else {
                    vals[i].write(p);
                }
            }
        }
    }
    let vals = vals.as_ptr().cast::<__m256i>();
    let ds = ds.as_ptr().cast::<__m256>();
    let mins = mins.as_ptr().cast::<__m256>();
    for j in 0..nx {
        let x = x.add(j * x_stride);
        if WHOLE {
            let r = blocks_row::<F>(
                nb,
                x,
                |b, l, h| *vals.add(16 * b + 8 * h + l),
                |b, h| (*ds.add(2 * b + h), *mins.add(2 * b + h)),
                |_| {},
            );
            _mm256_storeu_ps(out.add(j * out_stride), r[0]);
            _mm256_storeu_ps(out.add(j * out_stride + HALF), r[1]);
            continue;
        }
        for h in 0..2 {
            let r = if signed {
                half_signed::<F>(
                    nb,
                    x,
                    |b, l| {
                        let i = 16 * b + 8 * h + l;
                        (*vals.add(2 * i), *vals.add(2 * i + 1))
                    },
                    |b| *ds.add(2 * b + h),
                )
            } else {
                half::<F>(
                    nb,
                    x,
                    |b, l| *vals.add(16 * b + 8 * h + l),
                    |b| (*ds.add(2 * b + h), *mins.add(2 * b + h)),
                    |_| {},
                )
            };
            _mm256_storeu_ps(out.add(j * out_stride + HALF * h), r);
        }
    }
}

/// [`half`] for a [`Half32::SIGNED`] format in the lanes' order: `pair(b, l)` gives lane `l`
/// of block `b` as its signed quants `q` and `|q|`, and each lane's integer is
/// `Σ |q| · sign(y, q)`, the same integer as the prepared form's (activation quants lie in
/// −127..=127, as the Q8_0 quantizer makes them, so no sign flip overflows a byte; the row-major
/// Q8_0 kernels rely on the same). `d(b)` is the 8 rows' `d`.
///
/// # Safety
/// As [`half`].
#[inline(always)]
unsafe fn half_signed<F: Half32>(
    nb: usize,
    x: *const u8,
    pair: impl Fn(usize, usize) -> (__m256i, __m256i),
    d: impl Fn(usize) -> __m256,
) -> __m256 {
    debug_assert!(F::SIGNED && !F::MIN);
    let mut acc = [_mm256_setzero_ps(); 8];
    for b in 0..nb {
        let xp = x.add(b * F::XB);
        let prod = _mm256_mul_ps(d(b), _mm256_broadcastss_ps(f16x2_at(xp)));
        for (l, a) in acc.iter_mut().enumerate() {
            let (q, abs) = pair(b, l);
            let y = lane_y::<F>(xp, l);
            let dot = Maddubs::dpbusd(_mm256_setzero_si256(), abs, _mm256_sign_epi8(y, q));
            *a = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(dot), *a);
        }
    }
    lane_tree(acc)
}

/// Lane `l`'s 4 activation quants of the activation block at `xp`, in every dword.
///
/// # Safety
/// `xp` points to a whole activation block of the format; AVX2.
#[inline(always)]
unsafe fn lane_y<F: Group32>(xp: *const u8, l: usize) -> __m256i {
    _mm256_set1_epi32(core::ptr::read_unaligned(
        xp.add(F::XQ + 4 * l).cast::<i32>(),
    ))
}

/// The order a block's lanes are visited in.
const LANE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The reference's sum of the 8 lanes' accumulators.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn lane_tree(acc: [__m256; 8]) -> __m256 {
    let s: [__m256; 4] = core::array::from_fn(|i| _mm256_add_ps(acc[i], acc[i + 4]));
    _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]))
}

/// Rows `8h .. 8h + 8` of the group against one activation row `x`: `value(b, l)` gives lane
/// `l` of block `b` prepared ([`Half32::prepared`]), `scales(b)` the 8 rows' `d` and `m`
/// ([`scales`]).
///
/// # Safety
/// `x` holds `nb` activation blocks of the format; AVX2, FMA, F16C.
#[inline(always)]
unsafe fn half<F: Half32>(
    nb: usize,
    x: *const u8,
    value: impl Fn(usize, usize) -> __m256i,
    scales: impl Fn(usize) -> (__m256, __m256),
    prefetch: impl Fn(usize),
) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut ms = _mm256_setzero_ps();
    for b in 0..nb {
        prefetch(b);
        let xp = x.add(b * F::XB);
        let xds = f16x2_at(xp);
        let (d, m) = scales(b);
        let prod = _mm256_mul_ps(d, _mm256_broadcastss_ps(xds));
        let corr = F::corrections(loadu(xp.add(F::XQ)));
        // Lanes `l` and `l + 4` share their nibble bytes: taken together, the block's
        // registers live shorter (each lane's sum is its own, so any order is the same).
        for l in LANE_ORDER {
            let dot = F::dot(value(b, l), lane_y::<F>(xp, l), corr, l);
            acc[l] = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(dot), acc[l]);
        }
        if F::MIN {
            ms = _mm256_fmadd_ps(m, _mm256_broadcastss_ps(_mm_movehdup_ps(xds)), ms);
        }
    }
    with_minimum::<F>(lane_tree(acc), ms)
}

/// The whole group (both halves) against one activation row `x` in the block-sum order
/// (`gemm_blocks`): per block and half, the lanes' integers added (exact, any order), then one
/// conversion and one fused multiply-add. `value(b, l, h)`, `scales(b, h)` as [`half`]'s for
/// half `h`. Both halves of a block are taken together (two accumulators, where the lanes'
/// order needs eight a half): a decode row then streams its weights at one pace, where
/// reading a half at a time leaves memory idle while the second half runs from the cache
/// (Gemma-3's tied Q8_0 head on a Zen 1, 2 threads: about 15 → 19 GB/s).
///
/// # Safety
/// As [`half`].
#[inline(always)]
unsafe fn blocks_row<F: Half32>(
    nb: usize,
    x: *const u8,
    value: impl Fn(usize, usize, usize) -> __m256i,
    scales: impl Fn(usize, usize) -> (__m256, __m256),
    prefetch: impl Fn(usize),
) -> [__m256; 2] {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut ms = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        prefetch(b);
        let xp = x.add(b * F::XB);
        let xds = f16x2_at(xp);
        let corr = F::corrections(loadu(xp.add(F::XQ)));
        for h in 0..2 {
            let (d, m) = scales(b, h);
            let prod = _mm256_mul_ps(d, _mm256_broadcastss_ps(xds));
            let t = F::block_dot(|l| value(b, l, h), |l| lane_y::<F>(xp, l), corr);
            acc[h] = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(t), acc[h]);
            if F::MIN {
                ms[h] = _mm256_fmadd_ps(m, _mm256_broadcastss_ps(_mm_movehdup_ps(xds)), ms[h]);
            }
        }
    }
    [
        with_minimum::<F>(acc[0], ms[0]),
        with_minimum::<F>(acc[1], ms[1]),
    ]
}

/// `t` plus the minimum's separate sum `ms` for a format with one (Q4_1, Q5_1).
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn with_minimum<F: Group32>(t: __m256, ms: __m256) -> __m256 {
    if F::MIN {
        _mm256_add_ps(t, ms)
    } else {
        t
    }
}

/// The 8 f16 values of half `h` at `p` (16 consecutive f16, one per row), in f32.
///
/// # Safety
/// `p` points to 16 readable f16; F16C.
#[inline(always)]
pub(super) unsafe fn f16x8(p: *const u8, h: usize) -> __m256 {
    _mm256_cvtph_ps(loadu128(p.add(16 * h)))
}

/// The 8 rows' `d` of half `h` of block `sb`, and their `m` (zero for a format without one).
///
/// # Safety
/// `sb` points to a whole block of the layout; F16C.
#[inline(always)]
unsafe fn scales<F: Half32>(sb: *const u8, h: usize) -> (__m256, __m256) {
    let m = if F::MIN {
        f16x8(sb.add(Nib32::M_AT), h)
    } else {
        _mm256_setzero_ps()
    };
    (F::d8(sb, h), m)
}

/// A [`Group32`] layout read 8 rows at a time.
pub(super) trait Half32: Group32 {
    /// Batches keep this format's lanes as signed quants ([`Self::signed`]) and run the sign
    /// trick, `Σ |q| · sign(y, q)`: formats without a minimum, whose quants fit a signed byte.
    const SIGNED: bool = false;
    /// The signed quants `v − OFFSET` of a prepared lane (for [`Self::SIGNED`] formats).
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn signed(p: __m256i) -> __m256i {
        _mm256_sub_epi8(p, _mm256_set1_epi8(Self::OFFSET as i8))
    }
    /// Lane `l` (< 8) of the 8 rows of half `h` (< 2) of block `sb`, in the form [`Self::dot`]
    /// takes.
    ///
    /// # Safety
    /// `sb` points to a whole block of the layout; AVX2.
    unsafe fn prepared(sb: *const u8, l: usize, h: usize) -> __m256i;
    /// What [`Self::dot`] needs of the activation block's quants `y` beyond each lane's own:
    /// `−OFFSET · Σ y` over each dword (lane `l`'s start value in dword `l`), zero for formats
    /// without an offset.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn corrections(y: __m256i) -> __m256i {
        if Self::OFFSET == 0 {
            return _mm256_setzero_si256();
        }
        let off = _mm256_set1_epi8(Self::OFFSET as i8);
        let s = Maddubs::dpbusd(_mm256_setzero_si256(), off, y);
        _mm256_sub_epi32(_mm256_setzero_si256(), s)
    }
    /// The exact integer `Σ q·y` of each row of a prepared lane `p` with the lane's 4
    /// activation quants `y` (in every dword); `corr` as [`Self::corrections`] gives it, `l`
    /// the lane.
    ///
    /// # Safety
    /// AVX2.
    unsafe fn dot(p: __m256i, y: __m256i, corr: __m256i, l: usize) -> __m256i;
    /// The exact integer `Σ q·y` of each row over a whole block: prepared lanes `p(l)`, each
    /// lane's 4 activation quants `y(l)` in every dword, `corr` as [`Self::corrections`].
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn block_dot(
        p: impl Fn(usize) -> __m256i,
        y: impl Fn(usize) -> __m256i,
        corr: __m256i,
    ) -> __m256i {
        lane_sum::<Self>(p, y, corr)
    }
    /// The 8 rows' scales of half `h` (< 2) of block `sb` in f32: `d` as f16 at the block's
    /// start ([`f16x8`]).
    ///
    /// # Safety
    /// `sb` points to a whole block of the layout; F16C.
    #[inline(always)]
    unsafe fn d8(sb: *const u8, h: usize) -> __m256 {
        f16x8(sb, h)
    }
}

/// [`Half32::block_dot`] as the 8 lanes' [`Half32::dot`] added.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn lane_sum<F: Half32 + ?Sized>(
    p: impl Fn(usize) -> __m256i,
    y: impl Fn(usize) -> __m256i,
    corr: __m256i,
) -> __m256i {
    // The lanes' integers added (exact, any order), in a loop: as `array::from_fn` closures
    // (which do not inherit the caller's target features) the intrinsics here stayed calls,
    // and Q8_0's block sums ran at a twelfth of their speed.
    let mut s = F::dot(p(0), y(0), corr, 0);
    for l in 1..8 {
        s = _mm256_add_epi32(s, F::dot(p(l), y(l), corr, l));
    }
    s
}

impl<const MIN: bool> Half32 for Nib<MIN, false> {
    const SIGNED: bool = !MIN;
    #[inline(always)]
    unsafe fn prepared(sb: *const u8, l: usize, h: usize) -> __m256i {
        nibbles(sb.add(Self::LAYOUT.nibbles_at()), l, h)
    }
    #[inline(always)]
    unsafe fn dot(p: __m256i, y: __m256i, corr: __m256i, l: usize) -> __m256i {
        let start = if Self::OFFSET == 0 {
            _mm256_setzero_si256()
        } else {
            _mm256_permutevar8x32_epi32(corr, _mm256_set1_epi32(l as i32))
        };
        Maddubs::dpbusd(start, p, y)
    }
    #[inline(always)]
    unsafe fn block_dot(
        p: impl Fn(usize) -> __m256i,
        y: impl Fn(usize) -> __m256i,
        corr: __m256i,
    ) -> __m256i {
        // 4-bit values: a pair of products is at most 2 · 15 · 128 = 3840 in magnitude, so
        // the 8 lanes' pairs add up exactly in i16 (≤ 30720) before one widening.
        let mut s16 = _mm256_maddubs_epi16(p(0), y(0));
        for l in 1..8 {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(p(l), y(l)));
        }
        let dot = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
        if Self::OFFSET == 0 {
            return dot;
        }
        // The lanes' corrections, added into every dword.
        let c = _mm256_add_epi32(corr, _mm256_permute2x128_si256::<1>(corr, corr));
        let c = _mm256_add_epi32(c, _mm256_shuffle_epi32::<0b0100_1110>(c));
        let c = _mm256_add_epi32(c, _mm256_shuffle_epi32::<0b1011_0001>(c));
        _mm256_add_epi32(dot, c)
    }
}

/// Q5_0 (`MIN = false`) and Q5_1 (`MIN = true`) × 16 with their fifth bits as bit planes
/// (`quant::repack::Nib32::planes`): one 32-byte load holds a half's bits for all 8 lanes, and
/// lane `l`'s reach bit 4 of each byte by one shift. Q5_0's bits are stored inverted, so that
/// `nibble − 16 · bit'` is the signed quant, which runs as Q8_0's do, `Σ |q| · sign(y, q)`,
/// with no offset correction; Q5_1's values are unsigned, as in [`Nib`].
pub(super) struct Planes<const MIN: bool>;

/// Q5_0 in the bit-plane layout.
pub(super) type Q5_0P = Planes<false>;
/// Q5_1 in the bit-plane layout.
pub(super) type Q5_1P = Planes<true>;

impl<const MIN: bool> Planes<MIN> {
    /// The layout this format's groups have.
    const LAYOUT: Nib32 = Nib32 {
        min: MIN,
        fifth: true,
        planes: true,
    };
}

impl<const MIN: bool> Group32 for Planes<MIN> {
    const BYTES: usize = Self::LAYOUT.group_bytes();
    const OFFSET: u8 = if MIN { 0 } else { 16 };
    const MIN: bool = MIN;
}

impl<const MIN: bool> Half32 for Planes<MIN> {
    const SIGNED: bool = !MIN;
    #[inline(always)]
    unsafe fn signed(p: __m256i) -> __m256i {
        p // Q5_0's `prepared` gives the signed quants
    }
    #[inline(always)]
    unsafe fn prepared(sb: *const u8, l: usize, h: usize) -> __m256i {
        let f = Self::LAYOUT;
        let q = nibbles(sb.add(f.nibbles_at()), l, h);
        // Bit `l` of each byte of the half's planes to bit 4.
        let planes = loadu(sb.add(f.plane_at(8 * h, 0)));
        let b = _mm256_and_si256(shift_to_bit4(planes, l), _mm256_set1_epi8(16));
        if MIN {
            _mm256_or_si256(q, b)
        } else {
            _mm256_sub_epi8(q, b)
        }
    }
    #[inline(always)]
    unsafe fn corrections(_y: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn dot(p: __m256i, y: __m256i, corr: __m256i, l: usize) -> __m256i {
        if MIN {
            Maddubs::dpbusd(_mm256_setzero_si256(), p, y)
        } else {
            // Signed quants of at most 16 in magnitude: Q8_0's sign trick.
            Q8_0::dot(p, y, corr, l)
        }
    }
}

/// Lane `l`'s nibbles of half `h` of a group's block, its nibble bytes at `nb`, as bytes: lane
/// `l < 4` is the low nibbles of `qs[4l .. 4l + 4]`, lane `l + 4` their high ones.
///
/// # Safety
/// `nb` points to the block's 256 nibble bytes; AVX2.
#[inline(always)]
pub(super) unsafe fn nibbles(nb: *const u8, l: usize, h: usize) -> __m256i {
    let q = loadu(nb.add(64 * (l % 4) + 32 * h));
    let q = if l < 4 { q } else { _mm256_srli_epi16::<4>(q) };
    _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
}

/// `planes` shifted so that bit `l` of each byte lands on bit 4 (the other bits are left
/// unmasked): a 16-bit shift by at most 4 moves no bit of one byte into bit 4 of the other.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn shift_to_bit4(planes: __m256i, l: usize) -> __m256i {
    match l {
        0 => _mm256_slli_epi16::<4>(planes),
        1 => _mm256_slli_epi16::<3>(planes),
        2 => _mm256_slli_epi16::<2>(planes),
        3 => _mm256_slli_epi16::<1>(planes),
        4 => planes,
        5 => _mm256_srli_epi16::<1>(planes),
        6 => _mm256_srli_epi16::<2>(planes),
        _ => _mm256_srli_epi16::<3>(planes),
    }
}

impl Half32 for Q8_0 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn signed(p: __m256i) -> __m256i {
        p // `prepared` gives the signed quants
    }
    #[inline(always)]
    unsafe fn prepared(sb: *const u8, l: usize, h: usize) -> __m256i {
        // Stored as `q ^ 0x80`: back to the signed quants.
        _mm256_xor_si256(
            loadu(sb.add(32 + 64 * l + 32 * h)),
            _mm256_set1_epi8(0x80u8 as i8),
        )
    }
    #[inline(always)]
    unsafe fn corrections(_y: __m256i) -> __m256i {
        // The sign trick needs no offset correction.
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn dot(q: __m256i, y: __m256i, _corr: __m256i, _l: usize) -> __m256i {
        // The row-major kernels' sign trick, so that no pair of products overflows.
        Maddubs::dpbusd(
            _mm256_setzero_si256(),
            _mm256_sign_epi8(q, q),
            _mm256_sign_epi8(y, q),
        )
    }
}
