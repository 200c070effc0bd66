// The KV cache on the device: per layer, keys `[n_kv_heads, ctx, head_dim_k]` and values
// `[n_kv_heads, ctx, head_dim_v]`, f16, head-major (as the CPU's).

// Store row r's keys and values at position pos[r] of its sequence's cache (seq[r] picks the
// cache: `kc + seq[r] · seq_stride`).
// How a cache stores one position of a head: f16 values (`F16Row`), or Q8_0 blocks
// (`Q8Row`: per 32 values an f16 scale and 32 signed bytes, 34 bytes). Element `i` read through
// either is an f32; a Q8_0 element is the CPU's dequantization, q·d rounded to f16 (a Q8_0
// cache is attended as an f16 cache of those values: src/kernels/attention.rs).
struct F16Row {
    const u16* p;
    __device__ static long bytes(int hd) { return 2L * hd; }
    __device__ F16Row(const u8* b) : p((const u16*)b) {}
    __device__ __forceinline__ float operator[](int i) const { return h2f(p[i]); }
    // Elements i..i+7 (i a multiple of 8; rows of a multiple of 8 elements are 16-byte
    // aligned): one 16-byte load.
    __device__ __forceinline__ void get8(int i, float* o) const {
        u32x4 w = *(const u32x4*)(p + i);
        u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            o[2 * k] = h2f((u16)(v[k] & 0xFFFF));
            o[2 * k + 1] = h2f((u16)(v[k] >> 16));
        }
    }
};

struct Q8Row {
    const u8* p;
    __device__ static long bytes(int hd) { return hd / 32 * 34L; }
    __device__ Q8Row(const u8* b) : p(b) {}
    __device__ __forceinline__ float operator[](int i) const {
        const u8* b = p + (i >> 5) * 34;
        return h2f(f2h((float)(i8)b[2 + (i & 31)] * h2f(ld16(b))));
    }
    __device__ __forceinline__ void get8(int i, float* o) const {
        const u8* b = p + (i >> 5) * 34;
        float d = h2f(ld16(b));
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = h2f(f2h((float)(i8)b[2 + (i & 31) + k] * d));
    }
};

// The parameters of the cache stores, `kv_store_f16` and `kv_store_q8_0`.
#define KV_STORE_PARAMS                                                                      \
    const float *k, const float *v, u8 *kc, u8 *vc, const int *pos, const int *seq,         \
        long seq_stride_k, long seq_stride_v, int n_kv_heads, int hd_k, int hd_v, int ctx

// Row r's keys and values into its sequence's cache (`[n_kv_heads, rows]` rows per slot,
// `seq_stride_*` bytes apart) at its position's row (`pos mod rows`: `rows` is the context, or
// a sliding-window layer's ring), as f16.
extern "C" __global__ void kv_store_f16(KV_STORE_PARAMS) {
    pdl_begin();
    int r = blockIdx.x;
    long p = pos[r] % ctx;
    u16* kr = (u16*)(kc + seq[r] * seq_stride_k);
    u16* vr = (u16*)(vc + seq[r] * seq_stride_v);
    for (int i = threadIdx.x; i < n_kv_heads * hd_k; i += blockDim.x) {
        int h = i / hd_k, d = i % hd_k;
        kr[((long)h * ctx + p) * hd_k + d] = f2h(k[(long)r * n_kv_heads * hd_k + i]);
    }
    for (int i = threadIdx.x; i < n_kv_heads * hd_v; i += blockDim.x) {
        int h = i / hd_v, d = i % hd_v;
        vr[((long)h * ctx + p) * hd_v + d] = f2h(v[(long)r * n_kv_heads * hd_v + i]);
    }
}

// Quantize `heads` rows of `hd` values (x) to Q8_0 at `dst` (rows `ctx` positions apart: row h
// at dst + h·ctx·row bytes) as the CPU's cache does (ggml's `quantize_row_q8_0_ref`):
// d = amax / 127, q = round(x · (1 / d)) half away from zero, d stored as f16. One warp per
// block of 32.
__device__ void store_q8_0(const float* x, u8* dst, int heads, int hd, long ctx) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = hd / 32;
    for (int b = warp; b < heads * per; b += nw) {
        int h = b / per, bi = b % per;
        float v = x[(long)h * hd + bi * 32 + lane];
        float amax = warp_reduce<true>(fabsf(v));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        u8* blk = dst + (long)h * ctx * Q8Row::bytes(hd) + bi * 34L;
        blk[2 + lane] = (u8)(i8)roundf(v * id);
        if (lane == 0) *(u16*)blk = f2h(d);
    }
}

// `kv_store_f16` for a Q8_0 cache (head dimensions multiples of 32).
extern "C" __global__ void kv_store_q8_0(KV_STORE_PARAMS) {
    pdl_begin();
    int r = blockIdx.x;
    long p = pos[r] % ctx;  // (the layer's rows: see kv_store_f16)
    u8* kr = kc + seq[r] * seq_stride_k + p * Q8Row::bytes(hd_k);
    u8* vr = vc + seq[r] * seq_stride_v + p * Q8Row::bytes(hd_v);
    store_q8_0(k + (long)r * n_kv_heads * hd_k, kr, n_kv_heads, hd_k, ctx);
    store_q8_0(v + (long)r * n_kv_heads * hd_v, vr, n_kv_heads, hd_v, ctx);
}

