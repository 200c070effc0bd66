//! 256-bit kernels for every weight format, written once and generic over the integer dot
//! primitive ([`IDot`]: AVX2 `vpmaddubsw`+`vpmaddwd`, or AVX-512 VNNI `vpdpbusd`/`vpdpwssd`).
//!
//! Every function here is `#[inline(always)]` and `unsafe`: it is only ever inlined into a
//! `#[target_feature]` entry point of a tier in `super` (which enables at least AVX2, FMA and
//! F16C), called only after runtime detection, with pointers whose row lengths were checked by
//! the safe wrapper. The pointers are byte pointers into weight/activation rows; all loads are
//! unaligned.
//!
//! Shape of every kernel: a *tile* is one weight row against `NX` activation rows. Each weight
//! block is decoded once into registers and multiplied with the `NX` activation blocks, so a
//! prefill gemm pays the decode once per `NX` tokens; `vec_dot` is the `NX = 1` tile.

use crate::quant::blocks::{cast_mut, BlockQ8K};
use crate::quant::reference::{self, Quantize};
use core::arch::x86_64::*;

mod float;
mod iq2;
mod iq2xs;
mod iq_grid;
mod iq_tile;
mod iquants;
mod kquants;
pub(super) use float::*;
pub(super) use iq2::*;
pub(super) use iq2xs::*;
pub(super) use iq_grid::*;
use iq_tile::{gemm_tile16, TileFormat};
pub(super) use iquants::*;
pub(super) use kquants::*;

pub(super) use super::simd::{f16x2_at, hsum_ps, loadu, Blk32, Gemm, IDot, Maddubs, Maddubs512};

// ---------------------------------------------------------------------------------------------
// Small helpers.

#[inline(always)]
pub(super) unsafe fn loadu128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// How far ahead of the block it reads a matrix-vector product asks for the weights. Decode
/// runs these kernels at about the speed of their arithmetic, so a load that waits on memory
/// stalls them: on a Zen 1 (AVX2, 2 threads) asking 4 KiB ahead took SmolLM2's decode from
/// 93 to 103 tok/s and Gemma-3's from 45 to 47; 1 KiB and 8 KiB did no better. The AVX-512
/// rows (`t32_x16::row`, `t32_blocks::row`, `q4k_x16`, `q6k_x16`) ask the same way: on a Zen 5
/// (2 threads, alternating builds, tg64) SmolLM2 450-476 → 482-504 tok/s, Gemma-3 176-182 →
/// 182-186, a Llama-1B-shape Q4_0 60-61 → 65-67, the same shape in Q4_K with a Q6_K head
/// 42-43 → 47-50. Not on a Zen 4, whose own prefetcher does better alone ([`asks_ahead`]).
const PREFETCH_BYTES: usize = 4096;

/// Whether the group kernels ask for weights ahead ([`prefetch_ahead`]): everywhere but on a
/// Zen 4, whose own prefetcher streams the groups faster alone. There, one core's
/// `cargo bench --bench quant -- "matvec/.* x"` with `KILN_BENCH_ROWS=65536` (from memory)
/// without asking against asking: Q6_K 22.5 against 10.3 GiB/s, the other AVX-512 VNNI groups
/// 21-25 against 19-21. `KILN_PREFETCH=0` or `1` overrides the choice.
pub(in crate::quant::x86) fn asks_ahead() -> bool {
    static ASK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ASK.get_or_init(|| {
        crate::tuning::get()
            .prefetch
            .unwrap_or_else(|| !super::is_zen4())
    })
}

/// Asks for the cache lines `PREFETCH_BYTES` past those of the `bytes` (a block of a group)
/// at `sb`: the next blocks of the group, then the next group's (a thread's rows are
/// consecutive groups). Nothing where the CPU streams better alone ([`asks_ahead`]).
///
/// # Safety
/// SSE (a prefetch never faults, wherever it points).
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(sb: *const u8, bytes: usize) {
    if asks_ahead() {
        prefetch_lines(sb.wrapping_add(PREFETCH_BYTES), bytes)
    }
}

/// Asks for the cache lines of the `bytes` at `p` (the next group, from a pass that reads
/// the group again from the cache), where the CPU gains from it ([`asks_ahead`]).
///
/// # Safety
/// SSE (a prefetch never faults, wherever it points).
#[inline(always)]
pub(super) unsafe fn prefetch_next(p: *const u8, bytes: usize) {
    if asks_ahead() {
        prefetch_lines(p, bytes)
    }
}

