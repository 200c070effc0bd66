//! Block formats: layouts, scalar reference (de)quantizers and the fast dot-product kernels.
//!
//! A matrix multiply `y = W x` with a quantized weight `W` works like ggml's: the activation row
//! `x` (f32) is first quantized to the weight format's partner ([`dot_type`]: Q8_0, Q8_1 or
//! Q8_K; or f32/f16/bf16 for float weights), then each output is an integer-heavy dot product of
//! one weight row with that quantized row. [`kernels`] returns the functions for one weight
//! format, chosen once for the CPU we run on; the model keeps the [`Kernels`] per tensor.
//!
//! Using it for `y = W x` with `W` of `rows x n` in format `ty`:
//! ```text
//! let k = quant::kernels(ty)?;                       // once per tensor
//! let mut xq = vec![0u8; k.act.row_bytes(n).unwrap()];
//! (k.quantize_act)(&x, &mut xq);                     // once per activation row
//! let row = ty.row_bytes(n).unwrap();
//! let (w, x) = ((w_bytes, row, rows), (&xq[..], xq.len(), 1));
//! (k.gemm)(GemmArgs::new(n, w, x, (&mut y, rows)));  // matvec (nx = 1)
//! ```
//! For prefill, quantize every token's row into one buffer and call `gemm` with `nx` tokens:
//! each weight block is then decoded once per tile of 4 tokens. To use several threads, give
//! each thread a slice of weight rows (`w` offset by `first_row * row`, `nw` rows, and `out`
//! offset by `first_row`). The kernels panic only on caller bugs (a row that is not whole
//! blocks, or buffers shorter than the rows they are told to read); shapes from a file are
//! expected to be validated when the model loads.
//!
//! - [`blocks`]: the `#[repr(C)]` byte layout of every format.
//! - [`reference`](mod@reference): scalar (de)quantizers and dot products, the definition everything is tested
//!   against.
//! - `kquant_quantize`: ggml's reference quantizers of Q2_K..Q6_K (through [`quantize_row`]).
//! - `x86`: AVX2 / AVX-512 kernels, reachable only through [`Kernels`] after runtime detection.
//! - `neon`: AArch64 kernels (baseline NEON).

pub mod blocks;
mod iq1;
mod iq2;
mod iq2_grids;
mod iq3;
mod iq3_quantize;
mod iq_grids;
mod iq_order;
mod iq_signs;
mod iquant;
pub mod kquant_order;
mod kquant_quantize;
mod mxfp4;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod reference;
pub mod repack;
mod types;
#[cfg(target_arch = "x86_64")]
mod x86;

/// The i-quants' lookup tables (grids and sign masks), which the GPU's kernels are given as
/// they are (`backend/cuda/tables.rs`).
pub(crate) mod iq_tables {
    pub(crate) use super::iq2_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
    pub(crate) use super::iq_grids::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID};
    pub(crate) use super::iq_signs::KSIGNS_IQ2XS;
}

use blocks::*;
use reference::{BlockFormat, Quantize};
use std::mem::size_of;
use std::sync::OnceLock;
pub use types::GgmlType;

