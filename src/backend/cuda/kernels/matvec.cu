// Matrix products for decode-sized batches: y[t][r] = Σ_c W[r][c] · x[t][c] for `n_tok` rows
// of x (a few decode tokens), W the file's blocks.
//
// Quantized weights multiply 8-bit activations, as the CPU does (and ggml's MMVQ): x is first
// quantized (`quantize_q8_*`: int8 values in groups of 32, a scale d and s = d·Σq), then each
// 32-element group of a weight row meets its activation group in integer dot products of four
// bytes (`__dp4a`), and one multiply by the two scales. One block of four warps per output
// row; thread i takes groups i, i + 128, ... (i + blockDim.x); the block sums. Consecutive threads read
// consecutive groups, so a warp's loads cover a contiguous stretch of the row. Unquantized weights (F32, F16, BF16) multiply f32
// activations. Prompt-sized batches go through dequantization and a tensor-core product
// instead (gemm.cu).

// 32 activations quantized to 8 bits: x ≈ d · q, and s = d · Σ q (the sum that the formats
// with an offset or a minimum need), in registers, as the `dot_*` functions read them.
struct Q8x {
    int qs[8];
    float d;
    float s;
};

struct alignas(8) f32x2 {
    float x, y;
};

// Groups in memory (global or shared) as two arrays: the quants, 32 bytes a group (`q`, 8
// ints), and the scales d and s, 8 bytes a group (`ds`). A buffer of G groups holds the quants
// at its start and the scales 32·G bytes on (`q8_view`). Each lane of a warp reads another
// group, so a warp's loads of the quants (two of 16 bytes) and of the scales (one of 8) each
// cover contiguous bytes: 18 L1 wavefronts per 32 groups, where groups of 40 bytes read in
// ten 4-byte loads took about 100 (an 8B model's decode products were bound by them, not by
// their weights), and groups of 48 read in three vector loads 36.
struct Q8v {
    int* q;
    f32x2* ds;
};

__device__ __forceinline__ Q8v q8_view(const void* buf, long groups) {
    Q8v v = {(int*)buf, (f32x2*)((u8*)buf + 32 * groups)};
    return v;
}

// The groups from group `g` on.
__device__ __forceinline__ Q8v q8_at(Q8v v, long g) {
    Q8v r = {v.q + 8 * g, v.ds + g};
    return r;
}

// Group `g` into registers: two loads of 16 bytes and one of 8.
__device__ __forceinline__ Q8x ldq8(Q8v v, long g) {
    const u32x4* q = (const u32x4*)(v.q + 8 * g);
    u32x4 a = q[0], b = q[1];
    f32x2 ds = v.ds[g];
    Q8x r;
    r.qs[0] = (int)a.x, r.qs[1] = (int)a.y, r.qs[2] = (int)a.z, r.qs[3] = (int)a.w;
    r.qs[4] = (int)b.x, r.qs[5] = (int)b.y, r.qs[6] = (int)b.z, r.qs[7] = (int)b.w;
    r.d = ds.x;
    r.s = ds.y;
    return r;
}

// The activations are quantized as the CPU backend (kiln's, and ggml's on x86) quantizes them
// for the same weight format, so both devices round alike: Q8_0 for q4_0, q5_0 and q8_0, Q8_1
// for q4_1 and q5_1 (groups of 32: d = max|x| / 127 kept as f16, q = x · 127 / max|x| rounded
// to nearest even; Q8_1's s also as f16), Q8_K for the K formats (groups of 256 sharing one
// f32 scale that maps the signed extreme to −127, q clamped at 127). Each kernel takes `n`
// floats (a multiple of its group) and writes `n / 32` groups (`Q8v`); one thread per element.

// Element i (of a flat run of groups) quantized by the whole warp holding its group of 32.
template <bool S_F16>
__device__ void q8_32(float v, long i, Q8v y) {
    float amax = warp_reduce<true>(fabsf(v));
    float d = amax / 127.0f;
    int q = amax == 0.0f ? 0 : (int)rintf(v * (127.0f / amax));
    float sum = warp_sum((float)q);
    ((i8*)(y.q + 8 * (i >> 5)))[i & 31] = (i8)q;
    if ((i & 31) == 0) {
        f32x2 ds;
        ds.x = h2f(f2h(d));
        ds.y = S_F16 ? h2f(f2h(d * sum)) : h2f(f2h(d)) * sum;
        y.ds[i >> 5] = ds;
    }
}

// Element i quantized by a block of 256 threads holding its group of 256 (thread t: element
// t of the group).
__device__ void q8_256(float v, long i, Q8v y) {
    __shared__ float extreme;
    float amax = block_max(fabsf(v));
    // The first element of largest magnitude (its sign sets the scale's).
    float first = block_max(fabsf(v) == amax ? -(float)threadIdx.x : -1024.0f);
    if (-(int)first == (int)threadIdx.x) extreme = v;
    __syncthreads();
    float iscale = amax == 0.0f ? 0.0f : -127.0f / extreme;
    int q = amax == 0.0f ? 0 : min(127, (int)rintf(iscale * v));
    float d = amax == 0.0f ? 0.0f : 1.0f / iscale;
    float sum = warp_sum((float)q);
    ((i8*)(y.q + 8 * (i >> 5)))[i & 31] = (i8)q;
    if ((i & 31) == 0) {
        f32x2 ds;
        ds.x = d;
        ds.y = d * sum;
        y.ds[i >> 5] = ds;
    }
    __syncthreads();  // (`extreme` is read before the next group writes it)
}

extern "C" __global__ void quantize_q8_0(const float* x, u8* y, long n) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    // (whole warps: n is a multiple of 32)
    if (i < n) q8_32<false>(x[i], i, q8_view(y, n >> 5));
}

extern "C" __global__ void quantize_q8_1(const float* x, u8* y, long n) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) q8_32<true>(x[i], i, q8_view(y, n >> 5));
}

