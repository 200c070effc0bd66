#line 2 "matvec_iq.cu"
// The non-linear formats' decode products: matvec.cu's kernels (this file compiles as its
// continuation, nvrtc.rs `KERNELS`) stamped with a `dot_*` per format, each against the 8-bit
// activations the CPU multiplies that format with: Q8_0 for IQ4_NL and MXFP4, Q8_K for IQ4_XS
// and the 2-, 3- and 1-bit i-quants. A group of 32 weights becomes signed bytes (a table's
// values, or grid magnitudes with their signs) and meets its activation group in `__dp4a`
// dot products; the integer sum takes the group's scales, then one multiply by the float
// scales. The tables (IQ4_NL's and MXFP4's values, the grids, the sign masks) are tables.rs's,
// in global memory: each lane of a warp looks up other entries. Checked against the CPU's
// `vec_dot` in tests/cuda_ops.rs. A kernel of another shape over these formats (the experts'
// products) stamps its instances below these `dot_*`.

// Eight nibbles (four bytes) looked up in a table of 16 signed values: the low nibbles'
// values as four bytes (lo), the high nibbles' (hi).
__device__ __forceinline__ void lookup16(u32 q, const signed char* t, int* lo, int* hi) {
    u32 a = 0, b = 0;
    for (int k = 0; k < 4; ++k) {
        a |= (u32)(u8)t[(q >> (8 * k)) & 15] << (8 * k);
        b |= (u32)(u8)t[(q >> (8 * k + 4)) & 15] << (8 * k);
    }
    *lo = (int)a;
    *hi = (int)b;
}

// The integer sum of a group of 32 table values (v: four ints of the group's nibbles, laid out
// as q4_0's) times its activations.
__device__ __forceinline__ int table_sum(const int* v, const signed char* t, const Q8x* y) {
    int s = 0;
    for (int k = 0; k < 4; ++k) {
        int lo, hi;
        lookup16((u32)v[k], t, &lo, &hi);
        s = __dp4a(lo, y->qs[k], s);
        s = __dp4a(hi, y->qs[k + 4], s);
    }
    return s;
}

// iq4_nl: d, nibbles; value d·kvalues_iq4nl[q] (18-byte blocks: 2-byte aligned).
__device__ __forceinline__ float dot_iq4_nl(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * IQ4_NL_BYTES;
    int v[4];
    ld_16_unaligned(b + 2, v);
    return h2f(ld16(b)) * y->d * (float)table_sum(v, kvalues_iq4nl, y);
}

// MXFP4: the E8M0 scale byte, nibbles (17-byte blocks: byte loads); the scale is a power of
// two, so d_w·d_y is exact.
__device__ __forceinline__ float dot_mxfp4(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)g * MXFP4_BYTES;
    int v[4];
    for (int k = 0; k < 4; ++k) v[k] = (int)ld_qh(b + 1 + 4 * k);
    return e8m0_half(b[0]) * y->d * (float)table_sum(v, kvalues_mxfp4, y);
}

// iq4_xs: sub-block g % 8 of super-block g / 8: its 16 bytes of nibbles (136-byte blocks:
// 8-byte aligned, four 4-byte loads) and its 6-bit scale.
__device__ __forceinline__ float dot_iq4_xs(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ4_XS_BYTES;
    int sub = g & 7, v[4];
    for (int k = 0; k < 4; ++k) v[k] = *(const int*)(b + 8 + 16 * sub + 4 * k);
    int s = table_sum(v, kvalues_iq4nl, y);
    return h2f(ld16(b)) * y->d * (float)(iq4_xs_scale(b, sub) * s);
}

// Four magnitudes (bytes) with the signs of four bits (bit k: byte k negated), as signed
// bytes: (m ^ mask) − mask byte by byte, mask 0xFF where negated, without borrows between
// bytes.
__device__ __forceinline__ int signed4(u32 m, u32 bits) {
    u32 mask = ((bits & 1) * 0xFFu) | ((bits & 2) * 0x7F80u) | ((bits & 4) * 0x3FC000u) |
               ((bits & 8) * 0x1FE00000u);
    u32 a = m ^ mask;
    return (int)(((a | 0x80808080u) - (mask & 0x7F7F7F7Fu)) ^ ((a ^ ~mask) & 0x80808080u));
}

// Eight grid magnitudes (a u64 entry) with their 8 signs against activation ints k, k + 1.
__device__ __forceinline__ int signed8_dot(unsigned long long grid, u32 signs, const Q8x* y,
                                           int k, int s) {
    s = __dp4a(signed4((u32)grid, signs & 15), y->qs[k], s);
    return __dp4a(signed4((u32)(grid >> 32), (signs >> 4) & 15), y->qs[k + 1], s);
}

