//! A model's weights on the Vulkan device: every matrix as the file stores it (the products
//! read the file's blocks), norms as f32, in one arena written once; and the check that the
//! model's features are the ones the executor runs (the dense llama family), the others
//! refused by name.

use std::collections::HashMap;
use std::sync::Arc;

use super::arena::{Arena, Layout, Memory, Region};
use super::shaders::WeightFormat;
use super::{Vk, VulkanError};
use crate::backend::{Mat, NormW};
use crate::kernels::matmul::Linear;
use crate::kernels::ops::{Activation, RopeKind};
use crate::model::{Model, Norm, NormKind, Qkv};

/// A matrix on the device: `[rows, cols]` in the file's format.
#[derive(Clone, Copy, Debug)]
pub struct VkMat {
    pub fmt: WeightFormat,
    pub off: u64,
    pub bytes: usize,
    pub rows: usize,
    pub cols: usize,
    /// Where its bias (`[rows]` f32) is, if it has one.
    pub bias: Option<u64>,
}

/// A norm's weights on the device (`[len]` f32).
#[derive(Clone, Copy, Debug)]
pub struct VkNorm {
    pub off: u64,
    pub len: usize,
    pub eps: f32,
}

/// A layer's rotary embedding.
#[derive(Clone, Copy, Debug)]
pub struct VkRope {
    pub kind: RopeKind,
    pub n_dims: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub mscale: f32,
}

struct VkLayer {
    q: VkMat,
    k: VkMat,
    v: VkMat,
    o: VkMat,
    gate: VkMat,
    up: VkMat,
    down: VkMat,
    attn_norm: VkNorm,
    ffn_norm: VkNorm,
    /// Per-head RMSNorms of the queries and keys (qwen3's).
    q_norm: Option<VkNorm>,
    k_norm: Option<VkNorm>,
    rope: Option<VkRope>,
}

/// Every weight of a model on the device, in one arena.
pub struct VkWeights {
    pub arena: Arena,
    pub token_embd: VkMat,
    layers: Vec<VkLayer>,
    pub output_norm: VkNorm,
    pub output: VkMat,
}

fn refuse(what: String) -> VulkanError {
    VulkanError::Unsupported(what)
}

/// Refuse, by name, what the executor does not run: it runs the dense llama family (RMSNorm
/// before attention and feed-forward, separate q/k/v, gated SiLU or GELU feed-forward, plain
/// RoPE, every position attended) in the formats the products read.
pub fn check_model(m: &Model) -> Result<(), VulkanError> {
    let c = &m.config;
    let arch = &c.arch_name;
    let has = |what: &str| Err(refuse(format!("{arch}'s {what}")));
    if c.arch.is_encoder() {
        return has("encoder blocks (embedding models)");
    }
    if c.head_dim_k != c.head_dim_v {
        return has("different key and value head sizes");
    }
    for (name, on) in [
        ("soft-capped attention", c.attn_softcap.is_some()),
        ("soft-capped logits", c.final_softcap.is_some()),
        ("attention temperature", c.attn_temp.is_some()),
        ("query scale", c.q_scale.is_some()),
        ("residual scale", c.residual_scale.is_some()),
        ("logit scale", c.logit_scale.is_some()),
        ("mixture of experts", c.moe.is_some()),
        ("non-causal attention", !c.causal),
        ("learned positions", m.weights.pos_embd.is_some()),
    ] {
        if on {
            return has(name);
        }
    }
    if !matches!(m.traits.act, Activation::Silu | Activation::GeluTanh) {
        return has("activation");
    }
    if m.weights.output_norm.kind != NormKind::Rms || m.weights.output_norm.bias.is_some() {
        return has("LayerNorm");
    }
    for (i, l) in m.weights.layers.iter().enumerate() {
        let layer = |what: &str| Err(refuse(format!("{arch}'s {what} (layer {i})")));
        if matches!(l.qkv, Qkv::Fused(_)) {
            return layer("fused QKV projection");
        }
        for (name, on) in [
            (
                "post-norms",
                l.attn_post_norm.is_some() || l.ffn_post_norm.is_some(),
            ),
            ("mixture of experts", l.moe.is_some()),
            ("ungated feed-forward", l.ffn_gate.is_none()),
            ("sliding window", l.window.is_some()),
            ("attention sinks", l.attn_sinks.is_some()),
            (
                "blocks without input norms",
                l.attn_norm.is_none() || l.ffn_norm.is_none(),
            ),
        ] {
            if on {
                return layer(name);
            }
        }
        for n in [&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm]
            .into_iter()
            .flatten()
        {
            if n.kind != NormKind::Rms || n.bias.is_some() {
                return layer("LayerNorm");
            }
        }
        if let Some(r) = &l.rope {
            if r.freq_factors.is_some() || r.yarn_mix.is_some() {
                return layer("RoPE frequency factors or YaRN");
            }
        }
    }
    Ok(())
}