// Copy the first `n` u16 of each of `heads` heads (`stride` u16 apart) of one slot's keys or
// values to another slot's (either element type): prefix reuse between sequences.
extern "C" __global__ void kv_copy_u16(const u16* src, u16* dst, int heads, long n,
                                       long stride) {
    pdl_begin();
    long total = (long)heads * n;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long h = i / n, e = i % n;
        dst[h * stride + e] = src[h * stride + e];
    }
}

#define ATT_CHUNK 256

// The most splits of a decode row's keys (step/layout.rs `MAX_SPLITS`; at most the 128
// threads of a block, which `merge_splits` reads them with).
#define MAX_SPLITS 64

// The CPU's (and the reference's) f16 dot product of a query rounded to f16 with a key row:
// 64 lanes (4 accumulators of 16) advanced by fused multiply-adds over blocks of 64, summed
// pairwise, then halves, quarters and pairs of 16; a tail past the last block of 64 in f64.
// (src/kernels/f16ops.rs `dot_scalar`.) Rows of a multiple of 8 elements are read 8 at a time
// (`get8`: one 16-byte load of an f16 row, where the thread's key row took 8 loads of 2 bytes).
template <class R>
__device__ float dot_ref(const float* q16, R k, int hd) {
    int np = hd & ~63;
    double sum = 0.0;
    if (np > 0) {
        float a[64];
        for (int l = 0; l < 64; ++l) a[l] = 0.0f;
        if (hd % 8 == 0) {
            for (int b = 0; b < np; b += 64)
#pragma unroll
                for (int l = 0; l < 64; l += 8) {
                    float kv[8];
                    k.get8(b + l, kv);
#pragma unroll
                    for (int j = 0; j < 8; ++j) a[l + j] = fmaf(q16[b + l + j], kv[j], a[l + j]);
                }
        } else {
            for (int b = 0; b < np; b += 64)
                for (int l = 0; l < 64; ++l) a[l] = fmaf(q16[b + l], k[b + l], a[l]);
        }
        float t[16];
        for (int l = 0; l < 16; ++l) t[l] = (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]);
        float u[8];
        for (int l = 0; l < 8; ++l) u[l] = t[l + 8] + t[l];
        sum = (double)(((u[4] + u[0]) + (u[6] + u[2])) + ((u[5] + u[1]) + (u[7] + u[3])));
    }
    for (int i = np; i < hd; ++i) sum += (double)(q16[i] * k[i]);
    return (float)sum;
}

__device__ __forceinline__ float round_f16(float x) { return h2f(f2h(x)); }

// A scaled score's soft cap (Gemma-2's `attn_logit_softcapping`): `cap · tanh(x)`, the scale
// already divided by `cap` (the host passes `scale / cap`); `cap` 0: none, `x` itself. The
// CPU's `cap_score` (src/kernels/f16ops), after the reference's flash attention.
__device__ __forceinline__ float cap_score(float cap, float x) {
    return cap != 0.0f ? cap * tanhf(x) : x;
}

// A head's attention sink (gpt-oss's `attn_sinks`: a logit that joins the softmax's
// denominator as a key without a value) joined once every key is in: `m` the row's maximum,
// `*l` its sum of exponentials, `*acc` (thread d's) unnormalized output. The CPU's `join_sink`
// (the reference's "sinks" step): a sink above the maximum rescales the output by
// e^(m − sink) and the sum becomes l·e^(m − sink) + 1 (one fused multiply-add); else the sum
// takes e^(sink − m).
__device__ __forceinline__ void join_sink(float sink, float m, float* l, float* acc) {
    if (sink > m) {
        float ms = expf(m - sink);
        *acc = __fmul_rn(*acc, ms);
        *l = fmaf(*l, ms, 1.0f);
    } else {
        *l = fmaf(*l, 1.0f, expf(sink - m));
    }
}

// The row of position t in a layer of `rows` rows per head (a ring when t can pass it): no
// division while t is inside (the whole-context cache, and a ring before it wraps).
__device__ __forceinline__ int ring_row(int t, int rows) { return t < rows ? t : t % rows; }

// One (row, head) of attention: where its query, keys and values are (rows of the cache as
// `R`), which keys it sees.
template <class R>
struct Head {
    const float* q;
    const u8* k;
    const u8* v;
    int first, last;  // visible positions first..=last
    int hd_k, hd_v;
    int rows;         // the layer's rows per head: position t at row t mod rows
    bool short_ctx;   // the cache's padded length is under 512 (the vector path's domain)
    __device__ R key(int t) const { return R(k + (long)ring_row(t, rows) * R::bytes(hd_k)); }
    __device__ R value(int t) const { return value_at(ring_row(t, rows)); }
    __device__ R value_at(int row) const { return R(v + (long)row * R::bytes(hd_v)); }
};