/// One weight row · one activation row of `n` elements (both as raw bytes of their formats).
pub type VecDotFn = fn(n: usize, w: &[u8], x: &[u8]) -> f32;
/// f32 activations -> partner-format bytes (`out.len()` = the format's row bytes for `x.len()`).
pub type QuantizeFn = fn(x: &[f32], out: &mut [u8]);
/// Format bytes -> f32 (`out.len()` elements).
pub type DequantFn = fn(src: &[u8], out: &mut [f32]);
/// `nw` weight rows (stride `w_stride` bytes) x `nx` activation rows (stride `x_stride` bytes):
/// `out[j * out_stride + i] = dot(w row i, x row j)`. The prefill tile: each loaded weight block
/// serves several tokens. Every output is bit-identical to [`VecDotFn`] on the same two rows, so
/// results do not depend on how tokens are batched, except for Q3_K, Q4_K, Q5_K, Q6_K and
/// IQ4_XS, which reproduce the reference engine's batch-dependent arithmetic
/// ([`kquant_order`]): Q4_K rows in the batch's groups of four differ in the last bits from the
/// `nx % 4` rows after them, and Q3_K, Q5_K, Q6_K and IQ4_XS batches of 8 rows or more (its
/// tiled kernel) differ from smaller ones. Pass the whole batch (`nx` = tokens in it) to get the
/// reference's results.
pub type GemmFn = fn(GemmArgs<'_>);

/// The operands of one [`GemmFn`] call: `nw` weight rows `w_stride` bytes apart times `nx`
/// activation rows `x_stride` bytes apart, `n` elements each, into `out[j * out_stride + i]`.
pub struct GemmArgs<'a> {
    pub n: usize,
    pub w: &'a [u8],
    pub w_stride: usize,
    pub nw: usize,
    pub x: &'a [u8],
    pub x_stride: usize,
    pub nx: usize,
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

impl<'a> GemmArgs<'a> {
    /// `n` elements a row; the weight rows `(w, w_stride, nw)`, the activation rows
    /// `(x, x_stride, nx)` and the outputs `(out, out_stride)`.
    pub fn new(
        n: usize,
        w: (&'a [u8], usize, usize),
        x: (&'a [u8], usize, usize),
        out: (&'a mut [f32], usize),
    ) -> Self {
        GemmArgs {
            n,
            w: w.0,
            w_stride: w.1,
            nw: w.2,
            x: x.0,
            x_stride: x.1,
            nx: x.2,
            out: out.0,
            out_stride: out.1,
        }
    }

    /// Checks the buffers cover every row the call touches (`row_w`, `row_x`: the bytes of one
    /// weight row and of one activation row). Panics on a caller bug.
    pub(crate) fn check(&self, row_w: usize, row_x: usize) {
        let g = self;
        if g.nw == 0 || g.nx == 0 {
            return;
        }
        assert!(
            g.w_stride >= row_w && g.x_stride >= row_x && g.out_stride >= g.nw,
            "gemm strides"
        );
        assert!(
            g.w.len() >= (g.nw - 1) * g.w_stride + row_w,
            "gemm weight buffer too short"
        );
        assert!(
            g.x.len() >= (g.nx - 1) * g.x_stride + row_x,
            "gemm activation buffer too short"
        );
        assert!(
            g.out.len() >= (g.nx - 1) * g.out_stride + g.nw,
            "gemm output buffer too short"
        );
    }
}

/// Errors of the row-level API (lengths and formats are checked, never assumed).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: {n} elements is not a whole number of {block}-element blocks")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: {what} has {got} bytes, expected {expected} for {n} elements")]
    ByteLength {
        ty: GgmlType,
        what: &'static str,
        got: usize,
        expected: usize,
        n: usize,
    },
    #[error("{ty}: no {op} for this format")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}

/// Instruction-set tiers with their own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable reference code.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL/DQ on top of AVX2.
    Avx512,
    /// AVX-512 plus VNNI (`vpdpbusd` / `vpdpwssd`).
    Avx512Vnni,
    /// AVX-512 VNNI plus AMX's int8 tiles (prompt products of the 32-element formats), where
    /// the OS grants the tile state. Its 32-element products sum each block's whole integer
    /// dot ([`kquant_order::t32_dot_blocks`]) instead of the reference's 8 lanes.
    Amx,
    /// AArch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// Every tier, weakest first.
    pub const ALL: [Isa; 6] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Amx,
        Isa::Neon,
    ];

    /// Every tier this CPU can run, weakest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The strongest tier this CPU can run (detected once). The environment variable
    /// `KILN_ISA` (a tier's [`name`](Isa::name), e.g. `scalar` or `avx2`) caps it, to compare
    /// paths when debugging; an unknown name is ignored.
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = (crate::tuning::get().isa.as_deref()).and_then(Isa::from_name);
            Isa::available()
                .into_iter()
                .filter(|i| i.has_kernels() && (cap.is_none() || Some(*i) <= cap))
                .max()
                .unwrap_or(Isa::Scalar)
        })
    }

    /// The tier called `name` ([`Isa::name`]).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }

    /// Whether this CPU supports the tier (runtime CPUID on x86).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::has_avx512(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::has_avx512vnni(),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => x86::has_amx(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether this build has kernels for the tier (each architecture compiles only its own).
    fn has_kernels(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => {
                cfg!(target_arch = "x86_64")
            }
            Isa::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }
}

