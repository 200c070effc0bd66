// Matrix products for decode-sized batches: y[t][r] = Σ_c W[r][c] · x[t][c] for `n_tok` rows
// of x (a few decode tokens), W the file's blocks. One warp per output row; its lanes take
// blocks in turn, each dequantizing its block and multiplying it by x as f32, then the warp
// sums. The weight row is read from memory once for all tokens (later tokens hit the cache).
// Prompt-sized batches will take tensor-core kernels instead.

#define MATVEC(NAME, BYTES, ELEMS, DQ)                                                        \
    extern "C" __global__ void NAME(const u8* w, const float* x, float* y, int rows,         \
                                    int cols, int n_tok) {                                    \
        int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                       \
        int lane = threadIdx.x & 31;                                                          \
        if (row >= rows) return;                                                              \
        int nb = cols / ELEMS;                                                                \
        const u8* wr = w + (long)row * nb * BYTES;                                            \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            const float* xt = x + (long)t * cols;                                             \
            float acc = 0.0f;                                                                 \
            for (int b = lane; b < nb; b += 32) {                                             \
                const u8* blk = wr + (long)b * BYTES;                                         \
                const float* xb = xt + (long)b * ELEMS;                                       \
                for (int i = 0; i < ELEMS; ++i) acc += DQ(blk, i) * xb[i];                    \
            }                                                                                 \
            acc = warp_sum(acc);                                                              \
            if (lane == 0) y[(long)t * rows + row] = acc;                                     \
        }                                                                                     \
    }

MATVEC(matvec_q4_0, Q4_0_BYTES, 32, dq_q4_0)
MATVEC(matvec_q4_1, Q4_1_BYTES, 32, dq_q4_1)
MATVEC(matvec_q5_0, Q5_0_BYTES, 32, dq_q5_0)
MATVEC(matvec_q5_1, Q5_1_BYTES, 32, dq_q5_1)
MATVEC(matvec_q8_0, Q8_0_BYTES, 32, dq_q8_0)
MATVEC(matvec_q2_k, Q2_K_BYTES, 256, dq_q2_k)
MATVEC(matvec_q3_k, Q3_K_BYTES, 256, dq_q3_k)
MATVEC(matvec_q4_k, Q4_K_BYTES, 256, dq_q4_k)
MATVEC(matvec_q5_k, Q5_K_BYTES, 256, dq_q5_k)
MATVEC(matvec_q6_k, Q6_K_BYTES, 256, dq_q6_k)

// Unquantized rows: lanes take elements in turn.
#define MATVEC_PLAIN(NAME, T, CVT)                                                            \
    extern "C" __global__ void NAME(const T* w, const float* x, float* y, int rows, int cols, \
                                    int n_tok) {                                              \
        int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                       \
        int lane = threadIdx.x & 31;                                                          \
        if (row >= rows) return;                                                              \
        const T* wr = w + (long)row * cols;                                                   \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            const float* xt = x + (long)t * cols;                                             \
            float acc = 0.0f;                                                                 \
            for (int c = lane; c < cols; c += 32) acc += CVT(wr[c]) * xt[c];                  \
            acc = warp_sum(acc);                                                              \
            if (lane == 0) y[(long)t * rows + row] = acc;                                     \
        }                                                                                     \
    }

__device__ __forceinline__ float id_f32(float v) { return v; }
__device__ __forceinline__ float bf16_bits(u16 v) { return u2f(((u32)v) << 16); }

MATVEC_PLAIN(matvec_f32, float, id_f32)
MATVEC_PLAIN(matvec_f16, u16, h2f)
MATVEC_PLAIN(matvec_bf16, u16, bf16_bits)