// One block of 256 threads per group of 256.
extern "C" __global__ void quantize_q8_k(const float* x, u8* y, long n) {
    pdl_begin();
    long i = (long)blockIdx.x * 256 + threadIdx.x;
    q8_256(x[i], i, q8_view(y, n >> 5));
}

// RMS norm (as `rms_norm_f32`, into y) with the normalized rows also quantized for the
// products that read them, as `quantize_q8_*` would (`kind` 1: Q8_0, 2: Q8_1, 3: Q8_K, whose
// rows are whole groups of 256), into xq (`rows · width / 32` groups): one launch for both. One
// block of 256 threads per `slice` elements of a row (a multiple of 256): each block sums the
// whole row's squares (the same sum, in the same order, in every block of the row), then
// normalizes and quantizes its slice; x must not be y. Row `sel[b]` of x when `sel` is given.
extern "C" __global__ void rms_norm_q8(const float* x, const int* sel, float* y, const float* w,
                                       int width, float eps, u8* xq_buf, int kind, int slice) {
    pdl_begin();
    int parts = (width + slice - 1) / slice;
    Q8v xq = q8_view(xq_buf, (long)(gridDim.x / parts) * (width >> 5));
    int b = blockIdx.x / parts, part = blockIdx.x % parts;
    long r = sel ? (long)sel[b] : (long)b;
    const float* xr = x + r * width;
    float* yr = y + (long)b * width;
    float scale = rms_scale(xr, width, eps);
    int end = min(width, (part + 1) * slice);
    for (int base = part * slice; base < end; base += blockDim.x) {
        int i = base + threadIdx.x;
        float v = i < width ? xr[i] * scale * w[i] : 0.0f;
        if (i < width) yr[i] = v;
        long gi = (long)b * width + i;
        if (kind == 3)
            q8_256(v, gi, xq);
        else if (i < width)  // (whole warps: width is a multiple of 32)
            kind == 2 ? q8_32<true>(v, gi, xq) : q8_32<false>(v, gi, xq);
    }
}

// A u32 from a 2-byte-aligned address (block fields are 2-byte aligned at best).
__device__ __forceinline__ int ld32(const u8* p) {
    return (int)((u32)ld16(p) | ((u32)ld16(p + 2) << 16));
}

