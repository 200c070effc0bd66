//! The k-quants (Q2_K .. Q6_K) against Q8_K on 256-bit registers: the block decoders and
//! their tiles (`super`'s module text says how every kernel here is called).

use super::*;

// ---------------------------------------------------------------------------------------------
// K-quants against Q8_K. Each super-block is 8 chunks of 32 elements. A format provides the
// chunks as *unsigned* bytes (<= 63, so `vpmaddubsw` cannot saturate) and 16-bit scales; signed
// values and sub-block minimums are applied through Q8_K's `bsums` (sums of 16 activations):
//
//   dot = d·yd · Σ_chunks Σ scale·u·y  +  dm·yd · Σ_groups corr[g]·bsums[g]
//
// where for offset formats (Q3_K: u-4, Q6_K: u-32) `corr = -offset·scale` and `dm = d` (the
// two integer sums are added exactly), and for min formats (Q2_K, Q4_K, Q5_K) `corr = min`
// and `dm = -dmin`.

/// Per-super-block decoded scale data.
pub(in crate::quant::x86) struct KPrep {
    pub d: f32,
    pub dm: f32,
    /// Scales as i16, 8 per 128-bit lane, broadcast to both lanes. Per-16 formats: `[0]` holds
    /// scales 0..8, `[1]` scales 8..16. Per-32 formats: `[0]` holds the 8 scales.
    pub sc: [__m256i; 2],
    /// 16 i16 coefficients of the 16 bsums.
    pub corr: __m256i,
}

pub(in crate::quant::x86) trait BlkK {
    const SIZE: usize;
    /// Scales per 16 elements (else per 32).
    const PER16: bool;
    /// Offset format: the correction is added to the integer sum.
    const INT_CORR: bool;
    /// Batches of at least this many rows use the per-super-block arithmetic of the
    /// reference's tiled kernel (Q3_K, Q5_K and Q6_K: `kquant_order::tiled`).
    const TILED_FROM: usize = usize::MAX;
    /// Single rows: an offset subtracted inside the lanes, element by element (Q3_K's 4), as
    /// the reference's `vec_dot` does, instead of through `corr` (which the tiled order, where
    /// the super-block's integers are exact, keeps).
    const LANE_OFFSET: i8 = 0;
    /// A minimum format's single rows: the minimums' lanes before the scales' (Q2_K).
    const MINS_FIRST: bool = false;
    /// A minimum format's single rows: the minimums summed apart, one scalar chain added after
    /// the lanes (Q5_K).
    const MINS_APART: bool = false;
    unsafe fn prep(p: *const u8) -> KPrep;
    /// Unsigned quants of chunk `k` (elements `32k..32k+32`).
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i;
}

/// Byte-shuffle masks selecting the chunk's scales from `KPrep::sc`.
#[inline(always)]
unsafe fn scale_shuffle(per16: bool, k: usize) -> __m256i {
    if per16 {
        // Chunk k covers sub-blocks 2t, 2t+1 of its half (t = k % 4): low lane gets i16 #2t,
        // high lane gets #2t+1.
        let t = (k % 4) as i8;
        let lo = _mm_set1_epi16(i16::from_le_bytes([(4 * t) as u8, (4 * t + 1) as u8]));
        let hi = _mm_set1_epi16(i16::from_le_bytes([(4 * t + 2) as u8, (4 * t + 3) as u8]));
        _mm256_set_m128i(hi, lo)
    } else {
        let k = k as u8;
        _mm256_set1_epi16(i16::from_le_bytes([2 * k, 2 * k + 1]))
    }
}

/// `(x >> s) & mask` on bytes, for a shift count known after unrolling.
#[inline(always)]
unsafe fn shr_bytes(x: __m256i, s: usize, mask: i8) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi16(x, _mm_cvtsi32_si128(s as i32)),
        _mm256_set1_epi8(mask),
    )
}

pub(in crate::quant::x86) struct Q2K;
pub(in crate::quant::x86) struct Q3K;
pub(in crate::quant::x86) struct Q4K;
pub(in crate::quant::x86) struct Q5K;
pub(in crate::quant::x86) struct Q6K;

impl BlkK for Q2K {
    const SIZE: usize = 84;
    const PER16: bool = true;
    const INT_CORR: bool = false;
    const MINS_FIRST: bool = true;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let raw = loadu128(p);
        let sc = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0x0F));
        let sc16 = _mm256_cvtepu8_epi16(sc);
        let (d, dmin) = lanes01(f16x2_at(p.add(80)));
        KPrep {
            d,
            dm: -dmin,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            corr: _mm256_cvtepu8_epi16(mins),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        shr_bytes(loadu(p.add(16 + 32 * (k / 4))), 2 * (k % 4), 3)
    }
}

