// Q4_0: blocks of 32 (f16 scale d, 16 bytes of nibbles: value j low, value j + 16 high), each
// value (q - 8)·d.
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let b = rb + 18u * u;
    let d = w_f16(b);
    for (var j = 0u; j < 16u; j++) {
        let q = w_u8(b + 2u + j);
        o[j] = f32(i32(q & 0xfu) - 8) * d;
        o[j + 16u] = f32(i32(q >> 4u) - 8) * d;
    }
    return o;
}
