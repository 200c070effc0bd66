// Readers of a weight matrix's bytes (the file's layout, in a `w: array<u32>` binding), at
// byte offsets.

fn w_u8(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// Two bytes at an even offset.
fn w_u16(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu;
}

fn w_f16(o: u32) -> f32 {
    return f16_value(w_u16(o));
}

// Four bytes at an even offset.
fn w_u32(o: u32) -> u32 {
    if ((o & 2u) == 0u) {
        return w[o >> 2u];
    }
    return (w[o >> 2u] >> 16u) | (w[(o >> 2u) + 1u] << 16u);
}

// A signed byte.
fn w_i8(o: u32) -> i32 {
    return (bitcast<i32>(w_u8(o) << 24u)) >> 24u;
}
