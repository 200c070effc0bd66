// Store each row's K (or V) values, `width` a row, into the cache as f16 (rounded to nearest
// even) at the row's position (pos[row], from the step's buffer): cache row `pos`.

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let pairs = p.width / 2u;
    let id = group_index(wg, nwg) * 64u + li;
    if (id >= p.rows * pairs) {
        return;
    }
    let row = id / pairs;
    let i = id % pairs;
    let s = row * p.width + 2u * i;
    let lo = f16_bits(src[s]);
    let hi = f16_bits(src[s + 1u]);
    cache[(pos[row] * p.width) / 2u + i] = lo | (hi << 16u);
}