// iq2_xxs (66-byte blocks: 2-byte aligned): the sub-block's four grid index bytes and its u32
// of sign indices and scale; value d·(2·ls + 1)/8·grid·sign.
__device__ __forceinline__ float dot_iq2_xxs(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ2_XXS_BYTES;
    const u8* q = b + 2 + 8 * (g & 7);
    u32 idx = (u32)ld32(q), aux = (u32)ld32(q + 4);
    int s = 0;
    for (int l = 0; l < 4; ++l)
        s = signed8_dot(iq2xxs_grid[(idx >> (8 * l)) & 255], ksigns_iq2xs[(aux >> (7 * l)) & 127],
                        y, 2 * l, s);
    return h2f(ld16(b)) * y->d * (float)((2 * (int)(aux >> 28) + 1) * s) * 0.125f;
}

// iq2_xs: the sub-block's four u16 (9-bit grid index, 7-bit sign index), a scale per 16.
__device__ __forceinline__ float dot_iq2_xs(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ2_XS_BYTES;
    int sub = g & 7, s[2] = {0, 0};
    for (int l = 0; l < 4; ++l) {
        u32 q = ld16(b + 2 + 8 * sub + 2 * l);
        s[l >> 1] = signed8_dot(iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9], y, 2 * l, s[l >> 1]);
    }
    int sc = b[66 + sub];
    return h2f(ld16(b)) * y->d * (float)((2 * (sc & 15) + 1) * s[0] + (2 * (sc >> 4) + 1) * s[1]) *
           0.125f;
}

// iq2_s: 10-bit grid indices (a byte and a pair of the sub-block's qh byte), 8 free signs a
// byte, a scale per 16.
__device__ __forceinline__ float dot_iq2_s(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ2_S_BYTES;
    int sub = g & 7, s[2] = {0, 0}, qh = b[66 + sub];
    for (int l = 0; l < 4; ++l) {
        int idx = b[2 + 4 * sub + l] | ((qh << (8 - 2 * l)) & 0x300);
        s[l >> 1] = signed8_dot(iq2s_grid[idx], b[34 + 4 * sub + l], y, 2 * l, s[l >> 1]);
    }
    int sc = b[74 + sub];
    return h2f(ld16(b)) * y->d * (float)((2 * (sc & 15) + 1) * s[0] + (2 * (sc >> 4) + 1) * s[1]) *
           0.125f;
}

// iq3_xxs (98-byte blocks): eight grid index bytes of 4 magnitudes each, the u32 of sign
// indices and scale; value d·(2·ls + 1)/4·grid·sign.
__device__ __forceinline__ float dot_iq3_xxs(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ3_XXS_BYTES;
    int sub = g & 7, s = 0;
    u32 aux = (u32)ld32(b + 66 + 4 * sub);
    for (int k = 0; k < 8; ++k) {
        u32 signs = ksigns_iq2xs[(aux >> (7 * (k >> 1))) & 127] >> (4 * (k & 1));
        s = __dp4a(signed4(iq3xxs_grid[b[2 + 8 * sub + k]], signs & 15), y->qs[k], s);
    }
    return h2f(ld16(b)) * y->d * (float)((2 * (int)(aux >> 28) + 1) * s) * 0.25f;
}

// iq3_s (110-byte blocks): 9-bit grid indices, a sign bit per element, a scale per 32; value
// d·(2·ls + 1)·grid·sign.
__device__ __forceinline__ float dot_iq3_s(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ3_S_BYTES;
    int sub = g & 7, s = 0, qh = b[66 + sub];
    for (int k = 0; k < 8; ++k) {
        int idx = b[2 + 8 * sub + k] | (((qh >> k) & 1) << 8);
        u32 signs = b[74 + 4 * sub + (k >> 1)] >> (4 * (k & 1));
        s = __dp4a(signed4(iq3s_grid[idx], signs & 15), y->qs[k], s);
    }
    int ls = (b[106 + (sub >> 1)] >> (4 * (sub & 1))) & 15;
    return h2f(ld16(b)) * y->d * (float)((2 * ls + 1) * s);
}

// The 1-bit formats' integer sum over 8 elements (activation ints k, k + 1) of grid entry
// `grid` (8 signed values in −1..1), with its shift's sign δ: Σ (8·q + δ)·x, the codes of
// the value q ± 1/8 times 8.
__device__ __forceinline__ int iq1_sum8(unsigned long long grid, int delta, const Q8x* y, int k) {
    int s = __dp4a((int)(u32)grid, y->qs[k], 0);
    s = __dp4a((int)(u32)(grid >> 32), y->qs[k + 1], s);
    int ys = __dp4a(ONES, y->qs[k], 0);
    ys = __dp4a(ONES, y->qs[k + 1], ys);
    return 8 * s + delta * ys;
}

