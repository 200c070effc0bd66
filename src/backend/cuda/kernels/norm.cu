// Norms over groups of `width` floats (a row, or one head of a row): one block per group.
// Group g reads row `sel[g]` of x when `sel` is given (the output head's rows), else row g.
// `y` may be `x` (in place, without `sel`): each thread reads its elements before writing them.

__device__ __forceinline__ long src_row(const int* sel) {
    return sel ? (long)sel[blockIdx.x] : (long)blockIdx.x;
}

// y = x / sqrt(mean(x²) + eps) · w
extern "C" __global__ void rms_norm_f32(const float* x, const int* sel, float* y, const float* w,
                                        int width, float eps) {
    pdl_begin();
    const float* xr = x + src_row(sel) * width;
    float* yr = y + (long)blockIdx.x * width;
    float scale = rms_scale(xr, width, eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// y = (x − mean) / sqrt(var + eps) · w + b
extern "C" __global__ void layer_norm_f32(const float* x, const int* sel, float* y,
                                          const float* w, const float* b, int width, float eps) {
    pdl_begin();
    const float* xr = x + src_row(sel) * width;
    float* yr = y + (long)blockIdx.x * width;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / (float)width;
    float v = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float d = xr[i] - mean;
        v += d * d;
    }
    float inv = 1.0f / sqrtf(block_sum(v) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

// x += rms_norm(p)·w over rows of `width`, one block per row (`norm_add_row`): a post-norm
// and the residual add after it in one launch, the same bits as the two kernels.
extern "C" __global__ void rms_norm_add_f32(float* x, const float* p, const float* w, int width,
                                            float eps) {
    pdl_begin();
    norm_add_row(x + (long)blockIdx.x * width, p + (long)blockIdx.x * width, w, width, eps);
}