impl BlkK for Q3K {
    const SIZE: usize = 110;
    const PER16: bool = true;
    const INT_CORR: bool = true;
    const TILED_FROM: usize = crate::quant::kquant_order::TILED_MIN_ROWS;
    const LANE_OFFSET: i8 = 4;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        // Unpack the 12 bytes of 6-bit scales (ggml's kmask trick) to 16 bytes of `scale + 32`.
        let mut aux = [0u32; 3];
        core::ptr::copy_nonoverlapping(p.add(96), aux.as_mut_ptr().cast::<u8>(), 12);
        const KM1: u32 = 0x0303_0303;
        const KM2: u32 = 0x0f0f_0f0f;
        let tmp = aux[2];
        let s = [
            (aux[0] & KM2) | ((tmp & KM1) << 4),
            (aux[1] & KM2) | (((tmp >> 2) & KM1) << 4),
            ((aux[0] >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
            ((aux[1] >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
        ];
        let raw = _mm_loadu_si128(s.as_ptr().cast());
        let sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(raw, _mm_set1_epi8(32)));
        let d = f16_before(p.add(110));
        KPrep {
            d,
            dm: d,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            // (−4·scale; single rows subtract the offset in the lanes: `LANE_OFFSET`.)
            corr: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<2>(sc16)),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let low = shr_bytes(loadu(p.add(32 + 32 * (k / 4))), 2 * (k % 4), 3);
        let high = shr_bytes(loadu(p), k, 1);
        _mm256_or_si256(low, _mm256_slli_epi16::<2>(high))
    }
}

/// Q4_K / Q5_K scales and mins: 12 bytes -> 8 scales and 8 mins (ggml's utmp shuffle).
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> (__m256i, __m256i) {
    let mut u = [0u32; 4];
    core::ptr::copy_nonoverlapping(p, u.as_mut_ptr().cast::<u8>(), 12);
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    u[3] = ((u[2] >> 4) & KM2) | (((u[1] >> 6) & KM3) << 4);
    let uaux = u[1] & KM1;
    u[1] = (u[2] & KM2) | (((u[0] >> 6) & KM3) << 4);
    u[2] = uaux;
    u[0] &= KM1;
    // i16 lanes 0..8 = scales, 8..16 = mins.
    let sm = _mm256_cvtepu8_epi16(_mm_loadu_si128(u.as_ptr().cast()));
    let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    let mins = _mm256_extracti128_si256::<1>(sm);
    // Each min twice: bsums come per 16 elements, mins per 32.
    let corr = _mm256_set_m128i(
        _mm_unpackhi_epi16(mins, mins),
        _mm_unpacklo_epi16(mins, mins),
    );
    (sc, corr)
}

/// Q4_K's and Q5_K's shared head (`d`, `dmin`, then the 12 packed scale bytes) decoded.
#[inline(always)]
unsafe fn k4_prep(p: *const u8) -> KPrep {
    let (sc, corr) = k4_scales_mins(p.add(4));
    let (d, dmin) = lanes01(f16x2_at(p));
    KPrep {
        d,
        dm: -dmin,
        sc: [sc, sc],
        corr,
    }
}

impl BlkK for Q4K {
    const SIZE: usize = 144;
    const PER16: bool = false;
    const INT_CORR: bool = false;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        k4_prep(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        shr_bytes(loadu(p.add(16 + 32 * (k / 2))), 4 * (k % 2), 0x0F)
    }
}

impl BlkK for Q5K {
    const SIZE: usize = 176;
    const PER16: bool = false;
    const INT_CORR: bool = false;
    const TILED_FROM: usize = crate::quant::kquant_order::TILED_MIN_ROWS;
    const MINS_APART: bool = true;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        k4_prep(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let low = shr_bytes(loadu(p.add(48 + 32 * (k / 2))), 4 * (k % 2), 0x0F);
        let high = shr_bytes(loadu(p.add(16)), k, 1);
        _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
    }
}

impl BlkK for Q6K {
    const SIZE: usize = 210;
    const PER16: bool = true;
    const INT_CORR: bool = true;
    const TILED_FROM: usize = crate::quant::kquant_order::TILED_MIN_ROWS;
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> KPrep {
        let sc16 = _mm256_cvtepi8_epi16(loadu128(p.add(192)));
        let d = f16_before(p.add(210));
        KPrep {
            d,
            dm: d,
            sc: [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc16)),
            ],
            corr: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16)),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256i {
        let (h, c) = (k / 4, k % 4);
        let low = shr_bytes(loadu(p.add(64 * h + 32 * (c % 2))), 4 * (c / 2), 0x0F);
        let high = shr_bytes(loadu(p.add(128 + 32 * h)), 2 * c, 3);
        _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
    }
}

