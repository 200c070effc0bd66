//! x86-64 kernels. Every function that uses AVX2/AVX-512 instructions is `#[target_feature]`
//! and is reachable only through the [`Kernels`] table built by [`kernels`], which `super`
//! calls only for a tier that [`Isa::is_available`] confirmed at run time (CPUID).
//!
//! The kernels are written once, generic over the block format and the integer-dot primitive
//! (`avx2`); each tier below instantiates them inside its own `#[target_feature]` entry
//! points, so the same source compiles to AVX2 code, to AVX-512VL code, and to AVX-512 VNNI code
//! (`vpdpbusd` / `vpdpwssd`, see `simd.rs`; its 512-bit kernels are in `avx512.rs`).
//!
//! Matrices repacked into 16-row groups (`quant::repack`) have kernels of their own: `t32_x16`
//! (the 32-element formats on VNNI, the reference's 8 lanes), `t32_x16_ymm` (the same 8 rows at a
//! time without VNNI), `t32_blocks` (whole-block sums: Q4_0 on VNNI, and the AMX tier's rows off
//! the tiles), `amx` (the AMX tier's tile products), `q4k_x16`, `q4k_x16_ymm`, `q6k_x16`, `iq4xs_x16` and
//! `mxfp4_x16` (MXFP4's layout for `t32_blocks`).

mod amx;
mod avx2;
mod avx512;
mod iq4xs_x16;
mod mxfp4_x16;
mod q4k_x16;
mod q4k_x16_ymm;
mod q6k_x16;
mod simd;
mod t32_blocks;
mod t32_x16;
mod t32_x16_ymm;

pub(crate) use t32_x16::{
    MAX_BLOCKS as T32_X16_MAX_BLOCKS, STACK_BYTES as GROUP_KERNEL_STACK_BYTES,
};

use super::{GemmArgs, GemmFn, GgmlType, Isa, Kernels, QuantizeFn};
use avx2::Gemm;

pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(super) fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
}

pub(super) fn has_avx512vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

pub(super) use amx::has_amx;

/// An AMD Zen 4 (family 25 with AVX-512): its 512-bit operations run as two 256-bit halves,
/// and its own prefetcher streams the 16-row groups faster than asking ahead by hand does
/// (`avx2::asks_ahead`).
pub(super) fn is_zen4() -> bool {
    static ZEN4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ZEN4.get_or_init(|| {
        // SAFETY: CPUID leaves 0 and 1 exist on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let (vendor, sig) = unsafe {
            (
                core::arch::x86_64::__cpuid(0),
                core::arch::x86_64::__cpuid(1),
            )
        };
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163);
        let base = (sig.eax >> 8) & 0xF;
        let family = if base == 0xF {
            base + ((sig.eax >> 20) & 0xFF)
        } else {
            base
        };
        amd && family == 0x19 && has_avx512()
    })
}

