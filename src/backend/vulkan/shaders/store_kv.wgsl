// Store each row's K (or V) values, `width` a row, into the cache as f16 (rounded to nearest
// even) at the row's position (pos[row], from the step's buffer): cache row `pos`.

struct P {
    rows: u32,
    width: u32,
}

var<push_constant> p: P;
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cache: array<u32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
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
