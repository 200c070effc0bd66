//! Unit tests of the quant module, by topic: [`basics`] (rounding, layouts, the kernel tables'
//! checks, the tiers), [`dots`] (every kernel against the reference), [`repacked`] (16-row
//! groups); here the test data and references they share.

use super::blocks::*;
use super::reference::*;
use super::*;

mod basics;
mod dots;
mod repacked;

// ---------------------------------------------------------------------------------------------
// Test data and references, shared by the topics below and by other modules' tests.

/// xorshift64*: deterministic test data.
pub(crate) struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// How test blocks choose their scales.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scales {
    /// Random in ±[0.001, 0.1].
    Normal,
    /// fp16 maximum (65504) magnitude.
    Huge,
    /// fp16 subnormals.
    Subnormal,
    /// Scale zero: the block contributes nothing (and must not produce NaN).
    Zero,
}

fn f16_scale(rng: &mut Rng, s: Scales) -> [u8; 2] {
    let v = match s {
        Scales::Normal => {
            let m = 0.001 + 0.099 * (rng.uniform() * 0.5 + 0.5);
            if rng.next() & 1 == 0 {
                m
            } else {
                -m
            }
        }
        Scales::Huge => {
            if rng.next() & 1 == 0 {
                65504.0
            } else {
                -65504.0
            }
        }
        Scales::Subnormal => (rng.uniform()) * 6.0e-5,
        Scales::Zero => 0.0,
    };
    F16Le::from_f32(v).0
}

/// An MXFP4 block's E8M0 scale byte (`2^(e - 128)` times the doubled E2M1 values): normal
/// ones around 2^-10..2^-2, huge ones near 2^40 (the largest whose dots stay finite in f32
/// are tested apart, with 254 and 255), subnormal ones (0 and 1: `2^-128`, `2^-127`); there is
/// no zero scale, so `Zero` takes the smallest.
fn e8m0_scale(rng: &mut Rng, s: Scales) -> u8 {
    match s {
        Scales::Normal => 118 + (rng.next() % 9) as u8,
        Scales::Huge => 160 + (rng.next() % 8) as u8,
        Scales::Subnormal => (rng.next() & 1) as u8,
        Scales::Zero => 0,
    }
}

/// Offsets of the fp16 scale fields within one block of each format.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
        GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S => &[0],
        GgmlType::IQ3XXS | GgmlType::IQ3S | GgmlType::IQ1S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

