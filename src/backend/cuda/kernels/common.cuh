// Prelude of every kiln kernel file (prepended by nvrtc.rs). No CUDA headers: f16 and bf16
// conversions are inline PTX or bit operations, so NVRTC alone compiles the kernels.
//
// Conventions: matrices are the GGUF file's bytes, row-major, each row a whole number of
// blocks; activations are f32, row-major, `[rows, width]`; positions and lengths are read from
// device memory (never kernel arguments), so a recorded graph replays with new ones.

#define KILN_INF __int_as_float(0x7f800000)

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#ifndef KILN_EMULATED  // (the emulator, emulator.cpp, defines these three for the host)
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float u2f(u32 v) { return __uint_as_float(v); }
#endif

// The start of every kernel. Launched with programmatic stream serialization (gpu.rs, sm_90
// and later), a kernel's blocks may be placed before the kernel ahead of it in the stream has
// finished: wait here until it has and its writes are visible, then let the kernel after this
// one be placed (it waits in turn). Elsewhere (older GPUs, the software GPU) nothing.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Before `pdl_begin`: ask L2 for a weight row of a launch (`prefetch_row`), its threads taking
// every `lanes`-th line of 128 bytes in turn. For the weights alone, which no kernel writes: while this kernel waits for the
// one ahead, its weights come from memory, so its first loads after the wait find them in L2.
// Only for launches of at most KILN_L2_PREFETCH_MAX bytes of weights: a small model's matrices
// (its decode is a chain of short kernels, each waiting on memory), not a large model's,
// whose products stream at bandwidth and whose prefetches would compete with the kernel ahead
// (an 8B model decoded 4% slower with them, SmolLM2 5% faster; H100, 2026-11-27, 58292de). A hint (no
// load: nothing is read, nothing can fault); KILN_L2_PREFETCH 0 (`KILN_CUDA_PREFETCH=0`,
// nvrtc.rs) turns it off.
#ifndef KILN_L2_PREFETCH
#define KILN_L2_PREFETCH 1
#endif
#define KILN_L2_PREFETCH_MAX (8l << 20)
// Whether a launch of `bytes` of weights asks for them ahead.
__device__ __forceinline__ bool prefetch_fits(long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && KILN_L2_PREFETCH
    return bytes <= KILN_L2_PREFETCH_MAX;
#else
    return false;
#endif
}

// The 128-byte lines of bytes p..p + bytes, `lanes` threads taking every lanes-th.
__device__ __forceinline__ void prefetch_span(const u8* p, long bytes, int lane, int lanes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && KILN_L2_PREFETCH
    const u8* first = (const u8*)((unsigned long long)p & ~127ull);
    for (const u8* q = first + 128l * lane; q < p + bytes; q += 128l * lanes)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(q));
#endif
}

// Row `row` (`ng` groups of 32) of a matrix of G groups in a launch of `nrows` such rows: as
// the file stores it (A0 0: a row's blocks of `ELEMS` elements, `BYTES` each, together), or
// rearranged at upload (blocks.cuh: each block's fields in arrays of their own, A0, A1, A2
// and the rest of BYTES bytes a block: a run in each).
template <int BYTES, int ELEMS, int A0, int A1, int A2>
__device__ __forceinline__ void prefetch_row(const u8* w, int row, int ng, int G, int nrows,
                                             int lane, int lanes) {
    long nb = ng / (ELEMS / 32), all = (long)G / (ELEMS / 32), row_bytes = nb * BYTES;
    if (!prefetch_fits(row_bytes * nrows)) return;
    if (A0 == 0) {
        prefetch_span(w + row * row_bytes, row_bytes, lane, lanes);
        return;
    }
    const int size[4] = {A0, A1, A2, BYTES - A0 - A1 - A2};
    long at = 0;
    for (int a = 0; a < 4; ++a) {
        if (size[a]) prefetch_span(w + at + row * nb * size[a], nb * size[a], lane, lanes);
        at += all * size[a];
    }
}

// 16 bytes loaded at once (from a 16-byte aligned address).
struct alignas(16) u32x4 {
    u32 x, y, z, w;
};

