// Q8_0: blocks of 32 (f16 scale d, 32 signed bytes), each value d·q.
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let b = rb + 34u * u;
    let d = w_f16(b);
    for (var i = 0u; i < 32u; i++) {
        o[i] = f32(w_i8(b + 2u + i)) * d;
    }
    return o;
}