// Four bits, one per byte, into bit 4 of each byte (the fifth bit of q5 formats).
__device__ __forceinline__ int spread4(u32 b) {
    return (int)(((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25));
}

#define ONES 0x01010101

// Each `dot_*` returns Σ W[32g + i] · x[i] over group g of matrix `w` (groups of 32 numbered
// row by row: group g of row r is r·ng + g), x the activation group `y`; G is the matrix's
// number of groups (the layouts rearranged at upload place their arrays by it).

// The integer sum of a group's 32 products from its nibbles (v: four ints of bytes, low
// nibbles elements 0..15, high ones 16..31) and its fifth bits (qh; 0 for the 4-bit formats).
__device__ __forceinline__ int nib_sum(const int* v, u32 qh, const Q8x* y) {
    int s = 0;
    for (int k = 0; k < 4; ++k) {
        s = __dp4a((v[k] & 0x0F0F0F0F) | spread4(qh >> (4 * k)), y->qs[k], s);
        s = __dp4a(((v[k] >> 4) & 0x0F0F0F0F) | spread4(qh >> (4 * k + 16)), y->qs[k + 4], s);
    }
    return s;
}

// A group of values d·(q − off) (q4_0: 8, q5_0: 16) from its integer sum s and scale d.
__device__ __forceinline__ float sum_offset(int s, u16 d, float off, const Q8x* y) {
    return h2f(d) * (y->d * (float)s - off * y->s);
}

// A group of values d·q + m (q4_1, q5_1).
__device__ __forceinline__ float sum_min(int s, u16 d, u16 m, const Q8x* y) {
    return h2f(d) * y->d * (float)s + h2f(m) * y->s;
}

// 16 bytes at a 2-byte aligned address as four ints.
__device__ __forceinline__ void ld_16_unaligned(const u8* p, int* v) {
    for (int k = 0; k < 4; ++k) v[k] = ld32(p + 4 * k);
}

// q4_0: d, 16 bytes of nibbles; value d·(q − 8).
__device__ __forceinline__ float dot_q4_0(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * Q4_0_BYTES;
    int v[4];
    ld_16_unaligned(b + 2, v);
    return sum_offset(nib_sum(v, 0, y), ld16(b), 8.0f, y);
}

// q4_1: d, m, nibbles; value d·q + m.
__device__ __forceinline__ float dot_q4_1(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * Q4_1_BYTES;
    int v[4];
    ld_16_unaligned(b + 4, v);
    return sum_min(nib_sum(v, 0, y), ld16(b), ld16(b + 2), y);
}

// q5_0: d, 32 fifth bits, nibbles; value d·(q − 16).
__device__ __forceinline__ float dot_q5_0(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * Q5_0_BYTES;
    int v[4];
    ld_16_unaligned(b + 6, v);
    return sum_offset(nib_sum(v, (u32)ld32(b + 2), y), ld16(b), 16.0f, y);
}

// q5_1: d, m, fifth bits, nibbles; value d·q + m.
__device__ __forceinline__ float dot_q5_1(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * Q5_1_BYTES;
    int v[4];
    ld_16_unaligned(b + 8, v);
    return sum_min(nib_sum(v, (u32)ld32(b + 4), y), ld16(b), ld16(b + 2), y);
}

// q8_0: d, 32 signed bytes.
__device__ __forceinline__ float dot_q8_0(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * Q8_0_BYTES;
    int s = 0;
    for (int k = 0; k < 8; ++k) s = __dp4a(ld32(b + 2 + 4 * k), y->qs[k], s);
    return h2f(ld16(b)) * y->d * (float)s;
}

// The 32-element formats rearranged at upload (blocks.cuh: a matrix of G groups as arrays of
// quants, fifth bits and scales): a group's nibbles in one 16-byte load (q8_0's quants in
// two), its fifth bits and its scales in one load each, where the file's blocks of 18 to 34
// bytes, 2-byte aligned, take a 2-byte load per field and per 2 bytes of quants (each lane of
// a warp on another group: a cache line touched per lane and load). The same arithmetic as
// the file layout's `dot_*`, bit for bit.
// 16 bytes at a 16-byte aligned address as four ints (little-endian, as `ld32` reads them).
__device__ __forceinline__ void ld_16(const u8* p, int* v) {
    u32x4 v4 = *(const u32x4*)p;
    v[0] = (int)v4.x, v[1] = (int)v4.y, v[2] = (int)v4.z, v[3] = (int)v4.w;
}

__device__ __forceinline__ void ld_nibbles(const u8* w, int g, int* v) { ld_16(w + (long)g * 16, v); }

__device__ __forceinline__ float dot_q4_0r(const u8* w, int g, const Q8x* y, int G) {
    int v[4];
    ld_nibbles(w, g, v);
    return sum_offset(nib_sum(v, 0, y), ld16(w + 16l * G + 2l * g), 8.0f, y);
}

__device__ __forceinline__ float dot_q4_1r(const u8* w, int g, const Q8x* y, int G) {
    int v[4];
    ld_nibbles(w, g, v);
    u32 dm = *(const u32*)(w + 16l * G + 4l * g);
    return sum_min(nib_sum(v, 0, y), (u16)(dm & 0xFFFF), (u16)(dm >> 16), y);
}

__device__ __forceinline__ float dot_q5_0r(const u8* w, int g, const Q8x* y, int G) {
    int v[4];
    ld_nibbles(w, g, v);
    u32 qh = *(const u32*)(w + 16l * G + 4l * g);
    return sum_offset(nib_sum(v, qh, y), ld16(w + 20l * G + 2l * g), 16.0f, y);
}

__device__ __forceinline__ float dot_q5_1r(const u8* w, int g, const Q8x* y, int G) {
    int v[4];
    ld_nibbles(w, g, v);
    u32 qh = *(const u32*)(w + 16l * G + 4l * g);
    u32 dm = *(const u32*)(w + 20l * G + 4l * g);
    return sum_min(nib_sum(v, qh, y), (u16)(dm & 0xFFFF), (u16)(dm >> 16), y);
}

__device__ __forceinline__ float dot_q8_0r(const u8* w, int g, const Q8x* y, int G) {
    int v[8];
    ld_16(w + (long)g * 32, v);
    ld_16(w + (long)g * 32 + 16, v + 4);
    int s = 0;
    for (int k = 0; k < 8; ++k) s = __dp4a(v[k], y->qs[k], s);
    return h2f(ld16(w + 32l * G + 2l * g)) * y->d * (float)s;
}

// The K formats: group g is sub-block g % 8 of super-block g / 8 (256 elements).

// q2_K: elements 32·sub.. take shift 2·(sub % 4) of bytes 16 + 32·(sub / 4).., and two scale
// bytes (low nibble scale, high nibble min), one per 16 elements.
__device__ __forceinline__ float dot_q2_k(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * Q2_K_BYTES;
    int sub = g & 7, h = sub >> 2, j = sub & 3;
    int s[2] = {0, 0}, ys[2] = {0, 0};
    for (int k = 0; k < 8; ++k) {
        // (Blocks of 84 bytes: 4-byte aligned.)
        int v = (*(const int*)(b + 16 + 32 * h + 4 * k) >> (2 * j)) & 0x03030303;
        s[k >> 2] = __dp4a(v, y->qs[k], s[k >> 2]);
        ys[k >> 2] = __dp4a(ONES, y->qs[k], ys[k >> 2]);
    }
    int sc0 = b[8 * h + 2 * j], sc1 = b[8 * h + 2 * j + 1];
    float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
    return y->d * (d * (float)((sc0 & 15) * s[0] + (sc1 & 15) * s[1]) -
                   dmin * (float)((sc0 >> 4) * ys[0] + (sc1 >> 4) * ys[1]));
}

// q3_K's 6-bit scale k (of 16), packed in 12 bytes.
__device__ __forceinline__ int q3k_scale(const u8* s, int k) {
    if (k < 4) return (s[k] & 15) | ((s[8 + k] & 3) << 4);
    if (k < 8) return (s[k] & 15) | (((s[4 + k] >> 2) & 3) << 4);
    if (k < 12) return (s[k - 8] >> 4) | (((s[k] >> 4) & 3) << 4);
    return (s[k - 8] >> 4) | (((s[k - 4] >> 6) & 3) << 4);
}

// q3_K: value (s − 32)·(q + 4·hi − 4), q the 2-bit value, hi the bit of the high mask.
__device__ __forceinline__ float dot_q3_k(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * Q3_K_BYTES;
    int sub = g & 7, h = sub >> 2, j = sub & 3;
    int s[2] = {0, 0}, ys[2] = {0, 0};
    for (int k = 0; k < 8; ++k) {
        int q = (ld32(b + 32 + 32 * h + 4 * k) >> (2 * j)) & 0x03030303;
        int hi = (ld32(b + 4 * k) >> (4 * h + j)) & ONES;
        s[k >> 2] = __dp4a(q | (hi << 2), y->qs[k], s[k >> 2]);
        ys[k >> 2] = __dp4a(ONES, y->qs[k], ys[k >> 2]);
    }
    int k0 = 8 * h + 2 * j;
    int sc0 = q3k_scale(b + 96, k0) - 32, sc1 = q3k_scale(b + 96, k0 + 1) - 32;
    return h2f(ld16(b + 108)) * y->d *
           (float)(sc0 * (s[0] - 4 * ys[0]) + sc1 * (s[1] - 4 * ys[1]));
}

// q4_K: sub-block sub takes the low (even sub) or high nibbles of bytes 16 + 32·(sub / 2)..;
// value d·sc·q − dmin·m.
__device__ __forceinline__ float dot_q4_k(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * Q4_K_BYTES;
    int sub = g & 7, shift = 4 * (sub & 1);
    // (Blocks of 144 bytes: the 32 bytes of nibbles are 16-byte aligned, two loads.)
    int q[8];
    ld_16(b + 16 + 32 * (sub >> 1), q);
    ld_16(b + 32 + 32 * (sub >> 1), q + 4);
    int s = 0;
    for (int k = 0; k < 8; ++k) s = __dp4a((q[k] >> shift) & 0x0F0F0F0F, y->qs[k], s);
    int sc, m;
    k4_scale_min(b + 4, sub, &sc, &m);
    return h2f(ld16(b)) * (float)sc * y->d * (float)s - h2f(ld16(b + 2)) * (float)m * y->s;
}

// q5_K: as q4_K, with fifth bits (bit sub of the bytes 16..47).
__device__ __forceinline__ float dot_q5_k(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * Q5_K_BYTES;
    int sub = g & 7, shift = 4 * (sub & 1);
    // (Blocks of 176 bytes: nibbles and fifth bits 16-byte aligned, two loads each.)
    int qs[8], qh[8];
    ld_16(b + 48 + 32 * (sub >> 1), qs);
    ld_16(b + 64 + 32 * (sub >> 1), qs + 4);
    ld_16(b + 16, qh);
    ld_16(b + 32, qh + 4);
    int s = 0;
    for (int k = 0; k < 8; ++k) {
        int q = (qs[k] >> shift) & 0x0F0F0F0F;
        int hi = (qh[k] >> sub) & ONES;
        s = __dp4a(q | (hi << 4), y->qs[k], s);
    }
    int sc, m;
    k4_scale_min(b + 4, sub, &sc, &m);
    return h2f(ld16(b)) * (float)sc * y->d * (float)s - h2f(ld16(b + 2)) * (float)m * y->s;
}

// q6_K: value sc·(q − 32), q = low nibble | high pair << 4; one signed scale per 16. Group
// `quarter` of its half from the half's 8 words of low nibbles (ql) and of high pairs (qh),
// its two scales sc and d (f32).
__device__ __forceinline__ float q6_k_sum(const int* ql, const int* qh, int quarter, const u8* sc,
                                          float d, const Q8x* y) {
    int nshift = quarter < 2 ? 0 : 4;
    int s[2] = {0, 0}, ys[2] = {0, 0};
    for (int k = 0; k < 8; ++k) {
        int q = (ql[k] >> nshift) & 0x0F0F0F0F;
        int hi = (qh[k] >> (2 * quarter)) & 0x03030303;
        s[k >> 2] = __dp4a(q | (hi << 4), y->qs[k], s[k >> 2]);
        ys[k >> 2] = __dp4a(ONES, y->qs[k], ys[k >> 2]);
    }
    int sc0 = (i8)sc[0], sc1 = (i8)sc[1];
    return d * y->d * (float)(sc0 * (s[0] - 32 * ys[0]) + sc1 * (s[1] - 32 * ys[1]));
}

// The file's 210-byte blocks, 2-byte aligned: 4-byte words read as 2-byte halves.
__device__ __forceinline__ float dot_q6_k(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * Q6_K_BYTES;
    int sub = g & 7, h = sub >> 2, quarter = sub & 3;
    const u8* lo = b + 64 * h + ((quarter & 1) ? 32 : 0);
    int ql[8], qh[8];
    for (int k = 0; k < 8; ++k) {
        ql[k] = ld32(lo + 4 * k);
        qh[k] = ld32(b + 128 + 32 * h + 4 * k);
    }
    return q6_k_sum(ql, qh, quarter, b + 192 + 8 * h + 2 * quarter, h2f(ld16(b + 208)), y);
}

// q6_K rearranged at upload (blocks.cuh `dq_q6_kr`: the blocks' fields in arrays, G / 8
// blocks): the group's 32 bytes of low nibbles and 32 of high pairs in four 16-byte loads,
// where the file's blocks took 32 loads of 2 bytes.
__device__ __forceinline__ float dot_q6_kr(const u8* w, int g, const Q8x* y, int G) {
    long sb = g >> 3, nb = G >> 3;
    int sub = g & 7, h = sub >> 2, quarter = sub & 3;
    int ql[8], qh[8];
    const u8* lo = w + 128 * sb + 64 * h + ((quarter & 1) ? 32 : 0);
    ld_16(lo, ql);
    ld_16(lo + 16, ql + 4);
    ld_16(w + 128 * nb + 64 * sb + 32 * h, qh);
    ld_16(w + 128 * nb + 64 * sb + 32 * h + 16, qh + 4);
    return q6_k_sum(ql, qh, quarter, w + 192 * nb + 16 * sb + 8 * h + 2 * quarter,
                    h2f(ld16(w + 208 * nb + 2 * sb)), y);
}

// The sum of v over the block (whole warps, at most 32); every thread gets it.
__device__ __forceinline__ float row_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) r += part[i];
    __syncthreads();
    return r;
}

