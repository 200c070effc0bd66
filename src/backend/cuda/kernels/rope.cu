// Rotary position embedding, in place, over q `[rows, n_heads · head_dim]` and k `[rows,
// n_kv_heads · head_dim]` in one launch: row r is at position pos[r]. The first `n_dims` of
// each head rotate in pairs: adjacent (2i, 2i+1) for the normal kind, split halves
// (i, i + n_dims/2) for NeoX. θ_i = freq_scale · pos · theta_scale^i, divided by
// freq_factors[i] when given, with theta_scale = base^(−2/n_dims) computed by the host: the
// running product in f32 and the fused rotation are the CPU's (and the reference's)
// arithmetic, so the angles agree to the last bit but for cosf/sinf's rounding.
//
// With `kc` given (an f16 cache of `ctx` rows per head, the layer's: its position's row is
// `pos mod ctx`, as `kv_store_f16` lays it out), each row's rotated keys and its values `v`
// (`[rows, n_kv_heads · hd_v]`) also go to its sequence's cache: the store of the attention
// that follows, done here.
//
// YaRN (`yarn`): pair i's angle mixes the interpolated angle with the extrapolated one,
// `mix_i = (1 − clamp((i − low) / max(high − low, 0.001), 0, 1)) · ext` (ggml's
// `rope_yarn_ramp`, the bounds computed by the host: `Rope::yarn_ramp`), and cos and sin are
// multiplied by `mscale` (YaRN's magnitude, LongRoPE's attention factor; 1 for plain RoPE).
//
// One thread per (row, head, pair), then per key element past `n_dims`, then per value.

// YaRN's ramp and the rotation's magnitude (see above); `ext` 0: no mix.
struct Yarn {
    float mscale, ext, low, high;
};

// Rotates the pair (h[a], h[b]), pair `i` of a head at position `pos`, in place: θ_i as the
// running product, then the CPU's `Rope::cos_sin` (the frequency factor, the position scale,
// YaRN's mix, rounded op by op: no contraction), then the fused rotation.
__device__ __forceinline__ void rotate_pair(float* h, int a, int b, int i, int pos,
                                            float theta_scale, float freq_scale,
                                            const float* freq_factors, Yarn y) {
    float theta = (float)pos;
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    float ff = freq_factors ? freq_factors[i] : 1.0f;
    float extrap = theta / ff;
    float a_ = __fmul_rn(freq_scale, extrap);
    if (y.ext != 0.0f) {
        float t = ((float)i - y.low) / fmaxf(y.high - y.low, 0.001f);
        float mix = (1.0f - fminf(fmaxf(t, 0.0f), 1.0f)) * y.ext;
        a_ = __fadd_rn(__fmul_rn(a_, 1.0f - mix), __fmul_rn(extrap, mix));
    }
    float c = cosf(a_), s = sinf(a_);
    if (y.mscale != 1.0f) {
        c = __fmul_rn(c, y.mscale);
        s = __fmul_rn(s, y.mscale);
    }
    float x0 = h[a], x1 = h[b];
    h[a] = fmaf(x0, c, -(x1 * s));
    h[b] = fmaf(x0, s, x1 * c);
}

// The parameters of `rope_qk`, which `norm_rope_qk` takes first.
#define ROPE_QK_PARAMS                                                                       \
    float *q, float *k, const float *v, const int *pos, long rows, int n_heads, int n_kv_heads, \
        int head_dim, int n_dims, float theta_scale, float freq_scale,                        \
        const float *freq_factors, int neox, u8 *kc, u8 *vc, const int *seq,                   \
        long seq_stride_k, long seq_stride_v, int hd_v, int ctx, float mscale, float ext,      \
        float low, float high

