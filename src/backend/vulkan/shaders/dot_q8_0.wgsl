// Q8_0 · Q8_0, block `b` of the row at byte `rb`, the activations' block at word `xo`: the
// block's scale d_w, and lane `l`'s exact Σ q_w·q_x over elements 4l .. 4l + 4.
// (The reference's 8 lanes.)
const WHOLE_BLOCKS: bool = false;

fn block_d(rb: u32, b: u32) -> f32 {
    return w_f16(rb + 34u * b);
}

fn lane_dot(rb: u32, b: u32, xo: u32, l: u32) -> i32 {
    return dot4I8Packed(w_u32(rb + 34u * b + 2u + 4u * l), xq[xo + 1u + l]);
}
