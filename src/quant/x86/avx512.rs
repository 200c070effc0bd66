//! The 512-bit kernels the generic kernels in `avx2` call where `IDot::VNNI` holds (the
//! `Avx512Vnni` tier's instantiation; its integer-dot primitive, `simd::Vnni`, is `vpdpbusd` /
//! `vpdpwssd` on 256-bit registers, which need AVX-512VL).

use super::simd::{f16x2_at, hsum_ps, loadu, Blk32, Gemm, IDot, Vnni};
use core::arch::x86_64::*;

/// Four activation rows against one weight row of a 32-element format, two rows per 512-bit
/// register: each half of a register is lane for lane the 256-bit tile of
/// `T32::tile_impl::<D, 4>` (the same integer dot per lane, the same products `d_w·d_x` and
/// fused multiply-adds in the same block order, the same final horizontal sum), so every
/// output is bit-identical to that kernel's, at about half the instructions.
///
/// `sc4[b]` holds `[d_0..d_3, s_0..s_3]` of block `b` of the four rows, converted to f32.
#[inline(always)]
pub(super) unsafe fn t32_tile4<F: Blk32, D: IDot>(
    n: usize,
    w: *const u8,
    x: [*const u8; 4],
    sc4: *const [f32; 8],
) -> [f32; 4] {
    let xb = if F::SIGNED { 34 } else { 36 };
    let xq = if F::SIGNED { 2 } else { 4 };
    let nb = n / 32;
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut ms = _mm_setzero_ps();
    let idx = [
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
    ];
    for b in 0..nb {
        let wp = w.add(b * F::SIZE);
        let q = _mm512_broadcast_i64x4(F::quants::<D>(wp));
        // [d, m] of the weight block.
        let wdm = f16x2_at(wp);
        let s = sc4.add(b).cast::<f32>();
        // d_w · d_x of the four rows (the scalar kernel's product, lane by lane).
        let prod = _mm_mul_ps(_mm_broadcastss_ps(wdm), _mm_loadu_ps(s));
        let prod = _mm512_castps128_ps512(prod);
        if !F::SIGNED {
            // m_w · s_x summed per row, as the scalar kernel's lane 1.
            let m = _mm_movehdup_ps(wdm);
            ms = _mm_fmadd_ps(_mm_broadcastss_ps(m), _mm_loadu_ps(s.add(4)), ms);
        }
        let (aq, neg) = if F::SIGNED {
            (_mm512_abs_epi8(q), _mm512_movepi8_mask(q))
        } else {
            (q, 0)
        };
        for p in 0..2 {
            let y0 = loadu(x[2 * p].add(b * xb + xq));
            let y1 = loadu(x[2 * p + 1].add(b * xb + xq));
            let mut y = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(y0), y1);
            if F::SIGNED {
                // y · sign(q) (where q is 0, |q| is 0 too, so the product is 0 either way).
                y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
            }
            let i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aq, y);
            let pf = _mm512_cvtepi32_ps(i);
            let pp = _mm512_permutexvar_ps(idx[p], prod);
            acc[p] = _mm512_fmadd_ps(pp, pf, acc[p]);
        }
    }
    finish4::<F>(acc, ms)
}

/// Four results from two 512-bit accumulators holding two 8-lane results each (each half
/// summed as `hsum_ps` sums a 256-bit accumulator), plus, for unsigned formats, lane `i` of
/// the `m·s` sums `ms`.
#[inline(always)]
unsafe fn finish4<F: Blk32>(acc: [__m512; 2], ms: __m128) -> [f32; 4] {
    let msv: [f32; 4] = core::mem::transmute(ms);
    let mut out = [0f32; 4];
    for h in 0..2 {
        out[2 * h] = hsum_ps(_mm512_castps512_ps256(acc[h]));
        out[2 * h + 1] = hsum_ps(_mm512_extractf32x8_ps::<1>(acc[h]));
    }
    if !F::SIGNED {
        for (o, m) in out.iter_mut().zip(msv) {
            *o += m;
        }
    }
    out
}