/// Q8_K activation block: f32 d at 0, 256 quants at 4, 16 i16 bsums at 260.
pub(in crate::quant::x86) const Q8K_BYTES: usize = 292;

/// The 8 chunks of k-quant super-block `$b` of format `$F` (weights at `$wp`, decoded scales
/// `$pr`) against `$NX` activation rows: runs `$body` with row `$j`, chunk `$k`, the 16-bit
/// products `$p` of the chunk's quants and the row's activations (less the format's
/// `LANE_OFFSET` when `$lanes`), and the chunk's scale `$sc` in every 16-bit lane. Unrolled, so
/// every chunk index is a constant.
macro_rules! k_chunks {
    ($F:ty, $wp:expr, $pr:expr, $x:expr, $b:expr, $NX:expr, $lanes:expr, |$j:ident, $k:ident, $p:ident, $sc:ident| $body:block) => {{
        macro_rules! step {
            ($kk:expr) => {{
                let q = <$F>::chunk($wp, $kk);
                let $sc = _mm256_shuffle_epi8(
                    $pr.sc[if <$F>::PER16 { $kk / 4 } else { 0 }],
                    scale_shuffle(<$F>::PER16, $kk),
                );
                for $j in 0..$NX {
                    let y = loadu($x[$j].add($b * Q8K_BYTES + 4 + 32 * $kk));
                    let mut $p = _mm256_maddubs_epi16(q, y);
                    if <$F>::LANE_OFFSET != 0 && $lanes {
                        let off = _mm256_set1_epi8(<$F>::LANE_OFFSET);
                        $p = _mm256_sub_epi16($p, _mm256_maddubs_epi16(off, y));
                    }
                    let $k: usize = $kk;
                    $body
                }
            }};
        }
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        step!(4);
        step!(5);
        step!(6);
        step!(7);
    }};
}

/// Tile adapter for the k-quants.
pub(in crate::quant::x86) struct TK<F>(core::marker::PhantomData<F>);

