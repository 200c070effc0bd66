// The embedding gather: x[j] = row tokens[j] of the embedding matrix (the format's `deq32`, 32
// values at a time) · scale; one thread a unit of 32 values of a row.

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let units = p.cols / 32u;
    let id = group_index(wg, nwg) * 64u + li;
    if (id >= p.rows * units) {
        return;
    }
    let j = id / units;
    let u = id % units;
    var v = deq32(tokens[j] * p.row_bytes, u);
    let o = j * p.cols + u * 32u;
    for (var i = 0u; i < 32u; i++) {
        x[o + i] = v[i] * p.scale;
    }
}
