//! The AMX tier (Intel Sapphire Rapids and later): the 32-element formats' repacked 16-row
//! groups (`quant::repack`, read as in `t32_x16`) multiplied with a prompt's rows on the int8
//! tile unit, 16 activation rows at a time.
//!
//! **Arithmetic** ([`kquant_order::t32_dot_blocks`](crate::quant::kquant_order::t32_dot_blocks)):
//! per block, the exact integer dot of all 32 elements, converted and fused-multiply-added with
//! `d_w · d_x` into one f32 sum; a minimum's `m_w · s_x` summed apart and added at the end. A
//! tile product yields a block's whole integer dot, so the reference engine's 8 lanes
//! (`t32_x16`) cannot be kept; every row of this tier (decode and prompt, any batch) takes this
//! order instead, so results still do not depend on how rows are batched.
//!
//! **A block's tile product** `C += A · B` (`tdpbssd`, signed × signed bytes):
//! - A: 16 activation rows × the block's 32 quants, loaded in place from the Q8_0/Q8_1 rows
//!   (the row stride is the tile's stride);
//! - B: the group's block as signed bytes, 8 rows of 64: row `k` holds the 16 weight rows'
//!   elements `4k .. 4k + 4` (`t32_x16`'s lane `k`, less its offset), decoded once per call;
//! - C: 16 × 16 integers, activation row by weight row, stored and then scaled into 16 f32
//!   registers (one per activation row, 16 weight rows each). Two blocks are in flight at a
//!   time, in two sets of tiles.
//!
//! Rows after the last 16 (and a decode's single row) run on AVX-512 VNNI, in the same order
//! (`t32_blocks::row`).
//!
//! The tile instructions go through [`Tiles`]: [`Hw`] issues them; the tests run the same
//! kernel over `Model`, which computes them in software, so the layouts are checked on any
//! AVX-512 VNNI machine, and the instructions themselves where the CPU has AMX.

use super::avx2::Gemm;
use super::t32_blocks::{row, Decoded};
use super::t32_x16::{dx, sx, Group32, Lanes512, MAX_BLOCKS};
use crate::quant::GemmArgs;
use core::arch::asm;
use core::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether this CPU has AMX-TILE and AMX-INT8 (with AVX-512 VNNI for the rest of the tier),
/// and the kernel lets this process use the tile data (Linux: asked once, for the process,
/// with `arch_prctl(ARCH_REQ_XCOMP_PERM)`; without the grant a tile instruction faults).
pub(crate) fn has_amx() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        super::has_avx512vnni()
            && cpu_has_amx_int8()
            && tile_data_granted()
            // SAFETY: the CPU has AVX-512 VNNI and AMX-INT8 with the tile data granted
            // (checked just before).
            && unsafe { known_answer(&mut Hw) }
    })
}

/// A known answer before the tier is handed out: 16 activation rows of a small Q4_0 group
/// through the tile unit equal, bit for bit, the VNNI kernel of the same order
/// (`t32_blocks`). A CPU, hypervisor or kernel whose tiles compute otherwise is left on AVX-512
/// VNNI, with a warning, instead of producing wrong numbers.
///
/// # Safety
/// The CPU has AVX-512 VNNI, and `t` is usable ([`Tiles`]).
unsafe fn known_answer<T: Tiles>(t: &mut T) -> bool {
    use super::t32_x16::Q4_0;
    const NB: usize = 2;
    const XB: usize = Q4_0::XB;
    let mut w = [0u8; NB * Q4_0::BYTES];
    let mut x = [0u8; TILE_ROWS * NB * XB];
    let mut seed = 0x2545_f491_u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 24) as u8
    };
    for b in 0..NB {
        let sb = &mut w[b * Q4_0::BYTES..(b + 1) * Q4_0::BYTES];
        for r in 0..16 {
            // d = 1 + r/64 (f16), then random nibbles.
            sb[2 * r..2 * r + 2].copy_from_slice(&(0x3c00u16 + 16 * r as u16).to_le_bytes());
        }
        sb[32..].iter_mut().for_each(|v| *v = next());
    }
    for blk in x.chunks_exact_mut(XB) {
        blk[..2].copy_from_slice(&0x3800u16.to_le_bytes());
        blk[2..].iter_mut().for_each(|v| *v = next());
    }
    let (mut tiles, mut vnni) = ([0f32; 16 * TILE_ROWS], [1f32; 16 * TILE_ROWS]);
    // SAFETY: as the function's contract; `w` is one repacked Q4_0 group of `NB` blocks, `x`
    // holds 16 rows of `NB` Q8_0 blocks `NB · XB` bytes apart, and each output holds 16 rows
    // of 16.
    unsafe {
        let g = |out| {
            Gemm::of(GemmArgs::new(
                32 * NB,
                (&w, w.len() / 16, 16),
                (&x, NB * XB, 16),
                (out, 16),
            ))
        };
        gemm_on::<Q4_0, T>(t, g(&mut tiles));
        super::t32_blocks::gemm_tf::<Q4_0>(g(&mut vnni));
    }
    let same = tiles
        .iter()
        .zip(&vnni)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same {
        log::warn!("AMX tiles disagree with the VNNI kernels on a known product: AMX left unused");
    }
    same
}

/// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (EDX bit 25).
fn cpu_has_amx_int8() -> bool {
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only where the CPU has it.
    #[allow(unused_unsafe)]
    unsafe {
        __cpuid(0).eax >= 7 && {
            let edx = __cpuid_count(7, 0).edx;
            edx & (1 << 24) != 0 && edx & (1 << 25) != 0
        }
    }
}

/// Asks Linux for the tile data state (XFEATURE 18) and checks it was granted.
#[cfg(target_os = "linux")]
fn tile_data_granted() -> bool {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    let mut granted: u64 = 0;
    // SAFETY: `arch_prctl` with these codes reads its integer arguments and, for the query,
    // writes one u64 to `granted`, which outlives the call.
    let (asked, read) = unsafe {
        (
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ),
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_GET_XCOMP_PERM,
                &mut granted as *mut u64,
            ),
        )
    };
    let ok = asked == 0 && read == 0 && granted & (1 << XFEATURE_XTILEDATA) != 0;
    if !ok {
        // (ENOSPC: a thread's alternate signal stack is too small for the tile state.)
        log::warn!(
            "AMX: Linux did not grant the tile data ({}): AMX left unused",
            std::io::Error::last_os_error()
        );
    }
    ok
}

#[cfg(not(target_os = "linux"))]
fn tile_data_granted() -> bool {
    false
}

/// `ldtilecfg`'s 64-byte operand (palette 1): each tile's rows and bytes per row.
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<TileConfig>() == 64);

/// The tiles of set `s` (0 or 1): A (activations) is tile `3s`, B (weights) `3s + 1`, C
/// (integer dots) `3s + 2`.
const SETS: usize = 2;

impl TileConfig {
    /// Per set: A 16 rows × 32 bytes, B 8 rows × 64 bytes, C 16 rows × 16 i32.
    const KERNEL: TileConfig = {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut s = 0;
        while s < SETS {
            c.rows[3 * s] = 16;
            c.colsb[3 * s] = 32;
            c.rows[3 * s + 1] = 8;
            c.colsb[3 * s + 1] = 64;
            c.rows[3 * s + 2] = 16;
            c.colsb[3 * s + 2] = 64;
            s += 1;
        }
        c
    };
}

/// The tile instructions the kernel issues, by tile set (see [`SETS`]).
pub(super) trait Tiles {
    /// `ldtilecfg`.
    ///
    /// # Safety
    /// Tile data granted to the process (or a software model).
    unsafe fn config(&mut self, cfg: &TileConfig);
    /// `tileloadd` A: its rows from `p`, `stride` bytes apart.
    ///
    /// # Safety
    /// Configured; the rows are readable.
    unsafe fn load_a(&mut self, s: usize, p: *const u8, stride: usize);
    /// `tileloadd` B: its rows from `p`, 64 bytes apart.
    ///
    /// # Safety
    /// Configured; the rows are readable.
    unsafe fn load_b(&mut self, s: usize, p: *const u8);
    /// `tilezero` C.
    ///
    /// # Safety
    /// Configured.
    unsafe fn zero_c(&mut self, s: usize);
    /// `tdpbssd` C += A · B.
    ///
    /// # Safety
    /// Configured.
    unsafe fn dot(&mut self, s: usize);
    /// `tilestored` C: its rows to `p`, 64 bytes apart.
    ///
    /// # Safety
    /// Configured; the rows are writable.
    unsafe fn store_c(&mut self, s: usize, p: *mut u8);
    /// `tilerelease`: the tile state back to its initial (unused) state.
    ///
    /// # Safety
    /// Tile data granted to the process (or a software model).
    unsafe fn release(&mut self);
}

