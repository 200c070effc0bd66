//! cuBLAS for prompt-sized products (the issue: "cuBLAS only where it wins"): bf16 operands on
//! the tensor cores, f32 sums; f32 operands for the weights bf16 would round. Part of the
//! driver layer: the raw calls are here, each with what makes it sound.
//!
//! One handle per process, made when the GPU is opened (loading cuBLAS takes device memory once,
//! as the context does, outside any session's plan). Each product names its session's stream
//! and workspace (a buffer of the session's activation arena), so a product allocates nothing
//! and the memory plan counts what cuBLAS uses.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaContext, CudaStream};

use super::CudaError;

/// Bytes of a session's cuBLAS workspace (what NVIDIA advises for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

fn err(e: result::CublasError) -> CudaError {
    CudaError::Driver(format!("cuBLAS: {e:?}"))
}

/// A cuBLAS handle.
pub struct Blas {
    handle: sys::cublasHandle_t,
}

// SAFETY: the GPU keeps its handle behind a mutex, so it is used from one thread at a time;
// cuBLAS handles may move between threads.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle in `ctx`. `None` without libcublas.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Option<Blas>, CudaError> {
        // SAFETY: only tries to open the library file.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        ctx.bind_to_thread()?;
        Ok(Some(Blas {
            handle: result::create_handle().map_err(err)?,
        }))
    }

    /// `y[t][r] = Σ_c w[r][c] · x[t][c]` for `r < rows`, `t < n_tok`, `c < cols`: w and x bf16
    /// (`f32`: f32, in f32 arithmetic, not TF32: the handle keeps cuBLAS's default math
    /// mode), row-major; y f32 with rows `ldy` apart; on `stream`, in `workspace`
    /// (`WORKSPACE_BYTES`).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &mut self,
        f32: bool,
        stream: &Arc<CudaStream>,
        workspace: u64,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        n_tok: usize,
        ldy: usize,
    ) -> Result<(), CudaError> {
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::Driver(format!("cuBLAS: {v} is past i32")))
        };
        let (m, n, k, ld) = (dim(rows)?, dim(n_tok)?, dim(cols)?, dim(ldy)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ab = match f32 {
            true => sys::cudaDataType::CUDA_R_32F,
            false => sys::cudaDataType::CUDA_R_16BF,
        };
        stream.context().bind_to_thread()?;
        // SAFETY: the handle is live; the stream and the workspace (device memory of
        // WORKSPACE_BYTES) outlive the product, which runs on that stream.
        unsafe {
            result::set_stream(self.handle, stream.cu_stream() as sys::cudaStream_t)
                .map_err(err)?;
            sys::cublasSetWorkspace_v2(self.handle, workspace as *mut c_void, WORKSPACE_BYTES)
                .result()
                .map_err(err)?;
        }
        // Column-major, cuBLAS's view: y (rows × n_tok, ld ldy) = wᵀ' · x, where w's row-major
        // bytes are a cols × rows column-major matrix (transposed: op T) and x's a cols × n_tok
        // one. SAFETY: the pointers address live device buffers of at least rows·cols and
        // n_tok·cols elements of `ab` and (n_tok − 1)·ldy + rows f32 (the caller's layout);
        // alpha and beta are host scalars (cuBLAS's default pointer mode).
        unsafe {
            result::gemm_ex(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                ab,
                k,
                x as *const c_void,
                ab,
                k,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                sys::cudaDataType::CUDA_R_32F,
                ld,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(err)
        }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}