// `tpr` threads per output row, whole warps: one warp per row and blockDim.x / 32 rows per
// block for rows of up to 512 groups (step/products.rs `mv_shape`: the warp sums its row
// without a barrier, and a block has work for all its threads), a block of four warps per
// row past that. Up to three matrices of one format that share the input (the
// attention's q, k and v) go in one launch: rows0 + rows1 + rows2 rows, row i of the launch
// being row i of the first, then of the second, then of the third (rows1 = rows2 = 0: one).
// With `add`, the products are added to y (a residual stream: y + (w·x), as a separate add
// of the product would round it).
// `NAME##_f` takes f32 input, which each block quantizes into shared memory (as
// `quantize_q8_*` would: KIND 0 Q8_0, 1 Q8_1, 2 Q8_K), a token at a time, RMS-normalized
// first with weights `nw` (as `rms_norm_q8` would) unless `nw` is null: rows of at most
// F32_INPUT_COLS elements, a warp per row, blocks of 256. Its sums are those of `NAME` after those kernels,
// bit for bit, and their launches are saved.
// Row `row` of a launch over up to three matrices (rows0 + rows1 + rows2 rows): its matrix's
// bytes, its output, its row there and that matrix's rows.
struct MvRow {
    const u8* w;
    float* y;
    int row, rows;
};

