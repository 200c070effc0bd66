// The embedding gather: x[j] = row tokens[j] of the embedding matrix (the format's `deq32`, 32
// values at a time) · scale; one thread a unit of 32 values of a row.

struct P {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    scale: f32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
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
