// Decode attention: each row's query heads over its sequence's f16 K and V cache rows
// first..first + len (len = lens[row], first = lens[rows + row], from the step's buffer: a
// slot's rows start at its first), softmax(scale·q·k) weighting v, computed online
// 64 positions at a time (running maximum and sum, the accumulator rescaled as the maximum
// grows); one workgroup a (row, head), a head of at most 256 values; query head h reads KV head
// h / (heads / kv_heads).

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;

// Value `i` of a cache row starting at word `base`.
fn kv_at(which: u32, base: u32, i: u32) -> f32 {
    var word: u32;
    if (which == 0u) {
        word = kc[base + i / 2u];
    } else {
        word = vc[base + i / 2u];
    }
    return f16_value(word >> ((i & 1u) * 16u));
}

@compute @workgroup_size(64)
fn main(GROUP_BUILTINS) {
    let g = group_index(wg, nwg);
    if (g >= p.rows * p.heads) {
        return;
    }
    let row = g / p.heads;
    let h = g % p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let hd = p.head_dim;
    let kv_words = p.kv_heads * hd / 2u;
    let len = lens[row];
    let first = lens[p.rows + row];
    for (var i = li; i < hd; i += 64u) {
        qs[i] = q[(row * p.heads + h) * hd + i];
    }
    workgroupBarrier();
    var m = -3.4028235e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c0 = 0u; c0 < len; c0 += 64u) {
        let pp = c0 + li;
        var s = -3.4028235e38;
        if (pp < len) {
            let base = (first + pp) * kv_words + kvh * hd / 2u;
            var d = 0.0;
            for (var i = 0u; i < hd; i++) {
                d += qs[i] * kv_at(0u, base, i);
            }
            s = d * p.scale;
        }
        sc[li] = s;
        workgroupBarrier();
        let n = min(64u, len - c0);
        var cm = m;
        for (var j = 0u; j < n; j++) {
            cm = max(cm, sc[j]);
        }
        let corr = exp(m - cm);
        l *= corr;
        for (var k = 0u; k < 4u; k++) {
            acc[k] *= corr;
        }
        for (var j = 0u; j < n; j++) {
            let e = exp(sc[j] - cm);
            l += e;
            let base = (first + c0 + j) * kv_words + kvh * hd / 2u;
            for (var k = 0u; k < 4u; k++) {
                let i = li + 64u * k;
                if (i < hd) {
                    acc[k] += e * kv_at(1u, base, i);
                }
            }
        }
        m = cm;
        workgroupBarrier();
    }
    for (var k = 0u; k < 4u; k++) {
        let i = li + 64u * k;
        if (i < hd) {
            o[(row * p.heads + h) * hd + i] = acc[k] / l;
        }
    }
}
