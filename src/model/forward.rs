//! The forward pass shared by every architecture: embed → blocks → final norm → logits.
//!
//! One call processes `n` tokens (a prefill chunk, or one token when decoding) at positions
//! `kv.len()..kv.len()+n`, writes their keys and values into the cache, and advances it.
//! Every intermediate lives in [`Scratch`]; nothing here allocates.

use std::ops::Range;

use crate::cache::offload::OffloadFault;
use crate::cache::{KvCache, KvOverflow, KvWindowError, Scratch};
use crate::kernels::attention::{attention_kv, decode_is_short, AttnShape, SoloAttention};
use crate::kernels::f16ops::F16Ops;
use crate::kernels::matmul::{
    matmul, matmul_gated, matmul_many, quantize_input, Linear, GATED_MIN_ROWS,
};
use crate::kernels::ops::{self, Activation};
use crate::kernels::pool::ThreadPool;
use crate::model::{Model, Norm, NormKind, Qkv};

/// Threads and per-CPU kernel choices for running a model.
pub struct Runtime {
    pub pool: ThreadPool,
    pub f16: F16Ops,
}

impl Runtime {
    pub fn new(n_threads: usize) -> Runtime {
        Runtime {
            pool: ThreadPool::new(n_threads),
            f16: F16Ops::detect(),
        }
    }
}

/// Which logits a forward pass computes.
pub enum Logits<'a> {
    /// None (filling the cache only).
    None,
    /// The last token's, left in `scratch.logits[..vocab]`.
    Last,
    /// Rows `range` of the batch, each handed to the sink as `(row, logits)`.
    Rows(Range<usize>, &'a mut dyn FnMut(usize, &[f32])),
    /// The listed rows of the batch (increasing), each handed to the sink as
    /// `(index in the list, logits)`.
    Picked(&'a [usize], &'a mut dyn FnMut(usize, &[f32])),
    /// Embeddings: the final-normed hidden state (what the output matrix multiplies, the
    /// reference's `t_embd`, which its pooling reads) of every row in the `hidden` ranges of
    /// the batch, handed to `hidden_sink` as `(row, state)`; and the logits of the `picked`
    /// rows, as [`Logits::Picked`] hands them.
    Hidden {
        hidden: &'a [Range<usize>],
        hidden_sink: &'a mut dyn FnMut(usize, &[f32]),
        picked: &'a [usize],
        sink: &'a mut dyn FnMut(usize, &[f32]),
    },
}

