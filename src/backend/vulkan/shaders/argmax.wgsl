// The index of each row's largest value, the first on ties, NaN skipped, -0 equal to +0 (the
// sampler's `argmax`): values compared as total-order integer keys (NaN lowest), one workgroup
// a row.

var<workgroup> keys: array<i32, 256>;
var<workgroup> idx: array<u32, 256>;

fn key(v: f32) -> i32 {
    var b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return -2147483647 - 1;
    }
    if (b == 0x80000000u) {
        b = 0u;
    }
    let s = bitcast<i32>(b);
    return s ^ bitcast<i32>(bitcast<u32>(s >> 31u) >> 1u);
}

// Whether (ka, ia) wins over (kb, ib).
fn better(ka: i32, ia: u32, kb: i32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

@compute @workgroup_size(256)
fn main(GROUP_BUILTINS) {
    let r = group_index(wg, nwg);
    if (r >= p.rows) {
        return;
    }
    var bk = -2147483647 - 1;
    var bi = 0xffffffffu;
    for (var i = li; i < p.n; i += 256u) {
        let k = key(x[r * p.n + i]);
        if (better(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    keys[li] = bk;
    idx[li] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s && better(keys[li + s], idx[li + s], keys[li], idx[li])) {
            keys[li] = keys[li + s];
            idx[li] = idx[li + s];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        // All NaN (every key the lowest, the first index winning) or an empty row: 0.
        out[r] = select(idx[0], 0u, idx[0] == 0xffffffffu);
    }
}
