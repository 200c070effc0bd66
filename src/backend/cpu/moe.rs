//! The CPU's mixture-of-experts feed-forward ([`Backend::moe_ffn`](crate::backend::Backend)):
//! route every row, group the rows by expert, and run each active expert once over all of its
//! rows with the same quantized products as a dense layer (a decode step reads only its
//! chosen experts). Every buffer is the scratch's ([`crate::kernels::moe::MoeScratch`]).

use super::{gated_act_rows, project, Cpu};
use crate::kernels::matmul::{experts_product, matmul, quantize_input, ExpertRows, GatedAct};
use crate::kernels::ops::Activation;
use crate::kernels::par_rows;
use crate::model::moe::MAX_USED;

impl Cpu<'_> {
    pub(super) fn moe_rows(&mut self, li: usize, act: Activation, rows: usize) {
        let m = self.m;
        let layer = &m.weights.layers[li];
        let moe = layer.moe.as_ref().expect("a dense layer has no experts");
        let mc = m.config.moe.as_ref().expect("a dense model has no experts");
        let (pool, f16) = (&self.rt.pool, &self.rt.f16);
        let (dim, f, ne, k) = (m.config.dim, mc.ffn_dim, mc.n_expert, mc.n_used);
        let s = &mut *self.s;
        let ms = &mut s.moe;
        let xb = &s.xb[..rows * dim];

        // Route: the router's logits, gated, the top k and their weights.
        let probs = &mut ms.probs[..rows * ne];
        matmul(pool, &moe.router, xb, rows, &mut s.xq, probs, &mut s.matmul);
        ms.route_rows(&crate::backend::moe_routing(mc), rows);
        // Each expert's rows by sequence: a batch of several sequences gives each the bits of
        // its own step (formats whose arithmetic depends on the batch run a sequence's rows of
        // an expert as a batch of their own).
        let seqs = s.matmul.segments();
        if seqs.iter().sum::<usize>() == rows {
            ms.split_by_sequence(ne, seqs);
        } else {
            ms.split_by_sequence(ne, &[]);
        }
        let p = rows * k;
        for (i, &j) in ms.row_of[..p].iter().enumerate() {
            let j = j as usize;
            ms.xg[i * dim..(i + 1) * dim].copy_from_slice(&xb[j * dim..(j + 1) * dim]);
        }
        let xg = &ms.xg[..p * dim];
        let rows_of = ExpertRows {
            active: &ms.active[..ms.n_active],
            start: &ms.start[..ne + 1],
            seg_start: &ms.seg_start[..ne + 1],
            segs: &ms.segs,
        };

        // Every active expert's gate and up products over its rows, and the activation, in
        // one dispatch.
        let act_fn = match act {
            Activation::Silu => f16.swiglu,
            Activation::GeluTanh => f16.geglu,
        };
        let (g0, u0) = (&moe.gate[0], &moe.up[0]);
        let clamped = mc.clamped_swiglu;
        // gpt-oss: each product with its bias, then the clamped SwiGLU element by element.
        let gated: GatedAct<'_> = &|g: &mut [f32], u: &[f32]| match clamped {
            Some(cs) => g.iter_mut().zip(u).for_each(|(g, &u)| *g = cs.apply(*g, u)),
            None => act_fn(g, u),
        };
        if g0.kernels.act == u0.kernels.act {
            let rb = quantize_input(pool, g0, xg, p, &mut ms.xq);
            experts_product(
                pool,
                &moe.gate,
                Some((&moe.up, gated)),
                &rows_of,
                &ms.xq,
                rb,
                &mut ms.gate[..p * f],
                &mut s.matmul,
            );
        } else {
            // Gate and up in different activation formats: each product from its own.
            for (mats, out) in [(&moe.gate, &mut ms.gate), (&moe.up, &mut ms.up)] {
                let rb = quantize_input(pool, &mats[0], xg, p, &mut ms.xq);
                let out = &mut out[..p * f];
                experts_product(pool, mats, None, &rows_of, &ms.xq, rb, out, &mut s.matmul);
            }
            match clamped {
                Some(_) => gated(&mut ms.gate[..p * f], &ms.up[..p * f]),
                None => gated_act_rows(pool, f16, &mut ms.gate[..p * f], &ms.up[..p * f], act),
            }
        }

        // The down products, each expert's rows into its gathered rows.
        let rb = quantize_input(pool, &moe.down[0], &ms.gate[..p * f], p, &mut ms.xq);
        experts_product(
            pool,
            &moe.down,
            None,
            &rows_of,
            &ms.xq,
            rb,
            &mut ms.xg[..p * dim],
            &mut s.matmul,
        );

        // The shared expert (into `proj`) and its gate.
        let shared = match (
            &layer.ffn_gate,
            &layer.ffn_up,
            &layer.ffn_down,
            &moe.shared_gate,
        ) {
            (Some(gate), Some(up), Some(down), Some(sg)) => {
                let sf = gate.out_dim;
                project(
                    pool,
                    &[gate, up],
                    xb,
                    rows,
                    &mut s.xq,
                    &mut [&mut s.gate[..rows * sf], &mut s.up[..rows * sf]],
                    &mut s.matmul,
                );
                gated_act_rows(pool, f16, &mut s.gate[..rows * sf], &s.up[..rows * sf], act);
                let proj = &mut s.proj[..rows * dim];
                matmul(pool, down, &s.gate, rows, &mut s.xq, proj, &mut s.matmul);
                let sgo = &mut ms.shared_gate[..rows];
                matmul(pool, sg, xb, rows, &mut s.xq, sgo, &mut s.matmul);
                // The reference's sigmoid here: `silu(x) / x`, its scalar SiLU.
                for g in sgo.iter_mut() {
                    *g = (*g / (1.0 + (-*g).exp())) / *g;
                }
                true
            }
            _ => false,
        };

        // Each row: its experts' outputs times their weights, added in slot order (then the
        // shared expert's output times its gate).
        let (xg, pos_of, weights) = (&ms.xg, &ms.pos_of, &ms.weights);
        let sgate = &ms.shared_gate;
        par_rows(pool, &mut s.proj[..rows * dim], dim, &|rs, out| {
            let mut at = [0usize; MAX_USED];
            for (j, o) in rs.zip(out.chunks_exact_mut(dim)) {
                for (a, &pos) in at.iter_mut().zip(&pos_of[j * k..(j + 1) * k]) {
                    *a = pos as usize * dim;
                }
                let w = &weights[j * k..(j + 1) * k];
                let g = sgate[j];
                for (i, o) in o.iter_mut().enumerate() {
                    let mut v = xg[at[0] + i] * w[0];
                    for sl in 1..k {
                        v += xg[at[sl] + i] * w[sl];
                    }
                    *o = if shared { v + *o * g } else { v };
                }
            }
        });
    }
}
