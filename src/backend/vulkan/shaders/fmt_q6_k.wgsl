// Q6_K: super-blocks of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16 signed 8-bit
// scales, f16 d); unit `u` is the 32 values u % 8 of super-block u / 8, each d·sc·(q - 32).
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let b = rb + 210u * (u / 8u);
    let s = u % 8u;
    let n = s / 4u;
    let k = s % 4u;
    let d = w_f16(b + 208u);
    let ql = b + 64u * n + (k & 1u) * 32u;
    let qh = b + 128u + 32u * n;
    let lo_shift = (k / 2u) * 4u;
    for (var l = 0u; l < 32u; l++) {
        let lo = (w_u8(ql + l) >> lo_shift) & 0xfu;
        let hi = (w_u8(qh + l) >> (2u * k)) & 3u;
        let q = i32(lo | (hi << 4u)) - 32;
        let sc = w_i8(b + 192u + 8u * n + l / 16u + 2u * k);
        o[l] = d * f32(sc) * f32(q);
    }
    return o;
}
