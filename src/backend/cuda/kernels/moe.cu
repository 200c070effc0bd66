// Mixture-of-experts routing on the device (step/moe.rs): each token's router logits into its
// chosen experts and their weights, as the CPU's `kernels::moe::route` computes them, step for
// step: the gate (softmax, sigmoid, or none before the choice and a softmax over the chosen
// logits: gpt-oss), the top k by insertion (largest first, ties to the lower index, NaN never
// ranking above anything), the renormalization (the sum in f64, floored at 2^-14) and the
// scale. One block (a warp) per token, its first thread summing and choosing alone: the order
// of every sum is the CPU's. The softmax is the CPU's (`softmax_row`): runs of 16 through the vectorized
// exponential (`expf_approx`, its fused multiply-adds, the same bits everywhere), each run's
// sum reduced as `_mm512_reduce_add_ps` does, the tail and the sigmoid through `expf` (on the
// software GPU the host's, the CPU's function; on a GPU CUDA's, within 2 ulp of it), the sum
// in f64. Positions and experts come from device memory only: a recorded step replays it.

// The CPU's `f16ops::expf_approx`: e^x in f32 from a degree-5 polynomial on the reduced
// argument, j·2^n rounded once.
__device__ __forceinline__ float expf_approx(float x) {
    float r = __int_as_float(0x4b400000);  // 0x1.8p23
    float z = fmaf(x, __int_as_float(0x3fb8aa3b), r);
    float n = z - r;
    float b = fmaf(-n, __int_as_float(0x35bfbe8e), fmaf(-n, __int_as_float(0x3f317200), x));
    float u = b * b;
    float p_hi = fmaf(__int_as_float(0x3c072010), b, __int_as_float(0x3d2b9f17));
    float p_lo = fmaf(__int_as_float(0x3e2aaf33), b, __int_as_float(0x3efffedb));
    float p1 = fmaf(__int_as_float(0x3f7ffff6), b, 1.0f);
    float j = fmaf(fmaf(p_hi, u, p_lo), u, p1);
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : KILN_INF;
    if (n != n) return j;  // (NaN in: NaN out, as the CPU's)
    // j·2^n is exact in f64 (|n| ≤ 192), then one rounding to f32.
    return (float)ldexp((double)j, (int)n);
}

// The CPU's `moe::softmax_row` over `n` values in place (one thread).
__device__ void route_softmax(float* x, int n) {
    float mx = -KILN_INF;
    for (int i = 0; i < n; ++i) mx = fmaxf(mx, x[i]);
    double sum = 0.0;
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        float* v = x + c;
        for (int i = 0; i < 16; ++i) v[i] = expf_approx(v[i] - mx);
        float a[8], b[4];
        for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
        for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
        float c0 = b[0] + b[2], c1 = b[1] + b[3];
        sum += (double)(c0 + c1);
    }
    for (; c < n; ++c) {
        x[c] = expf(x[c] - mx);
        sum += (double)x[c];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; ++i) x[i] = __fmul_rn(x[i], inv);
}

// The most experts a token's probabilities hold in shared memory (more stay in global memory).
#define ROUTE_SHARED 1024

// Token blockIdx.x's routing: `probs` (`[tokens, ne]`) holds its router logits and is left
// holding its gated probabilities; `ids` and `wts` (`[tokens, k]`) get its chosen experts and
// their weights. `gate` 0: softmax, 1: sigmoid, 2: gpt-oss's softmax over the chosen logits;
// `norm`: weights renormalized to sum 1; `scale` (0 and 1: none). With `shared_logit`
// (Qwen2-MoE), shared[j] = sigmoid(shared_logit[j]) as the reference computes it there,
// silu(g) / g. Blocks of one warp: the lanes share out the maximum (order-free) and the
// exponentials (each its own), the first lane sums, chooses and weighs alone.
extern "C" __global__ void moe_route_f32(float* probs, int ne, int k, int gate, int norm,
                                         float scale, int* ids, float* wts,
                                         const float* shared_logit, float* shared) {
    __shared__ float sp[ROUTE_SHARED];
    __shared__ float inv;
    pdl_begin();
    long j = blockIdx.x;
    int t = threadIdx.x;
    float* gp = probs + j * ne;
    float* pr = ne <= ROUTE_SHARED ? sp : gp;
    if (pr == sp)
        for (int e = t; e < ne; e += blockDim.x) sp[e] = gp[e];
    __syncthreads();
    if (gate == 0) {
        float mx = -KILN_INF;
        for (int e = t; e < ne; e += blockDim.x) mx = fmaxf(mx, pr[e]);
        mx = warp_reduce<true>(mx);
        // Whole runs of 16 through the vectorized exponential, the tail through expf.
        int runs = ne & ~15;
        for (int e = t; e < ne; e += blockDim.x)
            pr[e] = e < runs ? expf_approx(pr[e] - mx) : expf(pr[e] - mx);
        __syncthreads();
        if (t == 0) {
            double sum = 0.0;
            for (int c = 0; c < runs; c += 16) {
                const float* v = pr + c;
                float a[8], b[4];
                for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
                for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
                float c0 = b[0] + b[2], c1 = b[1] + b[3];
                sum += (double)(c0 + c1);
            }
            for (int c = runs; c < ne; ++c) sum += (double)pr[c];
            inv = (float)(1.0 / sum);
        }
        __syncthreads();
        for (int e = t; e < ne; e += blockDim.x) pr[e] = __fmul_rn(pr[e], inv);
    }
    if (gate == 1)
        for (int e = t; e < ne; e += blockDim.x) pr[e] = 1.0f / (1.0f + expf(-pr[e]));
    __syncthreads();
    if (pr == sp)
        for (int e = t; e < ne; e += blockDim.x) gp[e] = sp[e];
    if (t != 0) return;
    int* ex = ids + j * k;
    float* wt = wts + j * k;
    // Top k by insertion.
    int have = 0;
    for (int e = 0; e < ne; ++e) {
        float p = pr[e];
        int at = have;
        while (at > 0 && p > pr[ex[at - 1]]) --at;
        if (at >= k) continue;
        int end = min(have + 1, k);
        for (int i = end - 1; i > at; --i) ex[i] = ex[i - 1];
        ex[at] = e;
        have = end;
    }
    for (int s = 0; s < k; ++s) wt[s] = pr[ex[s]];
    if (gate == 2) route_softmax(wt, k);
    if (norm) {
        double sum = 0.0;
        for (int s = 0; s < k; ++s) sum += (double)wt[s];
        float d = fmaxf((float)sum, __int_as_float(0x38800000));  // 2^-14
        for (int s = 0; s < k; ++s) wt[s] = wt[s] / d;
    }
    if (scale != 0.0f && scale != 1.0f)
        for (int s = 0; s < k; ++s) wt[s] = __fmul_rn(wt[s], scale);
    if (shared_logit) {
        float g = shared_logit[j];
        shared[j] = (g / (1.0f + expf(-g))) / g;
    }
}
