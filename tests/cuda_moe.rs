//! A mixture of experts routed on the CUDA backend (on a GPU, else on the software GPU: see
//! tests/cuda_backend.rs): the routing kernel (`moe_route_f32`) against the CPU's
//! `kernels::moe::route` on random and tied router logits, every gate.

mod common;

use common::ops::{gpu, random};
use kiln::backend::cuda::gpu::{Arena, Arg, Gpu, Layout};
use kiln::kernels::moe::{route, GateFn, Routing};

/// Router logits of `rows` tokens over `ne` experts: random ones, then tied ones (a few
/// levels, so most rows have ties at the top and across the k-th place), a row all equal, a
/// row with a NaN, a row of large magnitudes.
fn router_logits(ne: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> = random(3 * ne, seed).iter().map(|v| v * 4.0).collect();
    x.extend(
        random(3 * ne, seed + 1)
            .iter()
            .map(|v| (v * 3.0).round() * 0.5),
    );
    x.extend(std::iter::repeat_n(0.25, ne));
    let mut nan = random(ne, seed + 2);
    nan[ne / 2] = f32::NAN;
    x.extend(nan);
    x.extend(random(ne, seed + 3).iter().map(|v| v * 60.0));
    x
}

/// What the routing kernel computes for `logits` (`[rows, ne]`): the probabilities, the
/// chosen experts, their weights, and the shared expert's gate for `shared_logit`.
struct Routed {
    probs: Vec<f32>,
    ids: Vec<i32>,
    weights: Vec<f32>,
    shared: Vec<f32>,
}

fn route_on_gpu(g: &Gpu, r: &Routing, logits: &[f32], shared_logit: &[f32]) -> Routed {
    let (ne, k) = (r.n_expert, r.n_used);
    let rows = logits.len() / ne;
    let mut l = Layout::default();
    let (lo, ids, wts) = (
        l.take(logits.len() * 4),
        l.take(rows * k * 4),
        l.take(rows * k * 4),
    );
    let (so, sg) = (l.take(rows * 4), l.take(rows * 4));
    let mut a = Arena::new(g, l.bytes).unwrap();
    let s = g.default_stream();
    a.write(s, lo, zerocopy::IntoBytes::as_bytes(logits))
        .unwrap();
    a.write(s, so, zerocopy::IntoBytes::as_bytes(shared_logit))
        .unwrap();
    let gate = match r.gate {
        GateFn::Softmax => 0,
        GateFn::Sigmoid => 1,
        GateFn::SoftmaxWeight => 2,
    };
    let args = [
        Arg::P(a.ptr(lo)),
        Arg::I(ne as i32),
        Arg::I(k as i32),
        Arg::I(gate),
        Arg::I(r.norm as i32),
        Arg::F(r.scale),
        Arg::P(a.ptr(ids)),
        Arg::P(a.ptr(wts)),
        Arg::P(a.ptr(so)),
        Arg::P(a.ptr(sg)),
    ];
    g.launch(s, "moe_route_f32", rows as u32, 32, &args)
        .unwrap();
    g.synchronize(s).unwrap();
    let mut out = Routed {
        probs: vec![0.0; logits.len()],
        ids: vec![0; rows * k],
        weights: vec![0.0; rows * k],
        shared: vec![0.0; rows],
    };
    a.read(s, lo, zerocopy::IntoBytes::as_mut_bytes(&mut out.probs[..]))
        .unwrap();
    a.read(s, ids, zerocopy::IntoBytes::as_mut_bytes(&mut out.ids[..]))
        .unwrap();
    a.read(
        s,
        wts,
        zerocopy::IntoBytes::as_mut_bytes(&mut out.weights[..]),
    )
    .unwrap();
    a.read(
        s,
        sg,
        zerocopy::IntoBytes::as_mut_bytes(&mut out.shared[..]),
    )
    .unwrap();
    out
}

/// `a` and `b` equal bit for bit (NaN equal to NaN), or with `ulps` > 0 within that many
/// units in the last place.
fn close(a: f32, b: f32, ulps: u32) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    a.to_bits() == b.to_bits()
        || (a.signum() == b.signum() && a.to_bits().abs_diff(b.to_bits()) <= ulps)
}

/// The routing kernel against the CPU's `route` for every gate, with and without
/// renormalization and scale, expert counts that are and are not multiples of the softmax's
/// runs of 16, on random and tied logits: the same experts in the same order, and the same
/// weights and probabilities bit for bit on the software GPU (whose `expf` is the CPU's). On a
/// GPU CUDA's `expf` (within 2 ulp of the CPU's) computes the softmax's tail and the
/// sigmoid: the same experts, the values within 4 ulp (8 after a renormalization).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn routing_kernel_matches_the_cpu_route() {
    let g = gpu();
    let ulps = if g.is_emulated() { 0 } else { 4 };
    let mut cases = 0;
    for (ne, k) in [(8, 2), (60, 4), (64, 8), (128, 8), (32, 1), (40, 6)] {
        for (gate, norm, scale) in [
            (GateFn::Softmax, false, 0.0),
            (GateFn::Softmax, true, 1.0),
            (GateFn::Sigmoid, true, 2.5),
            (GateFn::Sigmoid, false, 0.0),
            (GateFn::SoftmaxWeight, false, 0.0),
            (GateFn::SoftmaxWeight, true, 1.5),
        ] {
            let r = Routing {
                n_expert: ne,
                n_used: k,
                gate,
                norm,
                scale,
            };
            let logits = router_logits(ne, (ne * 31 + k) as u64);
            let rows = logits.len() / ne;
            let shared_logit: Vec<f32> = random(rows, 99).iter().map(|v| v * 5.0).collect();
            let got = route_on_gpu(&g, &r, &logits, &shared_logit);
            let what = format!("{ne} experts, {k} used, {gate:?}, norm {norm}, scale {scale}");
            let mut probs = logits.clone();
            let (mut ids, mut wts) = (vec![0u32; rows * k], vec![0f32; rows * k]);
            for j in 0..rows {
                route(
                    &r,
                    &mut probs[j * ne..(j + 1) * ne],
                    &mut ids[j * k..(j + 1) * k],
                    &mut wts[j * k..(j + 1) * k],
                );
                let row = j * k..(j + 1) * k;
                let want: Vec<i32> = ids[row.clone()].iter().map(|&e| e as i32).collect();
                assert_eq!(
                    &got.ids[row.clone()],
                    &want[..],
                    "{what}: row {j}'s experts"
                );
                let tol = if norm { 2 * ulps } else { ulps };
                for i in row {
                    assert!(
                        close(got.weights[i], wts[i], tol),
                        "{what}: row {j} weight {i}: {} against the CPU's {}",
                        got.weights[i],
                        wts[i]
                    );
                }
                for e in j * ne..(j + 1) * ne {
                    assert!(
                        close(got.probs[e], probs[e], ulps),
                        "{what}: row {j} probability {e}: {} against {}",
                        got.probs[e],
                        probs[e]
                    );
                }
                // Qwen2-MoE's shared-expert gate, as step/moe.rs's host path computes it.
                let sl = shared_logit[j];
                let want = (sl / (1.0 + (-sl).exp())) / sl;
                assert!(close(got.shared[j], want, ulps), "{what}: shared gate {j}");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 36);
}
