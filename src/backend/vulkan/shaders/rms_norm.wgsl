// RMSNorm of each group of `n` values (a row, or a head of it): y = x·(1/sqrt(mean(x²) + eps))·w,
// one workgroup a group, the squares summed in f32 in a tree. In place where x and y are one
// region (each value is read and written by the same thread, after the sum).

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(GROUP_BUILTINS) {
    let g = group_index(wg, nwg);
    if (g >= p.groups) {
        return;
    }
    let o = g * p.n;
    var acc = 0.0;
    for (var i = li; i < p.n; i += 256u) {
        let v = x[o + i];
        acc += v * v;
    }
    part[li] = acc;
    let scale = 1.0 / sqrt(part_sum(li, 256u) / f32(p.n) + p.eps);
    for (var i = li; i < p.n; i += 256u) {
        y[o + i] = x[o + i] * scale * nw[i];
    }
}
