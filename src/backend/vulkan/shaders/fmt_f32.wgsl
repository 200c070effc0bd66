// f32 weights: unit `u` of a row (32 values) starting at byte `rb`.
fn deq32(rb: u32, u: u32) -> array<f32, 32> {
    var o: array<f32, 32>;
    let base = (rb >> 2u) + u * 32u;
    for (var i = 0u; i < 32u; i++) {
        o[i] = bitcast<f32>(w[base + i]);
    }
    return o;
}