__device__ __forceinline__ MvRow mv_row(int row, const u8* w0, const u8* w1, const u8* w2,
                                        float* y0, float* y1, float* y2, int rows0, int rows1,
                                        int rows2) {
    MvRow r = {w0, y0, row, rows0};
    if (row >= rows0) {
        r.row -= rows0, r.rows = rows1, r.w = w1, r.y = y1;
        if (r.row >= rows1) r.row -= rows1, r.rows = rows2, r.w = w2, r.y = y2;
    }
    return r;
}

// The widest input row the kernels over f32 input quantize in their blocks (step/products.rs
// takes them for rows up to 2048 by default, up to this with `KILN_CUDA_F32_INPUT_COLS`).
#define F32_INPUT_COLS 4096

// One token's input row (`cols` ≤ F32_INPUT_COLS f32, whole groups) quantized into shared `xs`
// (128 groups) by a block of 256 threads, as `quantize_q8_*` quantizes it, RMS-normalized first
// (as `rms_norm_q8`: x · scale · nw) when `nw` is given, 2048 elements at a time: each thread
// loads its (up to eight) elements first, so the loads are in flight together. Every warp
// takes part in every round (past `cols`, zeros into groups no one reads), so the block meets
// each shuffle together (as the software GPU requires).
template <int KIND>
__device__ __forceinline__ void quantize_row_shared(const float* x, int cols, const float* nw,
                                                    float eps, Q8v xs) {
    float scale = nw ? rms_scale(x, cols, eps) : 1.0f;
    for (int c0 = 0; c0 < cols; c0 += 2048) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int i = c0 + k * 256 + threadIdx.x;
            v[k] = i >= cols ? 0.0f : nw ? x[i] * scale * nw[i] : x[i];
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int i = c0 + k * 256 + threadIdx.x;
            if (c0 + k * 256 >= cols) break;
            if (KIND == 2)
                q8_256(v[k], i, xs);  // (rows of Q8_K are whole groups of 256)
            else
                q8_32<KIND == 1>(v[k], i, xs);
        }
    }
}

// RoPE in the epilogue of the attention's q, k and v products (one launch of `MATVEC_Q`'s
// `NAME_rope` or `NAME_f_rope`; step.rs `matmul`, for layers whose RoPE follows the products
// directly): the
// `rope_qk` kernel's arithmetic on the products' rows, bit for bit, and, with `kc` and `vc`
// given, the rotated keys and the values to the layer's f16 cache. Rows of a warp each (eight
// to a block): the pair (2i, 2i + 1) of a head is warps (w & ~1, w | 1) of one block, as the
// three matrices' rows are multiples of eight. Token t is at position rpos[t] of sequence
// rseq[t]; the cache has `ctx` rows per head (`pos mod ctx`).
#define ROPE_PARAMS                                                                           \
    const int *rpos, const int *rseq, u8 *kc, u8 *vc, long sk, long sv, const float *ff,      \
        float theta_scale, float freq_scale, int head_dim, int n_dims, int hd_v, int ctx
#define ROPE_ARGS \
    rpos, rseq, kc, vc, sk, sv, ff, theta_scale, freq_scale, head_dim, n_dims, hd_v, ctx

// The parameters `MATVEC_Q`'s kernels share (their input x's type given), and no epilogue.
#define MATVEC_PARAMS(X)                                                                      \
    const u8 *w0, const u8 *w1, const u8 *w2, X, float *y0, float *y1, float *y2, int rows0,  \
        int rows1, int rows2, int cols, int n_tok, int add, int tpr
#define MATVEC_ARGS w0, w1, w2, x, y0, y1, y2, rows0, rows1, rows2, cols, n_tok, add, tpr
#define NO_ROPE nullptr, nullptr, nullptr, nullptr, 0, 0, nullptr, 0.0f, 0.0f, 0, 0, 0, 0

__device__ __forceinline__ void rope_epilogue(float acc, int row, int rows0, int rows1,
                                              const MvRow& r, int t, int lane, ROPE_PARAMS) {
    __shared__ float res[8];
    int w = threadIdx.x >> 5;
    if (lane == 0) res[w] = acc;
    __syncthreads();
    if (lane == 0) {
        int p = rpos[t];
        float out = acc;
        if (row < rows0 + rows1) {  // q or k: rotated
            int d = r.row % head_dim, h = r.row / head_dim;
            if (d < n_dims) {
                int i = d >> 1;
                float theta = (float)p;
                for (int j = 0; j < i; ++j) theta *= theta_scale;
                float f = ff ? ff[i] : 1.0f;
                // (The CPU's `Rope::cos_sin` order, as `rotate_pair`'s: the position scale
                // times (θ / factor).)
                float a = __fmul_rn(freq_scale, theta / f);
                float c = cosf(a), sn = sinf(a);
                float x0 = res[w & ~1], x1 = res[w | 1];
                out = (d & 1) ? fmaf(x0, sn, x1 * c) : fmaf(x0, c, -(x1 * sn));
            }
            if (row >= rows0 && kc) {
                u16* kr = (u16*)(kc + rseq[t] * sk);
                kr[((long)h * ctx + p % ctx) * head_dim + d] = f2h(out);
            }
        } else if (vc) {
            int d = r.row % hd_v, h = r.row / hd_v;
            u16* vr = (u16*)(vc + rseq[t] * sv);
            vr[((long)h * ctx + p % ctx) * hd_v + d] = f2h(out);
        }
        r.y[(long)t * r.rows + r.row] = out;
    }
    __syncthreads();  // (res is rewritten for the next token)
}

