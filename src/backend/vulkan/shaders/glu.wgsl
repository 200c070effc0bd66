// The gated feed-forward's activation: gate = act(gate)·up, act SiLU (x / (1 + e^-x)) or, with
// `gelu`, GELU's tanh form 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))).

struct P {
    n: u32,
    gelu: u32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read_write> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = group_index(wg, nwg) * 64u + li;
    if (i >= p.n) {
        return;
    }
    let x = gate[i];
    var a: f32;
    if (p.gelu != 0u) {
        a = 0.5 * x * (1.0 + tanh(0.7978846 * x * fma(0.044715 * x, x, 1.0)));
    } else {
        a = x / (1.0 + exp(-x));
    }
    gate[i] = a * up[i];
}
