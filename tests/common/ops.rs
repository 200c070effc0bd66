//! Helpers of the CUDA op tests (`cuda_ops.rs`, `cuda_attention.rs`).

use std::sync::Arc;

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
