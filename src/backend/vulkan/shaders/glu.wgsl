// The gated feed-forward's activation of a gate value: SiLU (x / (1 + e^-x), e^-x the CPU's
// `expf_approx`) or, with `gelu`, GELU's tanh form 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))).
fn act(x: f32) -> f32 {
    if (p.gelu != 0u) {
        return 0.5 * x * (1.0 + tanh(0.7978846 * x * fma(0.044715 * x, x, 1.0)));
    }
    let d = 1.0 + expf_approx(0.0 - x);
    let q = x / d;
    // A driver may divide as a reciprocal and a product (two roundings): one correction step
    // gives the quotient the CPU's division rounds to.
    let r = fma(-q, d, x);
    if (r == 0.0 || abs(d) > 3.0e38) {
        return q;
    }
    return fma(r, 1.0 / d, q);
}

// The reference's vectorised expf, as the CPU computes it (kernels/f16ops `expf_approx`): a
// degree-5 polynomial on the reduced argument, scaled by 2^n once.
// (The CPU rounds x·log2(e) to an integer by adding and subtracting 1.5·2^23, which a driver may
// fold away; here the rounding of the product is checked against its exact value instead.)
fn expf_approx(x: f32) -> f32 {
    let log2e = bitcast<f32>(0x3fb8aa3bu);
    var n = round(x * log2e);
    let e = fma(x, log2e, -n);
    if (e > 0.5) {
        n += 1.0;
    } else if (e < -0.5) {
        n -= 1.0;
    }
    let b = fma(-n, bitcast<f32>(0x35bfbe8eu), fma(-n, bitcast<f32>(0x3f317200u), x));
    let u = b * b;
    let p_hi = fma(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u));
    let p_lo = fma(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu));
    let p1 = fma(bitcast<f32>(0x3f7ffff6u), b, 1.0);
    let j = fma(fma(p_hi, u, p_lo), u, p1);
    if (abs(n) > 192.0) {
        return select(bitcast<f32>(0x7f800000u), 0.0, n <= 0.0);
    }
    return ldexp(j, i32(n));
}
