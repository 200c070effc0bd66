//! The CUDA backend's driver layer (the only place besides kernels and the mmap layer where
//! `unsafe` lives for the GPU).
//!
//! libcuda and libnvrtc are loaded at run time (`cudarc` with dynamic loading), so one binary
//! builds and runs everywhere: without a driver, [`open`] refuses `--device cuda` with one
//! line. Kernels are CUDA C files in `kernels/`, compiled at first use by NVRTC for the GPU
//! present and cached on disk by hash ([`nvrtc`]).
//!
//! What exists so far: the device probe and the kernel build (every kernel compiles under
//! NVRTC in the test suite, on machines without a GPU too). The CUDA implementation of
//! [`super::Backend`] is not written yet, so [`open`] refuses on a machine with a GPU as well.

pub mod nvrtc;

/// Why the GPU cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver on this machine (libcuda.so.1 not found): --device cuda needs an NVIDIA GPU and its driver; use --device cpu")]
    NoDriver,
    #[error("NVRTC (libnvrtc.so.13) not found: it compiles kiln's CUDA kernels; install the CUDA toolkit or `pip install nvidia-cuda-nvrtc` and set KILN_NVRTC to its libnvrtc.so.13")]
    NoNvrtc,
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("kernel file {file} does not compile for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("kernel cache {path}: {reason}")]
    Cache { path: String, reason: String },
    #[error("this build of kiln has no CUDA forward pass yet (the GPU was found, but only the kernels and the backend seam exist); use --device cpu")]
    NotBuilt,
}

/// Whether libcuda can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: loading libcuda runs its initializers, as in any CUDA program; cudarc keeps the
    // library loaded for the life of the process.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Open the GPU for a forward pass.
pub fn open() -> Result<(), CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    Err(CudaError::NotBuilt)
}
