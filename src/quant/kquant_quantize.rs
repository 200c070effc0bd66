//! Reference quantizers of the K-quant formats Q2_K..Q6_K: ports of ggml's
//! `quantize_row_q{2..6}_K_ref` and their helpers (`make_qkx2_quants`, `make_q3_quants`,
//! `make_qx_quants`), which are what `llama-quantize` runs for these formats without an
//! importance matrix (`quantize_q*_K(.., quant_weights = NULL)` calls the `_ref` row function).
//!
//! The output is meant to be byte-identical to the reference's, so the arithmetic follows the C
//! statement by statement: f32 throughout, the same order of every sum and product (`w*x*l` is
//! `(w*x)*l`), divisions where the C divides and multiplications by an inverse where it
//! multiplies, ggml's [`nearest_int`] (round half to even through the 1.5·2²³ trick), the same
//! clamps, and the same integer truncations (`int` → `int8_t` / `uint8_t`). No fused multiply-add:
//! the reference compiles `ggml-quants.c` into `ggml-base` for baseline x86-64, where GCC has no
//! FMA instruction to contract `a*b + c` into, so every product is rounded before it is added.
//!
//! Loops index like the C they mirror, to keep the correspondence line by line.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::reference::{nearest_int, quantize_blocks, Quantize};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `MAX(lo, MIN(hi, v))`.
#[inline]
fn clamp(v: i32, lo: i32, hi: i32) -> i32 {
    lo.max(hi.min(v))
}

/// The value with the largest magnitude, keeping its sign (the first one on ties), and that
/// magnitude.
#[inline]
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// The first fit of ggml's symmetric searches (`make_qx_quants`, `make_q3_quants`): the signed
/// absmax `max` maps to `-nmax`, quants `l` in `[-nmax, nmax)` are stored as `l + offset`, and
/// the x²-weighted sums `Σ w·x·l`, `Σ w·l²` taken. Returns `(max, Σ w·x·l, Σ w·l²)`, or `None`
/// (every quant 0) for an all-zero group.
fn first_symmetric_fit(
    nmax: i32,
    x: &[f32],
    big_l: &mut [i8],
    offset: i32,
) -> Option<(f32, f32, f32)> {
    let n = x.len();
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        big_l[..n].fill(0);
        return None;
    }
    let iscale = -nmax as f32 / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        big_l[i] = (l + offset) as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    Some((max, sumlx, suml2))
}

