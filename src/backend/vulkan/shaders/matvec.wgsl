// y[t][r] (+)= Σ_c W[r][c]·x[t][c]: one workgroup a row, its threads striding over the row's
// units of 32 (dequantized to f32 by the format's `deq32`), the partial sums reduced in a tree.

var<workgroup> part: array<sum_t, 64>;

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let r = group_index(wg, nwg);
    if (r >= p.rows) {
        return;
    }
    let units = p.cols / 32u;
    let rb = r * p.row_bytes;
    for (var t = 0u; t < p.n_tok; t++) {
        var acc = 0.0;
        for (var u = li; u < units; u += 64u) {
            var v = deq32(rb, u);
            let xo = t * p.cols + u * 32u;
            for (var i = 0u; i < 32u; i++) {
                acc += v[i] * x[xo + i];
            }
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
