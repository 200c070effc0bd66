//! ggml's IQ3_XXS and IQ3_S quantizers without an importance matrix (`quantize_iq3_xxs` /
//! `quantize_iq3_s` with `quant_weights = NULL`: the weights are `x²`), byte-identical to their
//! output. `llama-quantize` runs IQ3_S's so, which lets the IQ3_S fixture model be derived as
//! the others are; IQ3_XXS it makes only with an importance matrix.
//!
//! Both search, per sub-block of 32, a scale over trial inverse scales; a group of 4 magnitudes
//! is rounded to 3-bit levels `l` (value `2l + 1`), and a point off the grid is replaced by the
//! best of its nearest grid points (`iq3xs_init_impl`'s neighbour lists, rebuilt here from the
//! grids themselves: their entries are the levels' values in the same order). As in
//! `kquant_quantize`, the arithmetic follows the C statement by statement: f32 throughout,
//! `w*x*q` as `(w*x)*q`, divisions where the C divides, no fused multiply-add.
#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

use super::blocks::*;
use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::reference::{check_lengths, nearest_int, Quantize};

/// ggml's `kMaxQ`: 8 levels.
const KMAXQ: i32 = 8;

/// `iq3xs_init_impl`'s tables for one grid: the points' levels (value `2l + 1` per byte), the
/// map from a 12-bit point (3 bits per level) to its grid index, and for every point off the
/// grid the grid indices nearest it.
struct Tables {
    grid: Vec<[i8; 4]>,
    map: Vec<i32>,
    neighbours: Vec<Vec<u16>>,
}

impl Tables {
    /// `grid_size` 256 (IQ3_XXS, magnitudes `4 + 8l`, the last 62) or 512 (IQ3_S, `2l + 1`).
    fn build(grid_size: usize) -> Tables {
        let (entries, nwant): (&[u32], usize) = if grid_size == 256 {
            (&IQ3XXS_GRID, 2)
        } else {
            (&IQ3S_GRID, 3)
        };
        let level = |v: u8| {
            if grid_size == 256 {
                (v as i32 - 4) / 8
            } else {
                (v as i32 - 1) / 2
            }
        };
        let grid: Vec<[i8; 4]> = entries
            .iter()
            .map(|&e| core::array::from_fn(|k| (2 * level((e >> (8 * k)) as u8) + 1) as i8))
            .collect();
        let mut map = vec![-1i32; 4096];
        for (i, p) in grid.iter().enumerate() {
            let u: usize = (0..4).map(|k| (((p[k] - 1) / 2) as usize) << (3 * k)).sum();
            map[u] = i as i32;
        }
        let mut neighbours = vec![Vec::new(); 4096];
        for (u, list) in neighbours.iter_mut().enumerate() {
            if map[u] >= 0 {
                continue;
            }
            let pos: [i32; 4] = core::array::from_fn(|k| 2 * ((u >> (3 * k)) & 7) as i32 + 1);
            let mut dist: Vec<(i32, usize)> = grid
                .iter()
                .enumerate()
                .map(|(j, pg)| {
                    let d2 = (0..4).map(|k| (pg[k] as i32 - pos[k]).pow(2)).sum();
                    (d2, j)
                })
                .collect();
            dist.sort_unstable();
            let (mut d2, mut nhave) = (dist[0].0, 1);
            for &(dj, j) in &dist {
                if dj > d2 {
                    if nhave == nwant {
                        break;
                    }
                    d2 = dj;
                    nhave += 1;
                }
                list.push(j as u16);
            }
        }
        Tables {
            grid,
            map,
            neighbours,
        }
    }

    fn get(grid_size: usize) -> &'static Tables {
        static T256: OnceLock<Tables> = OnceLock::new();
        static T512: OnceLock<Tables> = OnceLock::new();
        let cell = if grid_size == 256 { &T256 } else { &T512 };
        cell.get_or_init(|| Tables::build(grid_size))
    }

    /// `iq3_find_best_neighbour`: the neighbour of the off-grid point `u` nearest
    /// `xval / scale` (weights `weight`); writes its levels to `l`, returns its index.
    fn best_neighbour(&self, u: usize, xval: &[f32], weight: &[f32], scale: f32, l: &mut [i8]) {
        let mut best_d2 = f32::MAX;
        let mut index = usize::MAX;
        for &j in &self.neighbours[u] {
            let pg = &self.grid[j as usize];
            let mut d2 = 0f32;
            for i in 0..4 {
                let diff = scale * pg[i] as f32 - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                index = j as usize;
            }
        }
        let pg = &self.grid[index];
        for i in 0..4 {
            l[i] = (pg[i] - 1) / 2;
        }
    }
}

/// The 12-bit point of 4 levels.
#[inline]
fn point(l: &[i8]) -> usize {
    (0..4).map(|i| (l[i] as usize) << (3 * i)).sum()
}