/// The functions for one weight format on one instruction set.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    pub weight: GgmlType,
    /// The activation format `vec_dot` / `gemm` expect (= [`dot_type`] of `weight`).
    pub act: GgmlType,
    pub isa: Isa,
    pub vec_dot: VecDotFn,
    pub gemm: GemmFn,
    /// f32 -> `act` bytes.
    pub quantize_act: QuantizeFn,
    /// `weight` bytes -> f32 (for embeddings lookups and debugging).
    pub dequantize: DequantFn,
    /// Weight rows stored together: 1 for plain row-major matrices, [`repack::GROUP`] for
    /// a matrix [`repacked`] into groups. `gemm` must then be given tiles that start at a
    /// multiple of `group` rows (whole groups, or the plain rows after the last one), and
    /// `vec_dot` / `dequantize` apply only to those plain rows.
    pub group: usize,
}

/// A layout of a `rows × n` matrix of format `k.weight` that this CPU multiplies faster: the
/// function that writes it (the same number of bytes, rearranged; whole groups of rows are
/// independent, so it may be applied to any run of whole groups, or to a last run that also
/// holds the rows after the last group) and the kernels that read it. `None` when the plain
/// layout is already the fastest one here.
pub fn repacking(k: &Kernels, rows: usize, n: usize) -> Option<(repack::RepackFn, Kernels)> {
    repacking_in(k, rows, n, false)
}

/// Whether an output matrix of `k`'s format takes its repacked layout: always, but
/// `KILN_Q6K_GROUPS=0` keeps a Q6_K one row-major (the same arithmetic, so the same bits: an A/B
/// of the layouts). On a Zen 4 its 16-row groups once streamed from memory at a third of the
/// rows' speed (2026-11-28, 5d3fdf7, which kept it row-major there); the cause was the kernel's
/// order of reading a group, and asking ahead for lines the Zen 4 fetched better alone
/// (`x86::avx2::asks_ahead`), and since both were mended the two layouts now decode a Llama-1B shape's 215 MB Q6_K
/// output matrix equally fast there (55.6-57.5 tok/s, 2 threads; 2026-11-28, 8a837c2).
fn logits_keep_groups(k: &Kernels) -> bool {
    k.weight != GgmlType::Q6K || crate::tuning::get().q6k_groups
}

/// [`repacking`] for a matrix whose products feed no later quantization, the output (logits)
/// matrix: the same layout, but the 32-element formats' groups sum each block's whole integer
/// dot before one conversion and one fused multiply-add ([`kquant_order::t32_dot_blocks`])
/// instead of the reference's 8 lanes. The two orders differ in the last bits of a logit;
/// inside the network such a difference flips the rounding of the next layer's quantized
/// activations and grows (see `sums_whole_blocks`), but logits go only to the sampler. It
/// costs one conversion and one multiply-add per block and row instead of 8: the
/// largest matrix of a small model's decode (Gemma-3's tied 170 MiB Q8_0) runs 1.35× faster
/// on AVX2 (Zen 1).
pub fn repacking_for_logits(
    k: &Kernels,
    rows: usize,
    n: usize,
) -> Option<(repack::RepackFn, Kernels)> {
    repacking_in(k, rows, n, true)
}

/// The layout the loader gives an output matrix of `k`'s format on this CPU (and the memory
/// plan counts): [`repacking_for_logits`]', where it pays here ([`logits_keep_groups`]).
pub fn logits_layout(k: &Kernels, rows: usize, n: usize) -> Option<(repack::RepackFn, Kernels)> {
    repacking_for_logits(k, rows, n).filter(|_| logits_keep_groups(k))
}