/// Weight rows whose accumulators one pass of [`t32_gemm_pairs`] keeps (in memory between
/// chunks of blocks).
const PAIR_ROWS: usize = 16;
/// Activation blocks per prepared chunk of [`t32_gemm_pairs`] with 4 pairs of rows (24 KiB
/// of stack; 8 pairs take half as many blocks).
const PAIR_KB: usize = 32;

/// Two activation rows' block `b`, prepared once for every weight row: their quants side by
/// side, for signed formats `−OFFSET · Σ` of each 4 quants (the i32 lanes a `vpdpbusd` of the
/// unsigned weights starts from, so the lane ends as the signed dot), and their scales spread
/// over 8 lanes each.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct PairBlock {
    y: [i8; 64],
    corr: [i32; 16],
    dx: [f32; 16],
}

/// The gemm of a 32-element format against Q8_0 (signed formats: Q4_0, Q5_0, Q8_0) or Q8_1
/// (unsigned: Q4_1, Q5_1) activations over whole tiles of `2·NP` activation rows (`nx` a
/// multiple of that), 2 rows per 512-bit register. `NP` is 4 or 8: eight pairs per pass decode
/// each weight block once for 16 activation rows.
///
/// Per weight block and pair of activation rows it takes one `vpdpbusd` of the (unsigned, or
/// made unsigned as `q + OFFSET`) weight quants against both rows' quants, starting from zero
/// or from the prepared offset correction, so each i32 lane is exactly the 4-element dot of
/// `T32::tile_impl`; then the same `d_w · d_x` product and fused multiply-add into the same 8
/// lanes per row, in block order, and the same horizontal sum. Unsigned formats add their
/// `m_w · s_x` chain, run for the 8 rows in the lanes of one register. Every output has
/// `tile_impl`'s bits, at about two thirds of the vector operations of `t32_tile4`.
#[inline(always)]
pub(super) unsafe fn t32_gemm_pairs<F: Blk32, const NP: usize>(g: Gemm) {
    let (n, w, w_stride, nw, x, x_stride, nx, out, out_stride) = g.parts();
    // Activation block: Q8_0 (d, qs) or Q8_1 (d, s, qs).
    let (xb, xq) = if F::SIGNED { (34, 2) } else { (36, 4) };
    let nb = n / 32;
    let kb = PAIR_KB * 4 / NP;
    let mut prep = [core::mem::MaybeUninit::<PairBlock>::uninit(); 4 * PAIR_KB];
    // `s_x` of the activation rows (8 per register), per block (unsigned formats).
    let mut sx = [[core::mem::MaybeUninit::<__m256>::uninit(); PAIR_KB]; 2];
    let mut accs = [[_mm512_setzero_ps(); NP]; PAIR_ROWS];
    let mut mss = [[_mm256_setzero_ps(); 2]; PAIR_ROWS];
    let off = _mm512_set1_epi8(F::OFFSET as i8);
    let mut j = 0;
    while j + 2 * NP <= nx {
        let xr = |t: usize| x.add((j + t) * x_stride);
        let mut r0 = 0;
        while r0 < nw {
            let r1 = (r0 + PAIR_ROWS).min(nw);
            for (a, m) in accs.iter_mut().zip(mss.iter_mut()) {
                *a = [_mm512_setzero_ps(); NP];
                *m = [_mm256_setzero_ps(); 2];
            }
            let mut b0 = 0;
            while b0 < nb {
                let b1 = (b0 + kb).min(nb);
                // Prepare the pairs of activation rows for blocks b0..b1.
                for p in 0..NP {
                    let (t0, t1) = (xr(2 * p), xr(2 * p + 1));
                    for b in b0..b1 {
                        let (x0, x1) = (t0.add(b * xb), t1.add(b * xb));
                        let y = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(loadu(x0.add(xq))),
                            loadu(x1.add(xq)),
                        );
                        let (d0, d1) = (f16x2_at(x0), f16x2_at(x1));
                        let dx = _mm512_insertf32x8::<1>(
                            _mm512_broadcastss_ps(d0),
                            _mm256_broadcastss_ps(d1),
                        );
                        let slot = prep[p * kb + b - b0].as_mut_ptr();
                        _mm512_store_si512((*slot).y.as_mut_ptr().cast(), y);
                        if F::SIGNED {
                            let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, y);
                            _mm512_store_si512(
                                (*slot).corr.as_mut_ptr().cast(),
                                _mm512_sub_epi32(_mm512_setzero_si512(), c),
                            );
                        }
                        _mm512_store_ps((*slot).dx.as_mut_ptr(), dx);
                    }
                }
                if !F::SIGNED {
                    for (h, sxh) in sx.iter_mut().enumerate().take(NP / 4) {
                        for (b, slot) in (b0..b1).zip(sxh.iter_mut()) {
                            let s: [f32; 8] = core::array::from_fn(|t| {
                                let xp = xr(8 * h + t).add(b * xb);
                                _mm_cvtss_f32(_mm_movehdup_ps(f16x2_at(xp)))
                            });
                            slot.write(_mm256_loadu_ps(s.as_ptr()));
                        }
                    }
                }
                let pb = prep.as_ptr().cast::<PairBlock>();
                // Two weight rows per pass share each prepared block's loads.
                let mut r = r0;
                while r < r1 {
                    let k = r - r0;
                    macro_rules! rows {
                        ($R:literal) => {{
                            let (a, m) = (&mut accs[k..k + $R], &mut mss[k..k + $R]);
                            pair_rows::<F, $R, NP>(w, w_stride, r, b0, b1, kb, pb, &sx, a, m);
                            r += $R;
                        }};
                    }
                    if r + 2 <= r1 {
                        rows!(2)
                    } else {
                        rows!(1)
                    }
                }
                b0 = b1;
            }
            for ((r, acc), ms) in (r0..r1).zip(accs.iter()).zip(mss.iter()) {
                let msv: [[f32; 8]; 2] = core::mem::transmute(*ms);
                for (p, ap) in acc.iter().enumerate() {
                    let (t0, t1) = (2 * p, 2 * p + 1);
                    let mut o0 = hsum_ps(_mm512_castps512_ps256(*ap));
                    let mut o1 = hsum_ps(_mm512_extractf32x8_ps::<1>(*ap));
                    if !F::SIGNED {
                        o0 += msv[t0 / 8][t0 % 8];
                        o1 += msv[t1 / 8][t1 % 8];
                    }
                    *out.add((j + t0) * out_stride + r) = o0;
                    *out.add((j + t1) * out_stride + r) = o1;
                }
            }
            r0 = r1;
        }
        j += 2 * NP;
    }
}