/// `Σ w·x·q` and `Σ w·q²` of levels `l` (`q = 2l + 1`).
fn sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// What the two quantizers do differently.
struct Variant {
    /// IQ3_XXS: signs of 8 elements in 7 bits (the eighth flipped to even parity on the
    /// smallest element), a sub-block below `1e-8` is zero; IQ3_S: all 8 signs kept, only an
    /// exactly zero sub-block is.
    xxs: bool,
    /// The trial scales `15 + 0.2·is`, `is` in `-trials..=trials`.
    trials: i32,
    /// The fudge factor on the super-block scale.
    fudge: f32,
}

/// One sub-block of 32 quantized: its scale, the grid index of each group of 4, and the signs
/// of each 8 (IQ3_XXS: 7 bits); `None` for a zero sub-block.
type SubBlock = (f32, [usize; 8], [u8; 4]);

fn sub_block(t: &Tables, v: &Variant, xb: &[f32]) -> Option<SubBlock> {
    let mut weight = [0f32; 32];
    let mut waux = [0f32; 32];
    for i in 0..32 {
        weight[i] = xb[i] * xb[i];
        waux[i] = weight[i].sqrt();
    }
    let mut xval = [0f32; 32];
    let mut signs = [0u8; 4];
    for k in 0..4 {
        let (mut nflip, mut s) = (0, 0u8);
        for i in 0..8 {
            let x = xb[8 * k + i];
            if x >= 0.0 {
                xval[8 * k + i] = x;
            } else {
                xval[8 * k + i] = -x;
                nflip += 1;
                s |= 1 << i;
            }
        }
        if v.xxs {
            if nflip % 2 == 1 {
                let e = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                let (mut imin, mut min) = (0, e(0));
                for i in 1..8 {
                    if e(i) < min {
                        min = e(i);
                        imin = i;
                    }
                }
                xval[8 * k + imin] = -xval[8 * k + imin];
                s ^= 1 << imin;
            }
            s &= 127;
        }
        signs[k] = s;
    }
    let mut max = xval[0];
    for i in 1..32 {
        max = if max > xval[i] { max } else { xval[i] };
    }
    let zero = if v.xxs { max < 1e-8 } else { max == 0.0 };
    if zero {
        return None;
    }
    let mut l = [0i8; 32];
    let mut laux = [0i8; 32];
    let mut best = 0f32;
    let mut scale = max / (2 * KMAXQ - 1) as f32;
    let mut on_grid = [v.xxs; 8];
    let mut on_grid_aux = [true; 8];
    for is in -v.trials..=v.trials {
        let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            for i in 0..4 {
                let q = nearest_int(0.5 * (id * xval[4 * k + i] - 1.0));
                laux[4 * k + i] = q.clamp(0, KMAXQ - 1) as i8;
            }
            let u = point(&laux[4 * k..]);
            on_grid_aux[k] = t.map[u] >= 0;
            if t.map[u] < 0 {
                let (xs, ws) = (&xval[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
                t.best_neighbour(u, xs, ws, this_scale, &mut laux[4 * k..4 * k + 4]);
            }
        }
        let (sumqx, sumq2) = sums(&weight, &xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            on_grid = on_grid_aux;
        }
    }
    if on_grid.iter().any(|&g| !g) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            // IQ3_XXS redoes only the groups off the grid, IQ3_S every group.
            if v.xxs && on_grid[k] {
                continue;
            }
            let mut lk = [0i8; 4];
            for i in 0..4 {
                let q = nearest_int(0.5 * (id * xval[4 * k + i] - 1.0));
                lk[i] = q.clamp(0, KMAXQ - 1) as i8;
            }
            let u = point(&lk);
            let index = if t.map[u] >= 0 {
                t.map[u] as usize
            } else {
                let (xs, ws) = (&xval[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
                t.best_neighbour(u, xs, ws, scale, &mut l[4 * k..4 * k + 4]);
                t.map[point(&l[4 * k..])] as usize
            };
            for i in 0..4 {
                l[4 * k + i] = (t.grid[index][i] - 1) / 2;
            }
        }
        let (sumqx, sumq2) = sums(&weight, &xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for s in &mut signs {
            *s = if v.xxs { !*s & 127 } else { !*s };
        }
    }
    let index = core::array::from_fn(|k| {
        let i = t.map[point(&l[4 * k..])];
        assert!(i >= 0, "IQ3 quantizer: a point off the grid");
        i as usize
    });
    Some((scale, index, signs))
}

/// The 4-bit sub-block scales of a super-block whose largest is `max_scale` (non-zero): its
/// f16 scale (`max_scale / 31` times `fudge`) and each `ls`.
fn super_scales(scales: &[f32; 8], max_scale: f32, fudge: f32) -> (F16Le, [u8; 8]) {
    let d = max_scale / 31.0;
    let id = 1.0 / d;
    let ls =
        core::array::from_fn(|ib| nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8);
    (F16Le::from_f32(d * fudge), ls)
}

/// A quantized super-block: its f16 scale, each sub-block's 4-bit scale, and each
/// sub-block's grid indices and signs (`None` for a zero sub-block).
type SuperBlock = (F16Le, [u8; 8], [Option<([usize; 8], [u8; 4])>; 8]);

/// Quantizes one super-block; `None` when every sub-block's scale is zero.
fn super_block(v: &Variant, grid_size: usize, xs: &[f32]) -> Option<SuperBlock> {
    let t = Tables::get(grid_size);
    let mut scales = [0f32; 8];
    let mut parts = [None; 8];
    let mut max_scale = 0f32;
    for ib in 0..8 {
        let Some((scale, index, signs)) = sub_block(t, v, &xs[32 * ib..32 * ib + 32]) else {
            continue;
        };
        scales[ib] = scale;
        parts[ib] = Some((index, signs));
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return None;
    }
    let (d, ls) = super_scales(&scales, max_scale, v.fudge);
    Some((d, ls, parts))
}

impl Quantize for BlockIq3Xxs {
    /// `quantize_iq3_xxs` without an importance matrix.
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK_K, x.len());
        let v = Variant {
            xxs: true,
            trials: 15,
            fudge: 1.0125,
        };
        for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            *b = BlockIq3Xxs::default();
            let Some((d, ls, parts)) = super_block(&v, 256, xs) else {
                continue;
            };
            b.d = d;
            for (ib, part) in parts.iter().enumerate() {
                // A zero sub-block keeps zero indices and signs.
                let (index, signs) = part.unwrap_or_default();
                for k in 0..8 {
                    b.qs[8 * ib + k] = index[k] as u8;
                }
                let aux = signs[0] as u32
                    | (signs[1] as u32) << 7
                    | (signs[2] as u32) << 14
                    | (signs[3] as u32) << 21
                    | (ls[ib] as u32) << 28;
                b.qs[64 + 4 * ib..68 + 4 * ib].copy_from_slice(&aux.to_le_bytes());
            }
        }
    }
}