// A post-norm and the residual add in the epilogue of the product before them (`NAME_f_post`;
// step.rs `matmul_add`, Gemma-3's attention output and FFN down products): once every block
// has written its rows of the product y (`[n_tok, width]`, one matrix of `width` rows), the
// last block to finish does x += rms_norm(y)·w for each token, as `rms_norm_add_f32` does (a
// block of 256, the same bits), and sets the counter back to zero for the next launch.
#define POST_PARAMS float *px, const float *pw, float peps, int *count
#define POST_ARGS px, pw, peps, count
#define NO_POST nullptr, nullptr, 0.0f, nullptr

__device__ __forceinline__ void last_block_norm_add(const float* y, int width, int n_tok,
                                                    POST_PARAMS) {
    if (!last_to_arrive(count, (int)gridDim.x)) return;
    for (int t = 0; t < n_tok; ++t)
        norm_add_row(px + (long)t * width, y + (long)t * width, pw, width, peps);
}

// How many times the matvecs unroll their loop over a row's groups (loads of that many groups
// in flight per thread; nvrtc.rs sets it from KILN_CUDA_MV_UNROLL, for measuring).
#ifndef KILN_MV_UNROLL
#define KILN_MV_UNROLL 2
#endif
#define KILN_PRAGMA(x) _Pragma(#x)
#define KILN_UNROLL(n) KILN_PRAGMA(unroll n)

// The start of a `MATVEC_Q` kernel: its output row and lane, whether that row exists, the
// row's matrix and output, its groups; the row's weights prefetched before the wait on the
// launch before (PDL).
#define MV_ROW_BEGIN(BYTES, ELEMS, A0, A1, A2)                                                \
    int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;                            \
    int lane = threadIdx.x % tpr;                                                             \
    bool live = row < rows0 + rows1 + rows2;                                                  \
    MvRow r = mv_row(row, w0, w1, w2, y0, y1, y2, rows0, rows1, rows2);                       \
    int ng = cols >> 5, G = r.rows * ng;                                                      \
    if (live)                                                                                 \
        prefetch_row<BYTES, ELEMS, A0, A1, A2>(r.w, r.row, ng, G, rows0 + rows1 + rows2,      \
                                               lane, tpr);                                    \
    pdl_begin()

#define MATVEC_Q(NAME, BYTES, ELEMS, DOT, KIND, A0, A1, A2)                                   \
    __device__ __forceinline__ float NAME##_row(const u8* w, int g0, int G, Q8v xt, int ng,   \
                                                int lane, int tpr) {                          \
        float acc = 0.0f;                                                                     \
        KILN_UNROLL(KILN_MV_UNROLL) for (int g = lane; g < ng; g += tpr) {                    \
            Q8x xg = ldq8(xt, g);                                                             \
            acc += DOT(w, g0 + g, &xg, G);                                                    \
        }                                                                                     \
        return tpr == (int)blockDim.x ? row_sum(acc) : warp_sum(acc);                         \
    }                                                                                         \
    template <bool ROPE>                                                                      \
    __device__ __forceinline__ void NAME##_q(MATVEC_PARAMS(const u8* x), ROPE_PARAMS) {       \
        MV_ROW_BEGIN(BYTES, ELEMS, A0, A1, A2);                                               \
        if (!live) return;  /* (a whole warp: tpr < blockDim.x; every warp lives with RoPE) */\
        for (int t = 0; t < n_tok; ++t) {                                                     \
            Q8v xt = q8_at(q8_view(x, (long)n_tok * ng), (long)t * ng);                       \
            float acc = NAME##_row(r.w, r.row * ng, G, xt, ng, lane, tpr);                    \
            float* yo = r.y + (long)t * r.rows + r.row;                                       \
            if (ROPE)                                                                         \
                rope_epilogue(acc, row, rows0, rows1, r, t, lane, ROPE_ARGS);                 \
            else if (lane == 0)                                                               \
                *yo = add ? *yo + acc : acc;                                                  \
        }                                                                                     \
    }                                                                                         \
    template <bool ROPE>                                                                      \
    __device__ __forceinline__ void NAME##_fq(MATVEC_PARAMS(const float* x), ROPE_PARAMS,     \
                                              const float* nw, float eps, POST_PARAMS) {      \
        /* (F32_INPUT_COLS / 32 groups: quants 16-byte aligned, then scales) */               \
        __shared__ u32x4 xs_q[F32_INPUT_COLS / 16];                                           \
        __shared__ f32x2 xs_ds[F32_INPUT_COLS / 32];                                          \
        Q8v xs = {(int*)xs_q, xs_ds};                                                         \
        MV_ROW_BEGIN(BYTES, ELEMS, A0, A1, A2);  /* (all threads meet every barrier) */       \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            quantize_row_shared<KIND>(x + (long)t * cols, cols, nw, eps, xs);                 \
            __syncthreads();                                                                  \
            /* (Warps past the last row sum nothing, through the same shuffles.) */           \
            float acc = NAME##_row(r.w, r.row * ng, G, xs, live ? ng : 0, lane, tpr);         \
            float* yo = r.y + (long)t * r.rows + r.row;                                       \
            if (ROPE)                                                                         \
                rope_epilogue(acc, row, rows0, rows1, r, t, lane, ROPE_ARGS);                 \
            else if (live && lane == 0)                                                       \
                *yo = add ? *yo + acc : acc;                                                  \
            __syncthreads();  /* (xs is rewritten for the next token) */                      \
        }                                                                                     \
        if (px) last_block_norm_add(y0, rows0, n_tok, POST_ARGS);                             \
    }                                                                                         \
    extern "C" __global__ void NAME(MATVEC_PARAMS(const u8* x)) {                             \
        NAME##_q<false>(MATVEC_ARGS, NO_ROPE);                                                \
    }                                                                                         \
    extern "C" __global__ void NAME##_rope(MATVEC_PARAMS(const u8* x), ROPE_PARAMS) {         \
        NAME##_q<true>(MATVEC_ARGS, ROPE_ARGS);                                               \
    }                                                                                         \
    extern "C" __global__ void NAME##_f(MATVEC_PARAMS(const float* x), const float* nw,       \
                                        float eps) {                                          \
        NAME##_fq<false>(MATVEC_ARGS, NO_ROPE, nw, eps, NO_POST);                             \
    }                                                                                         \
    extern "C" __global__ void NAME##_f_post(MATVEC_PARAMS(const float* x), const float* nw,  \
                                             float eps, POST_PARAMS) {                        \
        NAME##_fq<false>(MATVEC_ARGS, NO_ROPE, nw, eps, POST_ARGS);                           \
    }                                                                                         \
    extern "C" __global__ void NAME##_f_rope(MATVEC_PARAMS(const float* x), ROPE_PARAMS,      \
                                             const float* nw, float eps) {                    \
        NAME##_fq<true>(MATVEC_ARGS, ROPE_ARGS, nw, eps, NO_POST);                            \
    }

