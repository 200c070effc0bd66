//! A mixture-of-experts feed-forward on the device ([`crate::backend::Backend::moe_ffn`]).
//!
//! The router's logits (and Qwen2-MoE's shared-expert gate) are products on the device. A
//! step of at most [`MAX_GRAPH_ROWS`] rows (decode) routes on the device too: `moe_route_f32`
//! (kernels/moe.cu) computes the CPU's routing ([`crate::kernels::moe::route`], the same
//! arithmetic step for step) into each token's expert ids and weights in device memory; the
//! chosen experts' gate and up products read those ids (`matvec_*_id`, kernels/matvec_id.cu:
//! one launch per stack, each (token, slot) pair the product of its expert's matrix, every
//! weight format), then the activation over every pair at once, the down products the same
//! way, and the weighted sum per row in slot order (`moe_combine_f32`). Nothing goes through
//! the host, so such a step records as a graph and replays like a dense one.
//!
//! Longer passes (prompts) route on the host: it reads the logits and routes every row with
//! the CPU's own functions and its grouping by expert (the counts per expert decide the
//! launches); the rows are gathered by expert on the device (`moe_gather_f32`), and each
//! chosen expert multiplies only its own rows with the backend's products of its format (a
//! matvec of decode-sized runs, the bf16 or f32 GEMM of prompt-sized ones:
//! [`CudaSession::product`]), so each expert's weights are read once a pass.

use super::layout::MoeLayout;
use super::products::{mv_shape, mv_threads, Prepared};
use super::{Arg, Buf, CudaSession, MAX_GRAPH_ROWS};
use crate::backend::cuda::weights::DevMat;
use crate::kernels::moe::{MoeScratch, MoeShape};
use crate::kernels::ops::Activation;
use crate::model::config::ClampedSwiglu;
use crate::model::moe::Gating;
use crate::model::{Model, ModelConfig};

/// The host's side of routing, made with the session: the CPU's routing scratch (logits,
/// choices, grouping) and the staging of what goes back to the device.
pub(super) struct MoeHost {
    scratch: MoeScratch,
    shared_logit: Vec<f32>,
    /// `[rows · n_used]` grouped rows, then pairs' positions; `[rows · n_used]` weights and
    /// `[rows]` shared gates.
    ints: Vec<i32>,
    floats: Vec<f32>,
}

impl MoeHost {
    /// For a model with experts (`None` for a dense one), `rows` rows a step.
    pub(super) fn new(c: &ModelConfig, rows: usize) -> Option<MoeHost> {
        let m = c.moe.as_ref()?;
        let p = rows * m.n_used;
        Some(MoeHost {
            scratch: MoeScratch::new(MoeShape {
                max_tokens: rows,
                n_expert: m.n_expert,
                n_used: m.n_used,
                dim: 0,
                ffn: 0,
                act_row_bytes: 0,
            }),
            shared_logit: vec![0.0; rows],
            ints: vec![0; p],
            floats: vec![0.0; p.max(rows)],
        })
    }
}

