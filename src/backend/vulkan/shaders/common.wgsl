// Shared by every kernel: the workgroup's index over a 2-D grid (the host splits counts past
// the device's limit per dimension), exact f32 → f16 rounding, and C's `roundf`.

fn group_index(wg: vec3<u32>, n: vec3<u32>) -> u32 {
    return wg.y * n.x + wg.x;
}

// The f16 bits of `f`, rounded to nearest even (as the CPU converts), for every input:
// subnormals, overflow to infinity, NaN kept NaN.
fn f16_bits(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x47800000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x33000000u) {
        return sign;
    }
    if (a < 0x38800000u) {
        let m = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - (a >> 23u);
        var r = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u) == 1u)) {
            r += 1u;
        }
        return sign | r;
    }
    var r = (((a >> 23u) - 112u) << 10u) | ((a & 0x7fffffu) >> 13u);
    let rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) {
        r += 1u;
    }
    return sign | r;
}

fn f16_value(bits: u32) -> f32 {
    return unpack2x16float(bits & 0xffffu).x;
}

// `f` rounded to f16 and back.
fn to_f16(f: f32) -> f32 {
    return f16_value(f16_bits(f));
}