/// [`repacking`], in the block-sum order for the 32-element formats when `whole`.
fn repacking_in(
    k: &Kernels,
    rows: usize,
    n: usize,
    whole: bool,
) -> Option<(repack::RepackFn, Kernels)> {
    #[cfg(target_arch = "x86_64")]
    if rows >= repack::GROUP {
        let layout: repack::RepackFn = match k.weight {
            GgmlType::Q4K => repack::repack_q4k_x16,
            GgmlType::Q6K => repack::repack_q6k_x16,
            GgmlType::Q4_0 => repack::repack_nib32_x16::<false, false, false>,
            GgmlType::Q4_1 => repack::repack_nib32_x16::<true, false, false>,
            GgmlType::Q5_0 if fifth_bit_planes(k.isa) => {
                repack::repack_nib32_x16::<false, true, true>
            }
            GgmlType::Q5_1 if fifth_bit_planes(k.isa) => {
                repack::repack_nib32_x16::<true, true, true>
            }
            GgmlType::Q5_0 => repack::repack_nib32_x16::<false, true, false>,
            GgmlType::Q5_1 => repack::repack_nib32_x16::<true, true, false>,
            GgmlType::Q8_0 => repack::repack_q8_0_x16,
            GgmlType::IQ4XS => repack::repack_iq4xs_x16,
            GgmlType::MXFP4 => repack::repack_mxfp4_x16,
            _ => return None,
        };
        // The 32-element formats' kernels hold a group's row within a stack buffer.
        if k.weight.block_size() == 32 && n > 32 * x86::T32_X16_MAX_BLOCKS {
            return None;
        }
        // The tier's group gemms: in the reference's order, and in the block-sum order
        // (`sums_whole_blocks` picks). AMX: AVX-512 VNNI's kernels, and the int8 tiles for
        // whole blocks (inside the network, whole-block sums where the reference sums 8
        // lanes flip near-ties that the golden checks catch: random-llama-q5_0 on a Sapphire
        // Rapids, top-1 140/141, greedy 3/5; 2026-11-27, 58292de).
        type ByType = fn(GgmlType) -> Option<GemmFn>;
        let (group, blocks): (ByType, ByType) = match k.isa {
            Isa::Amx => (x86::groups_vnni::group_gemm, x86::groups_amx::block_gemm),
            Isa::Avx512Vnni => (x86::groups_vnni::group_gemm, x86::groups_vnni::block_gemm),
            Isa::Avx512 => (
                x86::groups_avx512::group_gemm,
                x86::groups_avx512::block_gemm,
            ),
            Isa::Avx2 => (x86::groups_avx2::group_gemm, x86::groups_avx2::block_gemm),
            Isa::Scalar | Isa::Neon => return None,
        };
        let gemm: GemmFn = match (k.isa, k.weight) {
            (Isa::Avx512Vnni | Isa::Amx, GgmlType::Q6K) => x86::gemm_q6k_x16,
            (Isa::Avx512Vnni | Isa::Amx, GgmlType::IQ4XS) => x86::gemm_iq4xs_x16,
            // MXFP4 sums whole blocks in every layout, as the reference does.
            (Isa::Avx512Vnni | Isa::Amx, GgmlType::MXFP4) => x86::gemm_mxfp4_x16,
            (Isa::Avx512, GgmlType::MXFP4) => x86::gemm_mxfp4_x16_avx512,
            (Isa::Avx2, GgmlType::MXFP4) => x86::gemm_mxfp4_x16_avx2,
            (isa, ty) if sums_whole_blocks(isa, ty, whole) => blocks(ty)?,
            (_, ty) => group(ty)?,
        };
        let kernels = Kernels {
            gemm,
            group: repack::GROUP,
            ..*k
        };
        return Some((layout, kernels));
    }
    let _ = (k, rows, n, whole);
    None
}

/// Whether `isa`'s repacked Q5_0 and Q5_1 groups keep their fifth bits as bit planes
/// ([`repack::Nib32::planes`]): the tiers that read a group 8 rows at a time (AVX2, and AVX-512
/// without VNNI), where a lane's bits then take one shift instead of a byte shuffle. AVX-512
/// VNNI and AMX read one 64-bit mask per lane.
pub fn fifth_bit_planes(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512)
}

