//! The CUDA backend's driver layer (the only place besides kernels and the mmap layer where
//! `unsafe` lives for the GPU).
//!
//! libcuda and libnvrtc are loaded at run time (`cudarc` with dynamic loading), so one binary
//! builds and runs everywhere: without a driver, [`open`] refuses `--device cuda` with one
//! line. Kernels are CUDA C files in `kernels/`, compiled at first use by NVRTC for the GPU
//! present and cached on disk by hash ([`nvrtc`]).
//!
//! - [`gpu`]: context, stream, kernels, typed launches, counted allocations;
//! - [`pinned`]: page-locked host memory, copies between it and the device, events;
//! - [`weights`]: the model's tensors uploaded once, as the file stores them;
//! - [`tables`]: the non-linear formats' lookup tables (grids, sign masks) as C, for the
//!   kernels;
//! - [`step`]: a session's buffers and KV cache, and the seam's ops as launches, decode steps
//!   recorded as CUDA graphs.

pub mod blas;
pub mod exec;
pub mod gpu;
pub mod nvrtc;
pub mod pinned;
pub mod profile;
pub mod step;
pub mod tables;
pub mod weights;

pub use gpu::Gpu;
pub use step::{decode_rows, CudaKv, CudaSession, CudaSizes, CudaStep, MAX_GRAPH_ROWS};
pub use weights::DeviceWeights;

/// Why the GPU cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
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
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("not supported on the GPU yet: {0}")]
    Unsupported(String),
}

/// Make the software GPU (the emulator library built from [`nvrtc::emulator_source`]) this
/// process's GPU, for the tests on machines without one: `--device cuda` sessions then run
/// the CUDA backend's kernels on the host.
pub fn use_emulator(lib: &std::path::Path) -> Result<std::sync::Arc<Gpu>, CudaError> {
    let mut g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = g.as_ref().filter(|g| g.is_emulated()) {
        return Ok(gpu.clone());
    }
    let gpu = Gpu::emulated(lib)?;
    *g = Some(gpu.clone());
    Ok(gpu)
}

/// Whether libcuda can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: loading libcuda runs its initializers, as in any CUDA program; cudarc keeps the
    // library loaded for the life of the process.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The process's GPU, once opened.
static GPU: std::sync::Mutex<Option<std::sync::Arc<Gpu>>> = std::sync::Mutex::new(None);

/// Open the GPU (once per process) and build its kernels.
pub fn open() -> Result<std::sync::Arc<Gpu>, CudaError> {
    let mut g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = g.as_ref() {
        return Ok(gpu.clone());
    }
    let gpu = match Gpu::open() {
        Ok(gpu) => gpu,
        // Without a driver, `$KILN_CUDA_EMULATOR` may name the software GPU's library (the
        // tests drive the command line on it).
        Err(CudaError::NoDriver) => match &crate::tuning::get().cuda_emulator {
            Some(lib) => Gpu::emulated(lib)?,
            None => return Err(CudaError::NoDriver),
        },
        Err(e) => return Err(e),
    };
    *g = Some(gpu.clone());
    Ok(gpu)
}
