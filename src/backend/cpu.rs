//! The CPU backend: the seam's ops over the thread pool, the SIMD kernels chosen at load and
//! the [`Scratch`] buffers; each sequence's KV storage is a [`KvCache`] in RAM (or offloaded to
//! a file a layer at a time).
//!
//! A [`Cpu`] is a view made for one forward pass from what a session owns (the runtime, the
//! scratch, the model); making it allocates nothing.

pub mod exec;
mod moe;

use std::ops::Range;

use super::{row_pos, Backend, Buf, ForwardError, Mat, NormW, RowSel, SeqBatch};
use crate::cache::{KvCache, Scratch};
use crate::kernels::attention::{attention_kv, decode_is_short, AttnShape, SoloAttention};
use crate::kernels::f16ops::F16Ops;
use crate::kernels::matmul::{
    matmul, matmul_gated, matmul_many, quantize_input, Epilogue, Linear, MatmulScratch,
    GATED_MIN_ROWS,
};
use crate::kernels::ops::{self, Activation, AttnTemp, Rope};
use crate::kernels::pool::ThreadPool;
use crate::kernels::{par_elems, par_rows};
use crate::model::{Model, Norm, NormKind, Qkv};

/// Threads and per-CPU kernel choices for running a model.
pub struct Runtime {
    /// Shared by sessions that take turns on one calling thread ([`Runtime::sharing`]).
    pub pool: std::sync::Arc<ThreadPool>,
    pub f16: F16Ops,
}

impl Runtime {
    pub fn new(n_threads: usize) -> Runtime {
        Runtime {
            pool: std::sync::Arc::new(ThreadPool::new(n_threads)),
            f16: F16Ops::detect(),
        }
    }

    /// A runtime on this one's threads, for a session run only between this one's passes
    /// from the same calling thread (a draft model's): two pools would each keep their
    /// workers spinning while the other's run.
    pub fn sharing(&self) -> Runtime {
        Runtime {
            pool: std::sync::Arc::clone(&self.pool),
            f16: self.f16,
        }
    }
}

/// The CPU backend for one forward pass.
pub struct Cpu<'a> {
    m: &'a Model,
    rt: &'a Runtime,
    s: &'a mut Scratch,
    solo: Option<&'a mut SoloAttention>,
    /// Whether this step's attention runs one sequence per thread (decided in `begin`).
    use_solo: bool,
    /// The RoPE whose angles `s.rope_cs` holds for this step's positions.
    rope_of_cs: Option<&'a Rope>,
}

impl<'a> Cpu<'a> {
    /// The CPU backend for one pass of `m` over `s`, on `rt`'s threads. With `solo`, a batch
    /// of short decode rows runs all its sequences' attention in one dispatch (see
    /// [`SoloAttention`]).
    pub fn new(
        m: &'a Model,
        rt: &'a Runtime,
        s: &'a mut Scratch,
        solo: Option<&'a mut SoloAttention>,
    ) -> Cpu<'a> {
        Cpu {
            m,
            rt,
            s,
            solo,
            use_solo: false,
            rope_of_cs: None,
        }
    }
}

/// The scratch split into its named buffers and the matrix products' scratch, so that an op
/// can hold several at once.
struct Parts<'s> {
    bufs: [Option<&'s mut Vec<f32>>; 10],
    xq: &'s mut Vec<u8>,
    mm: &'s mut MatmulScratch,
}

impl<'s> Parts<'s> {
    fn of(s: &'s mut Scratch) -> Parts<'s> {
        let Scratch {
            x,
            xb,
            q,
            k,
            v,
            attn,
            proj,
            gate,
            up,
            logits,
            xq,
            matmul,
            ..
        } = s;
        // In `Buf`'s order.
        let bufs = [x, xb, q, k, v, attn, proj, gate, up, logits].map(Some);
        Parts {
            bufs,
            xq,
            mm: matmul,
        }
    }

    /// Take buffer `b` (each at most once).
    fn take(&mut self, b: Buf) -> &'s mut Vec<f32> {
        self.bufs[b as usize]
            .take()
            .expect("an op names one buffer twice")
    }
}

