// The prompt product, tiled: Y[t][r] (+)= Σ_c W[r][c]·X[t][c] for a 16-row × 16-token tile a
// workgroup, the weights dequantized (the format's `deq32`) and the inputs staged in shared
// memory 32 columns at a time.

var<workgroup> ws: array<array<f32, 33>, 16>;
var<workgroup> xs: array<array<f32, 33>, 16>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r0 = wg.x * 16u;
    let t0 = wg.y * 16u;
    let lr = li % 16u;
    let lt = li / 16u;
    let units = p.cols / 32u;
    var acc = 0.0;
    for (var u = 0u; u < units; u++) {
        if (li < 16u) {
            let r = r0 + li;
            if (r < p.rows) {
                var v = deq32(r * p.row_bytes, u);
                for (var i = 0u; i < 32u; i++) {
                    ws[li][i] = v[i];
                }
            } else {
                for (var i = 0u; i < 32u; i++) {
                    ws[li][i] = 0.0;
                }
            }
        }
        for (var e = li; e < 512u; e += 256u) {
            let tt = e / 32u;
            let c = e % 32u;
            let t = t0 + tt;
            var v = 0.0;
            if (t < p.n_tok) {
                v = x[t * p.cols + u * 32u + c];
            }
            xs[tt][c] = v;
        }
        workgroupBarrier();
        for (var i = 0u; i < 32u; i++) {
            acc += ws[lr][i] * xs[lt][i];
        }
        workgroupBarrier();
    }
    let r = r0 + lr;
    let t = t0 + lt;
    if (r < p.rows && t < p.n_tok) {
        let o = t * p.rows + r;
        if (p.add != 0u) {
            y[o] = y[o] + acc;
        } else {
            y[o] = acc;
        }
    }
}