// Whether a row at position p has a short context: the cache's padded length (the reference's,
// in steps of 256) is under 512, the vector arithmetic's domain for decode.
__device__ __forceinline__ bool short_context(int p, int ctx) {
    return min((p + 256) / 256 * 256, (ctx + 255) / 256 * 256) < 512;
}

template <class R>
__device__ Head<R> head_of(int r, int h, const float* q, const u8* kc, const u8* vc,
                           const int* pos, const int* seq, long seq_stride_k, long seq_stride_v,
                           int n_heads, int n_kv_heads, int hd_k, int hd_v, int ctx, int rows,
                           int window) {
    Head<R> a;
    int kvh = h / (n_heads / n_kv_heads);
    int p = pos[r];
    a.first = window > 0 && p + 1 > window ? p + 1 - window : 0;
    a.last = p;
    a.q = q + ((long)r * n_heads + h) * hd_k;
    a.k = kc + seq[r] * seq_stride_k + (long)kvh * rows * R::bytes(hd_k);
    a.v = vc + seq[r] * seq_stride_v + (long)kvh * rows * R::bytes(hd_v);
    a.hd_k = hd_k;
    a.hd_v = hd_v;
    a.rows = rows;
    a.short_ctx = short_context(p, ctx);
    return a;
}

// The vector arithmetic over all visible keys (see `attend_f16`); thread d < hd_v returns
// output dimension d. Key by key it is the CPU's chain: with M the largest score so far, a new
// maximum s rescales the f16 sum by e^(M − s), else the key weighs e^(s − M); the sum takes
// v·weight and is rounded to f16. Only that accumulation is sequential: per chunk of keys the
// scores, the maxima before each key (a scan over a warp) and the factors (e^ in parallel) are
// computed first, and the values are loaded 32 keys at a time ahead of the chain.
template <class R>
__device__ float attend_vec(const Head<R>& a, float scale, float cap, const float* sink) {
    __shared__ float sc[ATT_CHUNK];
    __shared__ float resc[ATT_CHUNK];
    __shared__ float wt[ATT_CHUNK];
    __shared__ float q16[256];
    __shared__ float chunk_max;
    int d = threadIdx.x, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < a.hd_k; i += blockDim.x) q16[i] = round_f16(a.q[i]);
    __syncthreads();
    float m = -KILN_INF, l = 0.0f, acc = 0.0f;
    for (int t0 = a.first; t0 <= a.last; t0 += ATT_CHUNK) {
        int n = min(ATT_CHUNK, a.last + 1 - t0);
        for (int j = threadIdx.x; j < n; j += blockDim.x)
            sc[j] = cap_score(cap, dot_ref(q16, a.key(t0 + j), a.hd_k) * scale);
        __syncthreads();
        {
            // Lane i takes keys 8i..8i+7: the maxima before each within its run, then the
            // maxima of the runs before it (a scan over the lanes), with the carried maximum.
            // Every warp computes the same (identical writes): warps stay in step, as the
            // software GPU needs for its shuffles.
            const int per = ATT_CHUNK / 32;
            float before[per], run = -KILN_INF;
            for (int k = 0; k < per; ++k) {
                int j = lane * per + k;
                before[k] = run;
                if (j < n) run = fmaxf(run, sc[j]);
            }
            float incl = run;
            for (int o = 1; o < 32; o <<= 1) {
                float v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl = fmaxf(incl, v);
            }
            float prev = __shfl_up_sync(0xffffffffu, incl, 1);
            prev = fmaxf(lane == 0 ? -KILN_INF : prev, m);
            for (int k = 0; k < per; ++k) {
                int j = lane * per + k;
                if (j >= n) break;
                float pm = fmaxf(prev, before[k]), s = sc[j];
                if (s > pm) {
                    resc[j] = expf(pm - s);
                    wt[j] = 1.0f;
                } else {
                    resc[j] = 1.0f;
                    wt[j] = expf(s - pm);
                }
            }
            if (lane == 31) chunk_max = incl;
        }
        __syncthreads();
        for (int j0 = 0; j0 < n; j0 += 32) {
            // The 32 keys' rows without a branch between the loads (a ring of at least 64
            // rows wraps at most once in 32 keys; a whole-context cache never does).
            float vv[32];
            int r0 = ring_row(t0 + j0, a.rows);
#pragma unroll
            for (int k = 0; k < 32; ++k) {
                int rk = r0 + k >= a.rows ? r0 + k - a.rows : r0 + k;
                vv[k] = d < a.hd_v && j0 + k < n ? a.value_at(rk)[d] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 32; ++k) {
                if (j0 + k < n) {
                    float r = resc[j0 + k], w = wt[j0 + k];
                    // No new maximum (most keys): r is 1 and acc · 1 rounded to f16 is acc,
                    // an f16 value already; the branch (the same for every thread) keeps the
                    // multiply and its rounding off the chain for those keys.
                    if (r != 1.0f) acc = round_f16(acc * r);
                    acc = round_f16(fmaf(vv[k], w, acc));
                    l = fmaf(l, r, w);
                }
            }
        }
        m = fmaxf(m, chunk_max);
        __syncthreads();
    }
    if (sink) join_sink(*sink, m, &l, &acc);
    return acc * (l == 0.0f ? 0.0f : 1.0f / l);
}