// iq1_s (50-byte blocks): four grid index bytes, the sub-block's u16 (top index bits, scale,
// shift sign); value d·(2·ls + 1)·(q ± 1/8).
__device__ __forceinline__ float dot_iq1_s(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ1_S_BYTES;
    int sub = g & 7, s = 0;
    u32 qh = ld16(b + 34 + 2 * sub);
    int delta = qh & 0x8000 ? -1 : 1;
    for (int l = 0; l < 4; ++l) {
        int idx = b[2 + 4 * sub + l] | (((qh >> (3 * l)) & 7) << 8);
        s += iq1_sum8(iq1s_grid[idx], delta, y, 2 * l);
    }
    return h2f(ld16(b)) * y->d * (float)((2 * (int)((qh >> 12) & 7) + 1) * s) * 0.125f;
}

// iq1_m (56-byte blocks): a nibble per 8 (top index bits, shift sign), a 3-bit scale per 16,
// d in the scales' top nibbles.
__device__ __forceinline__ float dot_iq1_m(const u8* w, int g, const Q8x* y, int = 0) {
    const u8* b = w + (long)(g >> 3) * IQ1_M_BYTES;
    int sub = g & 7, s[2] = {0, 0};
    for (int l = 0; l < 4; ++l) {
        int nib = (b[32 + 2 * sub + (l >> 1)] >> (4 * (l & 1))) & 15;
        int idx = b[4 * sub + l] | ((nib & 7) << 8);
        s[l >> 1] += iq1_sum8(iq1s_grid[idx], nib & 8 ? -1 : 1, y, 2 * l);
    }
    u32 sc = ld16(b + 48 + 2 * (sub >> 1)) >> (6 * (sub & 1));
    int sc0 = 2 * (int)(sc & 7) + 1, sc1 = 2 * (int)((sc >> 3) & 7) + 1;
    return h2f(iq1_m_d(b)) * y->d * (float)(sc0 * s[0] + sc1 * s[1]) * 0.125f;
}

MATVEC_Q(matvec_iq4_nl, IQ4_NL_BYTES, 32, dot_iq4_nl, 0, 0, 0, 0)
MATVEC_Q(matvec_mxfp4, MXFP4_BYTES, 32, dot_mxfp4, 0, 0, 0, 0)
MATVEC_Q(matvec_iq4_xs, IQ4_XS_BYTES, 256, dot_iq4_xs, 2, 0, 0, 0)
MATVEC_Q(matvec_iq2_xxs, IQ2_XXS_BYTES, 256, dot_iq2_xxs, 2, 0, 0, 0)
MATVEC_Q(matvec_iq2_xs, IQ2_XS_BYTES, 256, dot_iq2_xs, 2, 0, 0, 0)
MATVEC_Q(matvec_iq2_s, IQ2_S_BYTES, 256, dot_iq2_s, 2, 0, 0, 0)
MATVEC_Q(matvec_iq3_xxs, IQ3_XXS_BYTES, 256, dot_iq3_xxs, 2, 0, 0, 0)
MATVEC_Q(matvec_iq3_s, IQ3_S_BYTES, 256, dot_iq3_s, 2, 0, 0, 0)
MATVEC_Q(matvec_iq1_s, IQ1_S_BYTES, 256, dot_iq1_s, 2, 0, 0, 0)
MATVEC_Q(matvec_iq1_m, IQ1_M_BYTES, 256, dot_iq1_m, 2, 0, 0, 0)

MATVEC_GATED(gated_iq4_nl, IQ4_NL_BYTES, 32, dot_iq4_nl, 0, 0, 0, 0)
MATVEC_GATED(gated_mxfp4, MXFP4_BYTES, 32, dot_mxfp4, 0, 0, 0, 0)
MATVEC_GATED(gated_iq4_xs, IQ4_XS_BYTES, 256, dot_iq4_xs, 2, 0, 0, 0)
MATVEC_GATED(gated_iq2_xxs, IQ2_XXS_BYTES, 256, dot_iq2_xxs, 2, 0, 0, 0)
MATVEC_GATED(gated_iq2_xs, IQ2_XS_BYTES, 256, dot_iq2_xs, 2, 0, 0, 0)
MATVEC_GATED(gated_iq2_s, IQ2_S_BYTES, 256, dot_iq2_s, 2, 0, 0, 0)
MATVEC_GATED(gated_iq3_xxs, IQ3_XXS_BYTES, 256, dot_iq3_xxs, 2, 0, 0, 0)
MATVEC_GATED(gated_iq3_s, IQ3_S_BYTES, 256, dot_iq3_s, 2, 0, 0, 0)
MATVEC_GATED(gated_iq1_s, IQ1_S_BYTES, 256, dot_iq1_s, 2, 0, 0, 0)
MATVEC_GATED(gated_iq1_m, IQ1_M_BYTES, 256, dot_iq1_m, 2, 0, 0, 0)