/// Whether `isa`'s repacked groups of the 32-element format `ty` sum each block's whole integer
/// dot ([`kquant_order::t32_dot_blocks`]) instead of the reference's 8 lanes
/// ([`kquant_order::t32_dot_lanes`]): Q4_0's on every x86 tier, where this is the reference
/// engine's own arithmetic (from AVX2 up it rearranges Q4_0 matrices at load and sums whole
/// blocks over them; on AMX, a tile product); with `logits` ([`repacking_for_logits`]), every
/// x86 tier's for every 32-element format. Plain rows keep the 8 lanes, as the reference's
/// plain dot does.
pub fn sums_whole_blocks(isa: Isa, ty: GgmlType, logits: bool) -> bool {
    ty.block_size() == 32
        && match isa {
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => logits || ty == GgmlType::Q4_0,
            Isa::Scalar | Isa::Neon => false,
        }
}

/// Stack a repacked-group kernel uses for a batch (its decoded weights), at most.
#[cfg(target_arch = "x86_64")]
pub const GROUP_KERNEL_STACK_BYTES: usize = x86::GROUP_KERNEL_STACK_BYTES;
/// Stack a repacked-group kernel uses for a batch (none: no repacked layouts here).
#[cfg(not(target_arch = "x86_64"))]
pub const GROUP_KERNEL_STACK_BYTES: usize = 0;

/// The matrix `data` in the [`repacking`] layout, with its kernels, in one go (tests and
/// benchmarks; the loader repacks a run of rows at a time).
pub fn repacked(k: &Kernels, data: &[u8], rows: usize, n: usize) -> Option<(Vec<u8>, Kernels)> {
    repacked_by(repacking(k, rows, n), data, rows, n)
}

/// The matrix `data` rearranged by `choice` (a layout and its kernels, from [`repacking`] or
/// [`repacking_for_logits`]), if there is one.
pub fn repacked_by(
    choice: Option<(repack::RepackFn, Kernels)>,
    data: &[u8],
    rows: usize,
    n: usize,
) -> Option<(Vec<u8>, Kernels)> {
    let (layout, kernels) = choice?;
    let mut out = vec![0u8; data.len()];
    layout(data, rows, n, &mut out);
    Some((out, kernels))
}

