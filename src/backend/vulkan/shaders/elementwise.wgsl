// An element-wise kernel: y[i] = EXPR for each i < p.n, EXPR the op's expression
// (shaders.rs's `elementwise`: add, bias, scale, glu).

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let i = group_index(wg, nwg) * 64u + li;
    if (i < p.n) {
        y[i] = EXPR;
    }
}
