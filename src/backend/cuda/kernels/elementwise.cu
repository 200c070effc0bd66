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
