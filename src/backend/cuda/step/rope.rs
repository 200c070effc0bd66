//! A layer's rotary position embedding over q and k (`rope_qk`), which also stores the keys and
//! values into an f16 cache; where the layer normalizes its q and k heads first (Gemma-3,
//! Qwen3), those norms and the query scale after it (Gemma-3) go into the same launch
//! (`norm_rope_qk`): one kernel where the forward pass asks for three or four.

use super::CudaSession;
use crate::backend::cuda::gpu::Arg;
use crate::backend::cuda::weights::DevNorm;
use crate::backend::{Buf, NormW};
use crate::cache::KvType;
use crate::kernels::ops::{Rope, RopeKind, YarnParams};
use crate::model::Model;

/// The q and k head norms of one layer, held back for its RoPE launch: each norm's weights,
/// buffer (normalized in place) and head count.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeadNorms {
    layer: usize,
    q: Option<(DevNorm, u64, usize)>,
    k: Option<(DevNorm, u64, usize)>,
}

impl CudaSession {
    /// Hold back the head norm `w` (RMS, fusion on, in place over every row of the buffer `x`)
    /// for the layer's RoPE launch, where it can go there: a layer with a RoPE (which the
    /// forward pass runs right after its head norms). Returns whether it was held.
    pub(super) fn defer_head_norm(
        &mut self,
        m: &Model,
        w: NormW,
        n: DevNorm,
        x: u64,
        groups: usize,
    ) -> bool {
        let (NormW::QHead(layer) | NormW::KHead(layer)) = w else {
            return false;
        };
        // (Per head: OLMo-2's and OLMoE's norms of whole q and k vectors launch as asked.)
        let ok = n.len == m.config.head_dim_k && m.weights.layers[layer].rope.is_some();
        if !ok {
            return false;
        }
        // (Another layer's, never consumed: launched as asked, not dropped.)
        if let Some(h) = self.head_norms.take_if(|h| h.layer != layer) {
            self.launch_head_norms(h);
        }
        let h = self.head_norms.get_or_insert(HeadNorms {
            layer,
            q: None,
            k: None,
        });
        match w {
            NormW::QHead(_) => h.q = Some((n, x, groups)),
            _ => h.k = Some((n, x, groups)),
        }
        true
    }

    /// An op other than the RoPE reads or writes buffer `p`: launch the head norms held back
    /// for it after all, as the forward pass asked for them.
    pub(super) fn settle_head_norms(&mut self, p: u64) {
        let held = |n: Option<(DevNorm, u64, usize)>| n.is_some_and(|(_, x, _)| x == p);
        if let Some(h) = self.head_norms.take_if(|h| held(h.q) || held(h.k)) {
            self.launch_head_norms(h);
        }
    }

    /// The held head norms `h`, each in a launch of its own (`rms_norm_f32` over its heads).
    fn launch_head_norms(&mut self, h: HeadNorms) {
        for (n, x, groups) in [h.q, h.k].into_iter().flatten() {
            self.norm_groups(n, x, 0, x, groups);
        }
    }

    /// Layer `layer`'s RoPE over the step's `rows` rows of q and k: `rope_qk`, or
    /// `norm_rope_qk` with the head norms held back for it (and then the query scale, which
    /// the layer's `scale` then skips: `q_scaled`). With an f16 cache the keys and values go
    /// there in the same launch (the attention then skips its store).
    pub(super) fn rope_qk(&mut self, m: &Model, layer: usize, rows: usize) {
        let c = &m.config;
        // Held norms this launch cannot take (another layer's; a RoPE already done in the
        // products' epilogue, which never follows head norms) run as asked, before it.
        let norms = match self.head_norms.take() {
            Some(h) if h.layer == layer && self.roped != Some(layer) => Some(h),
            other => {
                if let Some(h) = other {
                    self.launch_head_norms(h);
                }
                None
            }
        };
        let Some(rope) = m.weights.layers[layer].rope.as_ref() else {
            return;
        };
        self.xq_holds = None;
        if self.roped.take() == Some(layer) {
            return; // (done in the products' epilogue)
        }
        let neox = matches!(rope.kind, RopeKind::Neox) as i32;
        let store = self.fuse && self.layout.kv_type == KvType::F16;
        let a = self.rope_args(m, layer, store);
        let mut args = [
            Arg::P(self.buf(Buf::Q)),
            Arg::P(self.buf(Buf::K)),
            Arg::P(self.buf(Buf::V)),
            a.pos,
            Arg::L(rows as i64),
            Arg::I(c.n_heads as i32),
            Arg::I(c.n_kv_heads as i32),
            a.head_dim_k,
            a.n_dims,
            a.theta_scale,
            a.freq_scale,
            a.factors,
            Arg::I(neox),
            a.k_cache,
            a.v_cache,
            a.seq,
            a.k_stride,
            a.v_stride,
            a.head_dim_v,
            a.slots,
            a.yarn[0],
            a.yarn[1],
            a.yarn[2],
            a.yarn[3],
            // `norm_rope_qk`'s: the head norms' weights and epsilons, the query scale.
            Arg::P(0),
            Arg::P(0),
            Arg::F(0.0),
            Arg::F(0.0),
            Arg::F(1.0),
        ];
        if let Some(h) = norms {
            let (q, k) = (h.q.map(|n| n.0), h.k.map(|n| n.0));
            args[24] = Arg::P(q.map_or(0, |n| n.w));
            args[25] = Arg::P(k.map_or(0, |n| n.w));
            args[26] = Arg::F(q.map_or(0.0, |n| n.eps));
            args[27] = Arg::F(k.map_or(0.0, |n| n.eps));
            // (A temperature comes between the RoPE and the scale: then the scale stays.)
            if let (Some(qs), None) = (c.q_scale, c.attn_temp) {
                args[28] = Arg::F(qs);
                self.q_scaled = true;
            }
            let blocks = rows * (c.n_heads + c.n_kv_heads);
            self.go("norm_rope_qk", blocks as u32, 256, &args);
            return;
        }
        let n_rot = rows * (c.n_heads + c.n_kv_heads) * rope.n_dims / 2;
        let n_store = rows * c.n_kv_heads * (c.head_dim_k - rope.n_dims + c.head_dim_v);
        let n = n_rot + if store { n_store } else { 0 };
        self.elementwise("rope_qk", &args[..24], n);
    }