// The gated FFN's two products and its activation in one launch:
// y[t][r] = act(gate_r · x_t) · (up_r · x_t), act SiLU (gelu 0) or GELU (gelu 1). Rows are
// shared out as `MATVEC_Q` shares them (`tpr` threads per row), so each product sums in the
// order of its matvec alone. `NAME##_f` takes f32 input as `MATVEC_Q`'s does (normalized
// with `nw` unless null; narrow rows, blocks of 256).
#define MATVEC_GATED(NAME, BYTES, ELEMS, DOT, KIND, A0, A1, A2)                               \
    __device__ __forceinline__ float NAME##_row(const u8* wg, const u8* wu, int g0, int G,    \
                                                Q8v xt, int ng, int lane, int tpr,            \
                                                int gelu) {                                   \
        float ag = 0.0f, au = 0.0f;                                                           \
        KILN_UNROLL(KILN_MV_UNROLL) for (int g = lane; g < ng; g += tpr) {                    \
            Q8x xg = ldq8(xt, g);                                                             \
            ag += DOT(wg, g0 + g, &xg, G);                                                    \
            au += DOT(wu, g0 + g, &xg, G);                                                    \
        }                                                                                     \
        bool block = tpr == (int)blockDim.x;                                                  \
        ag = block ? row_sum(ag) : warp_sum(ag);                                              \
        au = block ? row_sum(au) : warp_sum(au);                                              \
        return (gelu ? gelu_tanh(ag) : silu(ag)) * au;                                        \
    }                                                                                         \
    extern "C" __global__ void NAME(const u8* wg, const u8* wu, const u8* x, float* y,       \
                                    int rows, int cols, int n_tok, int gelu, int tpr) {       \
        int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;                        \
        int lane = threadIdx.x % tpr;                                                         \
        int ng = cols >> 5, G = rows * ng;                                                    \
        if (row < rows) {                                                                     \
            prefetch_row<BYTES, ELEMS, A0, A1, A2>(wg, row, ng, G, 2 * rows, lane, tpr);      \
            prefetch_row<BYTES, ELEMS, A0, A1, A2>(wu, row, ng, G, 2 * rows, lane, tpr);      \
        }                                                                                     \
        pdl_begin();                                                                          \
        if (row >= rows) return;  /* (a whole warp: tpr < blockDim.x) */                      \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            Q8v xt = q8_at(q8_view(x, (long)n_tok * ng), (long)t * ng);                       \
            float v = NAME##_row(wg, wu, row * ng, G, xt, ng, lane, tpr, gelu);               \
            if (lane == 0) y[(long)t * rows + row] = v;                                       \
        }                                                                                     \
    }                                                                                         \
    extern "C" __global__ void NAME##_f(const u8* wg, const u8* wu, const float* x, float* y,\
                                        int rows, int cols, int n_tok, int gelu, int tpr,     \
                                        const float* nw, float eps) {                         \
        /* (F32_INPUT_COLS / 32 groups: quants 16-byte aligned, then scales) */               \
        __shared__ u32x4 xs_q[F32_INPUT_COLS / 16];                                           \
        __shared__ f32x2 xs_ds[F32_INPUT_COLS / 32];                                          \
        Q8v xs = {(int*)xs_q, xs_ds};                                                         \
        int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;                        \
        int lane = threadIdx.x % tpr;                                                         \
        bool live = row < rows;  /* (all threads meet every barrier) */                       \
        int ng = cols >> 5, G = rows * ng, g0 = (live ? row : 0) * ng;                       \
        if (live) {                                                                           \
            prefetch_row<BYTES, ELEMS, A0, A1, A2>(wg, row, ng, G, 2 * rows, lane, tpr);      \
            prefetch_row<BYTES, ELEMS, A0, A1, A2>(wu, row, ng, G, 2 * rows, lane, tpr);      \
        }                                                                                     \
        pdl_begin();                                                                          \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            quantize_row_shared<KIND>(x + (long)t * cols, cols, nw, eps, xs);                 \
            __syncthreads();                                                                  \
            float v = NAME##_row(wg, wu, g0, G, xs, live ? ng : 0, lane, tpr, gelu);          \
            if (live && lane == 0) y[(long)t * rows + row] = v;                               \
            __syncthreads();  /* (xs is rewritten for the next token) */                      \
        }                                                                                     \
    }

