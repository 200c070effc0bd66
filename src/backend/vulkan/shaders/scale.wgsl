// y *= s.

struct P {
    n: u32,
    s: f32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = group_index(wg, nwg) * 64u + li;
    if (i < p.n) {
        y[i] = y[i] * p.s;
    }
}
