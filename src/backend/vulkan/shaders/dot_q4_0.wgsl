// Q4_0 · Q8_0 over block `b` of the row at byte `rb`, the activations' block at word `xo`:
// Σ (q_w - 8)·q_x = Σ q_w·q_x - 8·Σ q_x (the low nibbles against the first 16 activations,
// the high against the last), then ·d_w·d_x, the reference's order.
fn block_dot(rb: u32, b: u32, xo: u32) -> f32 {
    let o = rb + 18u * b;
    var s = 0i;
    var sx = 0i;
    for (var i = 0u; i < 4u; i++) {
        let q = w_u32(o + 2u + 4u * i);
        let lo = xq[xo + 1u + i];
        let hi = xq[xo + 5u + i];
        s += dot4I8Packed(q & 0x0f0f0f0fu, lo) + dot4I8Packed((q >> 4u) & 0x0f0f0f0fu, hi);
        sx += dot4I8Packed(lo, 0x01010101u) + dot4I8Packed(hi, 0x01010101u);
    }
    return f32(s - 8 * sx) * w_f16(o) * bitcast<f32>(xq[xo]);
}