extern "C" __global__ void rope_qk(ROPE_QK_PARAMS) {
    pdl_begin();
    Yarn y = {mscale, ext, low, high};
    int half_dims = n_dims / 2, heads = n_heads + n_kv_heads;
    long n_rot = rows * heads * half_dims;
    long n_pass = kc ? rows * n_kv_heads * (head_dim - n_dims) : 0;
    long n_v = kc ? rows * n_kv_heads * hd_v : 0;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < n_rot + n_pass + n_v;
         t += (long)gridDim.x * blockDim.x) {
        if (t >= n_rot + n_pass) {  // a value to the cache
            long e = t - n_rot - n_pass;
            long r = e / ((long)n_kv_heads * hd_v);
            int i = (int)(e % ((long)n_kv_heads * hd_v)), h = i / hd_v, d = i % hd_v;
            u16* vr = (u16*)(vc + seq[r] * seq_stride_v);
            vr[((long)h * ctx + pos[r] % ctx) * hd_v + d] = f2h(v[r * n_kv_heads * hd_v + i]);
            continue;
        }
        if (t >= n_rot) {  // a key element that does not rotate, to the cache
            long e = t - n_rot;
            int rest = head_dim - n_dims;
            long rh = e / rest;
            long r = rh / n_kv_heads;
            int h = (int)(rh % n_kv_heads), d = n_dims + (int)(e % rest);
            u16* kr = (u16*)(kc + seq[r] * seq_stride_k);
            kr[((long)h * ctx + pos[r] % ctx) * head_dim + d] = f2h(k[rh * head_dim + d]);
            continue;
        }
        int i = (int)(t % half_dims);
        long rh = t / half_dims;
        long r = rh / heads;
        int hh = (int)(rh % heads);
        bool is_k = hh >= n_heads;
        float* h = is_k ? k + (r * n_kv_heads + hh - n_heads) * head_dim
                        : q + (r * n_heads + hh) * head_dim;
        int a = neox ? i : 2 * i;
        int b = neox ? i + half_dims : 2 * i + 1;
        rotate_pair(h, a, b, i, pos[r], theta_scale, freq_scale, freq_factors, y);
        if (is_k && kc) {
            u16* kr = (u16*)(kc + seq[r] * seq_stride_k);
            long at = ((long)(hh - n_heads) * ctx + pos[r] % ctx) * head_dim;
            kr[at + a] = f2h(h[a]);
            kr[at + b] = f2h(h[b]);
        }
    }
}

// `rope_qk` with the heads' RMS norms before it (`wq`, `wk`: the q and k norm weights, null
// for none) and the query scale `q_scale` after it (Gemma-3's 1/sqrt(head_dim); 1 for none),
// in one launch where the forward pass has three or four (rms_norm_f32 over the q heads, over
// the k heads, rope_qk, scale_f32): one block per (row, head), q heads then k heads, of 256
// threads, rms_norm_f32's block, so each head's sum of squares is the same sum. Every step is
// its separate kernel's arithmetic in its order: the same bits.
extern "C" __global__ void norm_rope_qk(ROPE_QK_PARAMS, const float* wq, const float* wk,
                                        float eps_q, float eps_k, float q_scale) {
    pdl_begin();
    Yarn y = {mscale, ext, low, high};
    int half_dims = n_dims / 2, heads = n_heads + n_kv_heads;
    long r = blockIdx.x / heads;
    int hh = (int)(blockIdx.x % heads), kh = hh - n_heads;
    bool is_k = hh >= n_heads;
    float* h = is_k ? k + (r * n_kv_heads + kh) * head_dim : q + (r * n_heads + hh) * head_dim;
    const float* w = is_k ? wk : wq;
    if (w) {  // (the same for the whole block)
        float scale = rms_scale(h, head_dim, is_k ? eps_k : eps_q);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) h[i] = h[i] * scale * w[i];
        __syncthreads();  // a pair's two elements may be other threads'
    }
    u16* kr = 0;
    long at = 0;
    if (is_k && kc) {
        kr = (u16*)(kc + seq[r] * seq_stride_k);
        at = ((long)kh * ctx + pos[r] % ctx) * head_dim;
    }
    for (int i = threadIdx.x; i < half_dims; i += blockDim.x) {
        int a = neox ? i : 2 * i;
        int b = neox ? i + half_dims : 2 * i + 1;
        rotate_pair(h, a, b, i, pos[r], theta_scale, freq_scale, freq_factors, y);
        if (!is_k) {
            h[a] *= q_scale;
            h[b] *= q_scale;
        }
        if (kr) {
            kr[at + a] = f2h(h[a]);
            kr[at + b] = f2h(h[b]);
        }
    }
    for (int d = n_dims + threadIdx.x; d < head_dim; d += blockDim.x) {  // past the rotation
        if (!is_k) h[d] *= q_scale;
        else if (kr) kr[at + d] = f2h(h[d]);
    }
    if (is_k && kc) {  // the head's values to the cache
        u16* vr = (u16*)(vc + seq[r] * seq_stride_v);
        const float* vs = v + (r * n_kv_heads + kh) * hd_v;
        for (int d = threadIdx.x; d < hd_v; d += blockDim.x)
            vr[((long)kh * ctx + pos[r] % ctx) * hd_v + d] = f2h(vs[d]);
    }
}