/// ggml's `make_qx_quants` for `rmse_type = 1` and `qw = NULL` (the case
/// `quantize_row_q6_K_ref` uses): symmetric quants `l` in `[-nmax, nmax)` stored as `l + nmax`,
/// the scale chosen among 19 candidates by the x²-weighted least-squares fit. Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], big_l: &mut [i8]) -> f32 {
    let n = x.len();
    let Some((max, mut sumlx, mut suml2)) = first_symmetric_fit(nmax, x, big_l, nmax) else {
        return 0.0;
    };
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                big_l[i] = (nmax + clamp(l, -nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse = true`: symmetric quants refined one element at a
/// time (up to 5 passes) by the x²-weighted least-squares error. Quants are stored as
/// `l + nmax`, or all 0 for an all-zero group. Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], big_l: &mut [i8]) -> f32 {
    let n = x.len();
    let Some((_, mut sumlx, mut suml2)) = first_symmetric_fit(nmax, x, big_l, 0) else {
        return 0.0;
    };
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = big_l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if new_l != big_l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        big_l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in big_l[..n].iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The knobs of one [`make_qkx2_quants`] search.
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    /// Weigh absolute errors (true) or squared errors.
    use_mad: bool,
}

impl Qkx2 {
    /// `make_qkx2_quants(.., nmax, .., rmin, rdelta, nstep, use_mad)`'s knobs, in its order.
    const fn new(nmax: i32, rmin: f32, rdelta: f32, nstep: i32, use_mad: bool) -> Qkx2 {
        Qkx2 {
            nmax,
            rmin,
            rdelta,
            nstep,
            use_mad,
        }
    }
}

/// ggml's `make_qkx2_quants`: asymmetric quants `l` in `[0, nmax]` with `x ≈ scale*l - the_min`,
/// searching `nstep + 1` candidate scales for the least weighted error. Writes `big_l` (using
/// `laux` as scratch) and returns `(scale, the_min)`.
fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    big_l: &mut [u8],
    laux: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    // Same lengths as `x` (this also lets the compiler drop the bounds checks below).
    let (weights, big_l, laux) = (&weights[..n], &mut big_l[..n], &mut laux[..n]);
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        big_l.fill(0);
        return (0.0, -min);
    }
    let error = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        big_l[i] = clamp(l, 0, nmax) as u8;
        let diff = scale * big_l[i] as f32 + min - x[i];
        best_error += weights[i] * error(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * error(diff);
            }
            if cur_error < best_error {
                big_l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// [`make_qkx2_quants`] on each `N`-element sub-block `xs` of a super-block, weighted by
/// `weigh(xs)`, its quants into `big_l`. Returns the sub-blocks' scales and minimums and the
/// largest of each (0 if none is positive).
fn fit_qkx2<const N: usize, const S: usize>(
    search: &Qkx2,
    x: &[f32],
    big_l: &mut [u8; QK_K],
    weigh: impl Fn(&[f32]) -> [f32; N],
) -> ([f32; S], [f32; S], f32, f32) {
    let mut laux = [0u8; N];
    let mut mins = [0.0f32; S];
    let mut scales = [0.0f32; S];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..S {
        let xs = &x[N * j..N * j + N];
        let weights = weigh(xs);
        let ls = &mut big_l[N * j..N * j + N];
        (scales[j], mins[j]) = make_qkx2_quants(search, xs, &weights, ls, &mut laux);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    (scales, mins, max_scale, max_min)
}

/// `fit(xs, ls)` (a symmetric fit returning its scale) on each 16-element sub-block `xs` of a
/// super-block. Returns the quants `ls`, the scales, the one of the largest magnitude (signed,
/// the first on ties) and that magnitude.
fn fit_symmetric(
    x: &[f32],
    fit: impl Fn(&[f32], &mut [i8]) -> f32,
) -> ([i8; QK_K], [f32; QK_K / 16], f32, f32) {
    let mut big_l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for j in 0..QK_K / 16 {
        scales[j] = fit(&x[16 * j..16 * j + 16], &mut big_l[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    (big_l, scales, max_scale, amax)
}

/// Each `n`-element sub-block `j` of a super-block quantized again against its stored scale
/// `d(j)`: element `v` becomes `q(j, v, d)`; a sub-block whose scale is 0 keeps its quants.
fn requantize<T>(
    x: &[f32],
    n: usize,
    big_l: &mut [T],
    d: impl Fn(usize) -> f32,
    q: impl Fn(usize, f32, f32) -> T,
) {
    for j in 0..QK_K / n {
        let d = d(j);
        if d == 0.0 {
            continue;
        }
        for ii in 0..n {
            big_l[n * j + ii] = q(j, x[n * j + ii], d);
        }
    }
}

/// Pack 256 two-bit quants as Q2_K / Q3_K do: byte `32*h + l` of `qs` holds elements
/// `128*h + l + 32*k` at bits `2k..2k+2`.
fn pack_2bit(big_l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            qs[j / 4 + l] = big_l[j + l]
                | (big_l[j + l + 32] << 2)
                | (big_l[j + l + 64] << 4)
                | (big_l[j + l + 96] << 6);
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`.
impl Quantize for BlockQ2K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        const SEARCH: Qkx2 = Qkx2::new(3, -0.5, 0.1, 15, true);
        let q4scale = 15.0f32;
        quantize_blocks(x, out, QK_K, |x, y| {
            let mut big_l = [0u8; QK_K];
            let (scales, mins, max_scale, max_min) =
                fit_qkx2::<16, { QK_K / 16 }>(&SEARCH, x, &mut big_l, |xs| {
                    core::array::from_fn(|l| xs[l].abs())
                });

            if max_scale > 0.0 {
                let iscale = q4scale / max_scale;
                for j in 0..QK_K / 16 {
                    y.scales[j] = nearest_int(iscale * scales[j]) as u8;
                }
                y.d = F16Le::from_f32(max_scale / q4scale);
            } else {
                y.scales = [0; QK_K / 16];
                y.d = F16Le::from_f32(0.0);
            }
            if max_min > 0.0 {
                let iscale = q4scale / max_min;
                for j in 0..QK_K / 16 {
                    let l = nearest_int(iscale * mins[j]);
                    y.scales[j] |= (l << 4) as u8;
                }
                y.dmin = F16Le::from_f32(max_min / q4scale);
            } else {
                y.dmin = F16Le::from_f32(0.0);
            }
            let (d, dmin) = (y.d.to_f32(), y.dmin.to_f32());
            requantize(
                x,
                16,
                &mut big_l,
                |j| d * (y.scales[j] & 0xF) as f32,
                |j, v, d| {
                    let dm = dmin * (y.scales[j] >> 4) as f32;
                    clamp(nearest_int((v + dm) / d), 0, 3) as u8
                },
            );
            pack_2bit(&big_l, &mut y.qs);
        });
    }
}