impl<'a> Cpu<'a> {
    fn lin(&self, w: Mat) -> &'a Linear {
        let ws = &self.m.weights;
        let separate = |l: usize| match &ws.layers[l].qkv {
            Qkv::Separate { wq, wk, wv } => (wq, wk, wv),
            Qkv::Fused(_) => panic!("layer {l} has a fused QKV projection"),
        };
        match w {
            Mat::Qkv(l) => match &ws.layers[l].qkv {
                Qkv::Fused(w) => w,
                Qkv::Separate { .. } => panic!("layer {l} has separate q, k, v projections"),
            },
            Mat::Q(l) => separate(l).0,
            Mat::K(l) => separate(l).1,
            Mat::V(l) => separate(l).2,
            Mat::O(l) => &ws.layers[l].wo,
            Mat::Gate(l) => ws.layers[l]
                .ffn_gate
                .as_ref()
                .expect("an ungated feed-forward has no gate"),
            Mat::Up(l) => ws.layers[l]
                .ffn_up
                .as_ref()
                .expect("a layer without ffn_up"),
            Mat::Down(l) => ws.layers[l]
                .ffn_down
                .as_ref()
                .expect("a layer without ffn_down"),
            Mat::Output => &ws.output,
        }
    }

    fn norm_w(&self, w: NormW) -> &'a Norm {
        let ws = &self.m.weights;
        let opt = |n: &'a Option<Norm>| n.as_ref().expect("the model has no such norm");
        match w {
            NormW::Attn(l) => opt(&ws.layers[l].attn_norm),
            NormW::QHead(l) => opt(&ws.layers[l].q_norm),
            NormW::KHead(l) => opt(&ws.layers[l].k_norm),
            NormW::AttnPost(l) => opt(&ws.layers[l].attn_post_norm),
            NormW::Ffn(l) => opt(&ws.layers[l].ffn_norm),
            NormW::FfnPost(l) => opt(&ws.layers[l].ffn_post_norm),
            NormW::Output => &ws.output_norm,
            NormW::Embd => opt(&ws.embd_norm),
        }
    }

    /// Row width of a buffer.
    fn width(&self, b: Buf) -> usize {
        let c = &self.m.config;
        match b {
            Buf::X | Buf::Xb | Buf::Proj => c.dim,
            Buf::Q => c.q_dim(),
            Buf::K => c.kv_dim_k(),
            Buf::V => c.kv_dim_v(),
            Buf::Attn => c.attn_out_dim(),
            Buf::Gate | Buf::Up => match &c.moe {
                Some(m) => m.shared_ffn_dim.unwrap_or(0),
                None => c.ffn_dim,
            },
            Buf::Logits => c.vocab_size,
        }
    }
}

impl<'a> Backend for Cpu<'a> {
    type Kv = KvCache;

    fn max_rows(&self) -> usize {
        self.s.spec.max_tokens
    }

    fn logit_rows(&self) -> usize {
        self.s.spec.logit_rows.max(1)
    }

