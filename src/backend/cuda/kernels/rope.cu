// Rotary position embedding, in place, over `[rows, n_heads · head_dim]`: row r is at position
// pos[r]. The first `n_dims` of each head rotate in pairs: adjacent (2i, 2i+1) for the normal
// kind, split halves (i, i + n_dims/2) for NeoX. θ_i = freq_scale · pos · theta_scale^i,
// divided by freq_factors[i] when given, with theta_scale = base^(−2/n_dims) computed by the
// host: the running product in f32 and the fused rotation are the CPU's (and the reference's)
// arithmetic, so the angles agree to the last bit but for cosf/sinf's rounding.
// One thread per (row, head, pair).
extern "C" __global__ void rope_f32(float* x, const int* pos, long rows, int n_heads,
                                    int head_dim, int n_dims, float theta_scale,
                                    float freq_scale, const float* freq_factors, int neox) {
    int half_dims = n_dims / 2;
    long n = rows * n_heads * half_dims;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < n;
         t += (long)gridDim.x * blockDim.x) {
        int i = (int)(t % half_dims);
        long rh = t / half_dims;
        long r = rh / n_heads;
        float* h = x + rh * head_dim;
        float theta = (float)pos[r];
        for (int k = 0; k < i; ++k) theta *= theta_scale;
        float ff = freq_factors ? freq_factors[i] : 1.0f;
        float a_ = freq_scale * theta / ff;
        float c = cosf(a_), s = sinf(a_);
        int a = neox ? i : 2 * i;
        int b = neox ? i + half_dims : 2 * i + 1;
        float x0 = h[a], x1 = h[b];
        h[a] = fmaf(x0, c, -(x1 * s));
        h[b] = fmaf(x0, s, x1 * c);
    }
}
