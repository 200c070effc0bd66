// The block formats: bytes and elements per block, and element `i` of a block, dequantized
// (ggml's layouts; the CPU's reference dequantizers are in src/quant/reference.rs).
//
// Plain C over `u8`/`h2f`/`ld16`, so the test suite also compiles this file with the host's C
// compiler (`KILN_FN` = `static inline`) and checks every format against the CPU's reference
// dequantizer, bit for bit, on machines without a GPU.

#ifndef KILN_FN
#define KILN_FN __device__ __forceinline__
#endif

#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q8_0_BYTES 34
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

KILN_FN float dq_f32(const u8* b, int i) {
    u32 v = (u32)b[4 * i] | ((u32)b[4 * i + 1] << 8) | ((u32)b[4 * i + 2] << 16) |
            ((u32)b[4 * i + 3] << 24);
    return u2f(v);
}

KILN_FN float dq_f16(const u8* b, int i) { return h2f(ld16(b + 2 * i)); }

KILN_FN float dq_bf16(const u8* b, int i) { return u2f(((u32)ld16(b + 2 * i)) << 16); }

// The 32-element formats' element i from its block's fields, wherever they lie (the file's
// blocks below, or the arrays of a matrix rearranged at upload): qs 16 bytes of nibbles
// (element j < 16 the low nibble of byte j, j >= 16 the high nibble of byte j - 16; q8_0: 32
// signed bytes), qh 32 fifth bits (little-endian), d the f16 scale, dm the f16 scale and min.
KILN_FN int nib_at(const u8* qs, int i) {
    u8 q = qs[i & 15];
    return i < 16 ? (q & 15) : (q >> 4);
}