// The f32 arithmetic over keys lo..hi-1 (an online softmax a chunk at a time): the running
// max `m`, the sum `l` and thread d's unnormalized output dimension `acc`.
template <class R>
__device__ void attend_f32(const Head<R>& a, float scale, float cap, int lo, int hi,
                           float* m_out, float* l_out, float* acc_out) {
    __shared__ float sc[ATT_CHUNK];
    int d = threadIdx.x;
    float m = -KILN_INF, l = 0.0f, acc = 0.0f;
    for (int t0 = lo; t0 < hi; t0 += ATT_CHUNK) {
        int n = min(ATT_CHUNK, hi - t0);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            R kt = a.key(t0 + j);
            float s = 0.0f;
            for (int i = 0; i < a.hd_k; ++i) s += a.q[i] * kt[i];
            sc[j] = cap_score(cap, s * scale);
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
        if (d < a.hd_v) {
            int row = ring_row(t0, a.rows);
            for (int j = 0; j < n; ++j) {
                acc += expf(sc[j] - m_new) * a.value_at(row)[d];
                if (++row == a.rows) row = 0;
            }
        }
        m = m_new;
        __syncthreads();
    }
    *m_out = m;
    *l_out = l;
    *acc_out = acc;
}

// Attention of each row's query heads over its sequence's keys at positions
// `max(0, pos − window + 1) ..= pos` (window 0: no window). One block per (row, head); needs
// blockDim.x >= hd_v.
//
// `mode[row]` picks the arithmetic the CPU backend uses for the row's sequence in this pass,
// after the reference (src/kernels/attention.rs): 1 for fewer than 64 tokens, 2 for one token
// (decode), whose rows with a long context (the cache's padded length from 512 positions)
// take the f32 arithmetic, 0 for prompt batches; 3 for prompt batches left to `attend_tile`.
// The vector arithmetic rounds the query to f16 and keeps the weighted sum of values as f16,
// key by key: the keys' scores are computed in parallel a chunk at a time, then every thread
// runs the online softmax over the chunk in order for its output dimension. The f32 arithmetic: scores into shared
// memory a chunk at a time, a running max and sum, f32 sums of values.
template <class R>
__device__ void attend(const float* q, const u8* kc, const u8* vc, const int* pos,
                       const int* seq, long seq_stride_k, long seq_stride_v, float* out,
                       int n_heads, int n_kv_heads, int hd_k, int hd_v, int ctx, int rows,
                       float scale, int window, const int* mode, float cap,
                       const float* sinks) {
    int r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const float* sink = sinks ? sinks + h : nullptr;
    int vec = mode[r];
    if (vec == 3) return;  // (attend_tile's)
    Head<R> a = head_of<R>(r, h, q, kc, vc, pos, seq, seq_stride_k, seq_stride_v, n_heads,
                           n_kv_heads, hd_k, hd_v, ctx, rows, window);
    float* o = out + ((long)r * n_heads + h) * hd_v;
    if (vec == 1 || (vec == 2 && a.short_ctx)) {
        float v = attend_vec(a, scale, cap, sink);
        if (threadIdx.x < hd_v) o[threadIdx.x] = v;
        return;
    }
    float m, l, acc;
    attend_f32(a, scale, cap, a.first, a.last + 1, &m, &l, &acc);
    if (sink) join_sink(*sink, m, &l, &acc);
    if (threadIdx.x < hd_v) o[threadIdx.x] = acc / l;
}

// The kernel of `attend` for a cache of rows `R` (`attend_f16`, `attend_q8_0`).
#define ATTEND(NAME, R)                                                                         \
    extern "C" __global__ void NAME(const float* q, const u8* kc, const u8* vc, const int* pos, \
                                    const int* seq, long seq_stride_k, long seq_stride_v,       \
                                    float* out, int n_heads, int n_kv_heads, int hd_k,          \
                                    int hd_v, int ctx, int rows, float scale, int window,       \
                                    const int* mode, float cap, const float* sinks) {           \
        pdl_begin();                                                                            \
        attend<R>(q, kc, vc, pos, seq, seq_stride_k, seq_stride_v, out, n_heads, n_kv_heads,    \
                  hd_k, hd_v, ctx, rows, scale, window, mode, cap, sinks);                      \
    }
ATTEND(attend_f16, F16Row)
ATTEND(attend_q8_0, Q8Row)

// Decode attention split over the keys (long contexts): block (row, head, split) takes keys
// split·chunk .. (split + 1)·chunk − 1 of the visible ones and writes its running max, sum and
// unnormalized output to `part` (`[rows, heads, n_split, hd_v + 2]`); the last of them to
// finish combines them (`merge_splits`). The block of the first head of each group sharing a
// kv head does the whole group (`attend_group`: the keys and values read once for all of
// them), the others return. A row
// with a short context takes the vector arithmetic whole in split 0 of each head, straight to
// `out` (the CPU's choice for it, as in `attend` with mode 2), unless `mirror` is 0.
#define GROUP_HEADS 4

