// f16 weights: unit `u` of a row (32 values) starting at byte `rb`.
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let base = (rb >> 2u) + u * 16u;
    for (var i = 0u; i < 16u; i++) {
        let v = unpack2x16float(w[base + i]);
        o[2u * i] = v.x;
        o[2u * i + 1u] = v.y;
    }
    return o;
}
