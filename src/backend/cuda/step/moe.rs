//! A mixture-of-experts feed-forward on the device ([`crate::backend::Backend::moe_ffn`]).
//!
//! The router's logits (and Qwen2-MoE's shared-expert gate) are products on the device; the
//! host reads them and routes every row with the CPU's own functions
//! ([`crate::kernels::moe::route`], the same grouping by expert), so the choice of experts and
//! their weights are the CPU's given the same logits. The rows are gathered by expert on the
//! device (`moe_gather_f32`), each chosen expert multiplies only its own rows with the
//! backend's products of its format (a matvec of decode-sized runs, the bf16 or f32 GEMM of
//! prompt-sized ones: [`CudaSession::product`], so every weight format the backend
//! multiplies serves as an expert's), then the activation over every pair at once, the down
//! products, and the weighted sum per row in slot order (`moe_combine_f32`). A step of a MoE
//! model waits for the router once per layer: it is not recorded as a graph.

use super::products::Prepared;
use super::{Arg, Buf, CudaSession};
use crate::kernels::moe::{route, GateFn, MoeScratch, MoeShape, Routing};
use crate::kernels::ops::Activation;
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
        let routing = Routing {
            n_expert: ne,
            n_used: k,
            gate: match mc.gating {
                Gating::Softmax => GateFn::Softmax,
                Gating::Sigmoid => GateFn::Sigmoid,
                Gating::SoftmaxWeight => GateFn::SoftmaxWeight,
            },
            norm: mc.norm_weights,
            scale: mc.weights_scale,
        };
        let ms = &mut host.scratch;
        for j in 0..rows {
            route(
                &routing,
                &mut ms.probs[j * ne..(j + 1) * ne],
                &mut ms.experts[j * k..(j + 1) * k],
                &mut ms.weights[j * k..(j + 1) * k],
            );
        }
        ms.group(ne, k, rows);
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
        match mc.clamped_swiglu {
            Some(cs) => {
                let args = [
                    Arg::P(gate),
                    Arg::P(up),
                    Arg::F(cs.alpha),
                    Arg::F(cs.limit),
                    Arg::L((p * f) as i64),
                ];
                self.elementwise("swiglu_oai_f32", &args, p * f);
            }
            None => self.gated_act(gate, up, p * f, act),
        }
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