/// Generates one tier: `#[target_feature]` entry points instantiating the generic kernels with
/// the tier's integer-dot primitive, and safe wrappers that check buffer lengths first.
macro_rules! tier {
    ($name:ident, $features:literal, $idot:ty, $isa:expr) => {
        pub(super) mod $name {
            use super::avx2::{self as k, Tile};
            use super::*;

            #[target_feature(enable = $features)]
            unsafe fn vec_dot_tf<T: Tile>(n: usize, w: *const u8, x: *const u8) -> f32 {
                T::tile::<$idot, 1>(n, w, [x])[0]
            }

            #[target_feature(enable = $features)]
            unsafe fn gemm_tf<T: Tile>(g: Gemm) {
                T::gemm::<$idot>(g)
            }

            /// Row bytes of `n` elements for the weight and activation sides (panics on a
            /// ragged row: a caller bug, shapes are checked at model load).
            fn rows<T: Tile>(n: usize) -> (usize, usize) {
                assert!(
                    n % T::BLOCK == 0,
                    "row of {n} elements is not whole {}-blocks",
                    T::BLOCK
                );
                (n / T::BLOCK * T::W_BYTES, n / T::BLOCK * T::X_BYTES)
            }

            fn vec_dot<T: Tile>(n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (rw, rx) = rows::<T>(n);
                assert!(
                    w.len() >= rw && x.len() >= rx,
                    "vec_dot buffers shorter than the row"
                );
                // SAFETY: this tier was detected before its table was built; both rows hold
                // `n` elements (checked above) and the kernel reads only within them.
                unsafe { vec_dot_tf::<T>(n, w.as_ptr(), x.as_ptr()) }
            }

            pub(super) fn gemm<T: Tile>(g: GemmArgs) {
                let (rw, rx) = rows::<T>(g.n);
                g.check(rw, rx);
                // SAFETY: feature detected (see `vec_dot`); `check` verified every row touched
                // lies inside `w`, `x` and `out`.
                unsafe { gemm_tf::<T>(Gemm::of(g)) }
            }

            #[target_feature(enable = $features)]
            unsafe fn q8_01_tf(x: *const f32, y: *mut u8, nb: usize, with_sum: bool) {
                k::quantize_q8_01(x, y, nb, with_sum)
            }
            #[target_feature(enable = $features)]
            unsafe fn q8k_tf(x: *const f32, y: *mut u8, nb: usize) {
                k::quantize_q8k(x, y, nb)
            }
            #[target_feature(enable = $features)]
            unsafe fn f16_tf(x: *const f32, y: *mut u8, n: usize) {
                k::quantize_f16(x, y, n)
            }
            #[target_feature(enable = $features)]
            unsafe fn bf16_tf(x: *const f32, y: *mut u8, n: usize) {
                k::quantize_bf16(x, y, n)
            }

            /// Checks `out` holds the quantized row and returns the block count.
            fn act_blocks(x: &[f32], out: &[u8], block: usize, bytes: usize) -> usize {
                assert!(
                    x.len() % block == 0,
                    "activation row is not whole {block}-blocks"
                );
                let nb = x.len() / block;
                assert!(out.len() >= nb * bytes, "activation buffer too short");
                nb
            }

            fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
                let nb = act_blocks(x, out, 32, 34);
                // SAFETY: feature detected; `nb` blocks of input and output exist (checked).
                unsafe { q8_01_tf(x.as_ptr(), out.as_mut_ptr(), nb, false) }
            }
            fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
                let nb = act_blocks(x, out, 32, 36);
                // SAFETY: as `quantize_q8_0`.
                unsafe { q8_01_tf(x.as_ptr(), out.as_mut_ptr(), nb, true) }
            }
            fn quantize_q8k(x: &[f32], out: &mut [u8]) {
                let nb = act_blocks(x, out, 256, 292);
                // SAFETY: as `quantize_q8_0`.
                unsafe { q8k_tf(x.as_ptr(), out.as_mut_ptr(), nb) }
            }
            fn quantize_f16(x: &[f32], out: &mut [u8]) {
                let n = act_blocks(x, out, 1, 2);
                // SAFETY: as `quantize_q8_0`.
                unsafe { f16_tf(x.as_ptr(), out.as_mut_ptr(), n) }
            }
            fn quantize_bf16(x: &[f32], out: &mut [u8]) {
                let n = act_blocks(x, out, 1, 2);
                // SAFETY: as `quantize_q8_0`.
                unsafe { bf16_tf(x.as_ptr(), out.as_mut_ptr(), n) }
            }

            /// The table of this tier; `scalar` supplies the dequantizer and F32 activation copy.
            pub(in super::super) fn table(scalar: Kernels) -> Kernels {
                use k::{TIq1M, TIq1S, TIq2S, TIq2Xs, TIq2Xxs, TIq3S, TIq3Xxs};
                use k::{
                    TIq4Nl, TIq4Xs, TMxfp4, BF16, F16, F32, Q2K, Q3K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1,
                    Q6K, Q8_0, T32, TF, TK, TQ4K,
                };
                macro_rules! t {
                    ($tile:ty, $quant:expr) => {
                        Kernels {
                            isa: $isa,
                            vec_dot: vec_dot::<$tile>,
                            gemm: gemm::<$tile>,
                            quantize_act: $quant,
                            ..scalar
                        }
                    };
                }
                let copy: QuantizeFn = scalar.quantize_act;
                match scalar.weight {
                    GgmlType::F32 => t!(TF<F32>, copy),
                    GgmlType::F16 => t!(TF<F16>, quantize_f16),
                    GgmlType::BF16 => t!(TF<BF16>, quantize_bf16),
                    GgmlType::Q4_0 => t!(T32<Q4_0>, quantize_q8_0),
                    GgmlType::Q4_1 => t!(T32<Q4_1>, quantize_q8_1),
                    GgmlType::Q5_0 => t!(T32<Q5_0>, quantize_q8_0),
                    GgmlType::Q5_1 => t!(T32<Q5_1>, quantize_q8_1),
                    GgmlType::Q8_0 => t!(T32<Q8_0>, quantize_q8_0),
                    GgmlType::Q2K => t!(TK<Q2K>, quantize_q8k),
                    GgmlType::Q3K => t!(TK<Q3K>, quantize_q8k),
                    GgmlType::Q4K => t!(TQ4K, quantize_q8k),
                    GgmlType::Q5K => t!(TK<Q5K>, quantize_q8k),
                    GgmlType::Q6K => t!(TK<Q6K>, quantize_q8k),
                    GgmlType::IQ4NL => t!(TIq4Nl, quantize_q8_0),
                    GgmlType::IQ4XS => t!(TIq4Xs, quantize_q8k),
                    GgmlType::MXFP4 => t!(TMxfp4, quantize_q8_0),
                    GgmlType::IQ2XXS => t!(TIq2Xxs, quantize_q8k),
                    GgmlType::IQ2XS => t!(TIq2Xs, quantize_q8k),
                    GgmlType::IQ2S => t!(TIq2S, quantize_q8k),
                    GgmlType::IQ3XXS => t!(TIq3Xxs, quantize_q8k),
                    GgmlType::IQ3S => t!(TIq3S, quantize_q8k),
                    GgmlType::IQ1S => t!(TIq1S, quantize_q8k),
                    GgmlType::IQ1M => t!(TIq1M, quantize_q8k),
                    GgmlType::Q8_1 | GgmlType::Q8K => scalar,
                }
            }
        }
    };
}