// Keys whose values a thread loads together before summing them (attend_group).
#define VALUE_RUN 8

// The f32 arithmetic over keys lo..hi-1 for query heads h0 .. h0 + ng − 1 (ng ≤ GROUP_HEADS)
// of one kv head, a chunk of keys at a time: the queries in shared memory, one thread per key
// for the scores (keys read 8 elements at a time when hd_k allows), the weights e^(s − max)
// computed once per key, then the values: the block's threads are P = blockDim / hd_v streams
// of hd_v (thread p·hd_v + d: dimension d of stream p), stream p taking runs p, p + P, ... of
// VALUE_RUN keys, each run's values loaded together before they are summed; the streams' sums
// are added at the end. Writes each head's running max, sum and unnormalized output at
// `pr + g · stride`.
template <class R>
__device__ void attend_group(const Head<R>& a, int ng, float scale, float cap, int lo, int hi,
                             float* pr, long stride) {
    __shared__ float qg[GROUP_HEADS][256];
    __shared__ float sc[GROUP_HEADS][ATT_CHUNK];
    __shared__ float streams[1024];
    int P = max(1, (int)blockDim.x / a.hd_v);
    int p = threadIdx.x / a.hd_v, d = threadIdx.x % a.hd_v;
    for (int i = threadIdx.x; i < ng * a.hd_k; i += blockDim.x)
        qg[i / a.hd_k][i % a.hd_k] = a.q[i];  // (the group's heads are consecutive)
    float m[GROUP_HEADS], l[GROUP_HEADS], acc[GROUP_HEADS];
#pragma unroll
    for (int g = 0; g < GROUP_HEADS; ++g) {
        m[g] = -KILN_INF;
        l[g] = 0.0f;
        acc[g] = 0.0f;
    }
    __syncthreads();
    for (int t0 = lo; t0 < hi; t0 += ATT_CHUNK) {
        int n = min(ATT_CHUNK, hi - t0);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            R kt = a.key(t0 + j);
            float s[GROUP_HEADS] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (a.hd_k % 8 == 0) {
                for (int i = 0; i < a.hd_k; i += 8) {
                    float k8[8];
                    kt.get8(i, k8);
#pragma unroll
                    for (int g = 0; g < GROUP_HEADS; ++g) {
                        if (g < ng) {
#pragma unroll
                            for (int e = 0; e < 8; ++e) s[g] += qg[g][i + e] * k8[e];
                        }
                    }
                }
            } else {
                for (int i = 0; i < a.hd_k; ++i) {
                    float k1 = kt[i];
#pragma unroll
                    for (int g = 0; g < GROUP_HEADS; ++g)
                        if (g < ng) s[g] += qg[g][i] * k1;
                }
            }
#pragma unroll
            for (int g = 0; g < GROUP_HEADS; ++g)
                if (g < ng) sc[g][j] = cap_score(cap, s[g] * scale);
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < GROUP_HEADS; ++g) {
            if (g >= ng) break;  // (ng is the same for the whole block)
            float cm = -KILN_INF;
            for (int j = threadIdx.x; j < n; j += blockDim.x) cm = fmaxf(cm, sc[g][j]);
            cm = block_max(cm);
            float m_new = fmaxf(m[g], cm);
            float corr = expf(m[g] - m_new);
            float part = 0.0f;
            for (int j = threadIdx.x; j < n; j += blockDim.x) {
                float e = expf(sc[g][j] - m_new);
                sc[g][j] = e;
                part += e;
            }
            l[g] = l[g] * corr + block_sum(part);
            acc[g] *= corr;
            m[g] = m_new;
        }
        __syncthreads();
        if (p < P) {
            for (int j0 = p * VALUE_RUN; j0 < n; j0 += P * VALUE_RUN) {
                // (A ring of at least VALUE_RUN rows wraps at most once in a run.)
                float v[VALUE_RUN];
                int r0 = ring_row(t0 + j0, a.rows);
#pragma unroll
                for (int k = 0; k < VALUE_RUN; ++k) {
                    int rk = r0 + k >= a.rows ? r0 + k - a.rows : r0 + k;
                    v[k] = j0 + k < n ? a.value_at(rk)[d] : 0.0f;
                }
#pragma unroll
                for (int k = 0; k < VALUE_RUN; ++k) {
                    if (j0 + k >= n) break;
#pragma unroll
                    for (int g = 0; g < GROUP_HEADS; ++g)
                        if (g < ng) acc[g] += sc[g][j0 + k] * v[k];
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < GROUP_HEADS; ++g) {
        if (g >= ng) break;  // (ng is the same for the whole block)
        // The streams' sums of head g, added into stream 0.
        if (P > 1) {
            if (p > 0 && p < P) streams[(p - 1) * a.hd_v + d] = acc[g];
            __syncthreads();
            if (p == 0)
                for (int o = 1; o < P; ++o) acc[g] += streams[(o - 1) * a.hd_v + d];
            __syncthreads();
        }
        float* pg = pr + g * stride;
        if (p == 0) pg[2 + d] = acc[g];
        if (threadIdx.x == 0) {
            pg[0] = m[g];
            pg[1] = l[g];
        }
    }
}

// The splits of head rh (row · n_heads + head) combined into its output: out = Σ acc_s ·
// e^(m_s − M) / Σ l_s · e^(m_s − M). Thread s reads split s's max and sum (all at once), the
// block finds the largest max; each split's weight goes to shared memory, then thread d sums
// dimension d over the splits, several loads in flight at a time. The partials were written
// by other blocks of the launch: read past L1 (`__ldcg`).
__device__ void merge_splits(const float* part, float* out, long rh, int hd_v, int n_split,
                             const float* sink) {
    __shared__ float w[MAX_SPLITS];
    const float* pr = part + rh * n_split * (hd_v + 2);
    int s = threadIdx.x;
    float ms = s < n_split ? __ldcg(pr + s * (hd_v + 2)) : -KILN_INF;
    float ls = s < n_split ? __ldcg(pr + s * (hd_v + 2) + 1) : 0.0f;
    float mx = block_max(ms);
    float ws = ms == -KILN_INF ? 0.0f : expf(ms - mx);
    if (s < n_split) w[s] = ws;
    float l = block_sum(ls * ws);
    __syncthreads();
    if (threadIdx.x < hd_v) {
        float acc = 0.0f;
        const float* pd = pr + 2 + threadIdx.x;
#pragma unroll 8
        for (int k = 0; k < n_split; ++k) acc += __ldcg(pd + (long)k * (hd_v + 2)) * w[k];
        float lj = l;
        if (sink) join_sink(*sink, mx, &lj, &acc);
        out[rh * hd_v + threadIdx.x] = acc / lj;
    }
    __syncthreads();  // (w is rewritten for the next head)
}

// `counts` (one per row and head, zero between launches): the splits of a group that have
// written their partials; the last to arrive merges the group's heads and sets it back to
// zero, so no second launch is needed (and a recorded graph replays it as it is).
template <class R>
__device__ void attend_split(const float* q, const u8* kc, const u8* vc, const int* pos,
                             const int* seq, long seq_stride_k, long seq_stride_v, float* out,
                             float* part, int* counts, int n_heads, int n_kv_heads, int hd_k,
                             int hd_v, int ctx, int rows, float scale, int window, int n_split,
                             int chunk, int mirror, float cap, const float* sinks) {
    int sp = blockIdx.x % n_split, rh = blockIdx.x / n_split;
    int r = rh / n_heads, h = rh % n_heads;
    Head<R> a = head_of<R>(r, h, q, kc, vc, pos, seq, seq_stride_k, seq_stride_v, n_heads,
                           n_kv_heads, hd_k, hd_v, ctx, rows, window);
    if (mirror && a.short_ctx) {
        if (sp == 0) {
            float v = attend_vec(a, scale, cap, sinks ? sinks + h : nullptr);
            if (threadIdx.x < hd_v) out[(long)rh * hd_v + threadIdx.x] = v;
        }
        return;
    }
    // Heads h .. h + ng − 1 of the group, GROUP_HEADS at a time.
    int G = n_heads / n_kv_heads;
    if ((h % G) % GROUP_HEADS != 0) return;
    int ng = min(GROUP_HEADS, G - h % G);
    int lo = max(a.first, sp * chunk), hi = min(a.last + 1, (sp + 1) * chunk);
    float* pr = part + ((long)rh * n_split + sp) * (hd_v + 2);
    long stride = (long)n_split * (hd_v + 2);
    if (lo < hi) {
        attend_group(a, ng, scale, cap, lo, hi, pr, stride);
    } else {
        for (int g = 0; g < ng; ++g)
            if (threadIdx.x == 0) {
                pr[g * stride] = -KILN_INF;
                pr[g * stride + 1] = 0.0f;
            }
    }
    // The last block of the group to finish merges.
    if (!last_to_arrive(counts + rh, n_split)) return;
    for (int g = 0; g < ng; ++g)
        merge_splits(part, out, rh + g, hd_v, n_split, sinks ? sinks + h + g : nullptr);
}

#define ATTEND_SPLIT(NAME, R)                                                                   \
    extern "C" __global__ void NAME(const float* q, const u8* kc, const u8* vc, const int* pos, \
                                    const int* seq, long seq_stride_k, long seq_stride_v,       \
                                    float* out, float* part, int* counts, int n_heads,          \
                                    int n_kv_heads, int hd_k, int hd_v, int ctx, int rows,      \
                                    float scale, int window, int n_split, int chunk,            \
                                    int mirror, float cap, const float* sinks) {                \
        pdl_begin();                                                                            \
        attend_split<R>(q, kc, vc, pos, seq, seq_stride_k, seq_stride_v, out, part, counts,     \
                        n_heads, n_kv_heads, hd_k, hd_v, ctx, rows, scale, window, n_split,     \
                        chunk, mirror, cap, sinks);                                             \
    }
ATTEND_SPLIT(attend_split_f16, F16Row)
ATTEND_SPLIT(attend_split_q8_0, Q8Row)

// Prompt attention in tiles (rows of mode 3: prompt rows of a sequence's pass of at least 64
// tokens, the f32 arithmetic of `attend_f32`, which `attend` leaves to this kernel). The query
// vectors sharing a kv head are numbered row · G + g (G query heads per kv head); block
// (tile, kv head) takes FA_Q of them and runs an online softmax over their keys FA_K at a
// time: the scores of the tile of keys for every query (a FA_Q × FA_K product over the head
// dimension, FA_DC dimensions at a time, both operands in shared memory), then the values
// weighted by them. The keys and values are read once per block for all its queries. Rows of
// several sequences in one tile are taken one sequence at a time. 256 threads: thread
// (ty, tx) = (t / 16, t % 16) holds queries QPT·ty .. QPT·ty + QPT − 1, keys tx and tx + 16
// of a tile, and output dimensions tx + 16·c; FA_Q = 16·QPT (64, 32 or 16: fewer queries per
// block make more blocks, for models with few kv heads). Needs hd_v a multiple of 16, at most
// 256.
#define FA_K 32
#define FA_DC 32

template <class R, int QPT>
__device__ void attend_tile(const float* q, const u8* kc, const u8* vc, const int* pos,
                            const int* seq, long seq_stride_k, long seq_stride_v, float* out,
                            int n_rows, int n_heads, int n_kv_heads, int hd_k, int hd_v,
                            int rows, float scale, int window, const int* mode, float cap,
                            const float* sinks) {
    const int FA_Q = 16 * QPT;
    __shared__ float qs[FA_Q][FA_DC + 1];
    __shared__ float ks[FA_DC][FA_K + 1];
    __shared__ float ps[FA_K][FA_Q + 1];
    __shared__ u16 vs[FA_K][256];
    __shared__ int q_first[FA_Q], q_last[FA_Q], q_seq[FA_Q], q_state[FA_Q];
    __shared__ int pass_seq, pass_lo, pass_hi;
    int t = threadIdx.x, tx = t & 15, ty = t >> 4;
    int G = n_heads / n_kv_heads;
    int tiles = (n_rows * G + FA_Q - 1) / FA_Q;
    int tile = blockIdx.x % tiles, kvh = blockIdx.x / tiles;
    long flat0 = (long)tile * FA_Q;
    // Each query vector's row, visible keys and sequence; state 1: to do, 2: in this pass.
    if (t < FA_Q) {
        long f = flat0 + t;
        int r = (int)(f / G);
        q_state[t] = 0;
        if (f < (long)n_rows * G && mode[r] == 3) {
            int p = pos[r];
            q_first[t] = window > 0 && p + 1 > window ? p + 1 - window : 0;
            q_last[t] = p;
            q_seq[t] = seq[r];
            q_state[t] = 1;
        }
    }
    const int nc = hd_v / 16;
    for (;;) {
        __syncthreads();
        if (t == 0) {
            pass_seq = -1;
            int lo = 0x7fffffff, hi = 0;
            for (int i = 0; i < FA_Q; ++i) {
                if (q_state[i] != 1 || (pass_seq >= 0 && q_seq[i] != pass_seq)) continue;
                pass_seq = q_seq[i];
                q_state[i] = 2;
                lo = min(lo, q_first[i]);
                hi = max(hi, q_last[i] + 1);
            }
            pass_lo = lo;
            pass_hi = hi;
        }
        __syncthreads();
        if (pass_seq < 0) break;
        const u8* kb = kc + pass_seq * seq_stride_k + (long)kvh * rows * R::bytes(hd_k);
        const u8* vb = vc + pass_seq * seq_stride_v + (long)kvh * rows * R::bytes(hd_v);
        bool act[QPT];
        float m[QPT], l[QPT], o[QPT][16];
#pragma unroll
        for (int i = 0; i < QPT; ++i) {
            act[i] = q_state[ty * QPT + i] == 2;
            m[i] = -KILN_INF;
            l[i] = 0.0f;
#pragma unroll
            for (int c = 0; c < 16; ++c) o[i][c] = 0.0f;
        }
        for (int t0 = pass_lo; t0 < pass_hi; t0 += FA_K) {
            float s[QPT][2];
#pragma unroll
            for (int i = 0; i < QPT; ++i) s[i][0] = s[i][1] = 0.0f;
            for (int d0 = 0; d0 < hd_k; d0 += FA_DC) {
                for (int e = t; e < FA_Q * FA_DC; e += blockDim.x) {
                    int qv = e / FA_DC, dd = e % FA_DC;
                    long f = flat0 + qv;
                    float x = 0.0f;
                    if (q_state[qv] == 2 && d0 + dd < hd_k) {
                        int r = (int)(f / G), h = kvh * G + (int)(f % G);
                        x = q[((long)r * n_heads + h) * hd_k + d0 + dd];
                    }
                    qs[qv][dd] = x;
                }
                for (int e = t; e < FA_K * FA_DC; e += blockDim.x) {
                    int kk = e / FA_DC, dd = e % FA_DC;
                    int tk = t0 + kk;
                    ks[dd][kk] = tk < pass_hi && d0 + dd < hd_k
                                     ? R(kb + (long)ring_row(tk, rows) * R::bytes(hd_k))[d0 + dd]
                                     : 0.0f;
                }
                __syncthreads();
#pragma unroll 8
                for (int dd = 0; dd < FA_DC; ++dd) {
                    float b0 = ks[dd][tx], b1 = ks[dd][tx + 16];
#pragma unroll
                    for (int i = 0; i < QPT; ++i) {
                        float a = qs[ty * QPT + i][dd];
                        s[i][0] = fmaf(a, b0, s[i][0]);
                        s[i][1] = fmaf(a, b1, s[i][1]);
                    }
                }
                __syncthreads();
            }
            // The tile's values, as f16 (either row type's values are f16 numbers).
            for (int e = t; e < FA_K * hd_v; e += blockDim.x) {
                int kk = e / hd_v, d = e % hd_v;
                int tk = t0 + kk;
                vs[kk][d] = tk < pass_hi ? f2h(R(vb + (long)ring_row(tk, rows) * R::bytes(hd_v))[d]) : 0;
            }
            // Mask, then the online softmax per query (its 32 scores are over 16 lanes).
#pragma unroll
            for (int i = 0; i < QPT; ++i) {
                int qv = ty * QPT + i;
                float mx = -KILN_INF;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    int tk = t0 + tx + 16 * j;
                    bool vis = act[i] && tk >= q_first[qv] && tk <= q_last[qv];
                    s[i][j] = vis ? cap_score(cap, s[i][j] * scale) : -KILN_INF;
                    mx = fmaxf(mx, s[i][j]);
                }
                for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                float m_new = fmaxf(m[i], mx);
                float corr = m_new == -KILN_INF ? 1.0f : expf(m[i] - m_new);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    float p = m_new == -KILN_INF ? 0.0f : expf(s[i][j] - m_new);
                    ps[tx + 16 * j][qv] = p;
                    sum += p;
                }
                for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
                l[i] = l[i] * corr + sum;
                m[i] = m_new;
#pragma unroll
                for (int c = 0; c < 16; ++c) o[i][c] *= corr;
            }
            __syncthreads();
            for (int kk = 0; kk < FA_K; ++kk) {
                float pv[QPT];
#pragma unroll
                for (int i = 0; i < QPT; ++i) pv[i] = ps[kk][ty * QPT + i];
#pragma unroll
                for (int c = 0; c < 16; ++c) {
                    if (c < nc) {
                        float v = h2f(vs[kk][tx + 16 * c]);
#pragma unroll
                        for (int i = 0; i < QPT; ++i) o[i][c] = fmaf(pv[i], v, o[i][c]);
                    }
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < QPT; ++i) {
            int qv = ty * QPT + i;
            if (!act[i]) continue;
            long f = flat0 + qv;
            int r = (int)(f / G), h = kvh * G + (int)(f % G);
            if (sinks) {
#pragma unroll
                for (int c = 0; c < 16; ++c) {
                    float li = l[i];
                    join_sink(sinks[h], m[i], &li, &o[i][c]);
                    if (c == 15) l[i] = li;
                }
            }
            float inv = l[i] == 0.0f ? 0.0f : 1.0f / l[i];
            float* orow = out + ((long)r * n_heads + h) * hd_v;
#pragma unroll
            for (int c = 0; c < 16; ++c)
                if (c < nc) orow[tx + 16 * c] = o[i][c] * inv;
        }
        __syncthreads();
        if (t < FA_Q && q_state[t] == 2) q_state[t] = 0;
    }
}

#define ATTEND_TILE(NAME, R, QPT)                                                               \
    extern "C" __global__ void NAME(const float* q, const u8* kc, const u8* vc, const int* pos, \
                                    const int* seq, long seq_stride_k, long seq_stride_v,       \
                                    float* out, int n_rows, int n_heads, int n_kv_heads,        \
                                    int hd_k, int hd_v, int rows, float scale, int window,      \
                                    const int* mode, float cap, const float* sinks) {           \
        pdl_begin();                                                                            \
        attend_tile<R, QPT>(q, kc, vc, pos, seq, seq_stride_k, seq_stride_v, out, n_rows,       \
                            n_heads, n_kv_heads, hd_k, hd_v, rows, scale, window, mode, cap,    \
                            sinks);                                                             \
    }
ATTEND_TILE(attend_tile_f16, F16Row, 4)
ATTEND_TILE(attend_tile_q8_0, Q8Row, 4)
ATTEND_TILE(attend_tile32_f16, F16Row, 2)
ATTEND_TILE(attend_tile32_q8_0, Q8Row, 2)
ATTEND_TILE(attend_tile16_f16, F16Row, 1)
ATTEND_TILE(attend_tile16_q8_0, Q8Row, 1)