impl<F: BlkK> TK<F> {
    /// The tile body. `total`: each super-block's exact integers are reduced first, scaled by
    /// the weight's `d` (a minimum's sum then fused-multiply-added with `−dmin`) and
    /// fused-multiply-added with the activation's `d` (the reference's tiled kernel,
    /// `kquant_order::k_dot_tiled`); otherwise 8 lanes are advanced per super-block and reduced
    /// at the end (its `vec_dot`).
    #[inline(always)]
    unsafe fn tile_impl<D: IDot, const NX: usize>(
        n: usize,
        w: *const u8,
        x: [*const u8; NX],
        total: bool,
    ) -> [f32; NX] {
        let nb = n / 256;
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut tot = [0f32; NX];
        let mut mins = [0f32; NX];
        // Single rows of Q3_K: the offset in the lanes, none through `corr`.
        let lane_offset = F::LANE_OFFSET != 0 && !total;
        for b in 0..nb {
            let wp = w.add(b * F::SIZE);
            let pr = F::prep(wp);
            // Two integer accumulators per row (even/odd chunks): shorter dependency chains.
            let mut isum = [[_mm256_setzero_si256(); 2]; NX];
            if D::AVX512 && NX.is_multiple_of(2) {
                // Two activation rows per 512-bit register (each half the 256-bit lanes of the
                // other branch: the same exact integers), half the instructions.
                let mut i2 = [[_mm512_setzero_si512(); 2]; NX];
                for k in 0..8 {
                    let q = _mm512_broadcast_i64x4(F::chunk(wp, k));
                    let sc = _mm512_broadcast_i64x4(_mm256_shuffle_epi8(
                        pr.sc[if F::PER16 { k / 4 } else { 0 }],
                        scale_shuffle(F::PER16, k),
                    ));
                    for t in 0..NX / 2 {
                        let y = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(loadu(x[2 * t].add(b * Q8K_BYTES + 4 + 32 * k))),
                            loadu(x[2 * t + 1].add(b * Q8K_BYTES + 4 + 32 * k)),
                        );
                        let mut p = _mm512_maddubs_epi16(q, y);
                        if lane_offset {
                            let off = _mm512_set1_epi8(F::LANE_OFFSET);
                            p = _mm512_sub_epi16(p, _mm512_maddubs_epi16(off, y));
                        }
                        i2[t][k % 2] = D::dpwssd512(i2[t][k % 2], p, sc);
                    }
                }
                for t in 0..NX / 2 {
                    for h in 0..2 {
                        isum[2 * t][h] = _mm512_castsi512_si256(i2[t][h]);
                        isum[2 * t + 1][h] = _mm512_extracti64x4_epi64::<1>(i2[t][h]);
                    }
                }
            } else {
                k_chunks!(F, wp, pr, x, b, NX, lane_offset, |j, k, p16, sc| {
                    isum[j][k % 2] = D::dpwssd(isum[j][k % 2], p16, sc);
                });
            }
            for j in 0..NX {
                let xp = x[j].add(b * Q8K_BYTES);
                let yd = f32_at(xp);
                let s = _mm256_add_epi32(isum[j][0], isum[j][1]);
                if F::INT_CORR {
                    let s = if lane_offset {
                        s
                    } else {
                        _mm256_add_epi32(s, _mm256_madd_epi16(loadu(xp.add(260)), pr.corr))
                    };
                    if total {
                        let r = hsum_epi32(s) as f32 * pr.d;
                        tot[j] = r.mul_add(yd, tot[j]);
                    } else {
                        acc[j] = _mm256_fmadd_ps(
                            _mm256_set1_ps(yd * pr.d),
                            _mm256_cvtepi32_ps(s),
                            acc[j],
                        );
                    }
                    continue;
                }
                let m = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                if total {
                    let (s, m) = (hsum_epi32(s) as f32, hsum_epi32(m) as f32);
                    let r = pr.dm.mul_add(m, s * pr.d);
                    tot[j] = r.mul_add(yd, tot[j]);
                } else {
                    let dm = _mm256_set1_ps(pr.dm * yd);
                    if F::MINS_APART {
                        mins[j] = (pr.dm * yd).mul_add(hsum_epi32(m) as f32, mins[j]);
                    } else if F::MINS_FIRST {
                        acc[j] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(m), acc[j]);
                    }
                    acc[j] =
                        _mm256_fmadd_ps(_mm256_set1_ps(pr.d * yd), _mm256_cvtepi32_ps(s), acc[j]);
                    if !F::MINS_APART && !F::MINS_FIRST {
                        acc[j] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(m), acc[j]);
                    }
                }
            }
        }
        if total {
            return tot;
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = hsum_ps(acc[j]);
            if F::MINS_APART {
                out[j] += mins[j];
            }
        }
        out
    }
}

impl<F: BlkK> Tile for TK<F> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        Self::tile_impl::<D, NX>(n, w, x, false)
    }

    /// Batches of at least `F::TILED_FROM` rows take the reference's tiled arithmetic.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        if g.nx >= F::TILED_FROM {
            gemm_tiles::<TKTiled<F>, D>(g)
        } else {
            gemm_tiles::<Self, D>(g)
        }
    }
}

/// [`TK`] in its per-super-block ("tiled") arithmetic, for large batches.
pub(in crate::quant::x86) struct TKTiled<F>(core::marker::PhantomData<F>);

impl<F: BlkK> Tile for TKTiled<F> {
    const BLOCK: usize = 256;
    const W_BYTES: usize = F::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        TK::<F>::tile_impl::<D, NX>(n, w, x, true)
    }
}

/// Q4_K in the reference engine's repacked order (`kquant_order::q4k_dot`): per super-block the
/// exact integer scale sums and minimum sums of each pair of sub-blocks, accumulated in two
/// fused-multiply-add chains, per pair (rows in the batch's groups of four) or per super-block
/// (the batch's last `nx % 4` rows, and single rows), subtracted at the end.
pub(in crate::quant::x86) struct TQ4K;

