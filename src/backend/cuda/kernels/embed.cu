// Embedding rows: out[r] = row ids[r] of the matrix (G groups of 32 in all), dequantized,
// times `scale`; plus row pos[r] of a learned position matrix (uploaded as f32) when given.
// One block per row. DQ is a dequantizer of blocks of ELEMS elements with the rearranged
// layouts' signature (blocks.cuh `dq_*r`; the file's through common.cuh `dq_file`).

#define EMBED(NAME, ELEMS, DQ)                                                                \
    extern "C" __global__ void NAME(const u8* w, const int* ids, float* out, int cols,       \
                                    float scale, const float* pos_embd, const int* pos,      \
                                    long G) {                                                 \
        pdl_begin();                                                                         \
        long b0 = (long)ids[blockIdx.x] * (cols / ELEMS);                                     \
        float* o = out + (long)blockIdx.x * cols;                                             \
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {                               \
            float v = DQ(w, b0 + c / ELEMS, G, c % ELEMS) * scale;                           \
            if (pos_embd) v += pos_embd[(long)pos[blockIdx.x] * cols + c];                    \
            o[c] = v;                                                                         \
        }                                                                                     \
    }

EMBED(embed_f32, 1, (dq_file<4, dq_f32>))
EMBED(embed_f16, 1, (dq_file<2, dq_f16>))
EMBED(embed_bf16, 1, (dq_file<2, dq_bf16>))
EMBED(embed_q4_0, 32, (dq_file<Q4_0_BYTES, dq_q4_0>))
EMBED(embed_q4_1, 32, (dq_file<Q4_1_BYTES, dq_q4_1>))
EMBED(embed_q5_0, 32, (dq_file<Q5_0_BYTES, dq_q5_0>))
EMBED(embed_q5_1, 32, (dq_file<Q5_1_BYTES, dq_q5_1>))
EMBED(embed_q8_0, 32, (dq_file<Q8_0_BYTES, dq_q8_0>))
EMBED(embed_q2_k, 256, (dq_file<Q2_K_BYTES, dq_q2_k>))
EMBED(embed_q3_k, 256, (dq_file<Q3_K_BYTES, dq_q3_k>))
EMBED(embed_q4_k, 256, (dq_file<Q4_K_BYTES, dq_q4_k>))
EMBED(embed_q5_k, 256, (dq_file<Q5_K_BYTES, dq_q5_k>))
EMBED(embed_q6_k, 256, (dq_file<Q6_K_BYTES, dq_q6_k>))

// The non-linear formats (blocks.cuh, on tables.rs's tables).
EMBED(embed_iq4_nl, 32, (dq_file<IQ4_NL_BYTES, dq_iq4_nl>))
EMBED(embed_mxfp4, 32, (dq_file<MXFP4_BYTES, dq_mxfp4>))
EMBED(embed_iq4_xs, 256, (dq_file<IQ4_XS_BYTES, dq_iq4_xs>))
EMBED(embed_iq2_xxs, 256, (dq_file<IQ2_XXS_BYTES, dq_iq2_xxs>))
EMBED(embed_iq2_xs, 256, (dq_file<IQ2_XS_BYTES, dq_iq2_xs>))
EMBED(embed_iq2_s, 256, (dq_file<IQ2_S_BYTES, dq_iq2_s>))
EMBED(embed_iq3_xxs, 256, (dq_file<IQ3_XXS_BYTES, dq_iq3_xxs>))
EMBED(embed_iq3_s, 256, (dq_file<IQ3_S_BYTES, dq_iq3_s>))
EMBED(embed_iq1_s, 256, (dq_file<IQ1_S_BYTES, dq_iq1_s>))
EMBED(embed_iq1_m, 256, (dq_file<IQ1_M_BYTES, dq_iq1_m>))

// The formats rearranged at upload.
EMBED(embed_q4_0r, 32, dq_q4_0r)
EMBED(embed_q4_1r, 32, dq_q4_1r)
EMBED(embed_q5_0r, 32, dq_q5_0r)
EMBED(embed_q5_1r, 32, dq_q5_1r)
EMBED(embed_q8_0r, 32, dq_q8_0r)
EMBED(embed_q6_kr, 256, dq_q6_kr)