    /// Layer `layer`'s rotation and, with `store`, its f16 cache for the keys and values
    /// (else null pointers), as every launch that rotates takes them (`rope_qk`,
    /// `norm_rope_qk`, the products' epilogue: each in its own parameter order).
    pub(super) fn rope_args(&mut self, m: &Model, layer: usize, store: bool) -> RopeArgs {
        let c = &m.config;
        let rope = m.weights.layers[layer]
            .rope
            .as_ref()
            .expect("a layer with a RoPE");
        let at = self.layout.kv[layer];
        let (kc, vc) = if store { self.kv_at(layer) } else { (0, 0) };
        self.kv_stored = store.then_some(layer);
        RopeArgs {
            pos: Arg::P(self.at(self.layout.pos)),
            seq: Arg::P(self.at(self.layout.seq)),
            k_cache: Arg::P(kc),
            v_cache: Arg::P(vc),
            k_stride: Arg::L(at.slot_stride.0 as i64),
            v_stride: Arg::L(at.slot_stride.1 as i64),
            factors: Arg::P(self.w.rope_factors(layer)),
            theta_scale: Arg::F(rope.freq_base.powf(-2.0 / rope.n_dims as f32)),
            freq_scale: Arg::F(rope.freq_scale),
            head_dim_k: Arg::I(c.head_dim_k as i32),
            n_dims: Arg::I(rope.n_dims as i32),
            head_dim_v: Arg::I(c.head_dim_v as i32),
            slots: Arg::I(at.rows as i32),
            yarn: yarn_args(rope, &c.rope_yarn),
        }
    }
}

/// A layer's RoPE arguments ([`CudaSession::rope_args`]): the step's positions and sequence
/// slots, the f16 cache and its slot strides, the frequency factors and scales, the head sizes.
pub(super) struct RopeArgs {
    pub pos: Arg,
    pub seq: Arg,
    pub k_cache: Arg,
    pub v_cache: Arg,
    pub k_stride: Arg,
    pub v_stride: Arg,
    pub factors: Arg,
    pub theta_scale: Arg,
    pub freq_scale: Arg,
    pub head_dim_k: Arg,
    pub n_dims: Arg,
    pub head_dim_v: Arg,
    pub slots: Arg,
    /// YaRN's magnitude and ramp (`mscale`, `ext`, `low`, `high`: [`yarn_args`]).
    pub yarn: [Arg; 4],
}

/// A rotation's magnitude and YaRN's ramp as the kernels take them (`Yarn` in rope.cu):
/// `mscale`, the extrapolation mix `ext` (0 without YaRN) and the ramp's bounds.
fn yarn_args(rope: &Rope, y: &YarnParams) -> [Arg; 4] {
    let (ext, (low, high)) = match rope.yarn_mix {
        Some(_) => (y.ext_factor, rope.yarn_ramp(y)),
        None => (0.0, (0.0, 0.0)),
    };
    [Arg::F(rope.mscale), Arg::F(ext), Arg::F(low), Arg::F(high)]
}

/// Whether the rotation is plain (no YaRN mix, magnitude 1): what the products' RoPE
/// epilogue computes (`rope_epilogue` in matvec.cu).
pub(super) fn plain(rope: &Rope) -> bool {
    rope.yarn_mix.is_none() && rope.mscale == 1.0
}