impl Quantize for BlockIq3S {
    /// `quantize_iq3_s` without an importance matrix.
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_lengths(out.len(), QK_K, x.len());
        let v = Variant {
            xxs: false,
            trials: 9,
            fudge: 1.033,
        };
        for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            *b = BlockIq3S::default();
            let Some((d, ls, parts)) = super_block(&v, 512, xs) else {
                continue;
            };
            b.d = d;
            // ggml advances its index and sign pointers only past a non-zero sub-block, so
            // the ones after a zero sub-block land one sub-block early (the ninth bits do not).
            let mut at = 0;
            for (ib, part) in parts.iter().enumerate() {
                let Some((index, signs)) = part else {
                    continue;
                };
                for k in 0..8 {
                    b.qs[8 * at + k] = index[k] as u8;
                    b.qh[ib] |= ((index[k] >> 8) as u8) << k;
                }
                b.signs[4 * at..4 * at + 4].copy_from_slice(signs);
                at += 1;
            }
            for j in 0..4 {
                b.scales[j] = ls[2 * j] | ls[2 * j + 1] << 4;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The internal grids are ggml's `kgrid_256` / `kgrid_512` (3 bits per level), whose first
    /// and last entries are these.
    #[test]
    fn grids_are_the_reference_kgrids() {
        let kgrid = |size: usize, i: usize| {
            let p = Tables::get(size).grid[i];
            (0..4)
                .map(|k| (((p[k] - 1) / 2) as u16) << (3 * k))
                .sum::<u16>()
        };
        assert_eq!(
            (kgrid(256, 0), kgrid(256, 1), kgrid(256, 2), kgrid(256, 255)),
            (0, 2, 4, 3992)
        );
        assert_eq!(
            (kgrid(512, 0), kgrid(512, 1), kgrid(512, 3), kgrid(512, 511)),
            (0, 1, 5, 4032)
        );
        for size in [256, 512] {
            let t = Tables::get(size);
            let on = t.map.iter().filter(|&&m| m >= 0).count();
            assert_eq!(on, size);
            assert!((0..4096).all(|u| (t.map[u] >= 0) == t.neighbours[u].is_empty()));
        }
    }

    #[test]
    fn zero_rows_quantize_to_zero_blocks() {
        let x = vec![0f32; 512];
        let mut a = [BlockIq3Xxs::default(); 2];
        BlockIq3Xxs::quantize(&x, &mut a);
        assert!(a
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.qs.iter().all(|&q| q == 0)));
        let mut b = [BlockIq3S::default(); 2];
        BlockIq3S::quantize(&x, &mut b);
        assert!(b
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.qs.iter().all(|&q| q == 0)));
    }
}
