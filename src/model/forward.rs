//! The forward pass shared by every architecture: embed → blocks → final norm → logits,
//! written once over the [`Backend`] seam (the CPU's is [`crate::backend::cpu`]).
//!
//! One call processes the batch's rows (prefill chunks and decode tokens of one or several
//! sequences) at positions `kv.len()..kv.len()+n` of each sequence, writes their keys and
//! values into the caches, and advances them. Every intermediate lives in the backend's
//! buffers; nothing here allocates. Control flow depends only on the model and the row count.

use crate::backend::cpu::{Cpu, Runtime};
use crate::backend::{Backend, Buf, Mat, NormW, RowSel, SeqCache};
pub use crate::backend::{ForwardError, Logits, SeqBatch};
use crate::cache::{KvCache, Scratch};
use crate::kernels::attention::SoloAttention;
use crate::model::{Model, Qkv};

/// Run `tokens` through the model on the CPU, appending them to `kv`.
pub fn forward_cpu(
    m: &Model,
    rt: &Runtime,
    kv: &mut KvCache,
    s: &mut Scratch,
    tokens: &[u32],
    logits: Logits<'_>,
) -> Result<(), ForwardError> {
    let n_tokens = tokens.len();
    forward_batch_cpu(
        m,
        rt,
        &mut [SeqBatch {
            kv,
            n_tokens,
            alone: false,
        }],
        s,
        tokens,
        logits,
        None,
    )
}

