//! x86-64 kernels. Every function here that uses AVX2/AVX-512 is `#[target_feature]` and is
//! reachable only through the [`Kernels`] table built by [`kernels`], which is only called for
//! a tier [`Isa::is_available`] confirmed at run time.

use super::{Isa, Kernels};

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

/// The kernels of `isa` for `scalar.weight` (stage 1: the scalar table).
pub(super) fn kernels(scalar: Kernels, _isa: Isa) -> Kernels {
    scalar
}
