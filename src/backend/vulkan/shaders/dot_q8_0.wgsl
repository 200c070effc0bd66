// Q8_0 · Q8_0 over block `b` of the row at byte `rb`, the activations' block at word `xo`:
// (Σ q_w·q_x)·(d_w·d_x), the reference's order.
fn block_dot(rb: u32, b: u32, xo: u32) -> f32 {
    let o = rb + 34u * b;
    var s = 0i;
    for (var i = 0u; i < 8u; i++) {
        s += dot4I8Packed(w_u32(o + 2u + 4u * i), xq[xo + 1u + i]);
    }
    return f32(s) * (w_f16(o) * bitcast<f32>(xq[xo]));
}
