//! A mixture of experts routed on the CUDA backend (on a GPU, else on the software GPU: see
//! tests/cuda_backend.rs): the routing kernel (`moe_route_f32`) against the CPU's
//! `kernels::moe::route` on random and tied router logits, every gate; the products of the
//! experts named by ids in device memory (`matvec_*_id`) against each expert's own matvec, for
//! every weight format, both layouts, with biases; and whole models: a MoE decode step routed
//! on the device records as one graph, replays it, allocates nothing, and gives the bits of
//! the same steps routed on the host.

mod common;

use std::sync::Arc;

use common::ops::{gpu, i32_bytes, quantized_matvec_args, random, random_blocks};
use kiln::backend::cuda::exec::OnCuda;
use kiln::backend::cuda::gpu::{Arena, Arg, Gpu, Layout};
use kiln::backend::cuda::weights::{format_kernels, repack, repacked_kernels, FormatKernels};
use kiln::backend::Device;
use kiln::engine::{Session, SessionOptions};
use kiln::kernels::moe::{route, GateFn, Routing};
use kiln::model::Model;
use kiln::quant::GgmlType;
use kiln::sampler::argmax;

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
    // (One GPU test at a time: the decode test counts the device's allocations.)
    let _one = common::gpu("routing_kernel_matches_the_cpu_route");
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
                let all = j * ne..(j + 1) * ne;
                for (e, (&a, &b)) in got.probs[all.clone()].iter().zip(&probs[all]).enumerate() {
                    assert!(
                        close(a, b, ulps),
                        "{what}: row {j} probability {e}: {a} against {b}"
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

/// The weight formats with device kernels (the activation formats have none).
fn weight_formats() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&ty| format_kernels(ty).is_ok())
        .collect()
}

/// The non-linear formats (grids and value tables).
fn nonlinear(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ4NL | IQ4XS | MXFP4 | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ1M
    )
}

/// `n` experts' matrices of `ty`, `rows × cols` each, one after another: quantized by the CPU
/// from random values, or random blocks where the CPU has no quantizer for the format (and
/// for the non-linear formats' odd experts, which reach every grid index and scale code).
fn expert_stack(ty: GgmlType, n: usize, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut w = vec![0u8; n * rows * rb];
    let f = random(n * rows * cols, ty as u64 + 5);
    let per_row = cols / ty.block_size();
    for (r, (src, dst)) in f.chunks_exact(cols).zip(w.chunks_exact_mut(rb)).enumerate() {
        if ((r / rows) % 2 == 1 && nonlinear(ty))
            || kiln::quant::quantize_row(ty, src, dst).is_err()
        {
            dst.copy_from_slice(&random_blocks(
                ty,
                per_row,
                (ty as u64) << 8 | r as u64,
                false,
            ));
        }
    }
    w
}

