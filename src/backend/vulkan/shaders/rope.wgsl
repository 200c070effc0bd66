// RoPE of `heads` heads of each row at the row's position (pos[row], from the step's buffer):
// pair i turns by t_i = freq_scale·pos·theta_scale^i (the power by repeated products in f32,
// as the CPU computes it), cos and sin times mscale; pairs (2i, 2i+1) or, for NeoX, (i, i + n/2).

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let half = p.n_dims / 2u;
    let id = group_index(wg, nwg) * 64u + li;
    if (id >= p.rows * p.heads * half) {
        return;
    }
    let i = id % half;
    let head = (id / half) % p.heads;
    let row = id / (half * p.heads);
    var theta = f32(pos[row]);
    for (var j = 0u; j < i; j++) {
        theta *= p.theta_scale;
    }
    let t = p.freq_scale * theta;
    let c = cos(t) * p.mscale;
    let s = sin(t) * p.mscale;
    let base = row * p.stride + head * p.head_dim;
    var ia = base + 2u * i;
    var ib = ia + 1u;
    if (p.neox != 0u) {
        ia = base + i;
        ib = ia + half;
    }
    let a = v[ia];
    let b = v[ib];
    v[ia] = fma(a, c, -(b * s));
    v[ib] = fma(a, s, b * c);
}
