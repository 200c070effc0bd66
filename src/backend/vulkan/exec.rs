//! The Vulkan executor: the model's weights uploaded once ([`VkWeights`]), a KV cache (f16)
//! with a slot per sequence, the activation scratch and the step's data (token ids,
//! positions, lengths: host-visible) allocated once from the plan; a forward pass is the
//! seam's ops recorded as dispatches ([`VkStep`]) and submitted where the host reads a result.
//! A decode step (decode rows only, the last row's logits) is recorded once per row count and
//! replayed after that, its positions in the data buffer; greedy decoding takes the argmax on
//! the device.

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::arena::{Arena, Layout, Memory, Region};
use super::program::{Program, Recorder};
use super::weights::VkWeights;
use super::{ops, Vk, VulkanError};
use crate::backend::cpu::Runtime;
use crate::backend::exec::{recycle, slot_views, ExecError, ExecSpec, Executor, SlotRows};
use crate::backend::{Backend, Buf, ForwardError, Logits, Mat, NormW, RowSel, SeqBatch};
use crate::cache::{KvType, SeqCache, SlotKv, Slots};
use crate::kernels::ops::{Activation, AttnTemp};
use crate::model::forward::forward_batch;
use crate::model::Model;

/// Passes of at most this many rows take the decode products (a workgroup a weight row, every
/// row summed as a step of it alone would be); more rows take the tiled prompt products.
pub const DECODE_ROWS: usize = 16;

/// A recorded decode step: its row count and whether it computes the last row's logits.
type StepKey = (usize, bool);

/// The scratch buffers' offsets in the activation arena.
#[derive(Clone, Copy, Debug, Default)]
struct Offsets {
    x: u64,
    xb: u64,
    q: u64,
    k: u64,
    v: u64,
    attn: u64,
    proj: u64,
    gate: u64,
    up: u64,
    logits: u64,
    /// The 8-bit activations of the integer products.
    xq: u64,
}

/// The step's data (host-visible): offsets of its arrays of u32.
#[derive(Clone, Copy, Debug, Default)]
struct DataOffsets {
    tokens: u64,
    /// Each row's cache row (its slot's first row + its position).
    kv_row: u64,
    pos: u64,
    /// Each row's length (position + 1), then its slot's first cache row.
    lens: u64,
    gather: u64,
    argmax: u64,
}

/// Everything of a model's sequences on the device besides the weights.
pub struct VkSession {
    vk: Arc<Vk>,
    w: VkWeights,
    max_rows: usize,
    logit_rows: usize,
    n_ctx: usize,
    slots: usize,
    dims: Dims,
    act: Arena,
    off: Offsets,
    kv: Arena,
    /// Per layer: the K and V caches' offsets in `kv`.
    kv_off: Vec<(u64, u64)>,
    data: Arena,
    doff: DataOffsets,
    /// The dispatches of the pass since the last submission (none while replaying).
    rec: Option<Recorder>,
    /// The recording of this pass, where it is a decode step.
    key: Option<StepKey>,
    replaying: bool,
    /// Submissions of this pass so far.
    seg: usize,
    /// A gather waits in `rec` (its indices in the data buffer).
    gathered: bool,
    pending: Vec<Program>,
    steps: HashMap<StepKey, Vec<Program>>,
    argmaxes: HashMap<usize, Program>,
    err: Option<VulkanError>,
    host: Vec<f32>,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    dim: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    attn_scale: f32,
}

impl Dims {
    fn width(&self, b: Buf) -> usize {
        match b {
            Buf::X | Buf::Xb | Buf::Proj => self.dim,
            Buf::Q | Buf::Attn => self.heads * self.head_dim,
            Buf::K | Buf::V => self.kv_heads * self.head_dim,
            Buf::Gate | Buf::Up => self.ffn,
            Buf::Logits => self.vocab,
        }
    }
}

/// The widest input of a product.
fn xq_cols(d: &Dims) -> usize {
    d.dim.max(d.ffn).max(d.heads * d.head_dim)
}

fn unsupported(what: String) -> VulkanError {
    VulkanError::Unsupported(what)
}