/// Run a batch of several sequences' tokens on the CPU (see [`forward_batch`]). With `solo`,
/// a batch of short decode rows runs all its sequences' attention in one dispatch (see
/// [`SoloAttention`]).
pub fn forward_batch_cpu(
    m: &Model,
    rt: &Runtime,
    seqs: &mut [SeqBatch<'_>],
    s: &mut Scratch,
    tokens: &[u32],
    logits: Logits<'_>,
    solo: Option<&mut SoloAttention>,
) -> Result<(), ForwardError> {
    forward_batch(m, &mut Cpu::new(m, rt, s, solo), seqs, tokens, logits)
}

/// Run a batch holding the tokens of several sequences (continuous batching: one decode token
/// per sequence, or prefill chunks) through the model. Every matrix product reads its weights
/// once for all rows; attention runs per sequence over its own cache. Row `r` of the logits
/// belongs to row `r` of `tokens`.
pub fn forward_batch<B: Backend>(
    m: &Model,
    b: &mut B,
    seqs: &mut [SeqBatch<'_, B::Kv>],
    tokens: &[u32],
    logits: Logits<'_>,
) -> Result<(), ForwardError> {
    let (c, w) = (&m.config, &m.weights);
    let n = tokens.len();
    check_batch(m, b.max_rows(), seqs, tokens, &logits)?;
    // An encoder's blocks are post-norm: each sublayer reads the residual stream itself and
    // the norm follows the residual add (`encoder_norm`).
    let encoder = c.arch.is_encoder();
    b.begin(tokens, seqs);
    b.embed(tokens, seqs, m.embed_scale);
    if encoder {
        b.norm(NormW::Embd, Buf::X, Buf::X, 0..n);
    }
    for (li, layer) in w.layers.iter().enumerate() {
        // --- attention ---
        // (Without an input norm, OLMo-2's, the projections read the stream itself.)
        let src = if encoder || layer.attn_norm.is_none() {
            Buf::X
        } else {
            b.norm(NormW::Attn(li), Buf::X, Buf::Xb, 0..n);
            Buf::Xb
        };
        match &layer.qkv {
            Qkv::Fused(_) => {
                b.matmul(&[Mat::Qkv(li)], src, &[Buf::Q], n);
                b.split_qkv(n);
            }
            Qkv::Separate { .. } => b.matmul(
                &[Mat::Q(li), Mat::K(li), Mat::V(li)],
                src,
                &[Buf::Q, Buf::K, Buf::V],
                n,
            ),
        }
        if layer.q_norm.is_some() {
            b.norm(NormW::QHead(li), Buf::Q, Buf::Q, 0..n);
        }
        if layer.k_norm.is_some() {
            b.norm(NormW::KHead(li), Buf::K, Buf::K, 0..n);
        }
        if layer.rope.is_some() {
            b.rope(li, seqs, n);
        }
        if let Some(t) = c.attn_temp {
            b.attn_temperature(t, seqs, n);
        }
        if let Some(qs) = c.q_scale {
            b.scale(Buf::Q, qs, n);
        }
        b.attend(li, seqs, n)?;
        let post = layer
            .attn_post_norm
            .is_some()
            .then_some(NormW::AttnPost(li));
        residual_add(m, b, Mat::O(li), Buf::Attn, post, n);

        // --- feed-forward ---
        if encoder {
            // The FFN reads the normed stream from `Xb`; the stream itself is normed alike.
            encoder_norm(b, NormW::Attn(li), n);
        } else if layer.ffn_norm.is_some() {
            b.norm(NormW::Ffn(li), Buf::X, Buf::Xb, 0..n);
        } else {
            b.copy(Buf::Xb, Buf::X, n);
        }
        let act = m.traits.act;
        if layer.moe.is_some() {
            b.moe_ffn(li, act, n);
            b.add(Buf::X, Buf::Proj, n);
            continue;
        }
        let hidden = if layer.ffn_gate.is_some() {
            b.gated_ffn(Mat::Gate(li), Mat::Up(li), act, n);
            Buf::Gate
        } else {
            b.matmul(&[Mat::Up(li)], Buf::Xb, &[Buf::Up], n);
            b.activate(Buf::Up, act, n);
            Buf::Up
        };
        let post = layer.ffn_post_norm.is_some().then_some(NormW::FfnPost(li));
        residual_add(m, b, Mat::Down(li), hidden, post, n);
        if encoder {
            b.norm(NormW::Ffn(li), Buf::X, Buf::X, 0..n);
        }
    }
    for sq in seqs.iter_mut() {
        sq.kv.advance(sq.n_tokens)?;
    }

    // --- output head ---
    match logits {
        Logits::None => {}
        Logits::Last => {
            b.norm_gather(NormW::Output, Buf::X, RowSel::Range(n - 1, n), Buf::Xb);
            output_head(m, b, 1);
        }
        Logits::Rows(range, sink) => {
            let range = range.start.min(n)..range.end.min(n);
            let sel = RowSel::Range(range.start, range.end);
            output_rows(m, b, sel, &mut |b, i0, k| {
                b.read(Buf::Logits, 0..k, &mut |o, l| sink(range.start + i0 + o, l))
            });
        }
        Logits::EachRow(range, f) => {
            let range = range.start.min(n)..range.end.min(n);
            let sel = RowSel::Range(range.start, range.end);
            output_rows(m, b, sel, &mut |b, i0, k| {
                b.read_each(Buf::Logits, 0..k, &|o, l| f(range.start + i0 + o, l))
            });
        }
        Logits::Picked(rows, sink) => {
            assert!(
                rows.iter().all(|&r| r < n),
                "picked logit row past the batch"
            );
            output_rows(m, b, RowSel::List(rows), &mut picked_sink(sink));
        }
        Logits::Kept(rows) => {
            assert!(
                rows.iter().all(|&r| r < n) && rows.len() <= b.logit_rows(),
                "kept logit rows past the batch or the logits buffer"
            );
            output_rows(m, b, RowSel::List(rows), &mut |_, _, _| {});
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
                if encoder {
                    // No final norm: the last block's output is the state pooled.
                    b.read(Buf::X, r.clone(), hidden_sink);
                } else {
                    b.norm(NormW::Output, Buf::X, Buf::Xb, r.clone());
                    b.read(Buf::Xb, r.clone(), hidden_sink);
                }
            }
            output_rows(m, b, RowSel::List(picked), &mut picked_sink(sink));
        }
    }
    b.finish()
}

/// `X += post(src · Wᵀ)`, times the model's residual scale where it has one (Granite's
/// `ggml_scale` of the sublayer's output before the add).
fn residual_add<B: Backend>(m: &Model, b: &mut B, w: Mat, src: Buf, post: Option<NormW>, n: usize) {
    let Some(s) = m.config.residual_scale else {
        return b.matmul_add(w, src, post, Buf::X, n);
    };
    b.matmul(&[w], src, &[Buf::Proj], n);
    if let Some(norm) = post {
        b.norm(norm, Buf::Proj, Buf::Proj, 0..n);
    }
    b.scale(Buf::Proj, s, n);
    b.add(Buf::X, Buf::Proj, n);
}

/// An encoder's post-norm of the residual stream after a sublayer's add: `Xb = LN(X)` (the
/// next sublayer's input), and `X = LN(X)` (its residual), the same arithmetic on the same
/// rows.
fn encoder_norm<B: Backend>(b: &mut B, w: NormW, n: usize) {
    b.norm(w, Buf::X, Buf::Xb, 0..n);
    b.norm(w, Buf::X, Buf::X, 0..n);
}

/// Refuse a batch that does not fit, before anything is modified.
fn check_batch<K: SeqCache>(
    m: &Model,
    max_rows: usize,
    seqs: &[SeqBatch<'_, K>],
    tokens: &[u32],
    logits: &Logits<'_>,
) -> Result<(), ForwardError> {
    let c = &m.config;
    let n = tokens.len();
    let no_logits = match logits {
        Logits::None => true,
        Logits::Hidden { picked, .. } => picked.is_empty(),
        _ => false,
    };
    if c.arch.is_encoder() && !no_logits {
        return Err(ForwardError::EncoderLogits {
            arch: c.arch_name.clone(),
        });
    }
    if n == 0 || seqs.iter().any(|sq| sq.n_tokens == 0) {
        return Err(ForwardError::Empty);
    }
    let claimed: usize = seqs.iter().map(|sq| sq.n_tokens).sum();
    if claimed != n {
        return Err(ForwardError::BatchMismatch { tokens: n, claimed });
    }
    if n > max_rows {
        return Err(ForwardError::BatchTooLarge { n, max: max_rows });
    }
    for sq in seqs {
        sq.kv.check_fits(sq.n_tokens)?;
        sq.kv.check_window(sq.n_tokens)?;
        let end = sq.kv.len() + sq.n_tokens;
        if m.weights.pos_embd.is_some() && end > c.ctx_train {
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
    Ok(())
}

/// The logits of the selected rows of the batch, computed `logit_rows` at a time; each part
/// handed to `read(backend, first index in the selection, rows)`, its logits in the backend's
/// [`Buf::Logits`] rows `0..rows`.
fn output_rows<B: Backend>(
    m: &Model,
    b: &mut B,
    sel: RowSel<'_>,
    read: &mut dyn FnMut(&mut B, usize, usize),
) {
    let (count, per) = (sel.len(), b.logit_rows());
    let mut i0 = 0;
    while i0 < count {
        let i1 = (i0 + per).min(count);
        let k = i1 - i0;
        b.norm_gather(NormW::Output, Buf::X, sel.part(i0, i1), Buf::Xb);
        output_head(m, b, k);
        read(b, i0, k);
        i0 = i1;
    }
}

/// `Logits[..rows]` = the output head of `Xb[..rows]`, scaled where the model scales its
/// logits (Granite), soft-capped where it caps them (Gemma-2).
fn output_head<B: Backend>(m: &Model, b: &mut B, rows: usize) {
    b.output_head(rows, m.config.logit_scale, m.config.final_softcap);
}

/// [`output_rows`]'s reader for a sink of `(index among the selected rows, logits)`.
fn picked_sink<'s, B: Backend>(
    sink: &'s mut dyn FnMut(usize, &[f32]),
) -> impl FnMut(&mut B, usize, usize) + 's {
    move |b, i0, k| b.read(Buf::Logits, 0..k, &mut |o, l| sink(i0 + o, l))
}