/// A weight row of `n` elements: random quant bits, scales chosen by `scales`.
pub(crate) fn random_weight_row(ty: GgmlType, n: usize, rng: &mut Rng, scales: Scales) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..ty.row_bytes(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    match ty {
        GgmlType::F32 => {
            for c in bytes.chunks_mut(4) {
                c.copy_from_slice(&rng.uniform().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in bytes.chunks_mut(2) {
                c.copy_from_slice(&F16Le::from_f32(rng.uniform()).0);
            }
        }
        GgmlType::BF16 => {
            for c in bytes.chunks_mut(2) {
                c.copy_from_slice(&Bf16Le::from_f32(rng.uniform()).0);
            }
        }
        GgmlType::MXFP4 => {
            for blk in bytes.chunks_mut(ty.type_size()) {
                blk[0] = e8m0_scale(rng, scales);
            }
        }
        GgmlType::IQ1M => {
            // The f16 scale's nibbles are the top nibbles of the 4 scale words (bytes 49,
            // 51, 53, 55), lowest first.
            for blk in bytes.chunks_mut(ty.type_size()) {
                let d = u16::from_le_bytes(f16_scale(rng, scales));
                for k in 0..4 {
                    let b = &mut blk[49 + 2 * k];
                    *b = (*b & 0x0F) | (((d >> (4 * k)) & 0xF) as u8) << 4;
                }
            }
        }
        _ => {
            // Q4_K/Q5_K min scales (dmin) are positive in real files, but any sign is valid.
            for blk in bytes.chunks_mut(ty.type_size()) {
                for &off in scale_offsets(ty) {
                    blk[off..off + 2].copy_from_slice(&f16_scale(rng, scales));
                }
            }
        }
    }
    bytes
}

/// One row `w` against three copies of `x` through the batched kernel: the three dots.
fn gemm_thrice(k: &Kernels, n: usize, w: &[u8], x: &[u8]) -> [f32; 3] {
    let mut out = [0f32; 3];
    let x3 = [x, x, x].concat();
    (k.gemm)(GemmArgs::new(
        n,
        (w, w.len(), 1),
        (&x3, x.len(), 3),
        (&mut out, 1),
    ));
    out
}

/// A batched product of random rows: `nw` weight rows and `nx` activation rows of `n`
/// elements (drawn from `rng` in that order) and the batched kernel's `nw × nx` dots.
struct RandomGemm {
    w: Vec<u8>,
    x: Vec<u8>,
    rw: usize,
    rx: usize,
    nw: usize,
    nx: usize,
    out: Vec<f32>,
}

impl RandomGemm {
    /// The rows and their product (`out` filled with `fill` before the kernel writes it).
    fn run(
        ty: GgmlType,
        k: &Kernels,
        shape: (usize, usize, usize),
        rng: &mut Rng,
        fill: f32,
    ) -> Self {
        let (n, nw, nx) = shape;
        let (rw, rx) = (ty.row_bytes(n).unwrap(), k.act.row_bytes(n).unwrap());
        let w: Vec<u8> = (0..nw)
            .flat_map(|_| random_weight_row(ty, n, rng, Scales::Normal))
            .collect();
        let x: Vec<u8> = (0..nx).flat_map(|_| random_act_row(k, n, rng)).collect();
        let mut out = vec![fill; nw * nx];
        (k.gemm)(GemmArgs::new(n, (&w, rw, nw), (&x, rx, nx), (&mut out, nw)));
        RandomGemm {
            w,
            x,
            rw,
            rx,
            nw,
            nx,
            out,
        }
    }

    /// Every dot, activation rows outer: `(i, j, weight row i, activation row j, its dot)`.
    fn dots(&self) -> impl Iterator<Item = (usize, usize, &[u8], &[u8], f32)> + '_ {
        (0..self.nx).flat_map(move |j| {
            (0..self.nw).map(move |i| {
                let wi = &self.w[i * self.rw..(i + 1) * self.rw];
                let xj = &self.x[j * self.rx..(j + 1) * self.rx];
                (i, j, wi, xj, self.out[j * self.nw + i])
            })
        })
    }
}

/// The kernels of `ty` on every tier this CPU runs (a tier without them is passed over).
fn tiers(ty: GgmlType) -> impl Iterator<Item = (Isa, Kernels)> {
    Isa::available()
        .into_iter()
        .filter_map(move |isa| Some((isa, kernels_for(ty, isa).ok()?)))
}

/// An activation row: random f32 quantized by the table's own activation quantizer.
pub(crate) fn random_act_row(k: &Kernels, n: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|_| rng.uniform() * 4.0).collect();
    let mut out = vec![0u8; k.act.row_bytes(n).unwrap()];
    (k.quantize_act)(&x, &mut out);
    out
}

/// The f64 reference dot and its magnitude scale.
pub(crate) fn reference_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> DotAcc {
    fn go<B: BlockFormat>(n: usize, w: &[u8], x: &[u8]) -> DotAcc {
        let mut acc = DotAcc::default();
        let nb = n / B::BLOCK;
        let w = cast::<B>(&w[..nb * size_of::<B>()]).unwrap();
        let x = cast::<B::Dot>(&x[..nb * size_of::<B::Dot>()]).unwrap();
        B::vec_dot_acc(w, x, &mut acc);
        acc
    }
    assert!(
        !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8K),
        "{ty}: an activation format"
    );
    per_format!(ty, |B| go::<B>(n, w, x))
}

/// Every weight format: the float ones, then the block formats.
pub(crate) const WEIGHT_TYPES: [GgmlType; 23] = {
    let mut t = [GgmlType::F32; 23];
    (t[1], t[2]) = (GgmlType::F16, GgmlType::BF16);
    let mut i = 0;
    while i < super::ORDERED.len() {
        t[3 + i] = super::ORDERED[i];
        i += 1;
    }
    t
};

/// Kernel result within float-accumulation noise of the reference: 1e-5 of the magnitude.
fn assert_close(got: f32, want: &DotAcc, what: &str) {
    let tol = 1e-5 * want.mag + 1e-30;
    assert!(!got.is_nan(), "{what}: NaN (reference {})", want.sum);
    let err = (got as f64 - want.sum).abs();
    assert!(
        err <= tol,
        "{what}: got {got}, reference {} (error {err:e} > tol {tol:e})",
        want.sum
    );
}

/// kiln's exact result for row `j` of a batch of `nx` on every tier ([`kquant_order::row_dot`]:
/// the reference engine's x86 order), for the block formats.
///
/// [`kquant_order::row_dot`]: super::kquant_order::row_dot
fn exact_order(ty: GgmlType, w: &[u8], x: &[u8], n: usize, nx: usize, j: usize) -> Option<f32> {
    super::kquant_order::row_dot(ty, w, x, n, nx, j)
}

/// Block counts, including odd ones, for the dot tests.
const BLOCK_COUNTS: [usize; 5] = [1, 3, 7, 8, 33];