/// What [`check_model`] found present.
fn present<T>(x: &Option<T>) -> &T {
    x.as_ref().expect("checked by check_model")
}

/// Places matrices and norms in a layout, then writes them.
struct Placer<'m> {
    m: &'m Model,
    layout: Layout,
    by_name: HashMap<String, VkMat>,
    writes: Vec<(u64, Vec<u8>)>,
    mats: Vec<(u64, usize, &'m Linear)>,
}

impl<'m> Placer<'m> {
    fn mat(&mut self, l: &'m Linear) -> Result<VkMat, VulkanError> {
        if let Some(m) = self.by_name.get(&l.name) {
            return Ok(*m);
        }
        let info = self
            .m
            .file
            .tensor_info(&l.name)
            .ok_or_else(|| refuse(format!("tensor {} not in the file", l.name)))?;
        let fmt = WeightFormat::of(info.ty)
            .ok_or_else(|| refuse(format!("tensor {}'s type {}", l.name, info.ty)))?;
        let row = info
            .ty
            .row_bytes(l.in_dim)
            .ok_or_else(|| refuse(format!("tensor {}: rows of {} values", l.name, l.in_dim)))?;
        let bytes = l.out_dim * row;
        let off = self.layout.take(bytes);
        let bias = match &l.bias {
            Some(b) if b.len() != l.out_dim => {
                return Err(refuse(format!(
                    "tensor {}'s bias of {} values for {} rows",
                    l.name,
                    b.len(),
                    l.out_dim
                )))
            }
            Some(b) => {
                let at = self.layout.take(b.len() * 4);
                self.writes
                    .push((at, zerocopy::IntoBytes::as_bytes(&b[..]).to_vec()));
                Some(at)
            }
            None => None,
        };
        let m = VkMat {
            fmt,
            off,
            bytes,
            rows: l.out_dim,
            cols: l.in_dim,
            bias,
        };
        self.mats.push((off, bytes, l));
        self.by_name.insert(l.name.clone(), m);
        Ok(m)
    }

    fn norm(&mut self, n: &Norm) -> VkNorm {
        let off = self.layout.take(n.weight.len() * 4);
        let bytes = zerocopy::IntoBytes::as_bytes(&n.weight[..]).to_vec();
        self.writes.push((off, bytes));
        VkNorm {
            off,
            len: n.weight.len(),
            eps: n.eps,
        }
    }
}