/// The activation format a weight format is multiplied with (ggml's `vec_dot_type`).
pub fn dot_type(weight: GgmlType) -> GgmlType {
    match weight {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => {
            GgmlType::Q8_0
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
        types::super_block_types!() => GgmlType::Q8K,
    }
}

/// `$e` with the type `$B` standing for the block type of format `$ty`: one `match` over every
/// format.
macro_rules! per_format {
    ($ty:expr, |$B:ident| $e:expr) => {
        match $ty {
            GgmlType::F32 => {
                type $B = F32Le;
                $e
            }
            GgmlType::F16 => {
                type $B = F16Le;
                $e
            }
            GgmlType::BF16 => {
                type $B = Bf16Le;
                $e
            }
            GgmlType::Q4_0 => {
                type $B = BlockQ4_0;
                $e
            }
            GgmlType::Q4_1 => {
                type $B = BlockQ4_1;
                $e
            }
            GgmlType::Q5_0 => {
                type $B = BlockQ5_0;
                $e
            }
            GgmlType::Q5_1 => {
                type $B = BlockQ5_1;
                $e
            }
            GgmlType::Q8_0 => {
                type $B = BlockQ8_0;
                $e
            }
            GgmlType::Q8_1 => {
                type $B = BlockQ8_1;
                $e
            }
            GgmlType::Q2K => {
                type $B = BlockQ2K;
                $e
            }
            GgmlType::Q3K => {
                type $B = BlockQ3K;
                $e
            }
            GgmlType::Q4K => {
                type $B = BlockQ4K;
                $e
            }
            GgmlType::Q5K => {
                type $B = BlockQ5K;
                $e
            }
            GgmlType::Q6K => {
                type $B = BlockQ6K;
                $e
            }
            GgmlType::Q8K => {
                type $B = BlockQ8K;
                $e
            }
            GgmlType::IQ4NL => {
                type $B = BlockIq4Nl;
                $e
            }
            GgmlType::IQ4XS => {
                type $B = BlockIq4Xs;
                $e
            }
            GgmlType::MXFP4 => {
                type $B = BlockMxfp4;
                $e
            }
            GgmlType::IQ2XXS => {
                type $B = BlockIq2Xxs;
                $e
            }
            GgmlType::IQ2XS => {
                type $B = BlockIq2Xs;
                $e
            }
            GgmlType::IQ2S => {
                type $B = BlockIq2S;
                $e
            }
            GgmlType::IQ3XXS => {
                type $B = BlockIq3Xxs;
                $e
            }
            GgmlType::IQ3S => {
                type $B = BlockIq3S;
                $e
            }
            GgmlType::IQ1S => {
                type $B = BlockIq1S;
                $e
            }
            GgmlType::IQ1M => {
                type $B = BlockIq1M;
                $e
            }
        }
    };
}

/// The best kernels for this CPU.
pub fn kernels(weight: GgmlType) -> Result<Kernels, QuantError> {
    kernels_for(weight, Isa::detect())
}

/// The kernels of one instruction-set tier (tests use this to force a path).
/// Errors if the CPU lacks the tier or the format is activation-only (Q8_1, Q8_K).
pub fn kernels_for(weight: GgmlType, isa: Isa) -> Result<Kernels, QuantError> {
    if weight.is_internal() {
        return Err(QuantError::Unsupported {
            ty: weight,
            op: "weight kernels",
        });
    }
    if !isa.is_available() || !isa.has_kernels() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let scalar = scalar_kernels(weight);
    Ok(match isa {
        Isa::Scalar => scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => x86::kernels(scalar, isa),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::kernels(scalar),
        #[allow(unreachable_patterns)]
        _ => return Err(QuantError::IsaUnavailable(isa)),
    })
}

fn scalar_kernels(weight: GgmlType) -> Kernels {
    macro_rules! k {
        ($w:ty, $quant:expr) => {
            Kernels {
                weight,
                act: dot_type(weight),
                isa: Isa::Scalar,
                vec_dot: vec_dot_scalar::<$w>,
                gemm: gemm_scalar::<$w>,
                quantize_act: $quant,
                dequantize: dequant_bytes::<$w>,
                group: 1,
            }
        };
        // A block format: its dot in [`kquant_order`]'s arithmetic.
        ($w:ty, $quant:expr, $tag:literal) => {
            Kernels {
                vec_dot: vec_dot_ordered::<$tag>,
                gemm: gemm_ordered::<$tag>,
                ..k!($w, $quant)
            }
        };
    }
    let k8k = quantize_bytes::<BlockQ8K>;
    match weight {
        GgmlType::F32 => k!(F32Le, quantize_bytes::<F32Le>),
        GgmlType::F16 => k!(F16Le, quantize_bytes::<F16Le>),
        GgmlType::BF16 => k!(Bf16Le, quantize_bytes::<Bf16Le>),
        GgmlType::Q4_0 => k!(BlockQ4_0, quantize_q8_0_act_bytes, 0),
        GgmlType::Q4_1 => k!(BlockQ4_1, quantize_q8_1_act_bytes, 1),
        GgmlType::Q5_0 => k!(BlockQ5_0, quantize_q8_0_act_bytes, 2),
        GgmlType::Q5_1 => k!(BlockQ5_1, quantize_q8_1_act_bytes, 3),
        GgmlType::Q8_0 => k!(BlockQ8_0, quantize_q8_0_act_bytes, 4),
        GgmlType::Q2K => k!(BlockQ2K, k8k, 5),
        GgmlType::Q3K => k!(BlockQ3K, k8k, 6),
        GgmlType::Q4K => k!(BlockQ4K, k8k, 7),
        GgmlType::Q5K => k!(BlockQ5K, k8k, 8),
        GgmlType::Q6K => k!(BlockQ6K, k8k, 9),
        GgmlType::IQ4NL => k!(BlockIq4Nl, quantize_q8_0_act_bytes, 10),
        GgmlType::IQ4XS => k!(BlockIq4Xs, k8k, 11),
        GgmlType::MXFP4 => k!(BlockMxfp4, quantize_q8_0_act_bytes, 12),
        GgmlType::IQ2XXS => k!(BlockIq2Xxs, k8k, 13),
        GgmlType::IQ2XS => k!(BlockIq2Xs, k8k, 14),
        GgmlType::IQ2S => k!(BlockIq2S, k8k, 15),
        GgmlType::IQ3XXS => k!(BlockIq3Xxs, k8k, 16),
        GgmlType::IQ3S => k!(BlockIq3S, k8k, 17),
        GgmlType::IQ1S => k!(BlockIq1S, k8k, 18),
        GgmlType::IQ1M => k!(BlockIq1M, k8k, 19),
        GgmlType::Q8_1 | GgmlType::Q8K => unreachable!("activation-only formats are rejected"),
    }
}

/// The block formats, whose scalar kernels are [`kquant_order`]'s definitions (so the scalar
/// tier adds in the order of every other tier), indexed by a const-generic tag.
const ORDERED: [GgmlType; 20] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
];