// The file's layouts (A0 0), then the formats rearranged at upload (blocks.cuh: arrays of A0,
// A1, A2 and the rest of a block's bytes).
MATVEC_Q(matvec_q4_0, Q4_0_BYTES, 32, dot_q4_0, 0, 0, 0, 0)
MATVEC_Q(matvec_q4_1, Q4_1_BYTES, 32, dot_q4_1, 1, 0, 0, 0)
MATVEC_Q(matvec_q5_0, Q5_0_BYTES, 32, dot_q5_0, 0, 0, 0, 0)
MATVEC_Q(matvec_q5_1, Q5_1_BYTES, 32, dot_q5_1, 1, 0, 0, 0)
MATVEC_Q(matvec_q8_0, Q8_0_BYTES, 32, dot_q8_0, 0, 0, 0, 0)
MATVEC_Q(matvec_q2_k, Q2_K_BYTES, 256, dot_q2_k, 2, 0, 0, 0)
MATVEC_Q(matvec_q3_k, Q3_K_BYTES, 256, dot_q3_k, 2, 0, 0, 0)
MATVEC_Q(matvec_q4_k, Q4_K_BYTES, 256, dot_q4_k, 2, 0, 0, 0)
MATVEC_Q(matvec_q5_k, Q5_K_BYTES, 256, dot_q5_k, 2, 0, 0, 0)
MATVEC_Q(matvec_q6_k, Q6_K_BYTES, 256, dot_q6_k, 2, 0, 0, 0)
MATVEC_Q(matvec_q4_0r, Q4_0_BYTES, 32, dot_q4_0r, 0, 16, 0, 2)
MATVEC_Q(matvec_q4_1r, Q4_1_BYTES, 32, dot_q4_1r, 1, 16, 0, 4)
MATVEC_Q(matvec_q5_0r, Q5_0_BYTES, 32, dot_q5_0r, 0, 16, 4, 2)
MATVEC_Q(matvec_q5_1r, Q5_1_BYTES, 32, dot_q5_1r, 1, 16, 4, 4)
MATVEC_Q(matvec_q8_0r, Q8_0_BYTES, 32, dot_q8_0r, 0, 32, 0, 2)
MATVEC_Q(matvec_q6_kr, Q6_K_BYTES, 256, dot_q6_kr, 2, 128, 64, 16)

MATVEC_GATED(gated_q4_0, Q4_0_BYTES, 32, dot_q4_0, 0, 0, 0, 0)
MATVEC_GATED(gated_q4_1, Q4_1_BYTES, 32, dot_q4_1, 1, 0, 0, 0)
MATVEC_GATED(gated_q5_0, Q5_0_BYTES, 32, dot_q5_0, 0, 0, 0, 0)
MATVEC_GATED(gated_q5_1, Q5_1_BYTES, 32, dot_q5_1, 1, 0, 0, 0)
MATVEC_GATED(gated_q8_0, Q8_0_BYTES, 32, dot_q8_0, 0, 0, 0, 0)
MATVEC_GATED(gated_q2_k, Q2_K_BYTES, 256, dot_q2_k, 2, 0, 0, 0)
MATVEC_GATED(gated_q3_k, Q3_K_BYTES, 256, dot_q3_k, 2, 0, 0, 0)
MATVEC_GATED(gated_q4_k, Q4_K_BYTES, 256, dot_q4_k, 2, 0, 0, 0)
MATVEC_GATED(gated_q5_k, Q5_K_BYTES, 256, dot_q5_k, 2, 0, 0, 0)
MATVEC_GATED(gated_q6_k, Q6_K_BYTES, 256, dot_q6_k, 2, 0, 0, 0)
MATVEC_GATED(gated_q4_0r, Q4_0_BYTES, 32, dot_q4_0r, 0, 16, 0, 2)
MATVEC_GATED(gated_q4_1r, Q4_1_BYTES, 32, dot_q4_1r, 1, 16, 0, 4)
MATVEC_GATED(gated_q5_0r, Q5_0_BYTES, 32, dot_q5_0r, 0, 16, 4, 2)
MATVEC_GATED(gated_q5_1r, Q5_1_BYTES, 32, dot_q5_1r, 1, 16, 4, 4)
MATVEC_GATED(gated_q8_0r, Q8_0_BYTES, 32, dot_q8_0r, 0, 32, 0, 2)
MATVEC_GATED(gated_q6_kr, Q6_K_BYTES, 256, dot_q6_kr, 2, 128, 64, 16)

// Unquantized rows: the block's threads take elements in turn, f32 activations.
#define MATVEC_PLAIN(NAME, T, CVT)                                                            \
    extern "C" __global__ void NAME(const T* w, const float* x, float* y, int rows, int cols, \
                                    int n_tok) {                                              \
        pdl_begin();                                                                          \
        int row = blockIdx.x;                                                                 \
        const T* wr = w + (long)row * cols;                                                   \
        for (int t = 0; t < n_tok; ++t) {                                                     \
            const float* xt = x + (long)t * cols;                                             \
            float acc = 0.0f;                                                                 \
            for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += CVT(wr[c]) * xt[c];   \
            acc = row_sum(acc);                                                               \
            if (threadIdx.x == 0) y[(long)t * rows + row] = acc;                              \
        }                                                                                     \
    }

__device__ __forceinline__ float id_f32(float v) { return v; }
__device__ __forceinline__ float bf16_bits(u16 v) { return u2f(((u32)v) << 16); }

MATVEC_PLAIN(matvec_f32, float, id_f32)
MATVEC_PLAIN(matvec_f16, u16, h2f)
MATVEC_PLAIN(matvec_bf16, u16, bf16_bits)