impl CudaSession {
    /// Layer `li`'s experts over `Xb`'s `rows` rows into `Proj` (`Gate` and `Up` hold the
    /// shared expert's hidden state, if any).
    pub(super) fn moe_ffn(&mut self, m: &Model, li: usize, act: Activation, rows: usize) {
        let w = std::sync::Arc::clone(&self.w);
        let (Some(dm), Some(mc), Some(lay), Some(mut host)) = (
            w.moe(li),
            m.config.moe.as_ref(),
            self.layout.moe,
            self.moe_host.take(),
        ) else {
            self.err.get_or_insert(super::CudaError::Driver(format!(
                "internal: layer {li} has no experts on the device"
            )));
            return;
        };
        let (dim, f, ne, k) = (m.config.dim, mc.ffn_dim, mc.n_expert, mc.n_used);
        let x = self.buf(Buf::Xb);
        let proj = self.buf(Buf::Proj);
        self.reading(x);
        self.writes(Buf::Proj);
        self.xq_holds = None;

        // The router's logits and the shared expert's gate, on the device.
        let mut prep = Prepared::default();
        self.product(dm.router, x, self.at(lay.logits), rows, &mut prep);
        if let Some(sg) = dm.shared_gate {
            self.product(sg, x, self.at(lay.shared_logit), rows, &mut prep);
        }
        // The shared expert, into `Proj` (its hidden state in `Gate` and `Up`).
        let shared = match (m.weights.layers[li].ffn_gate.is_some(), dm.shared_gate) {
            (true, Some(_)) => {
                use crate::backend::Mat;
                let (g, u, d) = (
                    w.mat(Mat::Gate(li)),
                    w.mat(Mat::Up(li)),
                    w.mat(Mat::Down(li)),
                );
                let (gp, up) = (self.buf(Buf::Gate), self.buf(Buf::Up));
                self.writes(Buf::Gate);
                self.writes(Buf::Up);
                self.product(g, x, gp, rows, &mut prep);
                self.product(u, x, up, rows, &mut prep);
                self.gated_act(gp, up, rows * g.rows, act);
                self.xq_holds = None;
                self.product(d, gp, proj, rows, &mut Prepared::default());
                true
            }
            _ => false,
        };

        if self.moe_on_device && rows <= MAX_GRAPH_ROWS {
            self.moe_host = Some(host);
            self.experts_on_device(m, li, act, rows, lay, shared);
            return;
        }

        // The host routes: the logits back, the CPU's routing, the grouping by expert.
        self.flush();
        let ms = &mut host.scratch;
        let logits = zerocopy::IntoBytes::as_mut_bytes(&mut ms.probs[..rows * ne]);
        let r = self.act.read(&self.stream, lay.logits, logits);
        self.fail(r);
        if shared {
            let sl = zerocopy::IntoBytes::as_mut_bytes(&mut host.shared_logit[..rows]);
            let r = self.act.read(&self.stream, lay.shared_logit, sl);
            self.fail(r);
        }
        if self.err.is_some() {
            self.moe_host = Some(host);
            return;
        }
        let ms = &mut host.scratch;
        ms.route_rows(&crate::backend::moe_routing(mc), rows);
        let p = rows * k;
        for (d, &r) in host.ints.iter_mut().zip(&ms.row_of[..p]) {
            *d = r as i32;
        }
        self.put(lay.row_of, zerocopy::IntoBytes::as_bytes(&host.ints[..p]));
        for (d, &r) in host.ints.iter_mut().zip(&ms.pos_of[..p]) {
            *d = r as i32;
        }
        self.put(lay.pos_of, zerocopy::IntoBytes::as_bytes(&host.ints[..p]));
        self.put(lay.weights, zerocopy::IntoBytes::as_bytes(&ms.weights[..p]));
        if shared {
            // The reference's sigmoid here: `silu(x) / x`, its scalar SiLU (as the CPU).
            for (d, &g) in host.floats.iter_mut().zip(&host.shared_logit[..rows]) {
                *d = (g / (1.0 + (-g).exp())) / g;
            }
            self.put(
                lay.shared,
                zerocopy::IntoBytes::as_bytes(&host.floats[..rows]),
            );
        }

        // The rows gathered by expert; each chosen expert's gate and up products over its
        // rows, the activation over every pair, then its down products into `xg`.
        let (xg, gate, up) = (self.at(lay.xg), self.at(lay.gate), self.at(lay.up));
        let args = [
            Arg::P(x),
            Arg::P(self.at(lay.row_of)),
            Arg::P(xg),
            Arg::I(dim as i32),
            Arg::L(p as i64),
        ];
        self.elementwise("moe_gather_f32", &args, p * dim);
        let start = &host.scratch.start;
        let runs = || {
            (0..ne)
                .map(|e| (e, start[e], start[e + 1]))
                .filter(|&(_, a, b)| a < b)
        };
        for (e, a, b) in runs() {
            // (Each expert's rows are another input: nothing quantized before holds them.)
            self.xq_holds = None;
            let mut prep = Prepared::default();
            let xe = xg + (a * dim * 4) as u64;
            self.product(dm.gate[e], xe, gate + (a * f * 4) as u64, b - a, &mut prep);
            self.product(dm.up[e], xe, up + (a * f * 4) as u64, b - a, &mut prep);
        }
        self.experts_act(mc.clamped_swiglu, gate, up, p * f, act);
        for (e, a, b) in runs() {
            self.xq_holds = None;
            let (xe, ye) = (gate + (a * f * 4) as u64, xg + (a * dim * 4) as u64);
            self.product(dm.down[e], xe, ye, b - a, &mut Prepared::default());
        }
        self.xq_holds = None;
        self.moe_host = Some(host);

        // Each row's weighted sum of its experts' outputs (and the shared expert's, gated).
        let args = [
            Arg::P(xg),
            Arg::P(self.at(lay.pos_of)),
            Arg::P(self.at(lay.weights)),
            Arg::P(if shared { self.at(lay.shared) } else { 0 }),
            Arg::P(proj),
            Arg::I(dim as i32),
            Arg::I(k as i32),
            Arg::L(rows as i64),
        ];
        self.elementwise("moe_combine_f32", &args, rows * dim);
    }