/// A single row: the reference's decode path (one activation row).
fn vec_dot_ordered<const TAG: usize>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let ty = ORDERED[TAG];
    let act = dot_type(ty);
    assert!(
        x.len() >= act.row_bytes(n).expect("whole blocks"),
        "short activation row"
    );
    assert!(
        w.len() >= ty.row_bytes(n).expect("whole blocks"),
        "short weight row"
    );
    kquant_order::row_dot(ty, w, x, n, 1, 0).expect("a block format")
}

/// A batch of `nx` rows, each computed the way the reference computes that row of the batch.
fn gemm_ordered<const TAG: usize>(g: GemmArgs) {
    let ty = ORDERED[TAG];
    let row_w = ty.row_bytes(g.n).expect("whole blocks");
    let row_x = dot_type(ty).row_bytes(g.n).expect("whole blocks");
    gemm_rows(g, row_w, row_x, |n, w, x, nx, j| {
        kquant_order::row_dot(ty, &w[..row_w], x, n, nx, j).expect("a block format")
    });
}

/// Every dot of a gemm call through `dot(n, weight row, activation row, nx, j)` (the weight row
/// from its start to the buffer's end, the activation row `row_x` bytes), after
/// [`GemmArgs::check`].
fn gemm_rows(
    g: GemmArgs,
    row_w: usize,
    row_x: usize,
    dot: impl Fn(usize, &[u8], &[u8], usize, usize) -> f32,
) {
    g.check(row_w, row_x);
    if g.nw == 0 {
        return;
    }
    for j in 0..g.nx {
        let xr = &g.x[j * g.x_stride..j * g.x_stride + row_x];
        for i in 0..g.nw {
            g.out[j * g.out_stride + i] = dot(g.n, &g.w[i * g.w_stride..], xr, g.nx, j);
        }
    }
}

/// Blocks `[0, n / B::BLOCK)` of a byte row. Panics on a caller bug (short buffer, ragged n):
/// the model checks tensor shapes when it loads, so this never sees file data unchecked.
fn row_blocks<B: RawBlock>(bytes: &[u8], n: usize, block: usize) -> &[B] {
    assert!(
        n.is_multiple_of(block),
        "row of {n} elements is not a whole number of {block}-blocks"
    );
    let len = n / block * size_of::<B>();
    cast::<B>(&bytes[..len]).expect("whole blocks")
}

fn vec_dot_scalar<B: BlockFormat>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let w = row_blocks::<B>(w, n, B::BLOCK);
    let x = row_blocks::<B::Dot>(x, n, B::BLOCK);
    B::vec_dot_ref(w, x)
}

fn gemm_scalar<B: BlockFormat>(g: GemmArgs) {
    let row_w = g.n / B::BLOCK * size_of::<B>();
    let row_x = g.n / B::BLOCK * size_of::<B::Dot>();
    gemm_rows(g, row_w, row_x, |n, w, x, _, _| {
        vec_dot_scalar::<B>(n, w, x)
    });
}

fn dequant_bytes<B: BlockFormat>(src: &[u8], out: &mut [f32]) {
    let blocks = row_blocks::<B>(src, out.len(), B::BLOCK);
    B::dequantize(blocks, out);
}

fn quantize_bytes<B: Quantize>(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(B::BLOCK),
        "row is not a whole number of blocks"
    );
    let len = x.len() / B::BLOCK * size_of::<B>();
    let blocks = cast_mut::<B>(&mut out[..len]).expect("whole blocks");
    B::quantize(x, blocks);
}

fn quantize_q8_0_act_bytes(x: &[f32], out: &mut [u8]) {
    act_bytes(reference::quantize_q8_0_act, x, out)
}