KILN_FN u32 ld_qh(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

KILN_FN int fifth_at(const u8* qh, int i) { return (int)(((ld_qh(qh) >> i) & 1) << 4); }

// q4_0: value d·(q − 8).
KILN_FN float q4_0_at(const u8* qs, const u8* d, int i) {
    return h2f(ld16(d)) * (float)(nib_at(qs, i) - 8);
}

// q4_1: value d·q + m.
KILN_FN float q4_1_at(const u8* qs, const u8* dm, int i) {
    return h2f(ld16(dm)) * (float)nib_at(qs, i) + h2f(ld16(dm + 2));
}

// q5_0: value d·(q − 16), q = nibble | fifth bit << 4.
KILN_FN float q5_0_at(const u8* qs, const u8* qh, const u8* d, int i) {
    return h2f(ld16(d)) * (float)((nib_at(qs, i) | fifth_at(qh, i)) - 16);
}

// q5_1: value d·q + m.
KILN_FN float q5_1_at(const u8* qs, const u8* qh, const u8* dm, int i) {
    return h2f(ld16(dm)) * (float)(nib_at(qs, i) | fifth_at(qh, i)) + h2f(ld16(dm + 2));
}

// q8_0: value d·q.
KILN_FN float q8_0_at(const u8* qs, const u8* d, int i) { return h2f(ld16(d)) * (float)(i8)qs[i]; }

// The file's blocks: q4_0 d, qs; q4_1 d, m, qs; q5_0 d, qh, qs; q5_1 d, m, qh, qs; q8_0 d, qs.
KILN_FN float dq_q4_0(const u8* b, int i) { return q4_0_at(b + 2, b, i); }
KILN_FN float dq_q4_1(const u8* b, int i) { return q4_1_at(b + 4, b, i); }
KILN_FN float dq_q5_0(const u8* b, int i) { return q5_0_at(b + 6, b + 2, b, i); }
KILN_FN float dq_q5_1(const u8* b, int i) { return q5_1_at(b + 8, b + 4, b, i); }
KILN_FN float dq_q8_0(const u8* b, int i) { return q8_0_at(b + 2, b, i); }

// The formats rearranged at upload (weights.rs `repack`): a matrix of G groups of 32 as
// arrays, one per field of a block. The 32-element formats: group gi's quants at QB·gi (QB =
// 16 bytes of nibbles, or q8_0's 32 signed bytes), then (q5_0, q5_1) its fifth bits at QB·G +
// 4·gi, then its scales (d, or d and m: SB = 2 or 4 bytes) at (QB + HB)·G + SB·gi; q6_K's
// fields in the file's order (below). Element i of block b (of the format's elements) of the
// matrix at w, G groups of 32 in all: the signature the kernels that serve both layouts take
// (common.cuh `dq_file` gives the file's dequantizers this signature).
KILN_FN float dq_q4_0r(const u8* w, long gi, long G, int i) {
    return q4_0_at(w + 16 * gi, w + 16 * G + 2 * gi, i);
}

KILN_FN float dq_q4_1r(const u8* w, long gi, long G, int i) {
    return q4_1_at(w + 16 * gi, w + 16 * G + 4 * gi, i);
}

KILN_FN float dq_q5_0r(const u8* w, long gi, long G, int i) {
    return q5_0_at(w + 16 * gi, w + 16 * G + 4 * gi, w + 20 * G + 2 * gi, i);
}

KILN_FN float dq_q5_1r(const u8* w, long gi, long G, int i) {
    return q5_1_at(w + 16 * gi, w + 16 * G + 4 * gi, w + 20 * G + 4 * gi, i);
}

KILN_FN float dq_q8_0r(const u8* w, long gi, long G, int i) {
    return q8_0_at(w + 32 * gi, w + 32 * G + 2 * gi, i);
}

// q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit values, d, dmin;
// 256 elements in two halves of 128, each four shifts of 32 (16 per scale).
KILN_FN float dq_q2_k(const u8* b, int i) {
    int h = i >> 7, r = i & 127, j = r >> 5, w = r & 31;
    u8 sc = b[8 * h + 2 * j + (w >> 4)];
    int v = (b[16 + 32 * h + w] >> (2 * j)) & 3;
    return h2f(ld16(b + 80)) * (float)(sc & 15) * (float)v - h2f(ld16(b + 82)) * (float)(sc >> 4);
}

// q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of packed 6-bit
// scales (offset 32), d; value d·(s − 32)·(q − (high bit ? 0 : 4)).
KILN_FN float dq_q3_k(const u8* b, int i) {
    int h = i >> 7, r = i & 127, j = r >> 5, w = r & 31;
    int k = 8 * h + 2 * j + (w >> 4);
    const u8* s = b + 96;
    int sc;
    if (k < 4) sc = (s[k] & 15) | ((s[8 + k] & 3) << 4);
    else if (k < 8) sc = (s[k] & 15) | (((s[4 + k] >> 2) & 3) << 4);
    else if (k < 12) sc = (s[k - 8] >> 4) | (((s[k] >> 4) & 3) << 4);
    else sc = (s[k - 8] >> 4) | (((s[k - 4] >> 6) & 3) << 4);
    int q = (b[32 + 32 * h + w] >> (2 * j)) & 3;
    int hi = (b[w] >> (4 * h + j)) & 1;
    return h2f(ld16(b + 108)) * (float)(sc - 32) * (float)(q - (hi ? 0 : 4));
}

// q4_K / q5_K: d, dmin (f16), 12 bytes of packed 6-bit scales and mins; sub-block j of 32.
KILN_FN void k4_scale_min(const u8* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// q4_K: then 128 bytes of nibbles; 256 elements in four chunks of 64 (low nibbles, then high).
KILN_FN float dq_q4_k(const u8* b, int i) {
    int chunk = i >> 6, w = i & 63, is = 2 * chunk + (w >> 5);
    u8 q = b[16 + 32 * chunk + (w & 31)];
    int v = w < 32 ? (q & 15) : (q >> 4);
    int sc, m;
    k4_scale_min(b + 4, is, &sc, &m);
    return h2f(ld16(b)) * (float)sc * (float)v - h2f(ld16(b + 2)) * (float)m;
}

// q5_K: then 32 bytes of fifth bits and 128 bytes of nibbles.
KILN_FN float dq_q5_k(const u8* b, int i) {
    int chunk = i >> 6, w = i & 63, is = 2 * chunk + (w >> 5), l = w & 31;
    u8 q = b[48 + 32 * chunk + l];
    int v = (w < 32 ? (q & 15) : (q >> 4)) + (((b[16 + l] >> is) & 1) ? 16 : 0);
    int sc, m;
    k4_scale_min(b + 4, is, &sc, &m);
    return h2f(ld16(b)) * (float)sc * (float)v - h2f(ld16(b + 2)) * (float)m;
}

// q6_K: 128 bytes of low nibbles ql, 64 bytes of high 2-bit pairs qh, 16 signed scales sc, d;
// 256 elements in two halves of 128, each four quarters of 32; value d·sc·(q − 32).
KILN_FN float q6_k_at(const u8* ql, const u8* qh, const u8* sc, const u8* d, int i) {
    int h = i >> 7, r = i & 127, quarter = r >> 5, l = r & 31;
    u8 lo = ql[64 * h + l + ((quarter & 1) ? 32 : 0)];
    int nib = quarter < 2 ? (lo & 15) : (lo >> 4);
    int hi = (qh[32 * h + l] >> (2 * quarter)) & 3;
    int v = (nib | (hi << 4)) - 32;
    i8 s = (i8)sc[8 * h + (l >> 4) + 2 * quarter];
    return h2f(ld16(d)) * (float)s * (float)v;
}

KILN_FN float dq_q6_k(const u8* b, int i) { return q6_k_at(b, b + 128, b + 192, b + 208, i); }

// q6_K rearranged (nb = G / 8 blocks): low nibbles at 128·b, high pairs at 128·nb + 64·b,
// scales at 192·nb + 16·b, d at 208·nb + 2·b.
KILN_FN float dq_q6_kr(const u8* w, long b, long G, int i) {
    long nb = G / 8;
    return q6_k_at(w + 128 * b, w + 128 * nb + 64 * b, w + 192 * nb + 16 * b, w + 208 * nb + 2 * b,
                   i);
}

// The non-linear formats, on the lookup tables of tables.rs (prepended before this file):
// IQ4_NL's and MXFP4's 16 values, the i-quants' grids and sign masks. Each value in the CPU's
// float order (src/quant/iquant.rs, mxfp4.rs, iq2.rs, iq3.rs, iq1.rs), so the bits are its.
#define IQ4_NL_BYTES 18
#define IQ4_XS_BYTES 136
#define MXFP4_BYTES 17
#define IQ2_XXS_BYTES 66
#define IQ2_XS_BYTES 74
#define IQ2_S_BYTES 82
#define IQ3_XXS_BYTES 98
#define IQ3_S_BYTES 110
#define IQ1_S_BYTES 50
#define IQ1_M_BYTES 56

// iq4_nl: d, 16 bytes of nibbles (as q4_0's); value d·kvalues_iq4nl[q].
KILN_FN float dq_iq4_nl(const u8* b, int i) {
    return h2f(ld16(b)) * (float)kvalues_iq4nl[nib_at(b + 2, i)];
}

// iq4_xs: d, 16 bits of scales' top pairs, 4 bytes of scales' low nibbles, then 8 sub-blocks
// of 32 as iq4_nl's nibbles; value d·(ls − 32)·kvalues_iq4nl[q].
KILN_FN int iq4_xs_scale(const u8* b, int ib) {
    return (((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4)) -
           32;
}

KILN_FN float dq_iq4_xs(const u8* b, int i) {
    int ib = i >> 5;
    float dl = h2f(ld16(b)) * (float)iq4_xs_scale(b, ib);
    return dl * (float)kvalues_iq4nl[nib_at(b + 8 + 16 * ib, i & 31)];
}

// MXFP4: an E8M0 scale byte e, then nibbles; value 2^(e − 128)·kvalues_mxfp4[q] (the E2M1
// values doubled, the scale halved: ggml's `ggml_e8m0_to_fp32_half`, subnormal for e < 2).
KILN_FN float e8m0_half(u8 e) { return u2f(e < 2 ? 0x00200000u << e : ((u32)e - 1) << 23); }

KILN_FN float dq_mxfp4(const u8* b, int i) {
    return e8m0_half(b[0]) * (float)kvalues_mxfp4[nib_at(b + 1, i)];
}

// The 2-bit i-quants: element k of a group of 8 from its grid entry (8 magnitudes) and sign
// mask, scale d·(0.5 + ls)/4.
KILN_FN float iq2_at(float d, int ls, unsigned long long grid, int signs, int k) {
    float db = d * (0.5f + (float)ls) * 0.25f;
    float sign = (signs >> k) & 1 ? -1.0f : 1.0f;
    return db * (float)(int)((grid >> (8 * k)) & 255) * sign;
}

// iq2_xxs: d, then per sub-block of 32 four grid index bytes and a u32 of four 7-bit sign
// indices and the 4-bit scale (bits 28..32).
KILN_FN float dq_iq2_xxs(const u8* b, int i) {
    int ib = i >> 5, l = (i >> 3) & 3;
    u32 aux = ld_qh(b + 2 + 8 * ib + 4);
    return iq2_at(h2f(ld16(b)), (int)(aux >> 28), iq2xxs_grid[b[2 + 8 * ib + l]],
                  ksigns_iq2xs[(aux >> (7 * l)) & 127], i & 7);
}

// iq2_xs: d, 32 u16 (a 9-bit grid index, a 7-bit sign index), a scale nibble per 16.
KILN_FN float dq_iq2_xs(const u8* b, int i) {
    int ib = i >> 5, l = (i >> 3) & 3;
    u16 q = ld16(b + 2 + 8 * ib + 2 * l);
    int ls = (b[66 + ib] >> (4 * ((i >> 4) & 1))) & 15;
    return iq2_at(h2f(ld16(b)), ls, iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9], i & 7);
}

// iq2_s: d, 32 grid index bytes, 32 sign bytes, 8 bytes of index top pairs, 8 of scales.
KILN_FN float dq_iq2_s(const u8* b, int i) {
    int ib = i >> 5, l = (i >> 3) & 3;
    int idx = b[2 + 4 * ib + l] | ((b[66 + ib] << (8 - 2 * l)) & 0x300);
    int ls = (b[74 + ib] >> (4 * ((i >> 4) & 1))) & 15;
    return iq2_at(h2f(ld16(b)), ls, iq2s_grid[idx], b[34 + 4 * ib + l], i & 7);
}

// iq3_xxs: d, 64 grid index bytes (4 magnitudes each), then per sub-block of 32 a u32 of four
// 7-bit sign indices and the scale; value d·(0.5 + ls)/2·grid·sign.
KILN_FN float dq_iq3_xxs(const u8* b, int i) {
    int ib = i >> 5;
    u32 aux = ld_qh(b + 66 + 4 * ib);
    float db = h2f(ld16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
    int signs = ksigns_iq2xs[(aux >> (7 * ((i >> 3) & 3))) & 127];
    float sign = (signs >> (i & 7)) & 1 ? -1.0f : 1.0f;
    return db * (float)(int)((iq3xxs_grid[b[2 + (i >> 2)]] >> (8 * (i & 3))) & 255) * sign;
}

// iq3_s: d, 64 grid index bytes, their ninth bits (8 bytes), a sign bit per element (32
// bytes), a scale nibble per 32 (4 bytes); value d·(1 + 2·ls)·grid·sign.
KILN_FN float dq_iq3_s(const u8* b, int i) {
    int ib = i >> 5, k = i >> 2;
    int idx = b[2 + k] | (((b[66 + (k >> 3)] >> (k & 7)) & 1) << 8);
    int ls = (b[106 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
    float db = h2f(ld16(b)) * (float)(1 + 2 * ls);
    float sign = (b[74 + (i >> 3)] >> (i & 7)) & 1 ? -1.0f : 1.0f;
    return db * (float)(int)((iq3s_grid[idx] >> (8 * (i & 3))) & 255) * sign;
}

// The 1-bit i-quants: element k of a group of 8 from its grid entry (8 values in −1..1), the
// scale d·(2·ls + 1) and the shift's sign; value dl·(q ± 1/8).
KILN_FN float iq1_at(float d, int ls, unsigned long long grid, int negative, int k) {
    float dl = d * (float)(2 * ls + 1);
    float delta = 0.125f * (negative ? -1.0f : 1.0f);
    return dl * ((float)(i8)(u8)(grid >> (8 * k)) + delta);
}

// iq1_s: d, 32 grid index bytes, per sub-block of 32 a u16: the indices' top 3 bits, the scale
// (bits 12..15), the shift's sign (bit 15).
KILN_FN float dq_iq1_s(const u8* b, int i) {
    int g = i >> 3;
    u16 qh = ld16(b + 34 + 2 * (g >> 2));
    int idx = b[2 + g] | (((qh >> (3 * (g & 3))) & 7) << 8);
    return iq1_at(h2f(ld16(b)), (qh >> 12) & 7, iq1s_grid[idx], qh & 0x8000, i & 7);
}

// iq1_m: 32 grid index bytes, a nibble per 8 (the index's top 3 bits, the shift's sign), then 4
// u16 of 3-bit scales per 16 whose top nibbles hold the f16 d.
KILN_FN u16 iq1_m_d(const u8* b) {
    const u8* s = b + 48;
    return (u16)((ld16(s) >> 12) | ((ld16(s + 2) >> 8) & 0x00f0) | ((ld16(s + 4) >> 4) & 0x0f00) |
                 (ld16(s + 6) & 0xf000));
}

KILN_FN float dq_iq1_m(const u8* b, int i) {
    int g = i >> 3, s = i >> 4;
    int nib = (b[32 + (g >> 1)] >> (4 * (g & 1))) & 15;
    int idx = b[g] | ((nib & 7) << 8);
    int ls = (ld16(b + 48 + 2 * (s >> 2)) >> (3 * (s & 3))) & 7;
    return iq1_at(h2f(iq1_m_d(b)), ls, iq1s_grid[idx], nib & 8, i & 7);
}