impl VkSession {
    pub fn new(
        model: &Model,
        spec: &ExecSpec,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<VkSession, VulkanError> {
        if spec.kv_type != KvType::F16 {
            return Err(unsupported(format!(
                "a {} KV cache (the Vulkan cache is f16: --kv-type f16)",
                spec.kv_type.name()
            )));
        }
        if spec.kv_budget.is_some() {
            return Err(unsupported("a KV cache in a file (--kv-budget)".into()));
        }
        let vk = super::open()?;
        let w = VkWeights::upload(&vk, model, progress)?;
        let c = &model.config;
        let dims = Dims {
            dim: c.dim,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim_k,
            ffn: c.ffn_dim,
            vocab: c.vocab_size,
            attn_scale: c.attn_scale,
        };
        let max_rows = spec.scratch.max_tokens.max(1);
        let logit_rows = spec.scratch.logit_rows.clamp(1, max_rows);
        let mut l = Layout::default();
        let mut take = |b: Buf, rows: usize| l.take(rows * dims.width(b) * 4);
        let off = Offsets {
            x: take(Buf::X, max_rows),
            xb: take(Buf::Xb, max_rows),
            q: take(Buf::Q, max_rows),
            k: take(Buf::K, max_rows),
            v: take(Buf::V, max_rows),
            attn: take(Buf::Attn, max_rows),
            proj: take(Buf::Proj, max_rows),
            gate: take(Buf::Gate, max_rows),
            up: take(Buf::Up, max_rows),
            logits: take(Buf::Logits, logit_rows),
            xq: l.take(ops::q8_bytes(max_rows * xq_cols(&dims))),
        };
        let act = Arena::new(&vk, l.bytes, Memory::Device)?;
        let (n_ctx, slots) = (spec.n_ctx.max(1), spec.slots.max(1));
        let mut l = Layout::default();
        let cache = slots * n_ctx * dims.kv_heads * dims.head_dim * 2;
        let kv_off = (0..c.n_layers)
            .map(|_| (l.take(cache), l.take(cache)))
            .collect();
        let kv = Arena::new(&vk, l.bytes, Memory::Device)?;
        let mut l = Layout::default();
        let doff = DataOffsets {
            tokens: l.take(max_rows * 4),
            kv_row: l.take(max_rows * 4),
            pos: l.take(max_rows * 4),
            lens: l.take(max_rows * 8),
            gather: l.take(max_rows * 4),
            argmax: l.take(logit_rows * 4),
        };
        let data = Arena::new(&vk, l.bytes, Memory::Host)?;
        Ok(VkSession {
            vk,
            w,
            max_rows,
            logit_rows,
            n_ctx,
            slots,
            dims,
            act,
            off,
            kv,
            kv_off,
            data,
            doff,
            rec: None,
            key: None,
            replaying: false,
            seg: 0,
            gathered: false,
            pending: Vec::new(),
            steps: HashMap::new(),
            argmaxes: HashMap::new(),
            err: None,
            host: Vec::new(),
        })
    }

    /// Decode steps recorded (one per row count and kind).
    pub fn recorded_steps(&self) -> usize {
        self.steps.len()
    }

    /// Submissions of recorded decode steps.
    pub fn replays(&self) -> u64 {
        self.steps.values().flatten().map(|p| p.runs).sum()
    }

    fn buf_off(&self, b: Buf) -> u64 {
        let o = &self.off;
        match b {
            Buf::X => o.x,
            Buf::Xb => o.xb,
            Buf::Q => o.q,
            Buf::K => o.k,
            Buf::V => o.v,
            Buf::Attn => o.attn,
            Buf::Proj => o.proj,
            Buf::Gate => o.gate,
            Buf::Up => o.up,
            Buf::Logits => o.logits,
        }
    }

    /// Rows `0..rows` of a buffer.
    fn buf(&self, b: Buf, rows: usize) -> Result<Region, VulkanError> {
        let cap = if b == Buf::Logits {
            self.logit_rows
        } else {
            self.max_rows
        };
        if rows > cap {
            return Err(VulkanError::Bounds {
                what: "a scratch buffer",
                detail: format!("{rows} rows of {b:?}, {cap} allocated"),
            });
        }
        self.act
            .at(self.buf_off(b), rows.max(1) * self.dims.width(b) * 4)
    }

    fn data(&self, off: u64, words: usize) -> Result<Region, VulkanError> {
        self.data.at(off, words.max(1) * 4)
    }

    fn write_u32(&mut self, off: u64, v: &[u32]) -> Result<(), VulkanError> {
        self.data.write(off, zerocopy::IntoBytes::as_bytes(v))
    }

    /// Whether ops are recorded now (not replaying, no error met).
    fn recording(&self) -> bool {
        self.rec.is_some() && self.err.is_none()
    }

    fn fail(&mut self, r: Result<(), VulkanError>) {
        if let Err(e) = r {
            self.err.get_or_insert(e);
        }
    }

    /// Submit what was recorded since the last submission (or its recorded twin), and wait.
    fn flush(&mut self) -> Result<(), VulkanError> {
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        self.gathered = false;
        if self.replaying {
            let key = self.key.expect("replaying a recorded step");
            let p = self
                .steps
                .get_mut(&key)
                .and_then(|v| v.get_mut(self.seg))
                .ok_or_else(|| VulkanError::Bounds {
                    what: "a recorded step",
                    detail: format!("submission {} of {key:?} was not recorded", self.seg),
                })?;
            p.run()?;
            self.seg += 1;
            return Ok(());
        }
        let Some(rec) = self.rec.replace(Recorder::new(&self.vk)) else {
            return Ok(());
        };
        let mut p = rec.finish()?;
        p.run()?;
        self.seg += 1;
        if self.key.is_some() {
            self.pending.push(p);
        }
        Ok(())
    }

    /// Read rows `rows` of `b` (after a flush) into `self.host`.
    fn fetch(&mut self, b: Buf, rows: Range<usize>) -> Result<usize, VulkanError> {
        let w = self.dims.width(b);
        let n = rows.len() * w;
        if self.host.len() < n {
            self.host.resize(n, 0.0);
        }
        let off = self.buf_off(b) + (rows.start * w * 4) as u64;
        self.act.read_f32(off, &mut self.host[..n])?;
        Ok(w)
    }

    fn argmax(&mut self, out: &mut [u32]) -> Result<(), VulkanError> {
        let rows = out.len();
        if rows > self.logit_rows {
            return Err(VulkanError::Bounds {
                what: "argmax",
                detail: format!("{rows} rows of logits, {} computed", self.logit_rows),
            });
        }
        if !self.argmaxes.contains_key(&rows) {
            let mut rec = Recorder::new(&self.vk);
            let x = self.buf(Buf::Logits, rows)?;
            let o = self.data(self.doff.argmax, rows)?;
            ops::argmax(&mut rec, x, o, rows, self.dims.vocab)?;
            self.argmaxes.insert(rows, rec.finish()?);
        }
        self.argmaxes.get_mut(&rows).expect("recorded").run()?;
        let off = self.doff.argmax;
        self.data
            .read(off, zerocopy::IntoBytes::as_mut_bytes(&mut out[..]))
    }

    fn kv_bytes(&self) -> usize {
        self.kv.bytes() as usize
    }

    /// Copy the keys and values of slot `src`'s first `n` positions to slot `dst`, every
    /// layer, on the queue (and wait).
    pub fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> Result<(), VulkanError> {
        if dst.max(src) >= self.slots || n > self.n_ctx {
            return Err(VulkanError::Bounds {
                what: "a prefix copy",
                detail: format!(
                    "{n} positions of slot {src} to slot {dst}: {} slots of {} allocated",
                    self.slots, self.n_ctx
                ),
            });
        }
        let row = (self.dims.kv_heads * self.dims.head_dim * 2) as u64;
        let slot = self.n_ctx as u64 * row;
        let len = n * row as usize;
        let mut rec = Recorder::new(&self.vk);
        for &(ko, vo) in &self.kv_off {
            for o in [ko, vo] {
                let from = self.kv.at(o + src as u64 * slot, len)?;
                let to = self.kv.at(o + dst as u64 * slot, len)?;
                rec.copy(from, to)?;
            }
        }
        rec.finish()?.run()
    }
}

/// The seam's ops on a [`VkSession`], for one forward pass.
pub struct VkStep<'a> {
    pub m: &'a Model,
    pub s: &'a mut VkSession,
}

