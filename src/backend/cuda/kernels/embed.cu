// Embedding rows: out[r] = row ids[r] of the matrix (G groups of 32 in all), dequantized,
// times `scale`; plus row pos[r] of a learned position matrix (uploaded as f32) when given.
// One block per row.

#define EMBED(NAME, BYTES, ELEMS, DQ)                                                         \
    extern "C" __global__ void NAME(const u8* w, const int* ids, float* out, int cols,       \
                                    float scale, const float* pos_embd, const int* pos,      \
                                    long G) {                                                 \
        pdl_begin();                                                                         \
        const u8* row = w + (long)ids[blockIdx.x] * (cols / ELEMS) * BYTES;                   \
        float* o = out + (long)blockIdx.x * cols;                                             \
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {                               \
            float v = DQ(row + (c / ELEMS) * BYTES, c % ELEMS) * scale;                      \
            if (pos_embd) v += pos_embd[(long)pos[blockIdx.x] * cols + c];                    \
            o[c] = v;                                                                         \
        }                                                                                     \
    }

EMBED(embed_f32, 4, 1, dq_f32)
EMBED(embed_f16, 2, 1, dq_f16)
EMBED(embed_bf16, 2, 1, dq_bf16)
EMBED(embed_q4_0, Q4_0_BYTES, 32, dq_q4_0)
EMBED(embed_q4_1, Q4_1_BYTES, 32, dq_q4_1)
EMBED(embed_q5_0, Q5_0_BYTES, 32, dq_q5_0)
EMBED(embed_q5_1, Q5_1_BYTES, 32, dq_q5_1)
EMBED(embed_q8_0, Q8_0_BYTES, 32, dq_q8_0)
EMBED(embed_q2_k, Q2_K_BYTES, 256, dq_q2_k)
EMBED(embed_q3_k, Q3_K_BYTES, 256, dq_q3_k)
EMBED(embed_q4_k, Q4_K_BYTES, 256, dq_q4_k)
EMBED(embed_q5_k, Q5_K_BYTES, 256, dq_q5_k)
EMBED(embed_q6_k, Q6_K_BYTES, 256, dq_q6_k)

// The formats rearranged at upload (blocks.cuh `dq_*r`, blocks of ELEMS; G groups of 32).
#define EMBED_R(NAME, ELEMS, DQ)                                                              \
    extern "C" __global__ void NAME(const u8* w, const int* ids, float* out, int cols,       \
                                    float scale, const float* pos_embd, const int* pos,      \
                                    long G) {                                                 \
        pdl_begin();                                                                         \
        long b0 = (long)ids[blockIdx.x] * (cols / ELEMS), nb = G / (ELEMS / 32);              \
        float* o = out + (long)blockIdx.x * cols;                                             \
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {                               \
            float v = DQ(w, b0 + c / ELEMS, nb, c % ELEMS) * scale;                          \
            if (pos_embd) v += pos_embd[(long)pos[blockIdx.x] * cols + c];                    \
            o[c] = v;                                                                         \
        }                                                                                     \
    }

EMBED_R(embed_q4_0r, 32, dq_q4_0r)
EMBED_R(embed_q4_1r, 32, dq_q4_1r)
EMBED_R(embed_q5_0r, 32, dq_q5_0r)
EMBED_R(embed_q5_1r, 32, dq_q5_1r)
EMBED_R(embed_q8_0r, 32, dq_q8_0r)
EMBED_R(embed_q6_kr, 256, dq_q6_kr)
