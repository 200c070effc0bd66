// Prompt-sized matrix products: the weight rows are dequantized to bf16 into a scratch buffer,
// the activations converted to bf16, and cuBLAS multiplies them on the tensor cores with f32
// accumulation (step.rs). bf16 keeps f32's range, so large activations cannot overflow; its 8
// bits of mantissa are as fine as the CPU's 8-bit activations. F32 and F16 weights, which bf16
// would round, multiply in f32 (F16 rows widened exactly a chunk at a time). On the software
// GPU (no cuBLAS) `gemm_bf16` and `gemm_f32` below do the products.

// f32 → bf16, rounding to nearest even.
__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ float bf2f(u16 v) { return u2f(((u32)v) << 16); }

extern "C" __global__ void f32_to_bf16(const float* x, u16* y, long n) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(x[i]);
}

// Rows `[r0, r0 + n / cols)` of W (`cols` per row, G groups of 32 in all) to bf16
// `[n / cols, cols]`.
#define DEQUANT_BF16(NAME, ELEMS, DQ)                                                         \
    extern "C" __global__ void NAME(const u8* w, u16* out, int cols, long r0, long n,        \
                                    long G) {                                                 \
        pdl_begin();                                                                         \
        long i = (long)blockIdx.x * blockDim.x + threadIdx.x;                                 \
        if (i >= n) return;                                                                   \
        long e = r0 * cols + i;                                                               \
        out[i] = f2bf(DQ(w, e / ELEMS, G, (int)(e % ELEMS)));                                 \
    }

DEQUANT_BF16(dequant_bf16_q4_0, 32, (dq_file<Q4_0_BYTES, dq_q4_0>))
DEQUANT_BF16(dequant_bf16_q4_1, 32, (dq_file<Q4_1_BYTES, dq_q4_1>))
DEQUANT_BF16(dequant_bf16_q5_0, 32, (dq_file<Q5_0_BYTES, dq_q5_0>))
DEQUANT_BF16(dequant_bf16_q5_1, 32, (dq_file<Q5_1_BYTES, dq_q5_1>))
DEQUANT_BF16(dequant_bf16_q8_0, 32, (dq_file<Q8_0_BYTES, dq_q8_0>))
DEQUANT_BF16(dequant_bf16_q2_k, 256, (dq_file<Q2_K_BYTES, dq_q2_k>))
DEQUANT_BF16(dequant_bf16_q3_k, 256, (dq_file<Q3_K_BYTES, dq_q3_k>))
DEQUANT_BF16(dequant_bf16_q4_k, 256, (dq_file<Q4_K_BYTES, dq_q4_k>))
DEQUANT_BF16(dequant_bf16_q5_k, 256, (dq_file<Q5_K_BYTES, dq_q5_k>))
DEQUANT_BF16(dequant_bf16_q6_k, 256, (dq_file<Q6_K_BYTES, dq_q6_k>))
DEQUANT_BF16(dequant_bf16_bf16, 1, (dq_file<2, dq_bf16>))

// The non-linear formats (blocks.cuh, on tables.rs's tables).
DEQUANT_BF16(dequant_bf16_iq4_nl, 32, (dq_file<IQ4_NL_BYTES, dq_iq4_nl>))
DEQUANT_BF16(dequant_bf16_mxfp4, 32, (dq_file<MXFP4_BYTES, dq_mxfp4>))
DEQUANT_BF16(dequant_bf16_iq4_xs, 256, (dq_file<IQ4_XS_BYTES, dq_iq4_xs>))
DEQUANT_BF16(dequant_bf16_iq2_xxs, 256, (dq_file<IQ2_XXS_BYTES, dq_iq2_xxs>))
DEQUANT_BF16(dequant_bf16_iq2_xs, 256, (dq_file<IQ2_XS_BYTES, dq_iq2_xs>))
DEQUANT_BF16(dequant_bf16_iq2_s, 256, (dq_file<IQ2_S_BYTES, dq_iq2_s>))
DEQUANT_BF16(dequant_bf16_iq3_xxs, 256, (dq_file<IQ3_XXS_BYTES, dq_iq3_xxs>))
DEQUANT_BF16(dequant_bf16_iq3_s, 256, (dq_file<IQ3_S_BYTES, dq_iq3_s>))
DEQUANT_BF16(dequant_bf16_iq1_s, 256, (dq_file<IQ1_S_BYTES, dq_iq1_s>))
DEQUANT_BF16(dequant_bf16_iq1_m, 256, (dq_file<IQ1_M_BYTES, dq_iq1_m>))

// The formats rearranged at upload.
DEQUANT_BF16(dequant_bf16_q4_0r, 32, dq_q4_0r)
DEQUANT_BF16(dequant_bf16_q4_1r, 32, dq_q4_1r)
DEQUANT_BF16(dequant_bf16_q5_0r, 32, dq_q5_0r)
DEQUANT_BF16(dequant_bf16_q5_1r, 32, dq_q5_1r)
DEQUANT_BF16(dequant_bf16_q8_0r, 32, dq_q8_0r)
DEQUANT_BF16(dequant_bf16_q6_kr, 256, dq_q6_kr)

// Rows `[r0, r0 + n / cols)` of an F16 matrix to f32 `[n / cols, cols]` (exact).
extern "C" __global__ void widen_f16(const u8* w, float* out, int cols, long r0, long n,
                                     long) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = h2f(ld16(w + (r0 * cols + i) * 2));
}

// y[t][r] (row stride ldy) = Σ_c w[r][c] · x[t][c], operands of type T read by F, f32 sums:
// what cuBLAS computes in step.rs, one thread per output, for the software GPU.
template <typename T, float (*F)(T)>
__device__ __forceinline__ void gemm_naive(const T* w, const T* x, float* y, int rows, int cols,
                                           int n_tok, int ldy) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * n_tok) return;
    int t = (int)(i / rows), r = (int)(i % rows);
    float acc = 0.0f;
    for (int c = 0; c < cols; ++c) acc += F(w[(long)r * cols + c]) * F(x[(long)t * cols + c]);
    y[(long)t * ldy + r] = acc;
}

__device__ __forceinline__ float f32_id(float v) { return v; }

extern "C" __global__ void gemm_bf16(const u16* w, const u16* x, float* y, int rows, int cols,
                                     int n_tok, int ldy) {
    gemm_naive<u16, bf2f>(w, x, y, rows, cols, n_tok, ldy);
}

extern "C" __global__ void gemm_f32(const float* w, const float* x, float* y, int rows, int cols,
                                    int n_tok, int ldy) {
    gemm_naive<float, f32_id>(w, x, y, rows, cols, n_tok, ldy);
}