impl VkStep<'_> {
    /// Record `f`'s dispatches unless replaying (an error is kept for [`Backend::finish`]).
    fn go(&mut self, f: impl FnOnce(&mut VkSession) -> Result<(), VulkanError>) {
        if !self.s.recording() {
            return;
        }
        let r = f(&mut *self.s);
        self.s.fail(r);
    }

    fn refuse(&mut self, what: &str) {
        let arch = &self.m.config.arch_name;
        self.s.fail(Err(unsupported(format!(
            "{what} ({arch}) on the Vulkan backend"
        ))));
    }
}

fn rec(s: &mut VkSession) -> &mut Recorder {
    s.rec.as_mut().expect("recording")
}

impl Backend for VkStep<'_> {
    type Kv = SlotKv;

    fn max_rows(&self) -> usize {
        self.s.max_rows
    }

    fn logit_rows(&self) -> usize {
        self.s.logit_rows
    }

    fn begin(&mut self, tokens: &[u32], seqs: &[SeqBatch<'_, SlotKv>]) {
        let s = &mut *self.s;
        s.err = None;
        s.seg = 0;
        s.gathered = false;
        s.pending.clear();
        s.replaying = s.key.is_some_and(|k| s.steps.contains_key(&k));
        s.rec = (!s.replaying).then(|| Recorder::new(&s.vk));
        let n = tokens.len();
        let (mut kv_row, mut pos, mut lens) = (Vec::new(), Vec::new(), vec![0u32; 2 * n]);
        for sq in seqs {
            let first = sq.kv.slot * s.n_ctx;
            for r in 0..sq.n_tokens {
                let p = sq.kv.len() + r;
                lens[pos.len()] = (p + 1) as u32;
                lens[n + pos.len()] = first as u32;
                kv_row.push((first + p) as u32);
                pos.push(p as u32);
            }
        }
        let r = (|| {
            if seqs.iter().any(|sq| sq.kv.slot >= s.slots) {
                return Err(VulkanError::Bounds {
                    what: "a pass",
                    detail: format!("a slot past the {} allocated", s.slots),
                });
            }
            let d = s.doff;
            s.write_u32(d.tokens, tokens)?;
            s.write_u32(d.kv_row, &kv_row)?;
            s.write_u32(d.pos, &pos)?;
            s.write_u32(d.lens, &lens)
        })();
        s.fail(r);
    }

    fn embed(&mut self, tokens: &[u32], _seqs: &[SeqBatch<'_, SlotKv>], scale: f32) {
        let n = tokens.len();
        self.go(|s| {
            let e = s.w.token_embd;
            let w = s.w.region(&e)?;
            let t = s.data(s.doff.tokens, n)?;
            let x = s.buf(Buf::X, n)?;
            ops::embed(rec(s), e.fmt, w, t, x, (n, e.cols, e.rows), scale)
        });
    }

    fn norm(&mut self, w: NormW, src: Buf, dst: Buf, rows: Range<usize>) {
        if rows.start != 0 {
            return self.refuse("a norm of rows not from the first");
        }
        self.go(|s| {
            let nw = s.w.norm(w)?;
            let width = s.dims.width(src);
            let x = s.buf(src, rows.end)?;
            let y = s.buf(dst, rows.end)?;
            let wr = s.w.norm_region(&nw)?;
            let groups = rows.end * width / nw.len;
            ops::rms_norm(rec(s), x, wr, y, nw.len, groups, nw.eps)
        });
    }

    fn norm_gather(&mut self, w: NormW, src: Buf, sel: RowSel<'_>, dst: Buf) {
        if !self.s.recording() && !self.s.replaying {
            return;
        }
        let k = sel.len();
        let idx: Vec<u32> = (0..k).map(|i| sel.get(i) as u32).collect();
        // One gather's indices at a time in the data buffer.
        if self.s.gathered {
            let r = self.s.flush();
            self.s.fail(r);
        }
        let off = self.s.doff.gather;
        let r = self.s.write_u32(off, &idx);
        self.s.fail(r);
        self.s.gathered = true;
        self.go(|s| {
            let nw = s.w.norm(w)?;
            let width = s.dims.width(src);
            let x = s.buf(src, s.max_rows)?;
            let i = s.data(s.doff.gather, k)?;
            let y = s.buf(dst, k)?;
            ops::gather(rec(s), x, i, y, k, width)?;
            let wr = s.w.norm_region(&nw)?;
            ops::rms_norm(rec(s), y, wr, y, nw.len, k * width / nw.len, nw.eps)
        });
    }

    fn matmul(&mut self, ws: &[Mat], src: Buf, dsts: &[Buf], rows: usize) {
        self.go(|s| {
            let x = s.buf(src, rows)?;
            for (&w, &d) in ws.iter().zip(dsts) {
                let m = s.w.mat(w)?;
                let wr = s.w.region(&m)?;
                let y = s.buf(d, rows)?;
                let p = ops::Product {
                    rows: m.rows,
                    cols: m.cols,
                    n_tok: rows,
                    add: false,
                };
                if m.fmt.has_int() {
                    // (The CPU's and the reference's arithmetic for these formats: the
                    // activations quantized to 8 bits, integer dots.)
                    let xq = s.act.at(s.off.xq, ops::q8_bytes(rows * m.cols))?;
                    ops::matvec_int(rec(s), m.fmt, wr, x, xq, y, p)?;
                } else if rows <= DECODE_ROWS {
                    ops::matvec(rec(s), m.fmt, wr, x, y, p)?;
                } else {
                    ops::mm(rec(s), m.fmt, wr, x, y, p)?;
                }
                if let Some(b) = s.w.bias_region(&m)? {
                    ops::bias(rec(s), y, b, rows, m.rows)?;
                }
            }
            Ok(())
        });
    }

    fn gated_ffn(&mut self, gate: Mat, up: Mat, act: Activation, rows: usize) {
        self.matmul(&[gate, up], Buf::Xb, &[Buf::Gate, Buf::Up], rows);
        self.go(|s| {
            let n = rows * s.dims.ffn;
            let g = s.buf(Buf::Gate, rows)?;
            let u = s.buf(Buf::Up, rows)?;
            ops::glu(rec(s), g, u, n, act)
        });
    }

    fn moe_ffn(&mut self, _layer: usize, _act: Activation, _rows: usize) {
        self.refuse("a mixture-of-experts feed-forward");
    }

    fn activate(&mut self, _buf: Buf, _act: Activation, _rows: usize) {
        self.refuse("an ungated feed-forward");
    }

    fn split_qkv(&mut self, _rows: usize) {
        self.refuse("a fused QKV projection");
    }

    fn rope(&mut self, layer: usize, _seqs: &[SeqBatch<'_, SlotKv>], rows: usize) {
        self.go(|s| {
            let Some(r) = s.w.rope(layer) else {
                return Ok(());
            };
            let d = s.dims;
            let pos = s.data(s.doff.pos, rows)?;
            for (b, heads) in [(Buf::Q, d.heads), (Buf::K, d.kv_heads)] {
                let v = s.buf(b, rows)?;
                let a = ops::RopeArgs {
                    kind: r.kind,
                    rows,
                    heads,
                    head_dim: d.head_dim,
                    n_dims: r.n_dims,
                    stride: heads * d.head_dim,
                    freq_base: r.freq_base,
                    freq_scale: r.freq_scale,
                    mscale: r.mscale,
                };
                ops::rope(rec(s), v, pos, a)?;
            }
            Ok(())
        });
    }

    fn scale(&mut self, buf: Buf, f: f32, rows: usize) {
        self.go(|s| {
            let y = s.buf(buf, rows)?;
            let n = rows * s.dims.width(buf);
            ops::scale(rec(s), y, n, f)
        });
    }

    fn attn_temperature(&mut self, _t: AttnTemp, _seqs: &[SeqBatch<'_, SlotKv>], _rows: usize) {
        self.refuse("an attention temperature");
    }

    fn copy(&mut self, _dst: Buf, _src: Buf, _rows: usize) {
        self.refuse("a block without a feed-forward norm");
    }

    fn softcap(&mut self, _buf: Buf, _cap: f32, _rows: usize) {
        self.refuse("soft-capped logits");
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize) {
        self.go(|s| {
            let y = s.buf(dst, rows)?;
            let x = s.buf(src, rows)?;
            let n = rows * s.dims.width(dst);
            ops::add(rec(s), y, x, n)
        });
    }

    fn attend(
        &mut self,
        layer: usize,
        _seqs: &mut [SeqBatch<'_, SlotKv>],
        rows: usize,
    ) -> Result<(), ForwardError> {
        self.go(|s| {
            let d = s.dims;
            let width = d.kv_heads * d.head_dim;
            let cache_rows = s.slots * s.n_ctx;
            let bytes = cache_rows * width * 2;
            let (ko, vo) = s.kv_off[layer];
            let (kc, vc) = (s.kv.at(ko, bytes)?, s.kv.at(vo, bytes)?);
            let at = s.data(s.doff.kv_row, rows)?;
            let (k, v) = (s.buf(Buf::K, rows)?, s.buf(Buf::V, rows)?);
            ops::store_kv(rec(s), k, kc, at, rows, width, cache_rows)?;
            ops::store_kv(rec(s), v, vc, at, rows, width, cache_rows)?;
            let a = ops::AttnArgs {
                rows,
                heads: d.heads,
                kv_heads: d.kv_heads,
                head_dim: d.head_dim,
                cache_rows,
                scale: d.attn_scale,
            };
            let q = s.buf(Buf::Q, rows)?;
            let o = s.buf(Buf::Attn, rows)?;
            let lens = s.data(s.doff.lens, 2 * rows)?;
            ops::attn_decode(rec(s), q, (kc, vc), lens, o, a)
        });
        Ok(())
    }

    fn read(&mut self, buf: Buf, rows: Range<usize>, sink: &mut dyn FnMut(usize, &[f32])) {
        let r = self
            .s
            .flush()
            .and_then(|()| self.s.fetch(buf, rows.clone()));
        match r {
            Ok(w) => {
                for (i, j) in rows.enumerate() {
                    sink(j, &self.s.host[i * w..(i + 1) * w]);
                }
            }
            Err(e) => self.s.fail(Err(e)),
        }
    }

    fn finish(&mut self) -> Result<(), ForwardError> {
        let s = &mut *self.s;
        let r = s.flush();
        s.rec = None;
        if r.is_ok() && !s.replaying {
            if let Some(k) = s.key {
                s.steps.insert(k, std::mem::take(&mut s.pending));
            }
        }
        s.pending.clear();
        r.map_err(device)
    }
}

fn device(e: VulkanError) -> ForwardError {
    ForwardError::Device(format!("Vulkan: {e}"))
}

/// The Vulkan device's weights, session and slots.
pub struct VkExec {
    model: Arc<Model>,
    s: Box<VkSession>,
    slots: Slots<SlotKv>,
    seqs: Vec<SeqBatch<'static, SlotKv>>,
    logits: Vec<f32>,
    rt: Runtime,
}

impl VkExec {
    pub fn new(
        model: Arc<Model>,
        spec: &ExecSpec,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<VkExec, ExecError> {
        let s = Box::new(VkSession::new(&model, spec, progress)?);
        let n_slots = spec.slots.max(1);
        Ok(VkExec {
            slots: Slots::device(n_slots, &spec.layout),
            seqs: Vec::with_capacity(n_slots),
            logits: vec![0.0; model.config.vocab_size],
            rt: Runtime::new(1),
            s,
            model,
        })
    }

    pub fn session(&self) -> &VkSession {
        &self.s
    }
}

impl Executor for VkExec {
    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn max_rows(&self) -> usize {
        self.s.max_rows
    }

    fn forward(
        &mut self,
        rows: &[SlotRows],
        tokens: &[u32],
        want: Logits<'_>,
        _solo: bool,
    ) -> Result<(), ForwardError> {
        if matches!(want, Logits::Hidden { .. }) {
            return Err(device(unsupported("embeddings (hidden states)".into())));
        }
        let decode = rows.iter().all(|r| r.n_tokens == 1 || r.alone);
        self.s.key = match want {
            Logits::Last | Logits::None if decode && tokens.len() <= DECODE_ROWS => {
                Some((tokens.len(), matches!(want, Logits::Last)))
            }
            _ => None,
        };
        let mut views = slot_views(std::mem::take(&mut self.seqs), &mut self.slots, rows)?;
        let m = &*self.model;
        let step = &mut VkStep { m, s: &mut self.s };
        let r = forward_batch(m, step, &mut views, tokens, want);
        self.seqs = recycle(views);
        r
    }

    fn fetch_logits(&mut self) -> Result<(), ForwardError> {
        let n = self.s.fetch(Buf::Logits, 0..1).map_err(device)?;
        self.logits.copy_from_slice(&self.s.host[..n]);
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    fn argmax_on_device(&self) -> bool {
        true
    }

    fn argmax(&mut self, out: &mut [u32]) -> Result<(), ForwardError> {
        self.s.argmax(out).map_err(device)
    }

    crate::backend::exec::slot_bookkeeping!();

    fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> usize {
        let s = &mut self.s;
        self.slots
            .copy_device_prefix(dst, src, n, |d, from, n| s.copy_prefix(d, from, n).is_ok())
    }

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn share_threads(&mut self, _target: &dyn Executor) {}

    fn kv_bytes(&self) -> usize {
        self.s.kv_bytes()
    }

    fn host_scratch_bytes(&self) -> usize {
        0
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