// A little-endian u16 at any even offset (block fields are 2-byte aligned at best).
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

// A dequantizer of the file's blocks (blocks.cuh `dq_*(block, i)`, BYTES a block) under the
// signature of the rearranged layouts' (`dq_*r(matrix, block index, groups of 32 in the
// matrix, i)`), so one kernel serves both layouts.
template <int BYTES, float (*DQ)(const u8*, int)>
__device__ __forceinline__ float dq_file(const u8* w, long b, long, int i) {
    return DQ(w + b * BYTES, i);
}

// A sum (MAX false) or maximum (MAX true) over the warp; every lane gets it.
template <bool MAX>
__device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, w) : v + w;
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<false>(v); }

// The same over the block (blockDim.x a multiple of 32, at most 1024).
template <bool MAX>
__device__ float block_reduce(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_reduce<MAX>(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int n = (blockDim.x + 31) >> 5;
    v = lane < n ? part[lane] : (MAX ? -KILN_INF : 0.0f);
    return warp_reduce<MAX>(v);
}

__device__ float block_sum(float v) { return block_reduce<false>(v); }

// A sum in f64 over the block (blockDim.x a multiple of 32, at most 1024).
__device__ double block_sum_f64(double v) {
    __shared__ double part64[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) part64[warp] = v;
    __syncthreads();
    int n = (blockDim.x + 31) >> 5;
    v = lane < n ? part64[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float block_max(float v) { return block_reduce<true>(v); }

// 1 / sqrt(mean(x²) + eps) over a row of `width` (the block's threads take elements in turn):
// as the CPU (and the reference), f32 squares summed in f64, the mean rounded to f32.
__device__ float rms_scale(const float* xr, int width, float eps) {
    double ss = 0.0;
    int i = threadIdx.x, step = blockDim.x;
    // Four loads in flight at a time (a row is read right after another kernel wrote it, so
    // each load waits on the L2); the sum keeps the one-at-a-time order.
    for (; i + 3 * step < width; i += 4 * step) {
        float a = xr[i], b = xr[i + step], c = xr[i + 2 * step], d = xr[i + 3 * step];
        ss += (double)(a * a);
        ss += (double)(b * b);
        ss += (double)(c * c);
        ss += (double)(d * d);
    }
    if (i + step < width) {
        float a = xr[i], b = xr[i + step];
        ss += (double)(a * a);
        ss += (double)(b * b);
        i += 2 * step;
    }
    if (i < width) ss += (double)(xr[i] * xr[i]);
    ss = block_sum_f64(ss);
    return 1.0f / sqrtf((float)(ss / (double)width) + eps);
}


// Whether this block is the last of `n` to arrive at `count` (every thread of the block calls
// it, after writing what the last one reads). Each block's writes are made visible to the
// whole GPU before it is counted, so the last one sees every block's; it sets the counter back
// to zero for the next launch. (The split attention's merge, the products' post-norm.)
__device__ __forceinline__ bool last_to_arrive(int* count, int n) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count, 1) == n - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// x += rms_norm(p)·w over one row of `width` by the whole block: a post-norm (Gemma-3's, after
// the attention and after the FFN) and the residual add after it (`rms_norm_add_f32`, and the
// products' epilogue `last_block_norm_add`). The products and the sum are rounded one by one
// (no fused multiply-add), as rms_norm_f32 then add_f32 round them: the same bits.
__device__ __forceinline__ void norm_add_row(float* xr, const float* pr, const float* w,
                                             int width, float eps) {
    float scale = rms_scale(pr, width, eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(pr[i], scale), w[i]));
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// GELU, tanh approximation, as the reference (and the CPU) computes it: from a table of f16
// entries (`ggml_table_gelu_f16`), i.e. of the input rounded to f16, the f32 formula, the
// result rounded to f16; identity from 10, zero to −10. (src/kernels/ops.rs `gelu_tanh_with`.)
__device__ __forceinline__ float gelu_tanh(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    float v = h2f(f2h(x));
    float g = 0.5f * v * (1.0f + tanhf(0.7978846f * v * fmaf(0.044715f * v, v, 1.0f)));
    return h2f(f2h(g));
}
