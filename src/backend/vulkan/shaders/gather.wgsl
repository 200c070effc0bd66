// A gather of rows: dst[i] = src[idx[i]], rows of `n` values.

struct P {
    rows: u32,
    n: u32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = group_index(wg, nwg) * 64u + li;
    if (id >= p.rows * p.n) {
        return;
    }
    let i = id / p.n;
    let k = id % p.n;
    dst[id] = src[idx[i] * p.n + k];
}
