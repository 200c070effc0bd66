// A gather of rows: dst[i] = src[idx[i]], rows of `n` values.

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let id = group_index(wg, nwg) * 64u + li;
    if (id >= p.rows * p.n) {
        return;
    }
    let i = id / p.n;
    let k = id % p.n;
    dst[id] = src[idx[i] * p.n + k];
}
