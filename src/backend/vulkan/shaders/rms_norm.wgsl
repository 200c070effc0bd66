// RMSNorm of each group of `n` values (a row, or a head of it): y = x·(1/sqrt(mean(x²) + eps))·w,
// one workgroup a group, the f32 squares summed in `sum_t` in a tree (f64 where the device has
// it: the CPU's sum and mean, bit for bit). In place where x and y are one region (each value is
// read and written by the same thread, after the sum).

var<workgroup> part: array<sum_t, 256>;

@compute @workgroup_size(256)
fn main(GROUP_BUILTINS) {
    let g = group_index(wg, nwg);
    if (g >= p.groups) {
        return;
    }
    let o = g * p.n;
    var acc = sum_t(0.0);
    for (var i = li; i < p.n; i += 256u) {
        let v = x[o + i];
        acc += sum_t(v * v);
    }
    part[li] = acc;
    let mean = f32(part_sum(li, 256u) / sum_t(p.n));
    let scale = 1.0 / sqrt(mean + p.eps);
    for (var i = li; i < p.n; i += 256u) {
        y[o + i] = x[o + i] * scale * nw[i];
    }
}