/// Why a forward pass was refused. Nothing is modified when it is (but see
/// [`ForwardError::Offload`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error(transparent)]
    Overflow(#[from] KvOverflow),
    #[error(transparent)]
    Window(#[from] KvWindowError),
    /// An offloaded cache's file I/O failed (unlike the other errors, the pass had begun: the
    /// cache is lost).
    #[error(transparent)]
    Offload(#[from] OffloadFault),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("batch of {n} tokens exceeds the scratch size of {max}")]
    BatchTooLarge { n: usize, max: usize },
    #[error("position {pos} is past the {max} learned positions of this model")]
    PositionOutOfRange { pos: usize, max: usize },
    #[error("empty batch")]
    Empty,
    #[error("the batch has {tokens} tokens but its sequences claim {claimed}")]
    BatchMismatch { tokens: usize, claimed: usize },
}

/// One sequence's share of a batch: its KV cache and how many of the batch's tokens are its
/// (consecutive, after the previous sequences' tokens). Its tokens go to positions
/// `kv.len()..kv.len() + n_tokens`.
pub struct SeqBatch<'a> {
    pub kv: &'a mut KvCache,
    pub n_tokens: usize,
}

/// Call `f(row, position)` for every row of the batch, in order.
fn for_each_row(seqs: &[SeqBatch<'_>], mut f: impl FnMut(usize, usize)) {
    let mut row = 0;
    for sq in seqs {
        let pos0 = sq.kv.len();
        for j in 0..sq.n_tokens {
            f(row, pos0 + j);
            row += 1;
        }
    }
}

/// The position of batch row `j` (rows are the sequences' tokens, in order).
fn row_pos(seqs: &[SeqBatch<'_>], j: usize) -> usize {
    let mut r = j;
    for sq in seqs {
        if r < sq.n_tokens {
            return sq.kv.len() + r;
        }
        r -= sq.n_tokens;
    }
    panic!("row {j} past the batch")
}

/// Call `f(first_row, sequence)` for every sequence of the batch, in order.
fn for_each_seq(seqs: &mut [SeqBatch<'_>], mut f: impl FnMut(usize, &mut SeqBatch<'_>)) {
    let mut row = 0;
    for sq in seqs {
        f(row, sq);
        row += sq.n_tokens;
    }
}

/// Run `tokens` through the model, appending them to `kv`.
pub fn forward(
    m: &Model,
    rt: &Runtime,
    kv: &mut KvCache,
    s: &mut Scratch,
    tokens: &[u32],
    logits: Logits<'_>,
) -> Result<(), ForwardError> {
    let n_tokens = tokens.len();
    forward_batch(
        m,
        rt,
        &mut [SeqBatch { kv, n_tokens }],
        s,
        tokens,
        logits,
        None,
    )
}

/// Run a batch holding the tokens of several sequences (continuous batching: one decode token
/// per sequence, or prefill chunks) through the model. Every matrix product reads its weights
/// once for all rows; attention runs per sequence over its own cache. Row `r` of the logits
/// belongs to row `r` of `tokens`. With `solo`, a batch of short decode rows runs all its
/// sequences' attention in one dispatch (see [`SoloAttention`]).
pub fn forward_batch(
    m: &Model,
    rt: &Runtime,
    seqs: &mut [SeqBatch<'_>],
    s: &mut Scratch,
    tokens: &[u32],
    logits: Logits<'_>,
    solo: Option<&mut SoloAttention>,
) -> Result<(), ForwardError> {
    let c = &m.config;
    let w = &m.weights;
    let n = tokens.len();
    if n == 0 || seqs.iter().any(|sq| sq.n_tokens == 0) {
        return Err(ForwardError::Empty);
    }
    let claimed: usize = seqs.iter().map(|sq| sq.n_tokens).sum();
    if claimed != n {
        return Err(ForwardError::BatchMismatch { tokens: n, claimed });
    }
    if n > s.spec.max_tokens {
        return Err(ForwardError::BatchTooLarge {
            n,
            max: s.spec.max_tokens,
        });
    }
    for sq in seqs.iter() {
        sq.kv.check_fits(sq.n_tokens)?;
        sq.kv.check_window(sq.n_tokens)?;
        let end = sq.kv.len() + sq.n_tokens;
        if w.pos_embd.is_some() && end > c.ctx_train {
            return Err(ForwardError::PositionOutOfRange {
                pos: end - 1,
                max: c.ctx_train,
            });
        }
    }
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(ForwardError::BadToken {
            id,
            vocab: c.vocab_size,
        });
    }
    let pool = &rt.pool;
    let dim = c.dim;
    s.matmul.set_segments(seqs.iter().map(|sq| sq.n_tokens));
    let cap = seqs[0].kv.capacity();
    // One thread per sequence when every row is a decode row and either the contexts are
    // short or there are enough sequences to keep every thread busy (same bits either way).
    let many = seqs.len() >= 2 * pool.n_threads();
    let mut solo = solo.filter(|_| {
        seqs.len() > 1
            && seqs.iter().all(|sq| {
                sq.n_tokens == 1
                    && sq.kv.capacity() == cap
                    && sq.kv.layout().window == seqs[0].kv.layout().window
                    && (many || decode_is_short(cap, sq.kv.len()))
            })
    });

    // Embeddings.
    for_each_row(seqs, |j, pos| {
        let row = &mut s.x[j * dim..(j + 1) * dim];
        w.token_embd.row_f32(tokens[j] as usize, row);
        if m.embed_scale != 1.0 {
            ops::scale_inplace(row, m.embed_scale);
        }
        if let Some(pe) = &w.pos_embd {
            pe.row_f32(pos, &mut s.xb[..dim]);
            ops::add_inplace(row, &s.xb[..dim]);
        }
    });

    let (q_dim, kv_k, kv_v) = (c.q_dim(), c.kv_dim_k(), c.kv_dim_v());
    let rd = c.rope_dims.max(2);
    let mut rope_of_cs: Option<&crate::kernels::ops::Rope> = None;

    for (li, layer) in w.layers.iter().enumerate() {
        // --- attention ---
        norm_rows(
            pool,
            &layer.attn_norm,
            &s.x[..n * dim],
            &mut s.xb[..n * dim],
            dim,
        );
        match &layer.qkv {
            Qkv::Fused(wqkv) => {
                let qkv = q_dim + kv_k + kv_v;
                matmul(
                    pool,
                    wqkv,
                    &s.xb,
                    n,
                    &mut s.xq,
                    &mut s.q[..n * qkv],
                    &mut s.matmul,
                );
                // Split fused rows in place: q stays in front (compacted), k and v move out.
                for j in 0..n {
                    let row = j * qkv;
                    s.k[j * kv_k..(j + 1) * kv_k]
                        .copy_from_slice(&s.q[row + q_dim..row + q_dim + kv_k]);
                    s.v[j * kv_v..(j + 1) * kv_v]
                        .copy_from_slice(&s.q[row + q_dim + kv_k..row + qkv]);
                    s.q.copy_within(row..row + q_dim, j * q_dim);
                }
            }
            Qkv::Separate { wq, wk, wv } => {
                project(
                    pool,
                    &[wq, wk, wv],
                    &s.xb[..n * dim],
                    n,
                    &mut s.xq,
                    &mut [
                        &mut s.q[..n * q_dim],
                        &mut s.k[..n * kv_k],
                        &mut s.v[..n * kv_v],
                    ],
                    &mut s.matmul,
                );
            }
        }
        if let Some(qn) = &layer.q_norm {
            norm_rows(pool, qn, &[], &mut s.q[..n * q_dim], c.head_dim_k);
        }
        if let Some(kn) = &layer.k_norm {
            norm_rows(pool, kn, &[], &mut s.k[..n * kv_k], c.head_dim_k);
        }
        if let Some(rope) = &layer.rope {
            // Angles and rotations row by row over the pool (a prompt's rows are independent).
            if rope_of_cs != Some(rope) {
                let seqs = &*seqs;
                crate::kernels::par_rows(pool, &mut s.rope_cs[..n * rd], rd, &|rows, cs| {
                    for (j, cs) in rows.zip(cs.chunks_exact_mut(rd)) {
                        rope.cos_sin(row_pos(seqs, j), cs);
                    }
                });
                rope_of_cs = Some(rope);
            }
            let (cs_all, hd) = (&s.rope_cs, c.head_dim_k);
            for (x, width) in [(&mut s.q[..n * q_dim], q_dim), (&mut s.k[..n * kv_k], kv_k)] {
                crate::kernels::par_rows(pool, x, width, &|rows, x| {
                    for (j, row) in rows.zip(x.chunks_exact_mut(width)) {
                        rope.apply(row, hd, &cs_all[j * rd..(j + 1) * rd]);
                    }
                });
            }
        }
        if let Some(qs) = c.q_scale {
            ops::scale_inplace(&mut s.q[..n * q_dim], qs);
        }
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            scale: c.attn_scale,
            window: layer.window,
            kv_stride: cap,
            ring: seqs[0].kv.ring_rows(li),
        };
        let aod = c.attn_out_dim();
        // Each sequence's keys and values go to its own cache, at its own positions.
        let mut j0 = 0;
        for sq in seqs.iter_mut() {
            let pos0 = sq.kv.len();
            sq.kv.begin_layer(li)?;
            for j in j0..j0 + sq.n_tokens {
                let (k, v) = (
                    &s.k[j * kv_k..(j + 1) * kv_k],
                    &s.v[j * kv_v..(j + 1) * kv_v],
                );
                sq.kv.write(li, pos0 + j - j0, k, v);
            }
            j0 += sq.n_tokens;
        }
        if let Some(solo) = solo.as_deref_mut() {
            // One decode row per sequence: attend in one dispatch.
            let all = &*seqs;
            let seq = |i: usize| (all[i].kv.layer(li), all[i].kv.len());
            let q = &s.q[..n * q_dim];
            solo.run(
                pool,
                &rt.f16,
                &shape,
                q,
                all.len(),
                &seq,
                &mut s.attn[..n * aod],
            );
        } else {
            for_each_seq(seqs, |j0, sq| {
                let rows = j0..j0 + sq.n_tokens;
                let kv = &*sq.kv;
                attention_kv(
                    pool,
                    &rt.f16,
                    &AttnShape {
                        kv_stride: kv.capacity(),
                        ring: kv.ring_rows(li),
                        ..shape
                    },
                    &s.q[rows.start * q_dim..rows.end * q_dim],
                    rows.len(),
                    kv.len(),
                    kv.layer(li),
                    &mut s.attn[rows.start * aod..rows.end * aod],
                    &mut s.attn_scratch,
                );
            });
        }
        for_each_seq(seqs, |_, sq| {
            let pos0 = sq.kv.len();
            sq.kv.end_layer(li, pos0..pos0 + sq.n_tokens);
        });
        matmul(
            pool,
            &layer.wo,
            &s.attn,
            n,
            &mut s.xq,
            &mut s.proj[..n * dim],
            &mut s.matmul,
        );
        if let Some(pn) = &layer.attn_post_norm {
            norm_rows(pool, pn, &[], &mut s.proj[..n * dim], dim);
        }
        ops::add_inplace(&mut s.x[..n * dim], &s.proj[..n * dim]);

        // --- feed-forward ---
        norm_rows(
            pool,
            &layer.ffn_norm,
            &s.x[..n * dim],
            &mut s.xb[..n * dim],
            dim,
        );
        let f = c.ffn_dim;
        let act = m.traits.act;
        if let Some(gate) = &layer.ffn_gate {
            let up = &layer.ffn_up;
            if gate.kernels.act == up.kernels.act && n >= GATED_MIN_ROWS {
                // Both products and the activation in one pass over tiles of rows (the `up`
                // buffer then holds only decode rows: `weights::gated_ffn_fuses`).
                let rb = quantize_input(pool, gate, &s.xb[..n * dim], n, &mut s.xq);
                let act_fn = match act {
                    Activation::Silu => rt.f16.swiglu,
                    Activation::GeluTanh => rt.f16.geglu,
                };
                let out = &mut s.gate[..n * f];
                matmul_gated(pool, gate, up, &s.xq, rb, n, out, act_fn, &mut s.matmul);
            } else {
                project(
                    pool,
                    &[gate, up],
                    &s.xb[..n * dim],
                    n,
                    &mut s.xq,
                    &mut [&mut s.gate[..n * f], &mut s.up[..n * f]],
                    &mut s.matmul,
                );
                gated_act_rows(pool, &rt.f16, &mut s.gate[..n * f], &s.up[..n * f], act);
            }
            matmul(
                pool,
                &layer.ffn_down,
                &s.gate,
                n,
                &mut s.xq,
                &mut s.proj[..n * dim],
                &mut s.matmul,
            );
        } else {
            matmul(
                pool,
                &layer.ffn_up,
                &s.xb,
                n,
                &mut s.xq,
                &mut s.up[..n * f],
                &mut s.matmul,
            );
            act_rows(pool, &rt.f16, &mut s.up[..n * f], act);
            matmul(
                pool,
                &layer.ffn_down,
                &s.up,
                n,
                &mut s.xq,
                &mut s.proj[..n * dim],
                &mut s.matmul,
            );
        }
        if let Some(pn) = &layer.ffn_post_norm {
            norm_rows(pool, pn, &[], &mut s.proj[..n * dim], dim);
        }
        ops::add_inplace(&mut s.x[..n * dim], &s.proj[..n * dim]);
    }
    for sq in seqs.iter_mut() {
        sq.kv.advance(sq.n_tokens)?;
    }

    // --- output head ---
    match logits {
        Logits::None => {}
        Logits::Last => {
            let last = &s.x[(n - 1) * dim..n * dim];
            norm_row(&w.output_norm, last, &mut s.xb[..dim]);
            matmul(
                pool,
                &w.output,
                &s.xb,
                1,
                &mut s.xq,
                &mut s.logits[..c.vocab_size],
                &mut s.matmul,
            );
        }
        Logits::Rows(range, sink) => {
            let range = range.start.min(n)..range.end.min(n);
            output_rows(m, pool, s, range.len(), |i| range.start + i, &mut |i, l| {
                sink(range.start + i, l)
            });
        }
        Logits::Picked(rows, sink) => {
            assert!(
                rows.iter().all(|&r| r < n),
                "picked logit row past the batch"
            );
            output_rows(m, pool, s, rows.len(), |i| rows[i], sink);
        }
        Logits::Hidden {
            hidden,
            hidden_sink,
            picked,
            sink,
        } => {
            assert!(
                hidden.iter().all(|r| r.end <= n) && picked.iter().all(|&r| r < n),
                "hidden or logit row past the batch"
            );
            for r in hidden {
                let (src, dst) = (
                    &s.x[r.start * dim..r.end * dim],
                    &mut s.xb[r.start * dim..r.end * dim],
                );
                norm_rows(pool, &w.output_norm, src, dst, dim);
                for j in r.clone() {
                    hidden_sink(j, &s.xb[j * dim..(j + 1) * dim]);
                }
            }
            output_rows(m, pool, s, picked.len(), |i| picked[i], sink);
        }
    }
    Ok(())
}

/// The logits of `count` rows of the batch (the `i`-th is batch row `row_of(i)`), computed
/// `logit_rows` at a time and handed to `sink` as `(i, logits)`.
fn output_rows(
    m: &Model,
    pool: &ThreadPool,
    s: &mut Scratch,
    count: usize,
    row_of: impl Fn(usize) -> usize,
    sink: &mut dyn FnMut(usize, &[f32]),
) {
    let (c, w) = (&m.config, &m.weights);
    let dim = c.dim;
    let per = s.spec.logit_rows.max(1);
    let mut i0 = 0;
    while i0 < count {
        let i1 = (i0 + per).min(count);
        let k = i1 - i0;
        for (o, i) in (i0..i1).enumerate() {
            let j = row_of(i);
            let (src, dst) = (
                &s.x[j * dim..(j + 1) * dim],
                &mut s.xb[o * dim..(o + 1) * dim],
            );
            norm_row(&w.output_norm, src, dst);
        }
        matmul(
            pool,
            &w.output,
            &s.xb,
            k,
            &mut s.xq,
            &mut s.logits[..k * c.vocab_size],
            &mut s.matmul,
        );
        for o in 0..k {
            sink(i0 + o, &s.logits[o * c.vocab_size..(o + 1) * c.vocab_size]);
        }
        i0 = i1;
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
    mm: &mut crate::kernels::matmul::MatmulScratch,
) {
    let same = lins.iter().all(|l| l.kernels.act == lins[0].kernels.act);
    if same {
        let rb = quantize_input(pool, lins[0], x, n, xq);
        matmul_many(pool, lins, xq, rb, n, outs, mm);
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
    crate::kernels::par_rows(pool, out, width, &body);
}

fn gated_act_rows(pool: &ThreadPool, f16: &F16Ops, gate: &mut [f32], up: &[f32], act: Activation) {
    let width = 256;
    crate::kernels::par_rows(pool, gate, width, &|range: Range<usize>, g: &mut [f32]| {
        let u = &up[range.start * width..range.start * width + g.len()];
        match act {
            // The SIMD SwiGLU: the same bits as the scalar activation.
            Activation::Silu => (f16.swiglu)(g, u),
            Activation::GeluTanh => (f16.geglu)(g, u),
        }
    });
}

/// `x = act(x)` (ungated FFN) over the pool.
fn act_rows(pool: &ThreadPool, f16: &F16Ops, x: &mut [f32], act: Activation) {
    crate::kernels::par_rows(pool, x, 256, &|_, v: &mut [f32]| match act {
        Activation::Silu => v.iter_mut().for_each(|a| *a = ops::silu(*a)),
        Activation::GeluTanh => (f16.gelu)(v),
    });
}