impl TQ4K {
    /// `G` batch groups of four rows (`G > 1` on AVX-512 tiers only), each in the reference's
    /// 4-row gemm order: per pair of sub-blocks. Lanes are rows, each lane its own pair of
    /// fused-multiply-add chains; the weight chunks are decoded once for all the groups.
    #[inline(always)]
    unsafe fn tile4x<D: IDot, const G: usize>(
        n: usize,
        w: *const u8,
        x: [[*const u8; 4]; G],
    ) -> [[f32; 4]; G] {
        let nb = n / 256;
        let mut acc = [_mm_setzero_ps(); G];
        let mut acc_min = [_mm_setzero_ps(); G];
        for b in 0..nb {
            let wp = w.add(b * Q4K::SIZE);
            let pr = Q4K::prep(wp);
            // Scale-weighted 4-element sums, one 8-lane accumulator per pair of sub-blocks.
            let mut pairs = [[[_mm256_setzero_si256(); 4]; 4]; G];
            if D::AVX512 {
                // Two activation rows per 512-bit register (each half the 256-bit lanes below,
                // the same exact integers), half the instructions.
                let mut p2 = [[[_mm512_setzero_si512(); 4]; 2]; G];
                for k in 0..8 {
                    let q = _mm512_broadcast_i64x4(Q4K::chunk(wp, k));
                    let sc = _mm512_broadcast_i64x4(_mm256_shuffle_epi8(
                        pr.sc[0],
                        scale_shuffle(false, k),
                    ));
                    for (xg, pg) in x.iter().zip(p2.iter_mut()) {
                        for (t, acc) in pg.iter_mut().enumerate() {
                            let y = _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(loadu(
                                    xg[2 * t].add(b * Q8K_BYTES + 4 + 32 * k),
                                )),
                                loadu(xg[2 * t + 1].add(b * Q8K_BYTES + 4 + 32 * k)),
                            );
                            acc[k / 2] = D::dpwssd512(acc[k / 2], _mm512_maddubs_epi16(q, y), sc);
                        }
                    }
                }
                for (pg, p2g) in pairs.iter_mut().zip(p2.iter()) {
                    for (t, acc) in p2g.iter().enumerate() {
                        for (s, a) in acc.iter().enumerate() {
                            pg[2 * t][s] = _mm512_castsi512_si256(*a);
                            pg[2 * t + 1][s] = _mm512_extracti64x4_epi64::<1>(*a);
                        }
                    }
                }
            } else {
                for (xg, pg) in x.iter().zip(pairs.iter_mut()) {
                    k_chunks!(Q4K, wp, pr, xg, b, 4, false, |j, k, p16, sc| {
                        pg[j][k / 2] = D::dpwssd(pg[j][k / 2], p16, sc);
                    });
                }
            }
            for g in 0..G {
                let (x, pairs) = (&x[g], &pairs[g]);
                // Per pair p: [S_0p, S_1p, S_2p, S_3p], the four rows' exact scale sums, and the
                // same for the minimum sums (lane l of a row's `m8` = min[l] · the 32 activation
                // quants of sub-block l), built directly in row-per-lane order.
                let mut yd = [0f32; 4];
                let mut m8 = [_mm256_setzero_si256(); 4];
                for j in 0..4 {
                    let xp = x[j].add(b * Q8K_BYTES);
                    yd[j] = f32_at(xp);
                    m8[j] = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                }
                let mut st = [_mm_setzero_si128(); 4];
                for (t, s) in st.iter_mut().enumerate() {
                    let h = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(pairs[0][t], pairs[1][t]),
                        _mm256_hadd_epi32(pairs[2][t], pairs[3][t]),
                    );
                    *s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                }
                // hadd(m8_0, m8_1) = [M00 M01 M10 M11 | M02 M03 M12 M13] (M_jp: row j, pair p).
                let h01 = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(m8[0], m8[1]));
                let h23 = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(m8[2], m8[3]));
                let m02 = _mm256_unpacklo_epi64(h01, h23);
                let m13 = _mm256_unpackhi_epi64(h01, h23);
                let mt = [
                    _mm256_castsi256_si128(m02),
                    _mm256_castsi256_si128(m13),
                    _mm256_extracti128_si256::<1>(m02),
                    _mm256_extracti128_si256::<1>(m13),
                ];
                let ydv = _mm_loadu_ps(yd.as_ptr());
                let dd = _mm_mul_ps(_mm_set1_ps(pr.d), ydv);
                let dm = _mm_mul_ps(_mm_set1_ps(-pr.dm), ydv);
                for t in 0..4 {
                    acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(st[t]), dd, acc[g]);
                    acc_min[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(mt[t]), dm, acc_min[g]);
                }
            }
        }
        let mut r = [[0f32; 4]; G];
        for (g, rg) in r.iter_mut().enumerate() {
            _mm_storeu_ps(rg.as_mut_ptr(), _mm_sub_ps(acc[g], acc_min[g]));
        }
        r
    }

    /// Rows in the reference's gemv order: one conversion and fused multiply-add per
    /// super-block. The horizontal sums are taken four super-blocks at a time.
    #[inline(always)]
    unsafe fn gemv<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        let nb = n / 256;
        let mut acc = [0f32; NX];
        let mut acc_min = [0f32; NX];
        let mut b0 = 0;
        while b0 < nb {
            let g = (nb - b0).min(4);
            let mut v = [[_mm256_setzero_si256(); 4]; NX];
            let mut m = [[_mm256_setzero_si256(); 4]; NX];
            let mut dd = [[0f32; 4]; NX];
            let mut dm = [[0f32; 4]; NX];
            for t in 0..g {
                let b = b0 + t;
                let wp = w.add(b * Q4K::SIZE);
                let pr = Q4K::prep(wp);
                let mut isum = [[_mm256_setzero_si256(); 2]; NX];
                k_chunks!(Q4K, wp, pr, x, b, NX, false, |j, k, p16, sc| {
                    isum[j][k % 2] = D::dpwssd(isum[j][k % 2], p16, sc);
                });
                for j in 0..NX {
                    let xp = x[j].add(b * Q8K_BYTES);
                    let yd = f32_at(xp);
                    v[j][t] = _mm256_add_epi32(isum[j][0], isum[j][1]);
                    m[j][t] = _mm256_madd_epi16(loadu(xp.add(260)), pr.corr);
                    dd[j][t] = pr.d * yd;
                    dm[j][t] = -pr.dm * yd;
                }
            }
            for j in 0..NX {
                let tv = reduce4(v[j]);
                let tm = reduce4(m[j]);
                for t in 0..g {
                    acc[j] = (tv[t] as f32).mul_add(dd[j][t], acc[j]);
                    acc_min[j] = (tm[t] as f32).mul_add(dm[j][t], acc_min[j]);
                }
            }
            b0 += g;
        }
        let mut out = [0f32; NX];
        for j in 0..NX {
            out[j] = acc[j] - acc_min[j];
        }
        out
    }
}

