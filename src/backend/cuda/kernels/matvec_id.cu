#line 2 "matvec_id.cu"
// The chosen experts' products of a mixture of experts (step/moe.rs), their ids read from
// device memory (the routing kernel's output, moe.cu), so a decode step's experts need no
// copy to the host and the step records as a graph: y[p] = W[ids[p]] · x[p / x_div] for each
// (token, slot) pair p, W a stack of `stride`-byte matrices of `rows` × `cols` (the file's
// tensor, each expert rearranged on its own where the format is), the input row p / x_div
// (the token's for the gate and up products, x_div = k; the pair's own for the down ones,
// x_div = 1), plus the expert's bias row where there is one (gpt-oss), added as `add_bias_f32`
// adds it. A launch is `pairs` runs of the blocks a matvec of one matrix takes (MATVEC_Q's
// shape: `tpr` threads per row), each summing a row as `NAME##_row` does, bit for bit; the
// unquantized formats as MATVEC_PLAIN. This file continues matvec.cu and matvec_iq.cu (their
// `dot_*`), each instance complete in itself (nvrtc.rs compiles the instances in parts).

template <float (*DOT)(const u8*, int, const Q8x*, int)>
__device__ __forceinline__ void matvec_id(const u8* w, long stride, const int* ids, const u8* x,
                                          float* y, const float* bias, int rows, int cols,
                                          int n_x, int x_div, int tpr) {
    int per = blockDim.x / tpr;
    int bpm = (rows + per - 1) / per;
    int p = blockIdx.x / bpm;
    int row = (blockIdx.x % bpm) * per + threadIdx.x / tpr;
    int lane = threadIdx.x % tpr;
    pdl_begin();
    if (row >= rows) return;  // (a whole warp: tpr < blockDim.x)
    int e = ids[p];
    const u8* we = w + (long)e * stride;
    int ng = cols >> 5, G = rows * ng, g0 = row * ng;
    Q8v xt = q8_at(q8_view(x, (long)n_x * ng), (long)(p / x_div) * ng);
    float acc = 0.0f;
    KILN_UNROLL(KILN_MV_UNROLL) for (int g = lane; g < ng; g += tpr) {
        Q8x xg = ldq8(xt, g);
        acc += DOT(we, g0 + g, &xg, G);
    }
    acc = tpr == (int)blockDim.x ? row_sum(acc) : warp_sum(acc);
    if (lane == 0) y[(long)p * rows + row] = bias ? acc + bias[(long)e * rows + row] : acc;
}

// x: `n_x` rows quantized for the format (`quantize_q8_*`).
#define MATVEC_ID(NAME, DOT)                                                                  \
    extern "C" __global__ void NAME(const u8* w, long stride, const int* ids, const u8* x,    \
                                    float* y, const float* bias, int rows, int cols, int n_x, \
                                    int x_div, int tpr) {                                     \
        matvec_id<DOT>(w, stride, ids, x, y, bias, rows, cols, n_x, x_div, tpr);              \
    }

template <typename T, float (*CVT)(T)>
__device__ __forceinline__ void matvec_plain_id(const u8* w, long stride, const int* ids,
                                                const float* x, float* y, const float* bias,
                                                int rows, int cols, int x_div) {
    pdl_begin();
    int p = blockIdx.x / rows, row = blockIdx.x % rows;
    int e = ids[p];
    const T* wr = (const T*)(w + (long)e * stride) + (long)row * cols;
    const float* xt = x + (long)(p / x_div) * cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += CVT(wr[c]) * xt[c];
    acc = row_sum(acc);
    if (threadIdx.x == 0) y[(long)p * rows + row] = bias ? acc + bias[(long)e * rows + row] : acc;
}

// x: f32 rows. One block per (pair, row).
#define MATVEC_PLAIN_ID(NAME, T, CVT)                                                         \
    extern "C" __global__ void NAME(const u8* w, long stride, const int* ids, const float* x, \
                                    float* y, const float* bias, int rows, int cols,          \
                                    int x_div) {                                              \
        matvec_plain_id<T, CVT>(w, stride, ids, x, y, bias, rows, cols, x_div);               \
    }

MATVEC_ID(matvec_q4_0_id, dot_q4_0)
MATVEC_ID(matvec_q4_1_id, dot_q4_1)
MATVEC_ID(matvec_q5_0_id, dot_q5_0)
MATVEC_ID(matvec_q5_1_id, dot_q5_1)
MATVEC_ID(matvec_q8_0_id, dot_q8_0)
MATVEC_ID(matvec_q2_k_id, dot_q2_k)
MATVEC_ID(matvec_q3_k_id, dot_q3_k)
MATVEC_ID(matvec_q4_k_id, dot_q4_k)
MATVEC_ID(matvec_q5_k_id, dot_q5_k)
MATVEC_ID(matvec_q6_k_id, dot_q6_k)
MATVEC_ID(matvec_q4_0r_id, dot_q4_0r)
MATVEC_ID(matvec_q4_1r_id, dot_q4_1r)
MATVEC_ID(matvec_q5_0r_id, dot_q5_0r)
MATVEC_ID(matvec_q5_1r_id, dot_q5_1r)
MATVEC_ID(matvec_q8_0r_id, dot_q8_0r)
MATVEC_ID(matvec_q6_kr_id, dot_q6_kr)
MATVEC_ID(matvec_iq4_nl_id, dot_iq4_nl)
MATVEC_ID(matvec_mxfp4_id, dot_mxfp4)
MATVEC_ID(matvec_iq4_xs_id, dot_iq4_xs)
MATVEC_ID(matvec_iq2_xxs_id, dot_iq2_xxs)
MATVEC_ID(matvec_iq2_xs_id, dot_iq2_xs)
MATVEC_ID(matvec_iq2_s_id, dot_iq2_s)
MATVEC_ID(matvec_iq3_xxs_id, dot_iq3_xxs)
MATVEC_ID(matvec_iq3_s_id, dot_iq3_s)
MATVEC_ID(matvec_iq1_s_id, dot_iq1_s)
MATVEC_ID(matvec_iq1_m_id, dot_iq1_m)

MATVEC_PLAIN_ID(matvec_f32_id, float, id_f32)
MATVEC_PLAIN_ID(matvec_f16_id, u16, h2f)
MATVEC_PLAIN_ID(matvec_bf16_id, u16, bf16_bits)