    /// Layer `li`'s routing and experts over `Xb`'s `rows` rows into `Proj`, on the device
    /// alone (`shared`: `Proj` holds the shared expert's output and `shared_logit` its gate's
    /// logits). The pairs `p = j·k + s` stay in token order: expert ids, weights, products.
    fn experts_on_device(
        &mut self,
        m: &Model,
        li: usize,
        act: Activation,
        rows: usize,
        lay: MoeLayout,
        shared: bool,
    ) {
        let w = std::sync::Arc::clone(&self.w);
        let (Some(dm), Some(mc)) = (w.moe(li), m.config.moe.as_ref()) else {
            return; // (checked by the caller)
        };
        let (dim, f, k) = (m.config.dim, mc.ffn_dim, mc.n_used);
        let p = rows * k;
        let (x, proj) = (self.buf(Buf::Xb), self.buf(Buf::Proj));
        let (ids, weights) = (self.at(lay.row_of), self.at(lay.weights));
        let gate_fn = match mc.gating {
            Gating::Softmax => 0,
            Gating::Sigmoid => 1,
            Gating::SoftmaxWeight => 2,
        };
        let (sl, sg) = match shared {
            true => (self.at(lay.shared_logit), self.at(lay.shared)),
            false => (0, 0),
        };
        let args = [
            Arg::P(self.at(lay.logits)),
            Arg::I(mc.n_expert as i32),
            Arg::I(k as i32),
            Arg::I(gate_fn),
            Arg::I(mc.norm_weights as i32),
            Arg::F(mc.weights_scale),
            Arg::P(ids),
            Arg::P(weights),
            Arg::P(sl),
            Arg::P(sg),
        ];
        self.go("moe_route_f32", rows as u32, 32, &args);

        // Each pair's gate and up products (the token's row, quantized once for both where
        // their formats take the same 8-bit input), the activation over every pair.
        let (xg, gate, up) = (self.at(lay.xg), self.at(lay.gate), self.at(lay.up));
        let xq = self.quantized(dm.gate[0], x, rows);
        self.expert_products(&dm.gate, ids, xq.unwrap_or(x), gate, rows, k, p);
        let xq = self.quantized(dm.up[0], x, rows);
        self.expert_products(&dm.up, ids, xq.unwrap_or(x), up, rows, k, p);
        self.experts_act(mc.clamped_swiglu, gate, up, p * f, act);
        // The down products over the pairs' hidden states, quantized into `up` (free now; an
        // 8-bit group takes 40 of its 128 bytes) where the format multiplies 8-bit input.
        let down = dm.down[0];
        let input = match down.kernels.quantize {
            Some(q) => {
                let n = p * f;
                self.go(
                    q,
                    n.div_ceil(256) as u32,
                    256,
                    &[Arg::P(gate), Arg::P(up), Arg::L(n as i64)],
                );
                up
            }
            None => gate,
        };
        self.expert_products(&dm.down, ids, input, xg, p, 1, p);
        self.xq_holds = None;

        // Each row's weighted sum of its experts' outputs (and the shared expert's, gated).
        let args = [
            Arg::P(xg),
            Arg::P(0),
            Arg::P(weights),
            Arg::P(sg),
            Arg::P(proj),
            Arg::I(dim as i32),
            Arg::I(k as i32),
            Arg::L(rows as i64),
        ];
        self.elementwise("moe_combine_f32", &args, rows * dim);
    }