tier!(tier_avx2, "avx2,fma,f16c", k::Maddubs, Isa::Avx2);
tier!(
    tier_avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq",
    k::Maddubs512,
    Isa::Avx512
);
tier!(
    tier_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni",
    super::simd::Vnni,
    Isa::Avx512Vnni
);

/// The kernels of `isa` for `scalar.weight`.
pub(super) fn kernels(scalar: Kernels, isa: Isa) -> Kernels {
    match isa {
        Isa::Avx2 => tier_avx2::table(scalar),
        Isa::Avx512 => tier_avx512::table(scalar),
        Isa::Avx512Vnni => tier_vnni::table(scalar),
        // AVX-512 VNNI's kernels, but for the repacked groups of the 32-element formats
        // (`repacking`: `groups_amx`).
        Isa::Amx => Kernels {
            isa: Isa::Amx,
            ..tier_vnni::table(scalar)
        },
        Isa::Scalar | Isa::Neon => scalar,
    }
}

/// A kernel over one repacked group of rows (`q4k_x16::gemm_tf`, `q6k_x16::gemm_tf`,
/// `t32_x16::gemm_tf`, `t32_x16_ymm::gemm_tf`).
type GroupKernel = unsafe fn(Gemm);

/// The gemm of a `ty` matrix repacked into 16-row groups (`quant::repack`): a tile of 16 rows
/// is one group, run by `kernel` (rows of at most `max_n` elements, on a CPU where `has()`);
/// a shorter tile is the plain rows after the last group, run by the tier's row-major `plain`.
/// Handed out only with the tier whose detection `has` repeats.
fn gemm_groups(
    kernel: GroupKernel,
    plain: GemmFn,
    has: fn() -> bool,
    ty: GgmlType,
    max_n: usize,
    g: GemmArgs,
) {
    if g.nw != super::repack::GROUP {
        return plain(g);
    }
    let (n, qk) = (g.n, ty.block_size());
    assert!(
        n.is_multiple_of(qk) && n <= max_n,
        "repacked {ty} row of {n} elements"
    );
    let blocks = n / qk;
    let (rw, rx) = (
        blocks * ty.type_size(),
        blocks * super::dot_type(ty).type_size(),
    );
    assert_eq!(g.w_stride, rw, "a repacked group is 16 consecutive rows");
    g.check(rw, rx);
    if g.nx == 0 {
        return;
    }
    assert!(has(), "repacked kernels need their tier's instructions");
    // SAFETY: the CPU has the kernel's instructions (checked); `check` verified the 16 rows
    // (one group of `n / qk` repacked blocks, `n` within the kernel's limit), the `nx`
    // activation rows and every output lie inside the buffers.
    unsafe { kernel(Gemm::of(g)) }
}