/// Asks for the cache lines of the `bytes` at `p`.
///
/// # Safety
/// SSE (a prefetch never faults, wherever it points).
#[inline(always)]
pub(super) unsafe fn prefetch_lines(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
}

/// The fp16 in the *last* two bytes before `end` (reads `end - 4 .. end`, so it never reads
/// past a block that ends with its scale).
#[inline(always)]
pub(super) unsafe fn f16_before(end: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_movehdup_ps(f16x2_at(end.sub(4))))
}

/// Lanes 0 and 1 as scalars.
#[inline(always)]
unsafe fn lanes01(v: __m128) -> (f32, f32) {
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline(always)]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    core::ptr::read_unaligned(p.cast::<f32>())
}

#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
pub(super) unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// 16 bytes of packed nibbles -> 32 bytes in element order (low nibbles are elements 0..16).
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // A broadcast load plus a per-lane variable shift, instead of shift + `vinserti128`: the
    // insert would compete for port 5 with the fp16 scale conversions.
    let t = _mm256_broadcastsi128_si256(loadu128(p));
    let t = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(t, _mm256_set1_epi8(0x0F))
}

/// The 32 bits at `p` spread to 32 bytes: 0xFF where the bit is set (element order).
#[inline(always)]
pub(super) unsafe fn bits32(p: *const u8) -> __m256i {
    bits32_of(core::ptr::read_unaligned(p.cast::<u32>()))
}

/// The 32 bits of `x` spread to 32 bytes: 0xFF where the bit is set (bit `j`: byte `j`).
#[inline(always)]
pub(super) unsafe fn bits32_of(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// The `NX` activation rows of a tile.
pub(super) type Rows<const NX: usize> = [*const u8; NX];

/// Rows addressed by a tile: the weight row and `NX` activation rows.
pub(super) trait Tile {
    /// Elements per block, and bytes per weight / activation block.
    const BLOCK: usize;
    const W_BYTES: usize;
    const X_BYTES: usize;
    /// Dot of one weight row (`n` elements) with `NX` activation rows.
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX];

    /// `nw x nx` dots (see [`gemm_tiles`]); formats may specialise it.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm)
    where
        Self: Sized,
    {
        gemm_tiles::<Self, D>(g)
    }
}

/// `nw x nx` dots via tiles of up to 4 activation rows, weight row outermost so the weight row
/// stays in L1 while every activation row passes over it.
#[inline(always)]
pub(super) unsafe fn gemm_tiles<T: Tile, D: IDot>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    let xr = |j: usize| x.add(j * x_stride);
    for i in 0..nw {
        let wr = w.add(i * w_stride);
        let mut j = 0;
        while j + 4 <= nx {
            let r = T::tile::<D, 4>(n, wr, [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)]);
            for (t, v) in r.into_iter().enumerate() {
                *out.add((j + t) * out_stride + i) = v;
            }
            j += 4;
        }
        macro_rules! rest {
            ($nx:literal, [$($t:literal),*]) => {{
                let r = T::tile::<D, $nx>(n, wr, [$(xr(j + $t)),*]);
                for (t, v) in r.into_iter().enumerate() {
                    *out.add((j + t) * out_stride + i) = v;
                }
            }};
        }
        match nx - j {
            3 => rest!(3, [0, 1, 2]),
            2 => rest!(2, [0, 1]),
            1 => rest!(1, [0]),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats against Q8_0 (signed weights) or Q8_1 (unsigned weights + offset).

/// [`nibbles32`] of two blocks at once, one per 256-bit half.
#[inline(always)]
unsafe fn nibbles64(p0: *const u8, p1: *const u8) -> __m512i {
    let t = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(loadu128(p0))),
        _mm256_broadcastsi128_si256(loadu128(p1)),
    );
    let t = _mm512_srlv_epi64(t, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(t, _mm512_set1_epi8(0x0F))
}

/// The fifth bits of two 5-bit blocks (`qh` at `p0 + off`, `p1 + off`) as one 64-bit mask.
#[inline(always)]
unsafe fn qh64(p0: *const u8, p1: *const u8, off: usize) -> u64 {
    let lo = core::ptr::read_unaligned(p0.add(off).cast::<u32>()) as u64;
    let hi = core::ptr::read_unaligned(p1.add(off).cast::<u32>()) as u64;
    lo | (hi << 32)
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;

impl Blk32 for Q4_0 {
    const SIZE: usize = 18;
    const SIGNED: bool = true;
    const OFFSET: u8 = 8;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        nibbles32(p.add(2))
    }
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        nibbles64(p0.add(2), p1.add(2))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8))
    }
}

