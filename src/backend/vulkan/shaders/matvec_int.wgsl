// y[t][r] (+)= Σ_blocks d_w·d_x·Σ q_w·q_x: the integer product of a format of 32-value blocks
// with 8-bit activations (quantize_q8_0.wgsl), through the format's `block_dot` (packed 8-bit
// dot instructions where the device has them); one workgroup a row, the blocks' sums reduced
// in a tree.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    add: u32,
    row_bytes: u32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> xq: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r = group_index(wg, nwg);
    if (r >= p.rows) {
        return;
    }
    let blocks = p.cols / 32u;
    let rb = r * p.row_bytes;
    for (var t = 0u; t < p.n_tok; t++) {
        var acc = 0.0;
        for (var b = li; b < blocks; b += 64u) {
            acc += block_dot(rb, b, (t * blocks + b) * 9u);
        }
        part[li] = acc;
        let sum = part_sum(li, 64u);
        if (li == 0u) {
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
