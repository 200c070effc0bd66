// Rotary position embedding, in place, over `[rows, n_heads · head_dim]`: row r is at position
// pos[r]. The first `n_dims` of each head rotate in pairs: adjacent (2i, 2i+1) for the normal
// kind, split halves (i, i + n_dims/2) for NeoX. θ = pos · freq_scale · base^(−2i/n_dims),
// divided by freq_factors[i] when given. One thread per (row, head, pair).
extern "C" __global__ void rope_f32(float* x, const int* pos, long rows, int n_heads,
                                    int head_dim, int n_dims, float freq_base,
                                    float freq_scale, const float* freq_factors, int neox) {
    int half_dims = n_dims / 2;
    long n = rows * n_heads * half_dims;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < n;
         t += (long)gridDim.x * blockDim.x) {
        int i = (int)(t % half_dims);
        long rh = t / half_dims;
        long r = rh / n_heads;
        float* h = x + rh * head_dim;
        float theta = (float)pos[r] * freq_scale * powf(freq_base, -2.0f * (float)i / (float)n_dims);
        if (freq_factors) theta /= freq_factors[i];
        float c = cosf(theta), s = sinf(theta);
        int a = neox ? i : 2 * i;
        int b = neox ? i + half_dims : 2 * i + 1;
        float x0 = h[a], x1 = h[b];
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
}