/// The four horizontal sums of four 8-lane i32 vectors.
#[inline(always)]
unsafe fn reduce4(v: [__m256i; 4]) -> [i32; 4] {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let mut r = [0i32; 4];
    _mm_storeu_si128(r.as_mut_ptr().cast(), s);
    r
}

impl Tile for TQ4K {
    const BLOCK: usize = 256;
    const W_BYTES: usize = Q4K::SIZE;
    const X_BYTES: usize = Q8K_BYTES;

    /// Rows alone (and the batch's tail) are the reference's gemv.
    #[inline(always)]
    unsafe fn tile<D: IDot, const NX: usize>(n: usize, w: *const u8, x: Rows<NX>) -> [f32; NX] {
        Self::gemv::<D, NX>(n, w, x)
    }

    /// Rows `0 .. nx - nx % 4` in the reference's 4-row gemm order, the rest in its gemv order.
    #[inline(always)]
    unsafe fn gemm<D: IDot>(g: Gemm) {
        let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
        let xr = |j: usize| x.add(j * x_stride);
        let four = |j: usize| [xr(j), xr(j + 1), xr(j + 2), xr(j + 3)];
        let full = nx - nx % 4;
        for i in 0..nw {
            let wr = w.add(i * w_stride);
            let mut j = 0;
            if D::AVX512 {
                // Two groups per pass: each weight chunk decoded once for eight rows.
                while j + 8 <= full {
                    let r = Self::tile4x::<D, 2>(n, wr, [four(j), four(j + 4)]);
                    for (t, v) in r.into_iter().flatten().enumerate() {
                        *out.add((j + t) * out_stride + i) = v;
                    }
                    j += 8;
                }
            }
            while j < full {
                let [r] = Self::tile4x::<D, 1>(n, wr, [four(j)]);
                for (t, v) in r.into_iter().enumerate() {
                    *out.add((j + t) * out_stride + i) = v;
                }
                j += 4;
            }
        }
        // The `nx % 4` rows left: the gemv order (`Tile::tile`), as `gemm_tiles` runs them.
        if full < nx {
            gemm_tiles::<Self, D>(g.skip_rows(full));
        }
    }
}