impl VkWeights {
    /// Upload `m`'s weights (checked by [`check_model`] first), calling `progress(bytes done,
    /// bytes in all)`.
    pub fn upload(
        vk: &Arc<Vk>,
        m: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<VkWeights, VulkanError> {
        check_model(m)?;
        let w = &m.weights;
        let mut p = Placer {
            m,
            layout: Layout::default(),
            by_name: HashMap::new(),
            writes: Vec::new(),
            mats: Vec::new(),
        };
        let token_embd = p.mat(&w.token_embd)?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let Qkv::Separate { wq, wk, wv } = &l.qkv else {
                unreachable!("checked by check_model")
            };
            layers.push(VkLayer {
                q: p.mat(wq)?,
                k: p.mat(wk)?,
                v: p.mat(wv)?,
                o: p.mat(&l.wo)?,
                gate: p.mat(present(&l.ffn_gate))?,
                up: p.mat(present(&l.ffn_up))?,
                down: p.mat(present(&l.ffn_down))?,
                attn_norm: p.norm(present(&l.attn_norm)),
                ffn_norm: p.norm(present(&l.ffn_norm)),
                q_norm: l.q_norm.as_ref().map(|n| p.norm(n)),
                k_norm: l.k_norm.as_ref().map(|n| p.norm(n)),
                rope: l.rope.as_ref().map(|r| VkRope {
                    kind: r.kind,
                    n_dims: r.n_dims,
                    freq_base: r.freq_base,
                    freq_scale: r.freq_scale,
                    mscale: r.mscale,
                }),
            });
        }
        let output_norm = p.norm(&w.output_norm);
        let output = p.mat(&w.output)?;
        let mut arena = Arena::new(vk, p.layout.bytes, Memory::Device)?;
        let total = p.layout.bytes as usize;
        let mut done = 0;
        for &(off, bytes, l) in &p.mats {
            let info = m.file.tensor_info(&l.name).expect("placed above");
            let data = m.file.tensor_bytes(info);
            if data.len() < bytes {
                return Err(refuse(format!(
                    "tensor {}: {} bytes in the file, {bytes} expected",
                    l.name,
                    data.len()
                )));
            }
            arena.write(off, &data[..bytes])?;
            done += bytes;
            progress(done.min(total), total);
        }
        for (off, bytes) in &p.writes {
            arena.write(*off, bytes)?;
        }
        progress(total, total);
        Ok(VkWeights {
            arena,
            token_embd,
            layers,
            output_norm,
            output,
        })
    }

    pub fn mat(&self, m: Mat) -> Result<VkMat, VulkanError> {
        let l = |i: usize| &self.layers[i];
        Ok(match m {
            Mat::Q(i) => l(i).q,
            Mat::K(i) => l(i).k,
            Mat::V(i) => l(i).v,
            Mat::O(i) => l(i).o,
            Mat::Gate(i) => l(i).gate,
            Mat::Up(i) => l(i).up,
            Mat::Down(i) => l(i).down,
            Mat::Output => self.output,
            Mat::Qkv(_) => return Err(refuse("a fused QKV projection".into())),
        })
    }

    pub fn norm(&self, n: NormW) -> Result<VkNorm, VulkanError> {
        Ok(match n {
            NormW::Attn(i) => self.layers[i].attn_norm,
            NormW::Ffn(i) => self.layers[i].ffn_norm,
            NormW::Output => self.output_norm,
            NormW::QHead(i) => self.layers[i]
                .q_norm
                .ok_or_else(|| refuse(format!("the norm {n:?}")))?,
            NormW::KHead(i) => self.layers[i]
                .k_norm
                .ok_or_else(|| refuse(format!("the norm {n:?}")))?,
            other => return Err(refuse(format!("the norm {other:?}"))),
        })
    }

    pub fn rope(&self, layer: usize) -> Option<VkRope> {
        self.layers[layer].rope
    }

    /// A matrix's region.
    pub fn region(&self, m: &VkMat) -> Result<Region, VulkanError> {
        self.arena.at(m.off, m.bytes)
    }

    /// A matrix's bias, if it has one.
    pub fn bias_region(&self, m: &VkMat) -> Result<Option<Region>, VulkanError> {
        m.bias.map(|at| self.arena.at(at, m.rows * 4)).transpose()
    }

    pub fn norm_region(&self, n: &VkNorm) -> Result<Region, VulkanError> {
        self.arena.at(n.off, n.len * 4)
    }
}
