// The gated feed-forward's activation of a gate value: SiLU (x / (1 + e^-x)) or, with `gelu`,
// GELU's tanh form 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))).
fn act(x: f32) -> f32 {
    if (p.gelu != 0u) {
        return 0.5 * x * (1.0 + tanh(0.7978846 * x * fma(0.044715 * x, x, 1.0)));
    }
    return x / (1.0 + exp(-x));
}