/// The CPU's tile unit.
pub(super) struct Hw;

impl Tiles for Hw {
    #[inline(always)]
    unsafe fn config(&mut self, cfg: &TileConfig) {
        asm!("ldtilecfg [{c}]", c = in(reg) cfg, options(nostack, readonly, preserves_flags));
    }
    #[inline(always)]
    unsafe fn load_a(&mut self, s: usize, p: *const u8, stride: usize) {
        if s == 0 {
            asm!("tileloadd tmm0, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly, preserves_flags));
        } else {
            asm!("tileloadd tmm3, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn load_b(&mut self, s: usize, p: *const u8) {
        if s == 0 {
            asm!("tileloadd tmm1, [{p} + {s}*1]", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, readonly, preserves_flags));
        } else {
            asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, readonly, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn zero_c(&mut self, s: usize) {
        if s == 0 {
            asm!("tilezero tmm2", options(nomem, nostack, preserves_flags));
        } else {
            asm!("tilezero tmm5", options(nomem, nostack, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn dot(&mut self, s: usize) {
        if s == 0 {
            asm!(
                "tdpbssd tmm2, tmm0, tmm1",
                options(nomem, nostack, preserves_flags)
            );
        } else {
            asm!(
                "tdpbssd tmm5, tmm3, tmm4",
                options(nomem, nostack, preserves_flags)
            );
        }
    }
    #[inline(always)]
    unsafe fn store_c(&mut self, s: usize, p: *mut u8) {
        if s == 0 {
            asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags));
        } else {
            asm!("tilestored [{p} + {s}*1], tmm5", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags));
        }
    }
    #[inline(always)]
    unsafe fn release(&mut self) {
        asm!("tilerelease", options(nomem, nostack, preserves_flags));
    }
}

/// Activation rows from which a group runs on the tiles: one whole A tile.
const TILE_ROWS: usize = 16;

/// One 16-row group (`w`) against `nx` activation rows, as `t32_x16::gemm_tf` but in this
/// tier's arithmetic: whole tiles of 16 rows on the tile unit, the rest on VNNI.
///
/// # Safety
/// As `t32_x16::gemm_tf`, and the CPU has AMX-INT8 with the tile data granted ([`has_amx`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub(super) unsafe fn gemm_tf<F: Lanes512>(g: Gemm) {
    gemm_on::<F, Hw>(&mut Hw, g)
}

/// [`gemm_tf`] over the tile unit `t`.
///
/// # Safety
/// As [`gemm_tf`], with `t` usable ([`Tiles`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub(super) unsafe fn gemm_on<F: Lanes512, T: Tiles>(t: &mut T, g: Gemm) {
    let (n, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = n / 32;
    debug_assert!(nb <= MAX_BLOCKS);
    let tiled = nx / TILE_ROWS * TILE_ROWS;
    if tiled > 0 {
        batch::<F, T>(t, Gemm { nx: tiled, ..g });
    }
    for j in tiled..nx {
        _mm512_storeu_ps(
            out.add(j * out_stride),
            row::<F>(nb, w, x.add(j * x_stride)),
        );
    }
}

/// `nx` (a multiple of 16) activation rows on the tile unit: the group decoded once into B
/// tiles and scales, then each 16 rows' blocks two at a time.
///
/// # Safety
/// As [`gemm_on`], `nx` a multiple of [`TILE_ROWS`], `nb ≤ MAX_BLOCKS`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
unsafe fn batch<F: Lanes512, T: Tiles>(t: &mut T, g: Gemm) {
    let (_, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = g.n / 32;
    // The B tiles are the decoded lanes: row `k` is lane `k`.
    let mut g = Decoded::new();
    g.fill::<F>(nb, w, false);
    // Each set's C, stored: row `r` is activation row `r`'s 16 integer dots.
    let mut c = [[_mm512_setzero_si512(); TILE_ROWS]; SETS];
    t.config(&TileConfig::KERNEL);
    for j in (0..nx).step_by(TILE_ROWS) {
        let xj = x.add(j * x_stride);
        let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
        for b0 in (0..nb).step_by(SETS) {
            let sets = (nb - b0).min(SETS);
            for (s, cs) in c.iter_mut().enumerate().take(sets) {
                let b = b0 + s;
                t.zero_c(s);
                t.load_a(s, xj.add(b * F::XB + F::XQ), x_stride);
                t.load_b(s, g.lanes(b).as_ptr().cast());
                t.dot(s);
                t.store_c(s, cs.as_mut_ptr().cast());
            }
            for (s, cs) in c.iter().enumerate().take(sets) {
                let (b, d) = (b0 + s, g.d(b0 + s));
                for (r, a) in acc.iter_mut().enumerate() {
                    let prod = _mm512_mul_ps(d, dx(xj.add(r * x_stride + b * F::XB)));
                    *a = _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(cs[r]), *a);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let xr = xj.add(r * x_stride);
            let v = if F::MIN {
                let mut ms = _mm512_setzero_ps();
                for b in 0..nb {
                    ms = _mm512_fmadd_ps(g.m(b), sx(xr.add(b * F::XB)), ms);
                }
                _mm512_add_ps(*a, ms)
            } else {
                *a
            };
            _mm512_storeu_ps(out.add((j + r) * out_stride), v);
        }
    }
    t.release();
}

/// The tile unit in software, for the tests: the instructions' semantics on 8 tiles of 16
/// rows × 64 bytes, with the configured shapes checked as the CPU checks them.
#[cfg(test)]
pub(super) struct Model {
    data: [[u8; 1024]; 8],
    rows: [usize; 8],
    colsb: [usize; 8],
}

#[cfg(test)]
impl Model {
    pub(super) fn new() -> Model {
        Model {
            data: [[0; 1024]; 8],
            rows: [0; 8],
            colsb: [0; 8],
        }
    }

    unsafe fn load(&mut self, t: usize, p: *const u8, stride: usize) {
        assert!(self.rows[t] > 0, "tile {t} not configured");
        for r in 0..self.rows[t] {
            for b in 0..self.colsb[t] {
                self.data[t][64 * r + b] = *p.add(r * stride + b);
            }
        }
    }
}

#[cfg(test)]
impl Tiles for Model {
    unsafe fn config(&mut self, cfg: &TileConfig) {
        assert_eq!(cfg.palette, 1);
        for t in 0..8 {
            self.rows[t] = cfg.rows[t] as usize;
            self.colsb[t] = cfg.colsb[t] as usize;
            assert!(self.rows[t] <= 16 && self.colsb[t] <= 64);
        }
    }
    unsafe fn load_a(&mut self, s: usize, p: *const u8, stride: usize) {
        self.load(3 * s, p, stride)
    }
    unsafe fn load_b(&mut self, s: usize, p: *const u8) {
        self.load(3 * s + 1, p, 64)
    }
    unsafe fn zero_c(&mut self, s: usize) {
        self.data[3 * s + 2] = [0; 1024];
    }
    unsafe fn dot(&mut self, s: usize) {
        let (a, b, c) = (3 * s, 3 * s + 1, 3 * s + 2);
        // The shapes `tdpbssd` requires (#UD otherwise).
        assert_eq!(self.rows[c], self.rows[a]);
        assert_eq!(self.colsb[c], self.colsb[b]);
        assert_eq!(self.rows[b] * 4, self.colsb[a]);
        for m in 0..self.rows[c] {
            for n in 0..self.colsb[c] / 4 {
                let at = 64 * m + 4 * n;
                let cell: [u8; 4] = self.data[c][at..at + 4].try_into().expect("4 bytes");
                let mut sum = i32::from_le_bytes(cell);
                for k in 0..self.colsb[a] / 4 {
                    for i in 0..4 {
                        let av = self.data[a][64 * m + 4 * k + i] as i8 as i32;
                        let bv = self.data[b][64 * k + 4 * n + i] as i8 as i32;
                        sum = sum.wrapping_add(av * bv);
                    }
                }
                self.data[c][at..at + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }
    unsafe fn store_c(&mut self, s: usize, p: *mut u8) {
        let c = 3 * s + 2;
        for r in 0..self.rows[c] {
            for b in 0..self.colsb[c] {
                *p.add(64 * r + b) = self.data[c][64 * r + b];
            }
        }
    }
    unsafe fn release(&mut self) {
        *self = Model::new();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{t32_blocks, t32_x16};
    use super::*;
    use crate::quant::kquant_order::t32_dot_blocks;
    use crate::quant::tests::{random_act_row, random_weight_row, Rng, Scales};
    use crate::quant::{kernels_for, GgmlType, Isa};

    /// `rows × n` weights of `ty` (plain and repacked) and `nx` activation rows (`x_stride`
    /// bytes apart, with padding between them).
    struct Case {
        ty: GgmlType,
        n: usize,
        rows: usize,
        w: Vec<u8>,
        packed: Vec<u8>,
        x: Vec<u8>,
        x_stride: usize,
        nx: usize,
    }

    fn case(ty: GgmlType, rows: usize, n: usize, nx: usize, scales: Scales, rng: &mut Rng) -> Case {
        let k = kernels_for(ty, Isa::Scalar).unwrap();
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_weight_row(ty, n, rng, scales))
            .collect();
        // Every x86 tier repacks into the same layout; the callers checked for VNNI.
        let vnni = kernels_for(ty, Isa::Avx512Vnni).unwrap();
        let (packed, _) = crate::quant::repacked(&vnni, &w, rows, n).expect("a repacked layout");
        let rx = k.act.row_bytes(n).unwrap();
        let x_stride = rx + 5;
        let mut x = vec![0u8; nx * x_stride];
        for j in 0..nx {
            x[j * x_stride..j * x_stride + rx].copy_from_slice(&random_act_row(&k, n, rng));
        }
        Case {
            ty,
            n,
            rows,
            w,
            packed,
            x,
            x_stride,
            nx,
        }
    }

    /// A group kernel over the tile unit `T` (`gemm_on`).
    type TileKernel<T> = unsafe fn(&mut T, Gemm);

    fn tile_kernel<T: Tiles>(ty: GgmlType) -> TileKernel<T> {
        match ty {
            GgmlType::Q4_0 => gemm_on::<t32_x16::Q4_0, T>,
            GgmlType::Q4_1 => gemm_on::<t32_x16::Q4_1, T>,
            GgmlType::Q5_0 => gemm_on::<t32_x16::Q5_0, T>,
            GgmlType::Q5_1 => gemm_on::<t32_x16::Q5_1, T>,
            GgmlType::Q8_0 => gemm_on::<t32_x16::Q8_0, T>,
            ty => unreachable!("{ty}"),
        }
    }

    /// `c` through the tile kernel over `t`.
    fn check_tiles<T: Tiles>(c: &Case, t: &mut T, what: &str) {
        let k = tile_kernel::<T>(c.ty);
        check(c, what, &mut |g| {
            // SAFETY: as `check` says of `run`; `t` is usable (the callers check).
            unsafe { k(t, g) }
        });
    }

    /// Every group of `c` through `run` (a kernel over one group and `c`'s activation rows),
    /// each output against the scalar block order, bit for bit. `run` is given one repacked
    /// group of `c.n`-element rows and room for 16 outputs of each of `c.nx` rows.
    fn check(c: &Case, what: &str, run: &mut dyn FnMut(Gemm)) {
        let rw = c.ty.row_bytes(c.n).unwrap();
        let out_stride = c.rows + 3;
        let mut out = vec![f32::NAN; c.nx * out_stride];
        for g in (0..c.rows).step_by(16) {
            let w = &c.packed[g * rw..(g + 16) * rw];
            let (x, out) = ((&c.x[..], c.x_stride, c.nx), (&mut out[g..], out_stride));
            run(Gemm::of(GemmArgs::new(c.n, (w, rw, 16), x, out)));
        }
        for j in 0..c.nx {
            for i in 0..c.rows {
                let xj = &c.x[j * c.x_stride..];
                let want = t32_dot_blocks(c.ty, &c.w[i * rw..(i + 1) * rw], xj, c.n);
                let got = out[j * out_stride + i];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{what} {} {}x{} nx={} ({i},{j}): {got} vs {want}",
                    c.ty,
                    c.rows,
                    c.n,
                    c.nx
                );
            }
            for p in c.rows..out_stride {
                assert!(out[j * out_stride + p].is_nan(), "wrote padding");
            }
        }
    }

    const FORMATS: [GgmlType; 5] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ];

    /// The tile kernel's layouts and arithmetic, on the software tile unit: A read in place
    /// from the activation rows, B decoded signed, C scaled in block order, tails on VNNI;
    /// every scale regime, rows of 1 to 256 blocks, batches on and off the 16-row tiles.
    #[test]
    fn tile_kernel_in_software_matches_the_block_order() {
        if !crate::quant::x86::has_avx512vnni() {
            eprintln!("skipped: the AMX tier's kernels need AVX-512 VNNI");
            return;
        }
        let mut rng = Rng(0xa3c5_0001);
        let mut cases = 0;
        for ty in FORMATS {
            for &(rows, n, nx) in &[(16, 32, 16), (32, 640, 35), (16, 2048, 48), (16, 8192, 17)] {
                for scales in [
                    Scales::Normal,
                    Scales::Huge,
                    Scales::Subnormal,
                    Scales::Zero,
                ] {
                    let c = case(ty, rows, n, nx, scales, &mut rng);
                    check_tiles(&c, &mut Model::new(), "model");
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 5 * 4 * 4);
    }

    /// The VNNI kernels of the block order (`t32_blocks`: decode rows and batches), every
    /// format, with and without an offset or a minimum.
    #[test]
    fn vnni_block_kernels_match_the_block_order() {
        if !crate::quant::x86::has_avx512vnni() {
            eprintln!("skipped: needs AVX-512 VNNI");
            return;
        }
        type K = unsafe fn(Gemm);
        let mut rng = Rng(0xa3c5_0003);
        for ty in FORMATS {
            let k: K = match ty {
                GgmlType::Q4_0 => t32_blocks::gemm_tf::<t32_x16::Q4_0>,
                GgmlType::Q4_1 => t32_blocks::gemm_tf::<t32_x16::Q4_1>,
                GgmlType::Q5_0 => t32_blocks::gemm_tf::<t32_x16::Q5_0>,
                GgmlType::Q5_1 => t32_blocks::gemm_tf::<t32_x16::Q5_1>,
                GgmlType::Q8_0 => t32_blocks::gemm_tf::<t32_x16::Q8_0>,
                ty => unreachable!("{ty}"),
            };
            for &(rows, n, nx) in &[(16, 32, 1), (32, 640, 7), (16, 8192, 2), (48, 576, 13)] {
                for scales in [Scales::Normal, Scales::Huge, Scales::Subnormal] {
                    let c = case(ty, rows, n, nx, scales, &mut rng);
                    check(&c, "vnni", &mut |g| {
                        // SAFETY: as `check` says of `run`; the CPU has AVX-512 VNNI.
                        unsafe { k(g) }
                    });
                }
            }
        }
    }

    /// The known answer the tier is chosen on: the software tile unit gives it, and one
    /// whose products are off by one is refused.
    #[test]
    fn known_answer_refuses_a_wrong_tile_unit() {
        if !crate::quant::x86::has_avx512vnni() {
            eprintln!("skipped: needs AVX-512 VNNI");
            return;
        }
        /// The model, with every product's first dot one too many.
        struct OffByOne(Model);
        impl Tiles for OffByOne {
            unsafe fn config(&mut self, cfg: &TileConfig) {
                self.0.config(cfg)
            }
            unsafe fn load_a(&mut self, s: usize, p: *const u8, stride: usize) {
                self.0.load_a(s, p, stride)
            }
            unsafe fn load_b(&mut self, s: usize, p: *const u8) {
                self.0.load_b(s, p)
            }
            unsafe fn zero_c(&mut self, s: usize) {
                self.0.zero_c(s)
            }
            unsafe fn dot(&mut self, s: usize) {
                self.0.dot(s);
                let c = &mut self.0.data[3 * s + 2];
                let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) + 1;
                c[..4].copy_from_slice(&v.to_le_bytes());
            }
            unsafe fn store_c(&mut self, s: usize, p: *mut u8) {
                self.0.store_c(s, p)
            }
            unsafe fn release(&mut self) {
                self.0.release()
            }
        }
        // SAFETY: the CPU has AVX-512 VNNI (checked); the tile units are software.
        unsafe {
            assert!(known_answer(&mut Model::new()));
            assert!(!known_answer(&mut OffByOne(Model::new())));
        }
    }

    /// The same on the CPU's tile unit, where it has one.
    #[test]
    fn tile_kernel_matches_the_block_order() {
        if !has_amx() {
            eprintln!("skipped: this CPU has no AMX-INT8 (or the OS did not grant its tiles)");
            return;
        }
        let mut rng = Rng(0xa3c5_0002);
        for ty in FORMATS {
            for &(rows, n, nx) in &[(16, 32, 16), (32, 640, 35), (16, 8192, 33), (48, 576, 512)] {
                let c = case(ty, rows, n, nx, Scales::Normal, &mut rng);
                check_tiles(&c, &mut Hw, "hw");
            }
        }
    }
}