impl Blk32 for Q4_1 {
    const SIZE: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        nibbles64(p0.add(4), p1.add(4))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        nibbles32(p.add(4))
    }
}

impl Blk32 for Q5_0 {
    const SIZE: usize = 22;
    const SIGNED: bool = true;
    const OFFSET: u8 = 16;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // nibble + 16 where the fifth bit is set: one byte-masked add.
        let qh = core::ptr::read_unaligned(p.add(2).cast::<u32>());
        let q = nibbles32(p.add(6));
        _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        let q = nibbles64(p0.add(6), p1.add(6));
        _mm512_mask_add_epi8(q, qh64(p0, p1, 2), q, _mm512_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        if D::AVX512 {
            // nibble - 16 where the fifth bit is clear: one byte-masked subtract.
            let qh = core::ptr::read_unaligned(p.add(2).cast::<u32>());
            let q = nibbles32(p.add(6));
            _mm256_mask_sub_epi8(q, !qh, q, _mm256_set1_epi8(16))
        } else {
            // nibble | 0xF0 (= nibble - 16 as i8) where the fifth bit is clear.
            let hi = _mm256_andnot_si256(bits32(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nibbles32(p.add(6)), hi)
        }
    }
}

impl Blk32 for Q5_1 {
    const SIZE: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        let q = nibbles64(p0.add(8), p1.add(8));
        _mm512_mask_add_epi8(q, qh64(p0, p1, 4), q, _mm512_set1_epi8(16))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        if D::AVX512 {
            let qh = core::ptr::read_unaligned(p.add(4).cast::<u32>());
            let q = nibbles32(p.add(8));
            _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
        } else {
            let hi = _mm256_and_si256(bits32(p.add(4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles32(p.add(8)), hi)
        }
    }
}

impl Blk32 for Q8_0 {
    const SIZE: usize = 34;
    const SIGNED: bool = true;
    const OFFSET: u8 = 128;
    #[inline(always)]
    unsafe fn uquants(p: *const u8) -> __m256i {
        _mm256_xor_si256(loadu(p.add(2)), _mm256_set1_epi8(0x80u8 as i8))
    }
    #[inline(always)]
    unsafe fn quants<D: IDot>(p: *const u8) -> __m256i {
        loadu(p.add(2))
    }
}

/// Tile adapter for the 32-element formats.
pub(super) struct T32<F>(core::marker::PhantomData<F>);

impl<F: Blk32> T32<F> {
    /// Activation block layout: Q8_0 (d, qs) or Q8_1 (d, s, qs).
    const XB: usize = if F::SIGNED { 34 } else { 36 };
    const XQ: usize = if F::SIGNED { 2 } else { 4 };