/// ggml's `quantize_row_q3_K_ref`.
impl Quantize for BlockQ3K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK_K, |x, y| {
            let (mut big_l, scales, max_scale, _) =
                fit_symmetric(x, |xs, ls| make_q3_quants(4, xs, ls));

            y.scales = [0; 12];
            if max_scale != 0.0 {
                let iscale = -32.0f32 / max_scale;
                for j in 0..QK_K / 16 {
                    // `int8_t l = nearest_int(..)` truncates before the clamp.
                    let l = nearest_int(iscale * scales[j]) as i8 as i32;
                    let l = (clamp(l, -32, 31) + 32) as u8;
                    if j < 8 {
                        y.scales[j] = l & 0xF;
                    } else {
                        y.scales[j - 8] |= (l & 0xF) << 4;
                    }
                    y.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
                }
                y.d = F16Le::from_f32(1.0 / iscale);
            } else {
                y.d = F16Le::from_f32(0.0);
            }

            let (d, sc) = (y.d.to_f32(), q3k_scales(&y.scales));
            requantize(
                x,
                16,
                &mut big_l,
                |j| d * sc[j] as f32,
                |_, v, d| (clamp(nearest_int(v / d), -4, 3) + 4) as i8,
            );

            // The high bit of element j goes to bit j/32 of hmask[j%32].
            y.hmask = [0; QK_K / 8];
            let mut low = [0u8; QK_K];
            for j in 0..QK_K {
                let mut l = big_l[j] as u8;
                if l > 3 {
                    y.hmask[j % 32] |= 1 << (j / 32);
                    l -= 4;
                }
                low[j] = l;
            }
            pack_2bit(&low, &mut y.qs);
        });
    }
}

