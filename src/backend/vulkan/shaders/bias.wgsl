// y[i] += b[i mod width]: a product's bias added to each of its rows (after the product's sum,
// as the CPU adds it).

struct P {
    n: u32,
    width: u32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = group_index(wg, nwg) * 64u + li;
    if (i < p.n) {
        y[i] = y[i] + b[i % p.width];
    }
}