fn quantize_q8_1_act_bytes(x: &[f32], out: &mut [u8]) {
    act_bytes(reference::quantize_q8_1_act, x, out)
}

/// The activation quantizer `quantize` of a 32-element format `B` on a row, into bytes.
fn act_bytes<B: RawBlock>(quantize: fn(&[f32], &mut [B]), x: &[f32], out: &mut [u8]) {
    let len = x.len() / QK * size_of::<B>();
    assert!(
        x.len().is_multiple_of(QK),
        "row is not a whole number of blocks"
    );
    quantize(x, cast_mut(&mut out[..len]).expect("whole blocks"));
}

/// Check `n` elements are whole blocks of `ty` and `bytes` is exactly their size.
fn check_row(ty: GgmlType, what: &'static str, n: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = ty.row_bytes(n).ok_or(QuantError::NotBlockMultiple {
        ty,
        n,
        block: ty.block_size(),
    })?;
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            what,
            got: bytes,
            expected,
            n,
        });
    }
    Ok(())
}

/// Scalar reference dequantization of one row (`out.len()` elements) of any format.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_row(ty, "source", out.len(), src.len())?;
    let f: DequantFn = per_format!(ty, |B| dequant_bytes::<B>);
    f(src, out);
    Ok(())
}

/// Scalar reference quantization of one row: ggml's `quantize_row_*_ref` for Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K, and `quantize_iq4_nl` / `quantize_iq4_xs` without
/// weights for IQ4_NL and IQ4_XS, `quantize_row_mxfp4_ref` for MXFP4 (the model-file quantizers `llama-quantize` runs when it
/// has no importance matrix; the output is byte-identical to theirs), and plain conversion for
/// F32/F16/BF16. A row that is not a whole number of blocks (32 elements, or 256 for the
/// K-quants) is refused with [`QuantError::NotBlockMultiple`]. `quantize_iq3_xxs` /
/// `quantize_iq3_s` without weights for IQ3_XXS and IQ3_S; IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and
/// IQ1_M, which ggml quantizes only with an importance matrix, are refused with
/// [`QuantError::Unsupported`].
/// Activations for a matmul should use [`Kernels::quantize_act`] instead, which follows ggml's
/// CPU backend (for Q8_0/Q8_1 it rounds ties to even; see [`reference::quantize_q8_0_act`]).
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_row(ty, "destination", x.len(), out.len())?;
    let f: QuantizeFn = match ty {
        GgmlType::F32 => quantize_bytes::<F32Le>,
        GgmlType::F16 => quantize_bytes::<F16Le>,
        GgmlType::BF16 => quantize_bytes::<Bf16Le>,
        GgmlType::Q4_0 => quantize_bytes::<BlockQ4_0>,
        GgmlType::Q4_1 => quantize_bytes::<BlockQ4_1>,
        GgmlType::Q5_0 => quantize_bytes::<BlockQ5_0>,
        GgmlType::Q5_1 => quantize_bytes::<BlockQ5_1>,
        GgmlType::Q8_0 => quantize_bytes::<BlockQ8_0>,
        GgmlType::Q8_1 => quantize_bytes::<BlockQ8_1>,
        GgmlType::Q8K => quantize_bytes::<BlockQ8K>,
        GgmlType::Q2K => quantize_bytes::<BlockQ2K>,
        GgmlType::Q3K => quantize_bytes::<BlockQ3K>,
        GgmlType::Q4K => quantize_bytes::<BlockQ4K>,
        GgmlType::Q5K => quantize_bytes::<BlockQ5K>,
        GgmlType::Q6K => quantize_bytes::<BlockQ6K>,
        GgmlType::IQ4NL => quantize_bytes::<BlockIq4Nl>,
        GgmlType::IQ4XS => quantize_bytes::<BlockIq4Xs>,
        GgmlType::MXFP4 => quantize_bytes::<BlockMxfp4>,
        GgmlType::IQ3XXS => quantize_bytes::<BlockIq3Xxs>,
        GgmlType::IQ3S => quantize_bytes::<BlockIq3S>,
        GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S | GgmlType::IQ1S | GgmlType::IQ1M => {
            return Err(QuantError::Unsupported {
                ty,
                op: "quantizer",
            })
        }
    };
    f(x, out);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
