//! Helpers of the CUDA op tests (`cuda_ops.rs`, `cuda_attention.rs`).

use std::sync::Arc;

use kiln::backend::cuda::gpu::Arg;
use kiln::backend::cuda::{self, gpu::Gpu};

/// The machine's GPU, else the software GPU. Where neither can run (no GPU and not x86-64) it
/// panics: the op tests are `#[ignore]`d there, and one run anyway fails rather than passing
/// without having run. A software GPU that does not build or load fails the test too (see
/// [`super::emulator_lib`]).
pub fn gpu() -> Arc<Gpu> {
    match cuda::open() {
        Ok(g) => g,
        Err(no_gpu) => match super::emulator_lib() {
            Ok(lib) => cuda::use_emulator(&lib).unwrap_or_else(|e| {
                panic!("the software GPU {} does not load: {e}", lib.display())
            }),
            Err(why) => panic!("{no_gpu}, and no software GPU here: {why}"),
        },
    }
}

/// Deterministic values in [-1, 1).
pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Little-endian bytes of i32 values (a kernel's index arrays).
pub fn i32_bytes(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `n` blocks of a non-linear format (the i-quants, MXFP4) as random bytes: every grid index,
/// sign and scale code occurs (the formats' quantizers reach only some of them, and five
/// formats have none without an importance matrix). Each block's super-block scale is a
/// random f16 in ±[2^-8, 2^-5) (IQ1_M's spread over its scales' top nibbles); MXFP4's E8M0
/// scale byte lies in 118..=130, but with `edge`, every 7th block's is 0 or 1 (subnormal
/// scales) or 255 (2^127, whose large values overflow), which the dequantizers must get
/// right though no product could take them.
pub fn random_blocks(ty: kiln::quant::GgmlType, n: usize, seed: u64, edge: bool) -> Vec<u8> {
    use kiln::quant::GgmlType;
    let size = ty.type_size();
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(n * size);
    for b in 0..n {
        let mut blk: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let r = next();
        // An f16 of exponent −8..−6 (biased 7..9), random mantissa and sign.
        let d = ((r & 0x8000) | ((7 + (r >> 16) % 3) << 10) | ((r >> 24) & 0x3ff)) as u16;
        match ty {
            GgmlType::MXFP4 => {
                blk[0] = match b % 7 {
                    6 if edge => [0u8, 1, 255][(b / 7) % 3],
                    _ => 118 + (r % 13) as u8,
                };
            }
            GgmlType::IQ1M => {
                for k in 0..4 {
                    let hi = &mut blk[49 + 2 * k];
                    *hi = (*hi & 0x0f) | ((((d >> (4 * k)) & 15) as u8) << 4);
                }
            }
            _ => blk[..2].copy_from_slice(&d.to_le_bytes()),
        }
        out.extend(blk);
    }
    out
}

/// The arguments of a format's `matvec` kernel over one weight matrix at `w` (no fused second
/// or third matrix: their rows 0) and its 8-bit input at `xq`, into `y` (or, with `add`, added
/// to it): `rows` × `cols`, `n_tok` tokens, `tpr` threads per row.
pub fn quantized_matvec_args(
    w: u64,
    xq: u64,
    y: u64,
    (rows, cols): (usize, usize),
    n_tok: usize,
    add: bool,
    tpr: i32,
) -> [Arg; 14] {
    [
        Arg::P(w),
        Arg::P(w),
        Arg::P(w),
        Arg::P(xq),
        Arg::P(y),
        Arg::P(y),
        Arg::P(y),
        Arg::I(rows as i32),
        Arg::I(0),
        Arg::I(0),
        Arg::I(cols as i32),
        Arg::I(n_tok as i32),
        Arg::I(add as i32),
        Arg::I(tpr),
    ]
}