/// The id-indexed products against each chosen expert's own matvec, bit for bit, for every
/// weight format (the file's layout and, where the upload rearranges the format, the
/// rearranged one), with and without biases: pairs reading their token's row (x_div = k, the
/// gate and up products) and their own (x_div = 1, the down products), rows of a warp and of
/// a block, and a row count that leaves a block's last rows empty.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn expert_products_match_each_experts_matvec() {
    let _one = common::gpu("expert_products_match_each_experts_matvec");
    let g = gpu();
    let (n_expert, k) = (4, 2);
    let ids: Vec<i32> = vec![3, 0, 1, 3, 2, 1];
    let pairs = ids.len();
    let mut checked = 0;
    for ty in weight_formats() {
        let file = format_kernels(ty).unwrap();
        let mut layouts = vec![(file, false)];
        if let Some(r) = repacked_kernels(ty) {
            layouts.push((r, true));
        }
        for (rows, cols) in [(20usize, 256usize), (8, 512 * 32 + 256)] {
            if !cols.is_multiple_of(ty.block_size()) || (cols > 4096 && file.quantize.is_none()) {
                continue;
            }
            let stack = expert_stack(ty, n_expert, rows, cols);
            let each = stack.len() / n_expert;
            for &(kern, repacked) in &layouts {
                if repacked && !each.is_multiple_of(16) {
                    continue;
                }
                let w: Vec<u8> = match repacked {
                    true => stack
                        .chunks_exact(each)
                        .flat_map(|e| repack(ty, e, rows, cols).unwrap())
                        .collect(),
                    false => stack.clone(),
                };
                for (x_div, bias) in [(k, false), (1, true)] {
                    let n_x = pairs / x_div;
                    let x = random(n_x * cols, cols as u64 + x_div as u64);
                    let b = random(n_expert * rows, 17);
                    let got = id_products(
                        &g,
                        kern,
                        &w,
                        each,
                        &ids,
                        &x,
                        n_x,
                        x_div,
                        rows,
                        cols,
                        bias.then_some(&b[..]),
                    );
                    for (p, &e) in ids.iter().enumerate() {
                        let e = e as usize;
                        let one = &w[e * each..(e + 1) * each];
                        let t = p / x_div;
                        let want =
                            plain_matvec(&g, kern, one, &x[t * cols..(t + 1) * cols], rows, cols);
                        for r in 0..rows {
                            let want = if bias {
                                want[r] + b[e * rows + r]
                            } else {
                                want[r]
                            };
                            let have = got[p * rows + r];
                            assert_eq!(
                                have.to_bits(),
                                want.to_bits(),
                                "{ty:?} ({}), {rows}×{cols}, pair {p} (expert {e}), row {r}: {have} against the expert's matvec {want}",
                                if repacked { "rearranged" } else { "file layout" }
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 2 * weight_formats().len(), "{checked} cases");
}

/// The kernel's threads per row for unquantized formats, and (block, threads per row) for the
/// quantized ones: step/products.rs's choice for the software GPU's and a GPU's default
/// bound of 512 groups a warp.
fn shape(g: &Gpu, kern: FormatKernels, cols: usize) -> (u32, u32) {
    let t = if g.is_emulated() { 32 } else { 128 };
    match kern.quantize {
        None => (t, t),
        Some(_) if cols / 32 <= 512 => (256, 32),
        Some(_) => (t, t),
    }
}

/// `matvec_*_id` over the stack `w` (`each` bytes an expert) for the pairs `ids`.
#[allow(clippy::too_many_arguments)]
fn id_products(
    g: &Gpu,
    kern: FormatKernels,
    w: &[u8],
    each: usize,
    ids: &[i32],
    x: &[f32],
    n_x: usize,
    x_div: usize,
    rows: usize,
    cols: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let pairs = ids.len();
    let mut l = Layout::default();
    let (wo, xo, xq, io) = (
        l.take(w.len()),
        l.take(x.len() * 4),
        l.take(n_x * cols / 32 * 40),
        l.take(pairs * 4),
    );
    let (bo, yo) = (
        l.take(bias.map_or(4, |b| b.len() * 4)),
        l.take(pairs * rows * 4),
    );
    let mut a = Arena::new(g, l.bytes).unwrap();
    let s = g.default_stream();
    a.write(s, wo, w).unwrap();
    a.write(s, xo, zerocopy::IntoBytes::as_bytes(x)).unwrap();
    a.write(s, io, &i32_bytes(ids.iter().copied())).unwrap();
    if let Some(b) = bias {
        a.write(s, bo, zerocopy::IntoBytes::as_bytes(b)).unwrap();
    }
    let input = match kern.quantize {
        Some(q) => {
            let n = n_x * cols;
            let args = [Arg::P(a.ptr(xo)), Arg::P(a.ptr(xq)), Arg::L(n as i64)];
            g.launch(s, q, n.div_ceil(256) as u32, 256, &args).unwrap();
            a.ptr(xq)
        }
        None => a.ptr(xo),
    };
    let mut args = vec![
        Arg::P(a.ptr(wo)),
        Arg::L(each as i64),
        Arg::P(a.ptr(io)),
        Arg::P(input),
        Arg::P(a.ptr(yo)),
        Arg::P(bias.map_or(0, |_| a.ptr(bo))),
        Arg::I(rows as i32),
        Arg::I(cols as i32),
    ];
    let (block, tpr) = shape(g, kern, cols);
    let grid = match kern.quantize {
        Some(_) => {
            args.extend([Arg::I(n_x as i32), Arg::I(x_div as i32), Arg::I(tpr as i32)]);
            pairs * rows.div_ceil((block / tpr) as usize)
        }
        None => {
            args.push(Arg::I(x_div as i32));
            pairs * rows
        }
    };
    g.launch(s, kern.matvec_id, grid as u32, block, &args)
        .unwrap();
    g.synchronize(s).unwrap();
    let mut y = vec![f32::NAN; pairs * rows];
    a.read(s, yo, zerocopy::IntoBytes::as_mut_bytes(&mut y[..]))
        .unwrap();
    y
}

/// One matrix's matvec (`kern.matvec`) over one row of x, as the session launches it.
fn plain_matvec(
    g: &Gpu,
    kern: FormatKernels,
    w: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let mut l = Layout::default();
    let (wo, xo, xq, yo) = (
        l.take(w.len()),
        l.take(x.len() * 4),
        l.take(cols / 32 * 40),
        l.take(rows * 4),
    );
    let mut a = Arena::new(g, l.bytes).unwrap();
    let s = g.default_stream();
    a.write(s, wo, w).unwrap();
    a.write(s, xo, zerocopy::IntoBytes::as_bytes(x)).unwrap();
    let (block, tpr) = shape(g, kern, cols);
    match kern.quantize {
        Some(q) => {
            let args = [Arg::P(a.ptr(xo)), Arg::P(a.ptr(xq)), Arg::L(cols as i64)];
            g.launch(s, q, cols.div_ceil(256) as u32, 256, &args)
                .unwrap();
            let (wp, qp, yp) = (a.ptr(wo), a.ptr(xq), a.ptr(yo));
            let args = quantized_matvec_args(wp, qp, yp, (rows, cols), 1, false, tpr as i32);
            let grid = rows.div_ceil((block / tpr) as usize) as u32;
            g.launch(s, kern.matvec, grid, block, &args).unwrap();
        }
        None => {
            let args = [
                Arg::P(a.ptr(wo)),
                Arg::P(a.ptr(xo)),
                Arg::P(a.ptr(yo)),
                Arg::I(rows as i32),
                Arg::I(cols as i32),
                Arg::I(1),
            ];
            g.launch(s, kern.matvec, rows as u32, block, &args).unwrap();
        }
    }
    g.synchronize(s).unwrap();
    let mut y = vec![f32::NAN; rows];
    a.read(s, yo, zerocopy::IntoBytes::as_mut_bytes(&mut y[..]))
        .unwrap();
    y
}

/// Every mixture-of-experts fixture: every gate the fixtures have (softmax, gpt-oss's
/// softmax over the chosen logits), a shared expert (Qwen2-MoE), biases and the clamped
/// SwiGLU (gpt-oss), experts in f32, Q8_0, Q4_0 (rearranged at upload), the K-quants and
/// MXFP4.
const MOES: [&str; 9] = [
    "random-qwen3moe-f32",
    "random-qwen3moe-q8_0",
    "random-olmoe-f32",
    "random-olmoe-q4_k_m",
    "random-qwen2moe-f32",
    "random-qwen2moe-q4_0",
    "random-gpt-oss-f32",
    "random-gpt-oss-q4_k_m",
    "random-gpt-oss-mxfp4",
];

/// On a real GPU, the most a logit of a step routed on the device may differ from the same
/// step routed on the host (see `moe_decode_routes_on_the_device_and_replays_a_graph`).
const REAL_GPU_ROUTING: f32 = 1e-4;

fn session(m: &Arc<Model>, on_device: bool) -> Session {
    let mut o = SessionOptions::new(128, 2);
    o.prefill_chunk = 64;
    o.device = Device::Cuda;
    let mut s = Session::new(Arc::clone(m), o).expect("a session on the GPU");
    s.cuda_mut().unwrap().set_moe_routing_on_device(on_device);
    s
}

/// A MoE model's decode steps routed on the device: one graph for one-row steps, replayed
/// (no device allocation after the first), and the logits of every step (a short prompt's
/// too, routed on the device without a graph) equal bit for bit to the same steps routed
/// on the host, whose steps record no graph. (Bit for bit where the device's `expf` is the
/// host's, on the software GPU; on a real GPU the routing softmax's tail runs through CUDA's
/// `expf`, within 2 ulp of the host's (moe.cu), so a routing weight may differ in its last
/// bits: there the logits agree within [`REAL_GPU_ROUTING`], where an H200 showed up to
/// 6e-8 on random-olmoe-f32 and 1.9e-5 on random-gpt-oss-f32 (its four chosen experts'
/// softmax all through `expf`), 2026-11-30, and the greedy token is the same.)
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn moe_decode_routes_on_the_device_and_replays_a_graph() {
    let _gpu = common::gpu("moe_decode_routes_on_the_device_and_replays_a_graph");
    let real_gpu = kiln::backend::cuda::open().is_ok();
    let same = |a: &[f32], b: &[f32], what: String| {
        if real_gpu {
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                a.len() == b.len() && worst <= REAL_GPU_ROUTING && argmax(a) == argmax(b),
                "{what}: |Δlogit| up to {worst} routed on the device against the host"
            );
        } else {
            assert_eq!(a, b, "{what}");
        }
    };
    let prompt = [1u32, 5, 9, 14, 3];
    for stem in MOES {
        let m = Arc::new(Model::load(common::random_model(stem)).expect("load"));
        let mut dev = session(&m, true);
        let mut host = session(&m, false);
        dev.prefill(&prompt, &mut |_, _| {}).unwrap();
        host.prefill(&prompt, &mut |_, _| {}).unwrap();
        same(
            dev.logits(),
            host.logits(),
            format!("{stem}: the prompt's logits"),
        );
        let mut t = argmax(dev.logits());
        dev.decode(t).unwrap();
        host.decode(t).unwrap();
        let gpu = Arc::clone(dev.cuda().unwrap().gpu());
        let before = gpu.allocations();
        for step in 0..4 {
            same(
                dev.logits(),
                host.logits(),
                format!("{stem}: decode step {step}"),
            );
            t = argmax(dev.logits());
            dev.decode(t).unwrap();
            host.decode(t).unwrap();
        }
        same(
            dev.logits(),
            host.logits(),
            format!("{stem}: the last step"),
        );
        assert_eq!(
            gpu.allocations(),
            before,
            "{stem}: decode steps allocated device memory"
        );
        let d = dev.cuda().unwrap();
        assert_eq!(d.graphs(), 1, "{stem}: one graph for one-row steps");
        let launches = d.graph_launches(1).unwrap();
        assert_eq!(
            host.cuda().unwrap().graphs(),
            0,
            "{stem}: routed on the host, no graph"
        );
        println!(
            "{stem}: a decode step of {} layers is one graph of {launches} launches",
            m.config.n_layers
        );
    }
}
