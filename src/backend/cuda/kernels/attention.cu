// The KV cache on the device: per layer, keys `[n_kv_heads, ctx, head_dim_k]` and values
// `[n_kv_heads, ctx, head_dim_v]`, f16, head-major (as the CPU's).

// Store row r's keys and values at position pos[r] of its sequence's cache (seq[r] picks the
// cache: `kc + seq[r] · seq_stride`).
extern "C" __global__ void kv_store_f16(const float* k, const float* v, u16* kc, u16* vc,
                                        const int* pos, const int* seq, long seq_stride_k,
                                        long seq_stride_v, int n_kv_heads, int hd_k, int hd_v,
                                        int ctx) {
    int r = blockIdx.x;
    long p = pos[r];
    u16* kr = kc + seq[r] * seq_stride_k;
    u16* vr = vc + seq[r] * seq_stride_v;
    for (int i = threadIdx.x; i < n_kv_heads * hd_k; i += blockDim.x) {
        int h = i / hd_k, d = i % hd_k;
        kr[((long)h * ctx + p) * hd_k + d] = f2h(k[(long)r * n_kv_heads * hd_k + i]);
    }
    for (int i = threadIdx.x; i < n_kv_heads * hd_v; i += blockDim.x) {
        int h = i / hd_v, d = i % hd_v;
        vr[((long)h * ctx + p) * hd_v + d] = f2h(v[(long)r * n_kv_heads * hd_v + i]);
    }
}

#define ATT_CHUNK 256

// Attention of each row's query heads over its sequence's keys at positions
// `max(0, pos − window + 1) ..= pos` (window 0: no window). One block per (row, head);
// the keys go by in chunks: scores into shared memory, a running max and sum (online softmax),
// then each thread accumulates its output dimensions. Needs blockDim.x >= hd_v.
extern "C" __global__ void attend_decode_f16(const float* q, const u16* kc, const u16* vc,
                                             const int* pos, const int* seq, long seq_stride_k,
                                             long seq_stride_v, float* out, int n_heads,
                                             int n_kv_heads, int hd_k, int hd_v, int ctx,
                                             float scale, int window) {
    int r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    int kvh = h / (n_heads / n_kv_heads);
    int p = pos[r];
    int first = window > 0 && p + 1 > window ? p + 1 - window : 0;
    const float* qh = q + ((long)r * n_heads + h) * hd_k;
    const u16* kh = kc + seq[r] * seq_stride_k + (long)kvh * ctx * hd_k;
    const u16* vh = vc + seq[r] * seq_stride_v + (long)kvh * ctx * hd_v;
    __shared__ float sc[ATT_CHUNK];
    float m = -KILN_INF, l = 0.0f, acc = 0.0f;
    int d = threadIdx.x;
    for (int t0 = first; t0 <= p; t0 += ATT_CHUNK) {
        int n = min(ATT_CHUNK, p + 1 - t0);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const u16* kt = kh + (long)(t0 + j) * hd_k;
            float s = 0.0f;
            for (int i = 0; i < hd_k; ++i) s += qh[i] * h2f(kt[i]);
            sc[j] = s * scale;
        }
        __syncthreads();
        float cm = -KILN_INF;
        for (int j = threadIdx.x; j < n; j += blockDim.x) cm = fmaxf(cm, sc[j]);
        cm = block_max(cm);
        float m_new = fmaxf(m, cm);
        float corr = expf(m - m_new);
        l *= corr;
        acc *= corr;
        float part = 0.0f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) part += expf(sc[j] - m_new);
        l += block_sum(part);
        if (d < hd_v)
            for (int j = 0; j < n; ++j) acc += expf(sc[j] - m_new) * h2f(vh[(long)(t0 + j) * hd_v + d]);
        m = m_new;
        __syncthreads();
    }
    if (d < hd_v) out[((long)r * n_heads + h) * hd_v + d] = acc / l;
}
