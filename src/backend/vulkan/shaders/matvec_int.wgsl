// y[t][r] (+)= Σ_blocks d_w·d_x·Σ q_w·q_x: the integer product of a format of 32-value blocks
// with 8-bit activations (quantize_q8_0.wgsl), in the reference engine's order on x86 (the
// CPU's: quant/kquant_order.rs). Each row keeps 8 lanes, lane l taking per block the exact
// integer Σ q_w·q_x over elements 4l .. 4l + 4 (the format's `lane_dot`: packed 8-bit dot
// instructions where the device has them), converted to f32 and fused-multiply-added with the
// block's d_w·d_x; the lanes are added at the end as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
// (l3 + l7)) (`t32_dot_lanes`). A format whose `WHOLE_BLOCKS` is true (Q4_0, which the
// reference rearranges at load) instead converts each block's whole integer dot and
// fused-multiply-adds it with d_w·d_x into one sum (`t32_dot_blocks`). Eight rows a
// workgroup, a thread a lane (the first lane of a row alone for whole blocks).

var<workgroup> lanes: array<f32, 64>;

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let r = group_index(wg, nwg) * 8u + li / 8u;
    let l = li % 8u;
    let live = r < p.rows;
    let blocks = p.cols / 32u;
    let rb = r * p.row_bytes;
    for (var t = 0u; t < p.n_tok; t++) {
        var acc = 0.0;
        if (live && !WHOLE_BLOCKS) {
            for (var b = 0u; b < blocks; b++) {
                let xo = (t * blocks + b) * 9u;
                let d = block_d(rb, b) * bitcast<f32>(xq[xo]);
                acc = fma(d, f32(lane_dot(rb, b, xo, l)), acc);
            }
        }
        if (live && WHOLE_BLOCKS && l == 0u) {
            for (var b = 0u; b < blocks; b++) {
                let xo = (t * blocks + b) * 9u;
                let d = block_d(rb, b) * bitcast<f32>(xq[xo]);
                var s = 0i;
                for (var k = 0u; k < 8u; k++) {
                    s += lane_dot(rb, b, xo, k);
                }
                acc = fma(d, f32(s), acc);
            }
        }
        lanes[li] = acc;
        workgroupBarrier();
        if (live && l == 0u) {
            let s = li;
            var sum = lanes[s];
            if (!WHOLE_BLOCKS) {
                sum = ((lanes[s] + lanes[s + 4u]) + (lanes[s + 2u] + lanes[s + 6u]))
                    + ((lanes[s + 1u] + lanes[s + 5u]) + (lanes[s + 3u] + lanes[s + 7u]));
            }
            let o = t * p.rows + r;
            if (p.add != 0u) {
                y[o] = y[o] + sum;
            } else {
                y[o] = sum;
            }
        }
        workgroupBarrier();
    }
}
