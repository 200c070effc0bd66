// Q4_0 · Q8_0, block `b` of the row at byte `rb`, the activations' block at word `xo`: the
// block's scale d_w, and lane `l`'s exact Σ (q_w − 8)·q_x over elements 4l .. 4l + 4 (lanes
// 0-3: the low nibbles of bytes 4l.., lanes 4-7: the high nibbles of bytes 4(l − 4)..), as
// Σ q_w·q_x − 8·Σ q_x.
// (The reference rearranges Q4_0 matrices at load and sums whole blocks over them.)
const WHOLE_BLOCKS: bool = true;

fn block_d(rb: u32, b: u32) -> f32 {
    return w_f16(rb + 18u * b);
}

fn lane_dot(rb: u32, b: u32, xo: u32, l: u32) -> i32 {
    let q = w_u32(rb + 18u * b + 2u + 4u * (l % 4u));
    let nib = select(q & 0x0f0f0f0fu, (q >> 4u) & 0x0f0f0f0fu, l >= 4u);
    let x = xq[xo + 1u + l];
    return dot4I8Packed(nib, x) - 8 * dot4I8Packed(x, 0x01010101u);
}
