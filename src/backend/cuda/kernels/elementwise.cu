// Element-wise ops over `n` floats. One thread per element, grid-stride.

#define FOR_EACH(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

extern "C" __global__ void add_f32(float* dst, const float* src, long n) {
    pdl_begin();
    FOR_EACH(i, n) dst[i] += src[i];
}

extern "C" __global__ void scale_f32(float* x, float s, long n) {
    pdl_begin();
    FOR_EACH(i, n) x[i] *= s;
}

// x = tanh(x · inv) · cap, `inv` = 1 / cap computed by the host: the CPU's `softcap_inplace`
// (Gemma-2's `final_logit_softcapping` over the output logits).
extern "C" __global__ void softcap_f32(float* x, float inv, float cap, long n) {
    pdl_begin();
    FOR_EACH(i, n) x[i] = tanhf(x[i] * inv) * cap;
}

// The queries' attention temperature (Mistral-3): row r of q (`width` wide) times
// ln(⌊pos[r] / floor⌋ + 1) · scale + 1, the quotient in f32, the logarithm and the sum in f64,
// rounded to f32: the CPU's `AttnTemp::factor` (the reference's `llm_graph_input_attn_temp`).
extern "C" __global__ void attn_temp_f32(float* q, const int* pos, int width, float scale,
                                         int floor_, long n) {
    pdl_begin();
    FOR_EACH(i, n) {
        double steps = (double)floorf((float)pos[i / width] / (float)floor_);
        float f = (float)(log(steps + 1.0) * (double)scale + 1.0);
        q[i] *= f;
    }
}

// dst = src (a block without an input norm: the stream itself as the FFN's input).
extern "C" __global__ void copy_f32(float* dst, const float* src, long n) {
    pdl_begin();
    FOR_EACH(i, n) dst[i] = src[i];
}

// y[r][c] += bias[c] over `rows` rows of `cols`.
extern "C" __global__ void add_bias_f32(float* y, const float* bias, long rows, int cols) {
    pdl_begin();
    FOR_EACH(i, rows * cols) y[i] += bias[i % cols];
}

// gate = silu(gate) · up
extern "C" __global__ void swiglu_f32(float* gate, const float* up, long n) {
    pdl_begin();
    FOR_EACH(i, n) gate[i] = silu(gate[i]) * up[i];
}

// gate = gelu(gate) · up
extern "C" __global__ void geglu_f32(float* gate, const float* up, long n) {
    pdl_begin();
    FOR_EACH(i, n) gate[i] = gelu_tanh(gate[i]) * up[i];
}

extern "C" __global__ void silu_f32(float* x, long n) {
    pdl_begin();
    FOR_EACH(i, n) x[i] = silu(x[i]);
}

extern "C" __global__ void gelu_f32(float* x, long n) {
    pdl_begin();
    FOR_EACH(i, n) x[i] = gelu_tanh(x[i]);
}

// The fused QKV product's rows `[rows, q + k + v]` split into q (compacted in place is not
// possible in parallel, so into `q_out`), k and v.
extern "C" __global__ void split_qkv_f32(const float* qkv, float* q, float* k, float* v,
                                         long rows, int q_dim, int k_dim, int v_dim) {
    pdl_begin();
    int w = q_dim + k_dim + v_dim;
    FOR_EACH(i, rows * w) {
        long r = i / w;
        int c = (int)(i % w);
        if (c < q_dim) q[r * q_dim + c] = qkv[i];
        else if (c < q_dim + k_dim) k[r * k_dim + c - q_dim] = qkv[i];
        else v[r * v_dim + c - q_dim - k_dim] = qkv[i];
    }
}

// Greedy sampling on the device: the index of the largest logit of each row (the lowest index
// among equals, as the CPU's argmax). One block per row.
extern "C" __global__ void argmax_f32(const float* logits, int vocab, int* out) {
    pdl_begin();
    const float* row = logits + (long)blockIdx.x * vocab;
    float best = -KILN_INF;
    int idx = 0;
    int i = threadIdx.x, step = blockDim.x;
    // Eight loads in flight at a time, compared in index order (as one at a time).
    for (; i + 7 * step < vocab; i += 8 * step) {
        float v[8];
        for (int k = 0; k < 8; ++k) v[k] = row[i + k * step];
        for (int k = 0; k < 8; ++k)
            if (v[k] > best) { best = v[k]; idx = i + k * step; }
    }
    for (; i < vocab; i += step) {
        float v = row[i];
        if (v > best) { best = v; idx = i; }
    }
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = bv[threadIdx.x + s];
            int oi = bi[threadIdx.x + s];
            if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0];
}

// Mixture of experts (step/moe.rs): the token rows of the pairs (token, chosen expert),
// grouped by expert: xg[i] = x[row_of[i]], rows of `dim`, `p` pairs.
extern "C" __global__ void moe_gather_f32(const float* x, const int* row_of, float* xg, int dim,
                                          long p) {
    pdl_begin();
    FOR_EACH(i, p * dim) xg[i] = x[(long)row_of[i / dim] * dim + i % dim];
}

// Each token row's experts' outputs (`xg` at its pairs' grouped positions `pos_of[j·k + s]`,
// or at j·k + s without `pos_of`: pairs in token order) times their weights, added in slot
// order (largest weight first), as the CPU adds them: out = x_0·w_0, then out += x_s·w_s, each
// product and sum rounded (no contraction); with `shared` (Qwen2-MoE), out + proj·shared[j]
// where proj holds the shared expert's output.
extern "C" __global__ void moe_combine_f32(const float* xg, const int* pos_of, const float* w,
                                           const float* shared, float* proj, int dim, int k,
                                           long rows) {
    pdl_begin();
    FOR_EACH(i, rows * dim) {
        long j = i / dim;
        int c = (int)(i % dim);
        const float* wj = w + j * k;
        long at0 = pos_of ? pos_of[j * k] : j * k;
        float v = __fmul_rn(xg[at0 * dim + c], wj[0]);
        for (int s = 1; s < k; ++s) {
            long at = pos_of ? pos_of[j * k + s] : j * k + s;
            v = __fadd_rn(v, __fmul_rn(xg[at * dim + c], wj[s]));
        }
        proj[i] = shared ? __fadd_rn(v, __fmul_rn(proj[i], shared[j])) : v;
    }
}

// gpt-oss's clamped SwiGLU (the CPU's `ClampedSwiglu::apply`, the reference's
// `swiglu_oai`): x = min(g, limit), y = clamp(u, −limit, limit), g = x / (1 + e^(alpha·(−x)))
// · (y + 1).
extern "C" __global__ void swiglu_oai_f32(float* gate, const float* up, float alpha, float limit,
                                          long n) {
    pdl_begin();
    FOR_EACH(i, n) {
        float x = fminf(gate[i], limit);
        float y = fminf(fmaxf(up[i], -limit), limit);
        float glu = x / (1.0f + expf(__fmul_rn(alpha, -x)));
        gate[i] = __fmul_rn(glu, y + 1.0f);
    }
}