/// Four weight rows of a 32-element format against one activation row (decode), two rows per
/// 512-bit register: `T32::rows_impl::<D, 4>`'s bits at about half its vector operations.
///
/// Each half of a register is one row's 8-lane accumulator, taking per block the same exact
/// 4-element integer dots (signed formats: the weights made unsigned, `q + OFFSET`, from the
/// block's offset correction, as in [`t32_gemm_pairs`]), the same `d_w · d_x` product and fused
/// multiply-add, in block order; unsigned formats run the four rows' `m_w · s_x` chains in the
/// lanes of one register. `sc[b]` holds the activation block's `[d, s]` in f32.
#[inline(always)]
pub(super) unsafe fn t32_rows4<F: Blk32>(
    n: usize,
    w: [*const u8; 4],
    x: *const u8,
    sc: *const [f32; 2],
    prefetch: usize,
) -> [f32; 4] {
    let (xb, xq) = if F::SIGNED { (34, 2) } else { (36, 4) };
    let nb = n / 32;
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut ms = _mm_setzero_ps();
    let off = _mm512_set1_epi8(F::OFFSET as i8);
    // [d_0, m_0, .., d_3, m_3] (f32, 8 lanes) → row 2p's d in lanes 0-7, row 2p+1's in 8-15.
    let spread = [
        _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
    ];
    let mins = _mm256_set_epi32(0, 0, 0, 0, 7, 5, 3, 1);
    for b in 0..nb {
        let wp = w.map(|r| r.add(b * F::SIZE));
        for p in wp {
            // Interleaved rows defeat the hardware's stream detection: fetch ahead by hand
            // (a prefetch never faults, so running past the matrix is harmless).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(prefetch).cast());
        }
        let xp = x.add(b * xb);
        let y = _mm512_broadcast_i64x4(loadu(xp.add(xq)));
        let start = if F::SIGNED {
            _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, y),
            )
        } else {
            _mm512_setzero_si512()
        };
        let xds = *sc.add(b);
        // The four rows' [d, m] (the f16 pairs at each block's start), exactly in f32.
        let dm4 = _mm256_cvtph_ps(_mm_set_epi32(
            core::ptr::read_unaligned(wp[3].cast::<i32>()),
            core::ptr::read_unaligned(wp[2].cast::<i32>()),
            core::ptr::read_unaligned(wp[1].cast::<i32>()),
            core::ptr::read_unaligned(wp[0].cast::<i32>()),
        ));
        let dm = _mm512_castps256_ps512(dm4);
        let dx = _mm512_set1_ps(xds[0]);
        for (h, a) in acc.iter_mut().enumerate() {
            let q = F::quants2(wp[2 * h], wp[2 * h + 1]);
            let i = _mm512_dpbusd_epi32(start, q, y);
            let prod = _mm512_mul_ps(_mm512_permutexvar_ps(spread[h], dm), dx);
            *a = _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(i), *a);
        }
        if !F::SIGNED {
            let m4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm4, mins));
            ms = _mm_fmadd_ps(m4, _mm_set1_ps(xds[1]), ms);
        }
    }
    finish4::<F>(acc, ms)
}

