// The 8-bit activations of the integer products: each block of 32 inputs as the CPU's (and the
// reference's x86) activation quantizer computes it (d = amax / 127 rounded to f16,
// q = x · (127 / amax) rounded half to even), written as 9 words: d as f32, then the 32 signed
// bytes packed 4 to a word.

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let b = group_index(wg, nwg) * 64u + li;
    if (b >= p.blocks) {
        return;
    }
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(x[b * 32u + i]));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    xq[b * 9u] = bitcast<u32>(to_f16(d));
    for (var k = 0u; k < 8u; k++) {
        var word = 0u;
        for (var j = 0u; j < 4u; j++) {
            let q = i32(round(x[b * 32u + 4u * k + j] * id));
            word |= (bitcast<u32>(q) & 0xffu) << (8u * j);
        }
        xq[b * 9u + 1u + k] = word;
    }
}