    /// Integer dot of one decoded weight block (`q`, and `aq` = |q| for signed formats) with
    /// the activation block at `xp`, as 8 f32 lanes.
    #[inline(always)]
    unsafe fn block<D: IDot>(q: __m256i, aq: __m256i, xp: *const u8) -> __m256 {
        let y = loadu(xp.add(Self::XQ));
        let zero = _mm256_setzero_si256();
        let i = if F::SIGNED {
            D::dpbusd(zero, aq, _mm256_sign_epi8(y, q))
        } else {
            D::dpbusd(zero, q, y)
        };
        _mm256_cvtepi32_ps(i)
    }
}

impl<F: Blk32> T32<F> {
    /// The tile body. Activation block scales come either straight from the activation rows
    /// (`sc` null) or from `sc`, where `sc[r * nb + b]` holds `[d, s]` of block `b` of row `r`
    /// already converted to f32 (exact, so both give identical bits).
    #[inline(always)]
    unsafe fn tile_impl<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
        sc: *const [f32; 2],
    ) -> [f32; NX] {
        let nb = n / 32;
        // The reference engine's order (ggml's x86 `ggml_vec_dot_q*_q8_*`): one accumulator
        // advanced block by block with a fused multiply-add, the offset term `m·s` summed
        // separately (also fused), then `hsum(acc) + summ`. Small models amplify a last-bit
        // difference here into visibly different logits, so the order is kept exactly.
        // `ms` collects `m * s` of the unsigned formats in lane 1 (lane 0 is unused).
        let mut acc = [[_mm256_setzero_ps(); NX]; 1];
        let mut ms = [[_mm_setzero_ps(); NX]; 1];
        // A macro rather than a closure: closures are not inlined reliably, and a kernel body
        // outside the `#[target_feature]` function would call every intrinsic out of line.
        macro_rules! step {
            ($b:expr, $u:expr) => {{
                let wp = w.add($b * F::SIZE);
                let q = F::quants::<D>(wp);
                let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                // Lanes: [d, m] of the weight block (m only for unsigned formats).
                let wdm = f16x2_at(wp);
                for j in 0..NX {
                    let xp = x[j].add($b * Self::XB);
                    let p = Self::block::<D>(q, aq, xp);
                    let xds = if sc.is_null() {
                        f16x2_at(xp)
                    } else {
                        _mm_castsi128_ps(_mm_loadl_epi64(sc.add(j * nb + $b).cast()))
                    };
                    // [d_w * d_x, m * s]. Signed formats multiply lane 0 only: their lane 1
                    // holds quant bytes read as fp16, and a denormal product would cost a
                    // microcode assist.
                    let prod = if F::SIGNED {
                        _mm_mul_ss(wdm, xds)
                    } else {
                        _mm_mul_ps(wdm, xds)
                    };
                    acc[$u][j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), p, acc[$u][j]);
                    if !F::SIGNED {
                        ms[$u][j] = _mm_fmadd_ps(wdm, xds, ms[$u][j]);
                    }
                }
            }};
        }
        for b in 0..nb {
            step!(b, 0);
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = hsum_ps(acc[0][j]);
            if !F::SIGNED {
                out[j] += _mm_cvtss_f32(_mm_movehdup_ps(ms[0][j]));
            }
        }
        out
    }
}

impl<F: Blk32> T32<F> {
    /// `NW` weight rows against the activation row `x`, whose block scales are in `sc`
    /// (converted as for [`Self::tile_impl`]). Each row's result is bit-identical to
    /// `tile_impl::<D, 1>` on that row: the same operations in the same order, only
    /// interleaved with the other rows'.
    #[inline(always)]
    unsafe fn rows_impl<D: IDot, const NW: usize>(
        n: usize,
        w: [*const u8; NW],
        x: *const u8,
        sc: *const [f32; 2],
        prefetch: usize,
    ) -> [f32; NW] {
        let nb = n / 32;
        let mut acc = [_mm256_setzero_ps(); NW];
        let mut ms = [_mm_setzero_ps(); NW];
        for b in 0..nb {
            let xp = x.add(b * Self::XB);
            let xds = _mm_castsi128_ps(_mm_loadl_epi64(sc.add(b).cast()));
            for r in 0..NW {
                let wp = w[r].add(b * F::SIZE);
                // Interleaved rows defeat the hardware's stream detection: fetch ahead by hand
                // (a prefetch never faults, so running past the matrix is harmless).
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(prefetch).cast());
                let q = F::quants::<D>(wp);
                let aq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
                let wdm = f16x2_at(wp);
                let p = Self::block::<D>(q, aq, xp);
                let prod = if F::SIGNED {
                    _mm_mul_ss(wdm, xds)
                } else {
                    _mm_mul_ps(wdm, xds)
                };
                acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), p, acc[r]);
                if !F::SIGNED {
                    ms[r] = _mm_fmadd_ps(wdm, xds, ms[r]);
                }
            }
        }
        let mut out = [0f32; NW];
        for r in 0..NW {
            out[r] = hsum_ps(acc[r]);
            if !F::SIGNED {
                out[r] += _mm_cvtss_f32(_mm_movehdup_ps(ms[r]));
            }
        }
        out
    }
}

/// Most activation blocks per row whose scales [`T32`]'s gemm converts ahead (rows up to
/// 16384 elements; longer rows convert on the fly).
const PREP_BLOCKS: usize = 512;
/// Weight rows per chunk in [`T32`]'s gemm: small enough to stay in L2 while every tile of
/// activation rows passes over it.
const ROW_CHUNK: usize = 64;