/// Blocks `b0..b1` of `R` weight rows from row `r` against the `NP` prepared pairs `pb` (`kb`
/// blocks each; and, for unsigned formats, the rows' `s_x` in `sx`), into the rows'
/// accumulators: each row's operations exactly as one row alone, the prepared loads shared.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_rows<F: Blk32, const R: usize, const NP: usize>(
    w: *const u8,
    w_stride: usize,
    r: usize,
    b0: usize,
    b1: usize,
    kb: usize,
    pb: *const PairBlock,
    sx: &[[core::mem::MaybeUninit<__m256>; PAIR_KB]; 2],
    accs: &mut [[__m512; NP]],
    mss: &mut [[__m256; 2]],
) {
    let mut a: [[__m512; NP]; R] = core::array::from_fn(|i| accs[i]);
    let mut m: [[__m256; 2]; R] = core::array::from_fn(|i| mss[i]);
    for b in b0..b1 {
        let wp: [*const u8; R] = core::array::from_fn(|i| w.add((r + i) * w_stride + b * F::SIZE));
        let q: [__m512i; R] = core::array::from_fn(|i| {
            _mm512_broadcast_i64x4(if F::SIGNED {
                F::uquants(wp[i])
            } else {
                F::quants::<Vnni>(wp[i])
            })
        });
        // [d_w, m_w]
        let wdm: [__m128; R] = core::array::from_fn(|i| f16x2_at(wp[i]));
        let dw: [__m512; R] = core::array::from_fn(|i| _mm512_broadcastss_ps(wdm[i]));
        if !F::SIGNED {
            for (h, sxh) in sx.iter().enumerate().take(NP / 4) {
                let s = sxh[b - b0].assume_init();
                for i in 0..R {
                    let mw = _mm256_broadcastss_ps(_mm_movehdup_ps(wdm[i]));
                    m[i][h] = _mm256_fmadd_ps(mw, s, m[i][h]);
                }
            }
        }
        #[allow(clippy::needless_range_loop)] // `p` indexes the prepared pairs too
        for p in 0..NP {
            let s = &*pb.add(p * kb + b - b0);
            let y = _mm512_load_si512(s.y.as_ptr().cast());
            let c = if F::SIGNED {
                _mm512_load_si512(s.corr.as_ptr().cast())
            } else {
                _mm512_setzero_si512()
            };
            let dx = _mm512_load_ps(s.dx.as_ptr());
            for i in 0..R {
                let di = _mm512_dpbusd_epi32(c, q[i], y);
                let prod = _mm512_mul_ps(dw[i], dx);
                a[i][p] = _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(di), a[i][p]);
            }
        }
    }
    accs[..R].copy_from_slice(&a);
    mss[..R].copy_from_slice(&m);
}