/// Pack the eight 6-bit scales and mins of a Q4_K / Q5_K block (the inverse of
/// [`scale_min_k4`]).
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], scales: &mut [u8; 12]) {
    for j in 0..8 {
        if j < 4 {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            scales[j - 4] |= (ls[j] >> 4) << 6;
            scales[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared part of `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` for one super-block:
/// per 32-element sub-block a [`make_qkx2_quants`] fit weighted by `rms + |x|`, the 6-bit
/// scales and mins, then every quant recomputed against the stored scales. Returns the quants
/// (`0..=search.nmax`) and fills `d`, `dmin`, `scales`.
fn quantize_k4_scales(
    x: &[f32],
    search: &Qkx2,
    d_out: &mut F16Le,
    dmin_out: &mut F16Le,
    packed: &mut [u8; 12],
) -> [u8; QK_K] {
    let mut big_l = [0u8; QK_K];
    let (scales, mins, max_scale, max_min) =
        fit_qkx2::<32, { QK_K / 32 }>(search, x, &mut big_l, |xs| {
            let mut sum_x2 = 0.0f32;
            for l in 0..32 {
                sum_x2 += xs[l] * xs[l];
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            core::array::from_fn(|l| av_x + xs[l].abs())
        });

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        // `uint8_t ls = nearest_int(..)` truncates before `MIN(63, ls)`.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, packed);
    *d_out = F16Le::from_f32(max_scale / 63.0);
    *dmin_out = F16Le::from_f32(max_min / 63.0);

    let (d, dmin) = (d_out.to_f32(), dmin_out.to_f32());
    requantize(
        x,
        32,
        &mut big_l,
        |j| d * scale_min_k4(j, packed).0 as f32,
        |j, v, d| {
            let dm = dmin * scale_min_k4(j, packed).1 as f32;
            clamp(nearest_int((v + dm) / d), 0, search.nmax) as u8
        },
    );
    big_l
}

/// ggml's `quantize_row_q4_K_ref`.
impl Quantize for BlockQ4K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        const SEARCH: Qkx2 = Qkx2::new(15, -1.0, 0.1, 20, false);
        quantize_blocks(x, out, QK_K, |x, y| {
            let big_l = quantize_k4_scales(x, &SEARCH, &mut y.d, &mut y.dmin, &mut y.scales);
            for (j, q) in (0..QK_K).step_by(64).zip(y.qs.chunks_exact_mut(32)) {
                for l in 0..32 {
                    q[l] = big_l[j + l] | (big_l[j + l + 32] << 4);
                }
            }
        });
    }
}

/// ggml's `quantize_row_q5_K_ref`.
impl Quantize for BlockQ5K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        const SEARCH: Qkx2 = Qkx2::new(31, -0.5, 0.1, 15, false);
        quantize_blocks(x, out, QK_K, |x, y| {
            let big_l = quantize_k4_scales(x, &SEARCH, &mut y.d, &mut y.dmin, &mut y.scales);
            y.qh = [0; QK_K / 8];
            let (mut m1, mut m2) = (1u8, 2u8);
            for (n, ql) in (0..QK_K).step_by(64).zip(y.qs.chunks_exact_mut(32)) {
                for j in 0..32 {
                    let mut l1 = big_l[n + j];
                    if l1 > 15 {
                        l1 -= 16;
                        y.qh[j] |= m1;
                    }
                    let mut l2 = big_l[n + j + 32];
                    if l2 > 15 {
                        l2 -= 16;
                        y.qh[j] |= m2;
                    }
                    ql[j] = l1 | (l2 << 4);
                }
                m1 <<= 2;
                m2 <<= 2;
            }
        });
    }
}

/// ggml's `quantize_row_q6_K_ref`.
impl Quantize for BlockQ6K {
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, QK_K, |x, y| {
            let (mut big_l, scales, max_scale, max_abs_scale) =
                fit_symmetric(x, |xs, ls| make_qx_quants(32, xs, ls));

            if max_abs_scale < GROUP_MAX_EPS {
                *y = BlockQ6K::default();
                y.d = F16Le::from_f32(0.0);
                return;
            }

            let iscale = -128.0f32 / max_scale;
            y.d = F16Le::from_f32(1.0 / iscale);
            for ib in 0..QK_K / 16 {
                y.scales[ib] = 127.min(nearest_int(iscale * scales[ib])) as i8;
            }

            let d = y.d.to_f32();
            requantize(
                x,
                16,
                &mut big_l,
                |j| d * y.scales[j] as f32,
                |_, v, d| (clamp(nearest_int(v / d), -32, 31) + 32) as i8,
            );

            for (j, (ql, qh)) in (0..QK_K)
                .step_by(128)
                .zip(y.ql.chunks_exact_mut(64).zip(y.qh.chunks_exact_mut(32)))
            {
                for l in 0..32 {
                    let q = |k: usize| big_l[j + l + 32 * k] as u8;
                    ql[l] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                    ql[l + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                    qh[l] =
                        (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