impl<F: Blk32> Tile for T32<F> {
    const BLOCK: usize = 32;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Self::XB;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        Self::tile_impl::<D, NX>(n, w, x, core::ptr::null())
    }

    /// Converts the fp16 scales of each tile of (up to 4) activation rows once, then runs that
    /// tile against a chunk of weight rows: the per-block scale conversion, a large share of
    /// the work of a 32-element block, is paid once per chunk instead of once per weight row.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
        let nb = n / 32;
        if D::VNNI && nx >= 8 {
            // Whole tiles of 16, then 8, activation rows through the pair kernel, the rest
            // below.
            let n16 = nx / 16 * 16;
            super::avx512::t32_gemm_pairs::<F, 8>(Gemm { nx: n16, ..g });
            let n8 = nx / 8 * 8;
            super::avx512::t32_gemm_pairs::<F, 4>(Gemm {
                nx: n8 - n16,
                ..g.skip_rows(n16)
            });
            if n8 == nx {
                return;
            }
            return Self::gemm::<D>(g.skip_rows(n8));
        }
        if nb > PREP_BLOCKS {
            return gemm_tiles::<Self, D>(g);
        }
        // [d, s] per block, for the 4 rows of a tile (16 KiB). Left uninitialized: zeroing it
        // cost more than a whole decode-step matvec; only entries written below are read.
        let mut sc = [core::mem::MaybeUninit::<[f32; 2]>::uninit(); 4 * PREP_BLOCKS];
        // The same, per block [d_0..d_3, s_0..s_3] of a full tile, for `avx512::t32_tile4`.
        let mut sc4 = [core::mem::MaybeUninit::<[f32; 8]>::uninit(); PREP_BLOCKS];
        let xr = |j: usize| x.add(j * x_stride);
        let mut i0 = 0;
        while i0 < nw {
            let i1 = (i0 + ROW_CHUNK).min(nw);
            let mut j = 0;
            while j < nx {
                let t = (nx - j).min(4);
                for r in 0..t {
                    for b in 0..nb {
                        let v = f16x2_at(xr(j + r).add(b * Self::XB));
                        _mm_storel_epi64(
                            sc.as_mut_ptr().add(r * nb + b).cast(),
                            _mm_castps_si128(v),
                        );
                    }
                }
                let scp = sc.as_ptr().cast::<[f32; 2]>();
                if D::VNNI && t == 4 {
                    for (b, slot) in sc4[..nb].iter_mut().enumerate() {
                        let mut v = [0f32; 8];
                        for r in 0..4 {
                            let ds = *scp.add(r * nb + b);
                            v[r] = ds[0];
                            v[4 + r] = ds[1];
                        }
                        slot.write(v);
                    }
                    let sc4p = sc4.as_ptr().cast::<[f32; 8]>();
                    for i in i0..i1 {
                        let wr = w.add(i * w_stride);
                        let x4 = [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)];
                        let r = super::avx512::t32_tile4::<F, D>(n, wr, x4, sc4p);
                        for (k, v) in r.into_iter().enumerate() {
                            *out.add((j + k) * out_stride + i) = v;
                        }
                    }
                    j += t;
                    continue;
                }
                let mut i = i0;
                if t == 1 {
                    // One activation row (decode): four weight rows at a time, each with its
                    // own accumulator chain, so the chains overlap instead of waiting on one
                    // another; every row's arithmetic is unchanged.
                    while i + 4 <= i1 {
                        let wr = [0, 1, 2, 3].map(|k| w.add((i + k) * w_stride));
                        let r = if D::VNNI {
                            super::avx512::t32_rows4::<F>(n, wr, xr(j), scp, 64 * w_stride)
                        } else {
                            Self::rows_impl::<D, 4>(n, wr, xr(j), scp, 32 * w_stride)
                        };
                        for (k, v) in r.into_iter().enumerate() {
                            *out.add(j * out_stride + i + k) = v;
                        }
                        i += 4;
                    }
                }
                for i in i..i1 {
                    let wr = w.add(i * w_stride);
                    macro_rules! run {
                        ($nx:literal, [$($t:literal),*]) => {{
                            let r = Self::tile_impl::<D, $nx>(n, wr, [$(xr(j + $t)),*], scp);
                            for (t, v) in r.into_iter().enumerate() {
                                *out.add((j + t) * out_stride + i) = v;
                            }
                        }};
                    }
                    match t {
                        4 => run!(4, [0, 1, 2, 3]),
                        3 => run!(3, [0, 1, 2]),
                        2 => run!(2, [0, 1]),
                        _ => run!(1, [0]),
                    }
                }
                j += t;
            }
            i0 = i1;
        }
    }
}
