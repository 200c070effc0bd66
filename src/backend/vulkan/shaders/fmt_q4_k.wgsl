// Q4_K: super-blocks of 256 (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
// nibbles); unit `u` is sub-block u % 8 of super-block u / 8, each value d·sc·q - dmin·m.
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let b = rb + 144u * (u / 8u);
    let s = u % 8u;
    let d = w_f16(b);
    let dmin = w_f16(b + 2u);
    let sb = b + 4u;
    var sc: u32;
    var m: u32;
    if (s < 4u) {
        sc = w_u8(sb + s) & 63u;
        m = w_u8(sb + s + 4u) & 63u;
    } else {
        sc = (w_u8(sb + s + 4u) & 0xfu) | ((w_u8(sb + s - 4u) >> 6u) << 4u);
        m = (w_u8(sb + s + 4u) >> 4u) | ((w_u8(sb + s) >> 6u) << 4u);
    }
    let d1 = d * f32(sc);
    let m1 = dmin * f32(m);
    let qs = b + 16u + 32u * (s / 2u);
    let shift = (s & 1u) * 4u;
    for (var l = 0u; l < 32u; l++) {
        o[l] = d1 * f32((w_u8(qs + l) >> shift) & 0xfu) - m1;
    }
    return o;
}