    /// `y[p] = stack[ids[p]] · x[p / x_div]` (+ that expert's bias) for `pairs` pairs, the
    /// expert ids in device memory at `ids`; x is `n_x` rows, quantized for the stack's format
    /// where it takes 8-bit input (f32 otherwise). One launch (`matvec_*_id`).
    #[allow(clippy::too_many_arguments)]
    fn expert_products(
        &mut self,
        stack: &[DevMat],
        ids: u64,
        x: u64,
        y: u64,
        n_x: usize,
        x_div: usize,
        pairs: usize,
    ) {
        let e0 = stack[0];
        // (The experts lie one after another in their stack's placement, biases too.)
        let stride = stack.get(1).map_or(0, |e1| e1.ptr - e0.ptr);
        let head = [
            Arg::P(e0.ptr),
            Arg::L(stride as i64),
            Arg::P(ids),
            Arg::P(x),
            Arg::P(y),
            Arg::P(e0.bias.unwrap_or(0)),
            Arg::I(e0.rows as i32),
            Arg::I(e0.cols as i32),
        ];
        let name = e0.kernels.matvec_id;
        if e0.kernels.quantize.is_some() {
            let (block, tpr) = mv_shape(&self.gpu, e0.cols);
            let per_pair = e0.rows.div_ceil((block / tpr) as usize);
            let mut args = [Arg::I(0); 11];
            args[..8].copy_from_slice(&head);
            args[8..].copy_from_slice(&[
                Arg::I(n_x as i32),
                Arg::I(x_div as i32),
                Arg::I(tpr as i32),
            ]);
            self.go(name, (pairs * per_pair) as u32, block, &args);
        } else {
            let mut args = [Arg::I(0); 9];
            args[..8].copy_from_slice(&head);
            args[8] = Arg::I(x_div as i32);
            let threads = mv_threads(&self.gpu);
            self.go(name, (pairs * e0.rows) as u32, threads, &args);
        }
    }

    /// The experts' activation over `n` gate/up pairs, in place in `gate`: gpt-oss's clamped
    /// SwiGLU where the model has it, else the gated activation.
    fn experts_act(
        &mut self,
        clamped: Option<ClampedSwiglu>,
        gate: u64,
        up: u64,
        n: usize,
        act: Activation,
    ) {
        match clamped {
            Some(cs) => {
                let args = [
                    Arg::P(gate),
                    Arg::P(up),
                    Arg::F(cs.alpha),
                    Arg::F(cs.limit),
                    Arg::L(n as i64),
                ];
                self.elementwise("swiglu_oai_f32", &args, n);
            }
            None => self.gated_act(gate, up, n, act),
        }
    }

    /// `gate = act(gate) ⊙ up` over `n` elements (`swiglu_f32`, `geglu_f32`).
    fn gated_act(&mut self, gate: u64, up: u64, n: usize, act: Activation) {
        let name = match act {
            Activation::Silu => "swiglu_f32",
            Activation::GeluTanh => "geglu_f32",
        };
        self.elementwise(name, &[Arg::P(gate), Arg::P(up), Arg::L(n as i64)], n);
    }

    /// Bytes from the host to the activation arena at `off`.
    fn put(&mut self, off: usize, bytes: &[u8]) {
        let r = self.act.write(&self.stream, off, bytes);
        self.fail(r);
    }
}