    fn begin(&mut self, _tokens: &[u32], seqs: &[SeqBatch<'_>]) {
        // A sequence whose rows are alone is that many sequences of one row (a decode step's
        // bits).
        self.s.matmul.set_segments(seqs.iter().flat_map(|sq| {
            if sq.alone {
                std::iter::repeat_n(1, sq.n_tokens)
            } else {
                std::iter::repeat_n(sq.n_tokens, 1)
            }
        }));
        // One thread per sequence when every row is a decode row and either the contexts are
        // short or there are enough sequences to keep every thread busy (same bits either way).
        let cap = seqs[0].kv.capacity();
        let many = seqs.len() >= 2 * self.rt.pool.n_threads();
        self.use_solo = self.solo.is_some()
            && seqs.len() > 1
            && seqs.iter().all(|sq| {
                sq.n_tokens == 1
                    && sq.kv.capacity() == cap
                    && sq.kv.layout().window == seqs[0].kv.layout().window
                    && (many || decode_is_short(cap, sq.kv.len()))
            });
        self.rope_of_cs = None;
    }

    fn embed(&mut self, tokens: &[u32], seqs: &[SeqBatch<'_>], scale: f32) {
        let (w, dim) = (&self.m.weights, self.m.config.dim);
        let s = &mut *self.s;
        let x = &mut s.x[..tokens.len() * dim];
        par_rows(&self.rt.pool, x, dim, &|rs, x| {
            for (&t, x) in tokens[rs].iter().zip(x.chunks_exact_mut(dim)) {
                w.token_embd.row_f32(t as usize, x);
                if scale != 1.0 {
                    ops::scale_inplace(x, scale);
                }
                if let Some(te) = &w.type_embd {
                    ops::add_inplace(x, te);
                }
            }
        });
        if let Some(pe) = &w.pos_embd {
            let mut row = 0;
            for sq in seqs {
                let pos0 = sq.kv.len();
                for pos in pos0..pos0 + sq.n_tokens {
                    pe.row_f32(pos, &mut s.xb[..dim]);
                    ops::add_inplace(&mut s.x[row * dim..(row + 1) * dim], &s.xb[..dim]);
                    row += 1;
                }
            }
        }
    }

    fn norm(&mut self, w: NormW, src: Buf, dst: Buf, rows: Range<usize>) {
        let nw = self.norm_w(w);
        let (width, group) = (self.width(dst), nw.weight.len());
        let span = rows.start * width..rows.end * width;
        let pool = &self.rt.pool;
        let mut p = Parts::of(self.s);
        let out = &mut p.take(dst)[span.clone()];
        if src == dst {
            norm_rows(pool, nw, &[], out, group);
        } else {
            norm_rows(pool, nw, &p.take(src)[span], out, group);
        }
    }

    fn norm_gather(&mut self, w: NormW, src: Buf, sel: RowSel<'_>, dst: Buf) {
        let nw = self.norm_w(w);
        let width = self.width(src);
        let mut p = Parts::of(self.s);
        let (x, out) = (p.take(src), p.take(dst));
        for o in 0..sel.len() {
            let j = sel.get(o);
            norm_row(
                nw,
                &x[j * width..(j + 1) * width],
                &mut out[o * width..(o + 1) * width],
            );
        }
    }

    fn matmul(&mut self, ws: &[Mat], src: Buf, dsts: &[Buf], rows: usize) {
        assert_eq!(ws.len(), dsts.len());
        let pool = &self.rt.pool;
        let l = |i: usize| self.lin(ws[i]);
        match ws.len() {
            1 => {
                let lin = l(0);
                let mut p = Parts::of(self.s);
                let x = p.take(src);
                let out = &mut p.take(dsts[0])[..rows * lin.out_dim];
                matmul(pool, lin, x, rows, p.xq, out, p.mm);
            }
            2 => {
                let lins = [l(0), l(1)];
                let mut p = Parts::of(self.s);
                let x = &p.take(src)[..rows * lins[0].in_dim];
                let (a, b) = (p.take(dsts[0]), p.take(dsts[1]));
                let outs = &mut [
                    &mut a[..rows * lins[0].out_dim],
                    &mut b[..rows * lins[1].out_dim],
                ];
                project(pool, &lins, x, rows, p.xq, outs, p.mm);
            }
            3 => {
                let lins = [l(0), l(1), l(2)];
                let mut p = Parts::of(self.s);
                let x = &p.take(src)[..rows * lins[0].in_dim];
                let (a, b, c) = (p.take(dsts[0]), p.take(dsts[1]), p.take(dsts[2]));
                let outs = &mut [
                    &mut a[..rows * lins[0].out_dim],
                    &mut b[..rows * lins[1].out_dim],
                    &mut c[..rows * lins[2].out_dim],
                ];
                project(pool, &lins, x, rows, p.xq, outs, p.mm);
            }
            n => panic!("{n} products of one input (the forward pass has at most three)"),
        }
    }

    fn output_head(&mut self, rows: usize, scale: Option<f32>, softcap: Option<f32>) {
        let lin = self.lin(Mat::Output);
        let pool = &self.rt.pool;
        let mut p = Parts::of(self.s);
        let x = p.take(Buf::Xb);
        let out = &mut p.take(Buf::Logits)[..rows * lin.out_dim];
        let rb = quantize_input(pool, lin, x, rows, p.xq);
        // The scale and the soft cap on each tile of logits as it is computed (the arithmetic
        // of `scale` and `softcap`, element by element): no pass of their own over the
        // vocabulary, and the soft cap's `tanh` runs while the head's weights stream in.
        let finish = |t: &mut [f32]| {
            if let Some(s) = scale {
                ops::scale_inplace(t, s);
            }
            if let Some(c) = softcap {
                ops::softcap_inplace(t, c);
            }
        };
        let epilogue: Option<Epilogue<'_>> =
            (scale.is_some() || softcap.is_some()).then_some(&finish);
        matmul_many(pool, &[lin], p.xq, rb, rows, &mut [out], p.mm, epilogue);
    }

    fn gated_ffn(&mut self, gate: Mat, up: Mat, act: Activation, rows: usize) {
        let (gate, up) = (self.lin(gate), self.lin(up));
        let (pool, f16) = (&self.rt.pool, &self.rt.f16);
        let (dim, f) = (self.m.config.dim, self.m.config.ffn_dim);
        let s = &mut *self.s;
        let x = &s.xb[..rows * dim];
        if gate.kernels.act == up.kernels.act && rows >= GATED_MIN_ROWS {
            // Both products and the activation in one pass over tiles of rows (the `up`
            // buffer then holds only decode rows: `weights::gated_ffn_fuses`).
            let rb = quantize_input(pool, gate, x, rows, &mut s.xq);
            let act_fn = match act {
                Activation::Silu => f16.swiglu,
                Activation::GeluTanh => f16.geglu,
            };
            let out = &mut s.gate[..rows * f];
            matmul_gated(pool, gate, up, &s.xq, rb, rows, out, act_fn, &mut s.matmul);
        } else {
            project(
                pool,
                &[gate, up],
                x,
                rows,
                &mut s.xq,
                &mut [&mut s.gate[..rows * f], &mut s.up[..rows * f]],
                &mut s.matmul,
            );
            gated_act_rows(pool, f16, &mut s.gate[..rows * f], &s.up[..rows * f], act);
        }
    }

    fn moe_ffn(&mut self, layer: usize, act: Activation, rows: usize) {
        self.moe_rows(layer, act, rows);
    }

    fn activate(&mut self, buf: Buf, act: Activation, rows: usize) {
        let width = self.width(buf);
        let (pool, f16) = (&self.rt.pool, &self.rt.f16);
        let x = &mut Parts::of(self.s).take(buf)[..rows * width];
        par_rows(pool, x, 256, &|_, v: &mut [f32]| match act {
            Activation::Silu => v.iter_mut().for_each(|a| *a = ops::silu(*a)),
            Activation::GeluTanh => (f16.gelu)(v),
        });
    }

    fn split_qkv(&mut self, rows: usize) {
        let c = &self.m.config;
        let (q_dim, kv_k, kv_v) = (c.q_dim(), c.kv_dim_k(), c.kv_dim_v());
        let qkv = q_dim + kv_k + kv_v;
        let s = &mut *self.s;
        // In place: q stays in front (compacted), k and v move out.
        for j in 0..rows {
            let row = j * qkv;
            s.k[j * kv_k..(j + 1) * kv_k].copy_from_slice(&s.q[row + q_dim..row + q_dim + kv_k]);
            s.v[j * kv_v..(j + 1) * kv_v].copy_from_slice(&s.q[row + q_dim + kv_k..row + qkv]);
            s.q.copy_within(row..row + q_dim, j * q_dim);
        }
    }

    fn rope(&mut self, layer: usize, seqs: &[SeqBatch<'_>], rows: usize) {
        let c = &self.m.config;
        let rope = self.m.weights.layers[layer]
            .rope
            .as_ref()
            .expect("a layer without RoPE");
        let (q_dim, kv_k, hd) = (c.q_dim(), c.kv_dim_k(), c.head_dim_k);
        let rd = c.rope_dims.max(2);
        let pool = &self.rt.pool;
        let s = &mut *self.s;
        // Angles and rotations row by row over the pool (a prompt's rows are independent).
        if self.rope_of_cs != Some(rope) {
            par_rows(pool, &mut s.rope_cs[..rows * rd], rd, &|rs, cs| {
                for (j, cs) in rs.zip(cs.chunks_exact_mut(rd)) {
                    rope.cos_sin(row_pos(seqs, j), cs);
                }
            });
            self.rope_of_cs = Some(rope);
        }
        let cs_all = &s.rope_cs;
        for (x, width) in [
            (&mut s.q[..rows * q_dim], q_dim),
            (&mut s.k[..rows * kv_k], kv_k),
        ] {
            par_rows(pool, x, width, &|rs, x| {
                for (j, row) in rs.zip(x.chunks_exact_mut(width)) {
                    rope.apply(row, hd, &cs_all[j * rd..(j + 1) * rd]);
                }
            });
        }
    }

    fn scale(&mut self, buf: Buf, s: f32, rows: usize) {
        let width = self.width(buf);
        let x = &mut Parts::of(self.s).take(buf)[..rows * width];
        par_rows(&self.rt.pool, x, width, &|_, v| ops::scale_inplace(v, s));
    }

    fn attn_temperature(&mut self, t: AttnTemp, seqs: &[SeqBatch<'_>], rows: usize) {
        let width = self.width(Buf::Q);
        let q = &mut Parts::of(self.s).take(Buf::Q)[..rows * width];
        for (j, row) in q.chunks_exact_mut(width).enumerate() {
            ops::scale_inplace(row, t.factor(row_pos(seqs, j)));
        }
    }

    fn copy(&mut self, dst: Buf, src: Buf, rows: usize) {
        let width = self.width(dst);
        let mut p = Parts::of(self.s);
        let (d, x) = (p.take(dst), p.take(src));
        d[..rows * width].copy_from_slice(&x[..rows * width]);
    }

    fn softcap(&mut self, buf: Buf, cap: f32, rows: usize) {
        let width = self.width(buf);
        let x = &mut Parts::of(self.s).take(buf)[..rows * width];
        // Element-wise: a decode step's one row of logits is split across the threads too.
        par_elems(&self.rt.pool, x, &|v| ops::softcap_inplace(v, cap));
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize) {
        let width = self.width(dst);
        let mut p = Parts::of(self.s);
        let (d, x) = (p.take(dst), p.take(src));
        let x = &x[..rows * width];
        par_rows(&self.rt.pool, &mut d[..rows * width], width, &|rs, d| {
            ops::add_inplace(d, &x[rs.start * width..rs.end * width])
        });
    }

    fn attend(
        &mut self,
        li: usize,
        seqs: &mut [SeqBatch<'_>],
        rows: usize,
    ) -> Result<(), ForwardError> {
        let c = &self.m.config;
        let (q_dim, kv_k, kv_v, aod) = (c.q_dim(), c.kv_dim_k(), c.kv_dim_v(), c.attn_out_dim());
        let (pool, f16) = (&self.rt.pool, &self.rt.f16);
        let s = &mut *self.s;
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            scale: c.attn_scale,
            softcap: c.attn_softcap,
            window: self.m.weights.layers[li].window,
            causal: c.causal,
            kv_stride: seqs[0].kv.capacity(),
            ring: seqs[0].kv.ring_rows(li),
            sinks: self.m.weights.layers[li].attn_sinks.as_deref(),
            alibi: self.m.weights.alibi_slopes.as_deref(),
        };
        // Each sequence's keys and values go to its own cache, at its own positions.
        let mut j0 = 0;
        for sq in seqs.iter_mut() {
            let pos0 = sq.kv.len();
            sq.kv.begin_layer(li)?;
            let r = j0..j0 + sq.n_tokens;
            let (k, v) = (
                &s.k[r.start * kv_k..r.end * kv_k],
                &s.v[r.start * kv_v..r.end * kv_v],
            );
            sq.kv.write_batch(pool, li, pos0, r.len(), k, v);
            j0 = r.end;
        }
        match self.solo.as_deref_mut().filter(|_| self.use_solo) {
            Some(solo) => {
                // One decode row per sequence: attend in one dispatch.
                let all = &*seqs;
                let seq = |i: usize| (all[i].kv.layer(li), all[i].kv.len());
                let q = &s.q[..rows * q_dim];
                solo.run(
                    pool,
                    f16,
                    &shape,
                    q,
                    all.len(),
                    &seq,
                    &mut s.attn[..rows * aod],
                );
            }
            None => {
                let mut j0 = 0;
                for sq in seqs.iter() {
                    let kv = &*sq.kv;
                    let shape = AttnShape {
                        kv_stride: kv.capacity(),
                        ring: kv.ring_rows(li),
                        ..shape
                    };
                    // A sequence's rows together, or each as the decode step of its position
                    // (the keys of the later rows are stored, but a row does not see them).
                    // (Bidirectional attention sees the whole pass: never split.)
                    let parts = if c.causal && sq.alone {
                        sq.n_tokens.max(1)
                    } else {
                        1
                    };
                    let per = sq.n_tokens / parts;
                    for p in 0..parts {
                        let r = j0 + p * per..j0 + (p + 1) * per;
                        attention_kv(
                            pool,
                            f16,
                            &shape,
                            &s.q[r.start * q_dim..r.end * q_dim],
                            r.len(),
                            kv.len() + p * per,
                            kv.layer(li),
                            &mut s.attn[r.start * aod..r.end * aod],
                            &mut s.attn_scratch,
                        );
                    }
                    j0 += sq.n_tokens;
                }
            }
        }
        for sq in seqs.iter_mut() {
            let pos0 = sq.kv.len();
            sq.kv.end_layer(li, pos0..pos0 + sq.n_tokens);
        }
        Ok(())
    }

    fn read(&mut self, buf: Buf, rows: Range<usize>, sink: &mut dyn FnMut(usize, &[f32])) {
        let width = self.width(buf);
        let x = Parts::of(self.s).take(buf);
        for j in rows {
            sink(j, &x[j * width..(j + 1) * width]);
        }
    }

    fn read_each(&mut self, buf: Buf, rows: Range<usize>, f: &(dyn Fn(usize, &[f32]) + Sync)) {
        let width = self.width(buf);
        let x = &*Parts::of(self.s).take(buf);
        self.rt.pool.run_items(rows.len(), &|_, i| {
            let j = rows.start + i;
            f(j, &x[j * width..(j + 1) * width]);
        });
    }
}

/// Several projections of the same input: the input is quantized once per activation format
/// and the matrices sharing it run in one dispatch.
fn project(
    pool: &ThreadPool,
    lins: &[&Linear],
    x: &[f32],
    n: usize,
    xq: &mut [u8],
    outs: &mut [&mut [f32]],
    mm: &mut MatmulScratch,
) {
    let same = lins.iter().all(|l| l.kernels.act == lins[0].kernels.act);
    if same {
        let rb = quantize_input(pool, lins[0], x, n, xq);
        matmul_many(pool, lins, xq, rb, n, outs, mm, None);
    } else {
        for (l, o) in lins.iter().zip(outs.iter_mut()) {
            matmul(pool, l, x, n, xq, o, mm);
        }
    }
}

/// Normalize one row.
fn norm_row(nw: &Norm, x: &[f32], out: &mut [f32]) {
    match nw.kind {
        NormKind::Rms => ops::rms_norm(x, &nw.weight, nw.eps, out),
        NormKind::Layer => ops::layer_norm(
            x,
            &nw.weight,
            nw.bias.as_deref().unwrap_or(&[]),
            nw.eps,
            out,
        ),
    }
}

/// Normalize every `width`-wide row of `x` into `out`, or `out` in place when `x` is empty.
fn norm_rows(pool: &ThreadPool, nw: &Norm, x: &[f32], out: &mut [f32], width: usize) {
    let in_place = x.is_empty();
    let body = |rows: Range<usize>, o: &mut [f32]| {
        for (k, r) in rows.enumerate() {
            let dst = &mut o[k * width..(k + 1) * width];
            if in_place {
                match nw.kind {
                    NormKind::Rms => ops::rms_norm_inplace(dst, &nw.weight, nw.eps),
                    NormKind::Layer => ops::layer_norm_inplace(
                        dst,
                        &nw.weight,
                        nw.bias.as_deref().unwrap_or(&[]),
                        nw.eps,
                    ),
                }
            } else {
                norm_row(nw, &x[r * width..(r + 1) * width], dst);
            }
        }
    };
    par_rows(pool, out, width, &body);
}

fn gated_act_rows(pool: &ThreadPool, f16: &F16Ops, gate: &mut [f32], up: &[f32], act: Activation) {
    let width = 256;
    par_rows(pool, gate, width, &|range: Range<usize>, g: &mut [f32]| {
        let u = &up[range.start * width..range.start * width + g.len()];
        match act {
            // The SIMD SwiGLU: the same bits as the scalar activation.
            Activation::Silu => (f16.swiglu)(g, u),
            Activation::GeluTanh => (f16.geglu)(g, u),
        }
    });
}