/// `$name`: a `GemmFn` running [`gemm_groups`] for format `$ty` with the group kernel
/// `$kernel` (rows of at most `$max_n` elements, on a CPU where `$has()`) and the row-major
/// tile `$plain` of tier `$tier` for the rows after the last group.
macro_rules! group_gemm {
    ($(#[$doc:meta])* $name:ident, $ty:expr, $tier:ident, $has:expr, $plain:ty, $kernel:expr, $max_n:expr) => {
        $(#[$doc])*
        pub(super) fn $name(g: GemmArgs) {
            let k: GroupKernel = $kernel;
            gemm_groups(k, $tier::gemm::<$plain>, $has, $ty, $max_n, g)
        }
    };
}

/// [`group_gemm!`] for the 32-element format `$q` (a `GgmlType` and an `avx2` format of that
/// name): rows of at most `32 · t32_x16::MAX_BLOCKS` elements, the tier's row-major `T32` tile
/// for the rows after the last group.
macro_rules! t32_gemm {
    ($name:ident, $q:ident, $tier:ident, $has:expr, $kernel:expr) => {
        group_gemm!(
            $name,
            GgmlType::$q,
            $tier,
            $has,
            avx2::T32<avx2::$q>,
            $kernel,
            32 * t32_x16::MAX_BLOCKS
        );
    };
}

/// The 32-element formats' group gemms of one tier in the block-sum order, as
/// `block_gemm(ty)` (`quant::repacking_for_logits`, and Q4_0 everywhere): kernel `$blocks::$bfn`
/// over the layouts (Q5_0 and Q5_1 as `$q5_0`, `$q5_1`), the row-major tiles of tier `$tier`
/// for the rows after the last group.
macro_rules! block_gemms {
    ($tier:ident, $has:expr, $blocks:ident::$bfn:ident, $q5_0:ty, $q5_1:ty) => {
        t32_gemm!(
            blocks_q4_0,
            Q4_0,
            $tier,
            $has,
            $blocks::$bfn::<t32_x16::Q4_0>
        );
        t32_gemm!(
            blocks_q4_1,
            Q4_1,
            $tier,
            $has,
            $blocks::$bfn::<t32_x16::Q4_1>
        );
        t32_gemm!(blocks_q5_0, Q5_0, $tier, $has, $blocks::$bfn::<$q5_0>);
        t32_gemm!(blocks_q5_1, Q5_1, $tier, $has, $blocks::$bfn::<$q5_1>);
        t32_gemm!(
            blocks_q8_0,
            Q8_0,
            $tier,
            $has,
            $blocks::$bfn::<t32_x16::Q8_0>
        );

        /// The group gemm of the 32-element format `ty` in the block-sum order.
        pub(in super::super) fn block_gemm(ty: GgmlType) -> Option<crate::quant::GemmFn> {
            Some(match ty {
                GgmlType::Q4_0 => blocks_q4_0,
                GgmlType::Q4_1 => blocks_q4_1,
                GgmlType::Q5_0 => blocks_q5_0,
                GgmlType::Q5_1 => blocks_q5_1,
                GgmlType::Q8_0 => blocks_q8_0,
                _ => return None,
            })
        }
    };
}

/// The group gemms of one tier, as `$mod::group_gemm(ty)`: the 32-element formats' kernels of
/// module `$t32` (Q5_0 and Q5_1 as the layouts `$q5_0`, `$q5_1`; Q4_0 in the block-sum order)
/// and Q4_K's `$q4k`, with the row-major tiles of tier `$tier` for the rows after the last
/// group; and the [`block_gemms!`] of `$blocks::$bfn` as `$mod::block_gemm(ty)`.
macro_rules! group_gemms {
    ($mod:ident, $tier:ident, $has:expr, $t32:ident, $blocks:ident::$bfn:ident, $q5_0:ty, $q5_1:ty, $q4k:expr) => {
        pub(super) mod $mod {
            use super::*;
            block_gemms!($tier, $has, $blocks::$bfn, $q5_0, $q5_1);
            t32_gemm!(q4_1, Q4_1, $tier, $has, $t32::gemm_tf::<t32_x16::Q4_1>);
            t32_gemm!(q5_0, Q5_0, $tier, $has, $t32::gemm_tf::<$q5_0>);
            t32_gemm!(q5_1, Q5_1, $tier, $has, $t32::gemm_tf::<$q5_1>);
            t32_gemm!(q8_0, Q8_0, $tier, $has, $t32::gemm_tf::<t32_x16::Q8_0>);
            group_gemm!(
                q4k,
                GgmlType::Q4K,
                $tier,
                $has,
                avx2::TQ4K,
                $q4k,
                usize::MAX
            );

            /// The group gemm of `ty`, if this tier repacks it.
            pub(in super::super) fn group_gemm(ty: GgmlType) -> Option<crate::quant::GemmFn> {
                Some(match ty {
                    GgmlType::Q4_0 => blocks_q4_0,
                    GgmlType::Q4_1 => q4_1,
                    GgmlType::Q5_0 => q5_0,
                    GgmlType::Q5_1 => q5_1,
                    GgmlType::Q8_0 => q8_0,
                    GgmlType::Q4K => q4k,
                    _ => return None,
                })
            }
        }
    };
}

group_gemms!(
    groups_vnni,
    tier_vnni,
    has_avx512vnni,
    t32_x16,
    t32_blocks::gemm_tf,
    t32_x16::Q5_0,
    t32_x16::Q5_1,
    q4k_x16::gemm_tf
);
/// The AMX tier's int8 tiles, which sum whole blocks: its layers otherwise take
/// [`groups_vnni`]'s kernels (`quant::repacking`).
pub(super) mod groups_amx {
    use super::*;
    block_gemms!(
        tier_vnni,
        has_amx,
        amx::gemm_tf,
        t32_x16::Q5_0,
        t32_x16::Q5_1
    );
}
group_gemm!(
    /// [`gemm_groups`] for Q6_K (AVX-512 VNNI only: read 8 rows at a time it was slower than
    /// the row-major kernel).
    gemm_q6k_x16,
    GgmlType::Q6K,
    tier_vnni,
    has_avx512vnni,
    avx2::TK<avx2::Q6K>,
    q6k_x16::gemm_tf,
    usize::MAX
);
group_gemm!(
    /// [`gemm_groups`] for IQ4_XS (AVX-512 VNNI only: its grid values shifted to unsigned bytes
    /// take `vpdpbusd` directly, 16 rows at a time).
    gemm_iq4xs_x16,
    GgmlType::IQ4XS,
    tier_vnni,
    has_avx512vnni,
    avx2::TIq4Xs,
    iq4xs_x16::gemm_tf,
    usize::MAX
);
group_gemm!(
    /// [`gemm_groups`] for MXFP4 (AVX-512 VNNI only): `t32_blocks` over the grid's bytes
    /// (`mxfp4_x16`), its rows after the last group `avx2::TMxfp4`'s; both sum whole blocks.
    gemm_mxfp4_x16,
    GgmlType::MXFP4,
    tier_vnni,
    has_avx512vnni,
    avx2::TMxfp4,
    t32_blocks::gemm_tf::<mxfp4_x16::Mxfp4>,
    32 * t32_x16::MAX_BLOCKS
);
group_gemm!(
    /// [`gemm_groups`] for MXFP4 on AVX-512 without VNNI: `t32_x16_ymm`'s block sums, 8 rows at
    /// a time.
    gemm_mxfp4_x16_avx512,
    GgmlType::MXFP4,
    tier_avx512,
    has_avx512,
    avx2::TMxfp4,
    t32_x16_ymm::gemm_blocks::<mxfp4_x16::Mxfp4>,
    32 * t32_x16::MAX_BLOCKS
);
group_gemm!(
    /// [`gemm_groups`] for MXFP4 on AVX2 (as [`gemm_mxfp4_x16_avx512`]).
    gemm_mxfp4_x16_avx2,
    GgmlType::MXFP4,
    tier_avx2,
    has_avx2,
    avx2::TMxfp4,
    t32_x16_ymm::gemm_blocks::<mxfp4_x16::Mxfp4>,
    32 * t32_x16::MAX_BLOCKS
);
group_gemms!(
    groups_avx512,
    tier_avx512,
    has_avx512,
    t32_x16_ymm,
    t32_x16_ymm::gemm_blocks,
    t32_x16_ymm::Q5_0P,
    t32_x16_ymm::Q5_1P,
    q4k_x16_ymm::gemm_q4k
);
group_gemms!(
    groups_avx2,
    tier_avx2,
    has_avx2,
    t32_x16_ymm,
    t32_x16_ymm::gemm_blocks,
    t32_x16_ymm::Q5_0P,
    t32_x16_ymm::Q5_1P,
    q4k_x16_ymm::gemm_q4k
);
