//! The CUDA backend: a session's device buffers and KV cache ([`CudaSession`], allocated once),
//! and the seam's ops as kernel launches ([`CudaStep`], made per forward pass).
//!
//! A decode step (one token per sequence, or a verification pass's rows computed as decode
//! steps: [`SeqBatch::alone`]) is recorded once per row count as a CUDA graph, from
//! the embedding to the last layer, and replayed after that: positions, slots and token ids
//! are copied to the device before the replay and read by the kernels there. The output head
//! (a gather by row, the product with the vocabulary, the copy back) runs outside the graph.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::gpu::{blocks_for, Arena, Arg, Gpu, Graph, Stream};
use super::profile::Profile;

mod ahead;
mod arch;
mod attention;
mod deferred;
mod layout;
mod moe;
mod offload;
mod products;
mod rope;
use super::weights::{DevMat, DevNorm, DeviceWeights};
use super::CudaError;
use crate::backend::{Backend, Buf, ForwardError, Mat, NormW, RowSel, SeqBatch, SeqCache};
use crate::cache::KvLayout;
use crate::kernels::attention::TILE_Q;
use crate::kernels::ops::{Activation, AttnTemp};
use crate::model::{Model, NormKind};
use layout::GemmLayout;
pub use layout::{CudaKv, CudaSizes, RingLayout, SessionLayout};
use products::{mv_shape, Epilogue, Prepared};

/// Products of at least this many rows dequantize the weights to bf16 and multiply on the
/// tensor cores (cuBLAS); fewer rows take the matvec kernels.
pub const GEMM_MIN_ROWS: usize = 64;

/// The most rows a recorded decode step may carry (more run without a graph): the steps
/// whose products all take the matvec kernels. A step of at most this many decode rows (one
/// token of a sequence, or a verification pass's rows computed as decode steps: see
/// [`SeqBatch::alone`]) computes each row as a step of it alone would, bit for bit.
pub const MAX_GRAPH_ROWS: usize = GEMM_MIN_ROWS - 1;

/// Whether every row of a step is a decode row: a sequence's one token, or a row of a pass
/// computed as decode steps ([`SeqBatch::alone`]).
pub fn decode_rows<K: SeqCache>(seqs: &[SeqBatch<'_, K>]) -> bool {
    seqs.iter().all(|sq| sq.n_tokens == 1 || sq.alone)
}

/// Elements of a row each block of `rms_norm_q8` normalizes and quantizes: 512, or
/// `KILN_CUDA_NORM_SLICE` (a multiple of 256; a large one keeps a row in one block).
fn norm_slice() -> usize {
    crate::tuning::get().cuda_norm_slice
}

enum Capture {
    /// Ops launch as they come.
    Direct,
    /// Ops are recorded into the graph of this many rows.
    Recording(usize),
    /// The graph of this many rows replays in place of the ops.
    Replaying(usize),
}

/// Everything a session keeps on the GPU besides the weights, allocated once.
pub struct CudaSession {
    gpu: Arc<Gpu>,
    w: Arc<DeviceWeights>,
    sizes: CudaSizes,
    layout: SessionLayout,
    /// This session's queue of work.
    stream: Stream,
    act: Arena,
    /// The KV cache, or the ring of an offloaded one (`offload`).
    kv: Arena,
    offload: Option<offload::Offload>,
    host_i32: Vec<i32>,
    host_f32: Vec<f32>,
    /// Recorded decode steps (verification passes among them) by row count, and how many
    /// kernels each launches.
    graphs: HashMap<usize, (Graph, usize)>,
    capture: Capture,
    /// Kernels launched since the recording in progress began.
    recorded: usize,
    /// Record decode steps as graphs.
    pub use_graphs: bool,
    /// A mixture-of-experts model's routing on the host (passes of more than
    /// [`MAX_GRAPH_ROWS`] rows, or all with `moe_on_device` off).
    moe_host: Option<moe::MoeHost>,
    /// Route decode-sized passes on the device (step/moe.rs), so their steps record as graphs.
    moe_on_device: bool,
    /// The first error of the pass in progress.
    err: Option<CudaError>,
    /// Time per kernel (`KILN_CUDA_PROFILE`).
    profile: Option<Profile>,
    /// Products that share an input in one launch (`KILN_CUDA_FUSE=0`: each alone); the CPU's
    /// attention arithmetic on short decode contexts (`KILN_CUDA_MIRROR=0`: f32). See
    /// [`crate::tuning`].
    fuse: bool,
    mirror: bool,
    /// The attention's RoPE in its products' epilogue where it can go there
    /// (`KILN_CUDA_ROPE_EPILOGUE=0`: `rope_qk` launched after them, for measuring).
    rope_in_products: bool,
    /// A post-norm and its residual add in the epilogue of the product before them
    /// (`KILN_CUDA_POST_EPILOGUE=0`: `rms_norm_add_f32` launched after it, for measuring).
    post_in_products: bool,
    /// Prompt attention in tiles (`attend_tile_*`) for passes of at least `TILE_Q` tokens of a
    /// sequence (else one block per row and head, as the shorter passes), where the value
    /// rows fit the tile kernels (SmolLM2's pp512 50,647 tok/s in tiles, 25,929 without, on an
    /// H200, 2026-11-26, a98fc2b).
    tile: bool,
    /// What the `xq` buffer holds: `rows` of the buffer at this address, quantized by this
    /// kernel (a norm quantizes for the products after it). Ops that may write a buffer forget
    /// it.
    xq_holds: Option<(u64, &'static str, usize)>,
    /// The layer whose keys and values the RoPE has put in the cache in this step.
    kv_stored: Option<usize>,
    /// The layer whose q, k and v products applied its RoPE in their epilogue (its `rope`
    /// then launches nothing).
    roped: Option<usize>,
    /// A layer's q and k head norms, held back for its RoPE launch (step/rope.rs).
    head_norms: Option<rope::HeadNorms>,
    /// A post-norm held back for the residual add after it (step/deferred.rs).
    post_norm: Option<deferred::PostNorm>,
    /// The RoPE's launch applied the query scale (the next `scale` of q launches nothing).
    q_scaled: bool,
    /// A norm its products apply themselves (step/deferred.rs), and the buffer such a norm
    /// left unwritten.
    deferred: Option<deferred::DeferredNorm>,
    skipped: Option<u64>,
    /// The second stream that dequantizes prompt products' weights ahead of them
    /// (step/ahead.rs; none without prompt-sized products or with `KILN_CUDA_DEQUANT_AHEAD=0`).
    ahead: Option<ahead::Ahead>,
    /// The weight buffer the next chunk goes to.
    wbf_next: usize,
}

impl Drop for CudaSession {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprint!("{}", p.report());
        }
    }
}

impl CudaSession {
    /// Allocate a session's buffers and KV cache for `m` (whose weights are `w`), the cache of
    /// geometry `kv` (sliding-window layers keep rings) for `sizes.slots` sequences.
    pub fn new(
        gpu: Arc<Gpu>,
        w: Arc<DeviceWeights>,
        m: &Model,
        sizes: CudaSizes,
        kv: &KvLayout,
    ) -> Result<CudaSession, CudaError> {
        let c = &m.config;
        let tuning = crate::tuning::get();
        if c.head_dim_k > 256 || c.head_dim_v > 1024 {
            return Err(CudaError::Unsupported(format!(
                "heads of {} key / {} value dimensions (the CUDA attention takes up to 256 / 1024)",
                c.head_dim_k, c.head_dim_v
            )));
        }
        for hd in [c.head_dim_k, c.head_dim_v] {
            if let Err(e) = sizes.kv_type.check_head_dim(hd) {
                return Err(CudaError::Unsupported(e.to_string()));
            }
        }
        let layout = SessionLayout::new(c, m.traits.fused_qkv, sizes, kv);
        let stream = gpu.stream()?;
        let act = Arena::new(&gpu, layout.act_bytes)?;
        let kv = Arena::new(&gpu, layout.kv_bytes)?;
        let offload = match layout.ring {
            Some(_) if sizes.slots != 1 => {
                return Err(CudaError::Unsupported(format!(
                    "a KV cache offloaded to host memory for {} sequences (one only)",
                    sizes.slots
                )))
            }
            Some(r) => Some(offload::Offload::new(&gpu, r, &layout.kv)?),
            None => None,
        };
        let profile = Profile::from_env();
        let ahead = match layout.gemm {
            Some(g) if g.wbf[0] != g.wbf[1] => Some(ahead::Ahead::new(&gpu)?),
            _ => None,
        };
        let t = sizes.max_rows.max(1);
        let host_f32 = vec![0.0; (sizes.logit_rows.max(1) * c.vocab_size).max(t * c.dim)];
        Ok(CudaSession {
            // (At least the image of the step's four parameter arrays: see `begin`.)
            host_i32: vec![0; layout.rows_i32.max((layout.mode - layout.ids) / 4 + t)],
            host_f32,
            act,
            kv,
            offload,
            layout,
            stream,
            gpu,
            w,
            sizes,
            graphs: HashMap::new(),
            recorded: 0,
            capture: Capture::Direct,
            use_graphs: profile.is_none(),
            moe_host: moe::MoeHost::new(c, t),
            moe_on_device: true,
            err: None,
            profile,
            fuse: tuning.cuda_fuse,
            xq_holds: None,
            kv_stored: None,
            roped: None,
            head_norms: None,
            post_norm: None,
            q_scaled: false,
            deferred: None,
            skipped: None,
            ahead,
            wbf_next: 0,
            mirror: tuning.cuda_mirror,
            rope_in_products: tuning.cuda_rope_epilogue,
            post_in_products: tuning.cuda_post_epilogue,
            tile: c.head_dim_v.is_multiple_of(16) && c.head_dim_v <= 256,
        })
    }

    /// Copy `n` i32 from the host staging buffer to the step parameter at `off`.
    fn put_i32(&mut self, off: usize, n: usize) {
        let bytes = zerocopy::IntoBytes::as_bytes(&self.host_i32[..n]);
        let r = self.act.write(&self.stream, off, bytes);
        self.fail(r);
    }

    /// Rows `rows` of buffer `b`, copied to the host staging buffer (`[rows.len(), width]`).
    fn fetch(&mut self, b: Buf, rows: Range<usize>) -> Result<&[f32], CudaError> {
        let w = self.w(b);
        let n = rows.len() * w;
        let off = self.layout.buf[b as usize] + rows.start * w * 4;
        let out = zerocopy::IntoBytes::as_mut_bytes(&mut self.host_f32[..n]);
        self.act.read(&self.stream, off, out)?;
        Ok(&self.host_f32[..n])
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn sizes(&self) -> CudaSizes {
        self.sizes
    }

    /// Bytes of the KV cache on the device (every slot's; an offloaded cache's ring).
    pub fn kv_bytes(&self) -> usize {
        self.layout.kv_bytes
    }

    /// Bytes of an offloaded KV cache in host memory (0 when the cache is on the device).
    pub fn host_kv_bytes(&self) -> usize {
        self.offload.as_ref().map_or(0, |o| o.host_bytes())
    }

    /// Rows `rows` of the logits buffer, copied to the host (`[rows.len(), vocab]`).
    pub fn logits(&mut self, rows: Range<usize>) -> Result<&[f32], CudaError> {
        self.fetch(Buf::Logits, rows)
    }

    /// The index of the largest logit of each of the first `rows` logit rows, computed on the
    /// device: one token id per row crosses the bus.
    pub fn argmax(&mut self, rows: usize, out: &mut [u32]) -> Result<(), CudaError> {
        let v = self.w(Buf::Logits);
        self.gpu.launch(
            &self.stream,
            "argmax_f32",
            rows as u32,
            1024,
            &[
                Arg::P(self.buf(Buf::Logits)),
                Arg::I(v as i32),
                Arg::P(self.at(self.layout.argmax)),
            ],
        )?;
        let got = zerocopy::IntoBytes::as_mut_bytes(&mut self.host_i32[..rows]);
        self.act.read(&self.stream, self.layout.argmax, got)?;
        for (o, &i) in out.iter_mut().zip(&self.host_i32[..rows]) {
            *o = i as u32;
        }
        Ok(())
    }

    /// Make the first `n` positions of slot `dst`'s cache a copy of slot `src`'s, every layer
    /// (a prefix another sequence computed).
    pub fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> Result<(), CudaError> {
        let l = &self.layout;
        let ctx = self.sizes.n_ctx;
        if dst >= self.sizes.slots || src >= self.sizes.slots || n > ctx {
            return Err(CudaError::Driver(format!(
                "prefix copy of {n} positions from slot {src} to slot {dst} ({} slots of {ctx})",
                self.sizes.slots
            )));
        }
        if dst == src || n == 0 {
            return Ok(());
        }
        let heads = l.kv_heads;
        for at in &l.kv {
            let parts = [
                (at.k, at.slot_stride.0, l.row_bytes.0),
                (at.v, at.slot_stride.1, l.row_bytes.1),
            ];
            // A ring's rows 0..n, or all of them once positions wrapped (position p at row
            // p mod rows in both slots). (Rows are whole u16: f16 values, or Q8_0 blocks of 34
            // bytes.)
            let used = n.min(at.rows);
            for (base, per, row) in parts {
                let args = [
                    Arg::P(self.kv.ptr(base + src * per)),
                    Arg::P(self.kv.ptr(base + dst * per)),
                    Arg::I(heads as i32),
                    Arg::L((used * row / 2) as i64),
                    Arg::L((at.rows * row / 2) as i64),
                ];
                let grid = blocks_for(heads * used * row / 2);
                self.gpu
                    .launch(&self.stream, "kv_copy_u16", grid, 256, &args)?;
            }
        }
        self.gpu.synchronize(&self.stream)
    }

    /// Kernels the recorded decode step of `rows` rows launches, if there is one.
    pub fn graph_launches(&self, rows: usize) -> Option<usize> {
        self.graphs.get(&rows).map(|&(_, n)| n)
    }

    /// Fuse ops where the kernels allow (the default, unless `KILN_CUDA_FUSE=0`), or launch
    /// each op alone (for comparison: the results are the same).
    pub fn set_fusion(&mut self, on: bool) {
        self.fuse = on;
        self.graphs.clear();
    }

    /// Follow the CPU's f16 attention arithmetic on short decode contexts (the default), or not
    /// (f32, as `KILN_CUDA_MIRROR=0`); recorded graphs are dropped.
    pub fn set_mirror(&mut self, on: bool) {
        self.mirror = on;
        self.graphs.clear();
    }

    /// Route a mixture of experts' decode-sized passes on the device (the default: their
    /// steps record as graphs), or on the host as longer passes route (for comparison: the
    /// same experts, weights and bits); recorded graphs are dropped.
    pub fn set_moe_routing_on_device(&mut self, on: bool) {
        self.moe_on_device = on;
        self.graphs.clear();
    }

    /// Decode graphs recorded so far.
    pub fn graphs(&self) -> usize {
        self.graphs.len()
    }

    fn fail(&mut self, r: Result<(), CudaError>) {
        if let Err(e) = r {
            self.err.get_or_insert(e);
        }
    }

    /// Launch, unless a graph replays in place of the ops.
    fn go(&mut self, name: &str, grid: u32, block: u32, args: &[Arg]) {
        if matches!(self.capture, Capture::Replaying(_)) || self.err.is_some() {
            return;
        }
        if matches!(self.capture, Capture::Recording(_)) {
            self.recorded += 1;
        }
        let t = self.start_op();
        let r = self.gpu.launch(&self.stream, name, grid, block, args);
        self.fail(r);
        self.end_op(name, t);
    }

    /// With a profile: wait for the work so far; the op's start.
    fn start_op(&mut self) -> Option<std::time::Instant> {
        self.profile.as_ref()?;
        let r = self.gpu.synchronize(&self.stream);
        self.fail(r);
        Some(std::time::Instant::now())
    }

    /// With a profile: wait for the op, and count its time.
    fn end_op(&mut self, name: &str, t: Option<std::time::Instant>) {
        let Some(t) = t else { return };
        let r = self.gpu.synchronize(&self.stream);
        self.fail(r);
        if let Some(p) = self.profile.as_mut() {
            p.add(name, t);
        }
    }

    /// End the recorded part of a step: finish recording (and run it), or replay.
    fn flush(&mut self) {
        self.settle();
        match std::mem::replace(&mut self.capture, Capture::Direct) {
            Capture::Direct => {}
            Capture::Recording(rows) => {
                let r = self.gpu.end_capture(&self.stream).and_then(|g| {
                    // An op failed while recording: the graph is incomplete; drop it.
                    if self.err.is_some() {
                        return Ok(());
                    }
                    self.gpu.replay(&g)?;
                    self.graphs.insert(rows, (g, self.recorded));
                    Ok(())
                });
                self.fail(r);
            }
            Capture::Replaying(rows) => {
                let r = match self.graphs.get(&rows) {
                    Some((g, _)) => self.gpu.replay(g),
                    None => Err(CudaError::Driver(format!("no graph for {rows} rows"))),
                };
                self.fail(r);
            }
        }
    }

    /// Device addresses of the activation buffers and step parameters.
    fn buf(&self, b: Buf) -> u64 {
        self.act.ptr(self.layout.buf[b as usize])
    }

    fn at(&self, off: usize) -> u64 {
        self.act.ptr(off)
    }

    fn w(&self, b: Buf) -> usize {
        self.layout.width[b as usize]
    }

    fn norm_groups(&mut self, n: DevNorm, x: u64, sel: u64, y: u64, groups: usize) {
        let (x, sel, y, w) = (Arg::P(x), Arg::P(sel), Arg::P(y), Arg::P(n.w));
        let (len, eps, grid) = (Arg::I(n.len as i32), Arg::F(n.eps), groups as u32);
        match n.kind {
            NormKind::Rms => self.go("rms_norm_f32", grid, 256, &[x, sel, y, w, len, eps]),
            NormKind::Layer => {
                let b = Arg::P(n.b.unwrap_or(0));
                self.go("layer_norm_f32", grid, 256, &[x, sel, y, w, b, len, eps]);
            }
        }
    }

    /// An op will write buffer `b`: forget `xq`'s contents if they were made from it.
    fn writes(&mut self, b: Buf) {
        let p = self.buf(b);
        self.writing(p);
        if self.xq_holds.is_some_and(|(x, _, _)| x == p) {
            self.xq_holds = None;
        }
    }

    /// A decode-sized RMS norm of whole rows whose readers (`mats`) all take the same 8-bit
    /// input: normalize and quantize for them in one launch (`rms_norm_q8`), and remember that
    /// `xq` holds y quantized. False (nothing launched) otherwise.
    fn norm_quantized(
        &mut self,
        mats: [Option<Mat>; 3],
        n: DevNorm,
        x: u64,
        sel: u64,
        y: u64,
        rows: usize,
    ) -> bool {
        let decode = rows < GEMM_MIN_ROWS || self.layout.gemm.is_none();
        if !self.fuse || !decode || n.kind != NormKind::Rms || mats[0].is_none() {
            return false;
        }
        let mut q = None;
        for m in mats.into_iter().flatten() {
            let m = self.w.mat(m);
            match (q, m.kernels.quantize) {
                (_, None) => return false,
                (None, Some(k)) => q = Some(k),
                (Some(a), Some(b)) if a != b => return false,
                _ => {}
            }
        }
        let (Some(q), true) = (q, n.len == self.w(Buf::Xb)) else {
            return false;
        };
        let kind = match q {
            "quantize_q8_0" => 1,
            "quantize_q8_1" => 2,
            "quantize_q8_k" if n.len.is_multiple_of(256) => 3,
            _ => return false,
        };
        // Rows in slices over several blocks (x is not y: each block reads the whole row).
        let slice = if x == y {
            n.len.next_multiple_of(256)
        } else {
            norm_slice()
        };
        let args = [
            Arg::P(x),
            Arg::P(sel),
            Arg::P(y),
            Arg::P(n.w),
            Arg::I(n.len as i32),
            Arg::F(n.eps),
            Arg::P(self.at(self.layout.xq)),
            Arg::I(kind),
            Arg::I(slice as i32),
        ];
        self.go(
            "rms_norm_q8",
            (rows * n.len.div_ceil(slice)) as u32,
            256,
            &args,
        );
        self.xq_holds = Some((y, q, rows));
        true
    }

    fn elementwise(&mut self, name: &str, args: &[Arg], n: usize) {
        self.go(name, blocks_for(n), 256, args);
    }
}

/// The CUDA backend for one forward pass.
pub struct CudaStep<'a> {
    pub m: &'a Model,
    pub s: &'a mut CudaSession,
}

impl Backend for CudaStep<'_> {
    type Kv = CudaKv;

    fn max_rows(&self) -> usize {
        self.s.sizes.max_rows
    }

    fn logit_rows(&self) -> usize {
        self.s.sizes.logit_rows.max(1)
    }

    fn begin(&mut self, tokens: &[u32], seqs: &[SeqBatch<'_, CudaKv>]) {
        let s = &mut *self.s;
        s.err = None;
        s.capture = Capture::Direct;
        s.xq_holds = None;
        s.kv_stored = None;
        s.roped = None;
        s.head_norms = None;
        s.post_norm = None;
        s.q_scaled = false;
        s.deferred = None;
        s.skipped = None;
        s.ahead_begin();
        let n = tokens.len();
        // The step's parameters (token ids, positions, slots, attention arithmetic) lie one
        // after another in the arena, `stride` i32 apart: staged as that image, one copy.
        let stride = (s.layout.pos - s.layout.ids) / 4;
        debug_assert!(
            s.layout.seq - s.layout.pos == 4 * stride && s.layout.mode - s.layout.seq == 4 * stride
        );
        let (mirror, tile) = (s.mirror, s.tile);
        let (ids, rest) = s.host_i32.split_at_mut(stride);
        let (pos, rest) = rest.split_at_mut(stride);
        let (seq, mode) = rest.split_at_mut(stride);
        for (h, &t) in ids.iter_mut().zip(tokens) {
            *h = t as i32;
        }
        let mut j = 0;
        for sq in seqs {
            // Per row, the CPU's choice of attention arithmetic for its sequence's part.
            // (A pass computed as decode steps takes a decode row's, row by row.)
            let n_tokens = if sq.alone { 1 } else { sq.n_tokens };
            let m = match n_tokens {
                1 if mirror => 2,
                n if n > 1 && n < TILE_Q => 1,
                n if attention::tiles(tile, n) => 3,
                _ => 0,
            };
            for p in sq.kv.len()..sq.kv.len() + sq.n_tokens {
                pos[j] = p as i32;
                seq[j] = sq.kv.slot as i32;
                mode[j] = m;
                j += 1;
            }
        }
        s.put_i32(s.layout.ids, 3 * stride + n);
        s.offload_begin(seqs.len(), seqs.first().map_or(0, |sq| sq.kv.len()), n);
        let decode = decode_rows(seqs);
        debug_assert!(
            !seqs.iter().any(|sq| sq.alone) || (decode && n <= MAX_GRAPH_ROWS),
            "rows computed as decode steps need a pass of at most {MAX_GRAPH_ROWS} decode rows"
        );
        // (A mixture of experts' decode steps route on the device unless told otherwise.)
        let graph =
            s.use_graphs && s.offload.is_none() && (s.moe_host.is_none() || s.moe_on_device);
        if graph && decode && n <= MAX_GRAPH_ROWS && s.err.is_none() {
            if s.graphs.contains_key(&n) {
                s.capture = Capture::Replaying(n);
            } else {
                match s.gpu.begin_capture(&s.stream) {
                    Ok(()) => {
                        s.capture = Capture::Recording(n);
                        s.recorded = 0;
                    }
                    Err(e) => s.fail(Err(e)),
                }
            }
        }
    }

    fn embed(&mut self, tokens: &[u32], _seqs: &[SeqBatch<'_, CudaKv>], scale: f32) {
        let s = &mut *self.s;
        s.xq_holds = None;
        let e = s.w.token_embd;
        let args = [
            Arg::P(e.ptr),
            Arg::P(s.at(s.layout.ids)),
            Arg::P(s.buf(Buf::X)),
            Arg::I(e.cols as i32),
            Arg::F(scale),
            Arg::P(s.w.pos_embd.unwrap_or(0)),
            Arg::P(s.at(s.layout.pos)),
            Arg::L(e.groups() as i64),
        ];
        s.go(e.kernels.embed, tokens.len() as u32, 256, &args);
    }

    fn norm(&mut self, w: NormW, src: Buf, dst: Buf, rows: Range<usize>) {
        let s = &mut *self.s;
        if w == NormW::Output {
            s.flush();
        }
        let (sp, dp) = (s.buf(src), s.buf(dst));
        s.reading(sp);
        s.writing(dp);
        s.xq_holds = None;
        let n = s.w.norm(w);
        let width = s.w(dst);
        let off = (rows.start * width * 4) as u64;
        let groups = rows.len() * width / n.len.max(1);
        let (x, y) = (sp + off, dp + off);
        // Only an RMS norm in place over the rows from the first can be held back for a later
        // launch (fusion on).
        let held = s.fuse && x == y && rows.start == 0 && n.kind == NormKind::Rms;
        if held
            && (s.defer_head_norm(self.m, w, n, x, groups)
                || (groups == rows.end && s.defer_post_norm(w, n, y, rows.end)))
        {
            return; // (applied by the RoPE's launch, or by the add after it)
        }
        let mats = readers(self.m, w);
        if rows.start == 0 && w != NormW::Output && s.defer_norm(mats, n, x, y, rows.end) {
            return;
        }
        if rows.start == 0 && s.norm_quantized(mats, n, x, 0, y, rows.end) {
            return;
        }
        s.norm_groups(n, x, 0, y, groups);
    }

    fn norm_gather(&mut self, w: NormW, src: Buf, sel: RowSel<'_>, dst: Buf) {
        let s = &mut *self.s;
        let (sp, dp) = (s.buf(src), s.buf(dst));
        s.reading(sp);
        s.writing(dp);
        s.flush();
        for i in 0..sel.len() {
            s.host_i32[i] = sel.get(i) as i32;
        }
        s.put_i32(s.layout.sel, sel.len());
        s.xq_holds = None;
        let n = s.w.norm(w);
        let (x, y, sp) = (s.buf(src), s.buf(dst), s.at(s.layout.sel));
        if s.norm_quantized(readers(self.m, w), n, x, sp, y, sel.len()) {
            return;
        }
        s.norm_groups(n, x, sp, y, sel.len());
    }

    fn matmul(&mut self, ws: &[Mat], src: Buf, dsts: &[Buf], rows: usize) {
        let s = &mut *self.s;
        for &d in dsts {
            s.writes(d);
        }
        let mut prep = Prepared::default();
        let x = s.buf(src);
        if s.deferred_for(x, rows).is_none() {
            s.reading(x);
        }
        // (No allocation: this runs for every op of every decoded token.)
        let n = ws.len().clamp(1, 3);
        let pick = |i: usize| {
            let (m, d) = (ws[i.min(n - 1)], dsts[i.min(n - 1)]);
            // A fused QKV product goes to its own buffer; `split_qkv` moves it out.
            let y = match (m, s.layout.qkv) {
                (Mat::Qkv(_), Some(o)) => s.at(o),
                _ => s.buf(d),
            };
            (s.w.mat(m), y)
        };
        let all = [pick(0), pick(1), pick(2)];
        let mats = &all[..n];
        // Decode-sized products of one quantized format: one launch for each run of them (all
        // the matrices, or, where the formats differ, Gemma-3's q and k, then its v). The
        // attention's q, k and v in one launch may take their RoPE in its epilogue.
        let decode = s.fuse && (rows < GEMM_MIN_ROWS || s.layout.gemm.is_none());
        let same = |a: DevMat, b: DevMat| a.ty == b.ty && a.cols == b.cols;
        let mut i = 0;
        while i < mats.len() {
            let m = mats[i].0;
            let run = if decode && m.kernels.quantize.is_some() {
                mats[i..].iter().take_while(|&&(o, _)| same(o, m)).count()
            } else {
                1
            };
            let group = &mats[i..i + run];
            if run > 1 {
                let rope = match ws {
                    [Mat::Q(l), Mat::K(_), Mat::V(_)] if run == 3 => {
                        s.rope_epilogue(self.m, *l, group)
                    }
                    _ => None,
                };
                let epi = rope.as_ref().map_or(Epilogue::Store, Epilogue::Rope);
                s.matvecs(group, x, rows, epi);
                for &(m, y) in group {
                    s.bias(m, y, rows);
                }
            } else {
                s.product(m, x, mats[i].1, rows, &mut prep);
            }
            i += run;
        }
        s.consumed_by(x);
    }

    fn matmul_add(&mut self, w: Mat, src: Buf, post: Option<NormW>, dst: Buf, rows: usize) {
        let s = &mut *self.s;
        let m = s.w.mat(w);
        // Decode-sized, quantized, no bias: the matvec adds its products to dst, or, through
        // a post-norm, its last block normalizes them and adds them (`matvec_post`).
        let decode = rows < GEMM_MIN_ROWS || s.layout.gemm.is_none();
        if s.fuse && decode && m.bias.is_none() && m.kernels.quantize.is_some() {
            let (x, y) = (s.buf(src), s.buf(dst));
            let epi = match post {
                None => Some(Epilogue::Add),
                Some(w) => s.post_norm_epilogue(w, m, x, y, rows),
            };
            if let Some(epi) = epi {
                let out = match epi {
                    Epilogue::PostNorm(_) => {
                        s.reading(y);
                        s.writes(Buf::Proj);
                        s.buf(Buf::Proj)
                    }
                    _ => y,
                };
                s.writes(dst);
                s.reading(x);
                s.matvecs(&[(m, out)], x, rows, epi);
                return;
            }
        }
        self.matmul(&[w], src, &[Buf::Proj], rows);
        if let Some(norm) = post {
            self.norm(norm, Buf::Proj, Buf::Proj, 0..rows);
        }
        self.add(dst, Buf::Proj, rows);
    }

    fn gated_ffn(&mut self, gate: Mat, up: Mat, act: Activation, rows: usize) {
        let s = &mut *self.s;
        s.writes(Buf::Gate);
        s.writes(Buf::Up);
        let (g, u) = (s.w.mat(gate), s.w.mat(up));
        let (x, gp, upp) = (s.buf(Buf::Xb), s.buf(Buf::Gate), s.buf(Buf::Up));
        let mut prep = Prepared::default();
        // Decode-sized, one quantized format, no biases: products and activation in one launch.
        let fused = s.fuse
            && (rows < GEMM_MIN_ROWS || s.layout.gemm.is_none())
            && g.ty == u.ty
            && g.bias.is_none()
            && u.bias.is_none();
        if let (true, Some(name)) = (fused, g.kernels.gated) {
            let (block, tpr) = mv_shape(&s.gpu, g.cols);
            let own = s.own_input(g.kernels.gated_f32, g, x, rows);
            let (input, norm) = s.product_input(own, g, x, rows);
            if let Some(input) = input {
                let args = [
                    Arg::P(g.ptr),
                    Arg::P(u.ptr),
                    Arg::P(input),
                    Arg::P(gp),
                    Arg::I(g.rows as i32),
                    Arg::I(g.cols as i32),
                    Arg::I(rows as i32),
                    Arg::I(matches!(act, Activation::GeluTanh) as i32),
                    Arg::I(tpr as i32),
                    Arg::P(norm.0),
                    Arg::F(norm.1),
                ];
                let grid = g.rows.div_ceil((block / tpr) as usize) as u32;
                match own {
                    Some(k) => s.go(k, grid, block, &args),
                    None => s.go(name, grid, block, &args[..9]),
                }
                s.consumed_by(x);
                return;
            }
        }
        s.product(g, x, gp, rows, &mut prep);
        s.product(u, x, upp, rows, &mut prep);
        s.consumed_by(x);
        let n = rows * g.rows;
        let name = match act {
            Activation::Silu => "swiglu_f32",
            Activation::GeluTanh => "geglu_f32",
        };
        s.elementwise(name, &[Arg::P(gp), Arg::P(upp), Arg::L(n as i64)], n);
    }

    fn activate(&mut self, buf: Buf, act: Activation, rows: usize) {
        let s = &mut *self.s;
        s.reading(s.buf(buf));
        s.writes(buf);
        s.xq_holds = None;
        let n = rows * s.w(buf);
        let name = match act {
            Activation::Silu => "silu_f32",
            Activation::GeluTanh => "gelu_f32",
        };
        let p = s.buf(buf);
        s.elementwise(name, &[Arg::P(p), Arg::L(n as i64)], n);
    }

    fn split_qkv(&mut self, rows: usize) {
        let s = &mut *self.s;
        s.xq_holds = None;
        let Some(qkv) = s.layout.qkv.map(|o| s.at(o)) else {
            s.err
                .get_or_insert(CudaError::Driver("no fused QKV buffer".into()));
            return;
        };
        let (q, k, v) = (s.w(Buf::Q), s.w(Buf::K), s.w(Buf::V));
        let args = [
            Arg::P(qkv),
            Arg::P(s.buf(Buf::Q)),
            Arg::P(s.buf(Buf::K)),
            Arg::P(s.buf(Buf::V)),
            Arg::L(rows as i64),
            Arg::I(q as i32),
            Arg::I(k as i32),
            Arg::I(v as i32),
        ];
        s.elementwise("split_qkv_f32", &args, rows * (q + k + v));
    }

    fn rope(&mut self, layer: usize, _seqs: &[SeqBatch<'_, CudaKv>], rows: usize) {
        self.s.rope_qk(self.m, layer, rows);
    }

    fn scale(&mut self, buf: Buf, k: f32, rows: usize) {
        let s = &mut *self.s;
        if buf == Buf::Q && std::mem::take(&mut s.q_scaled) {
            return; // (done in the RoPE's launch)
        }
        s.reading(s.buf(buf));
        s.writes(buf);
        s.xq_holds = None;
        let n = rows * s.w(buf);
        let p = s.buf(buf);
        s.elementwise("scale_f32", &[Arg::P(p), Arg::F(k), Arg::L(n as i64)], n);
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize) {
        let s = &mut *self.s;
        let (d, x) = (s.buf(dst), s.buf(src));
        s.reading(d);
        s.writes(dst);
        s.xq_holds = None;
        if s.post_norm_add(d, x, rows) {
            return;
        }
        s.reading(x);
        let n = rows * s.w(dst);
        s.elementwise("add_f32", &[Arg::P(d), Arg::P(x), Arg::L(n as i64)], n);
    }

    fn attend(
        &mut self,
        layer: usize,
        seqs: &mut [SeqBatch<'_, CudaKv>],
        rows: usize,
    ) -> Result<(), ForwardError> {
        let window = self.m.weights.layers[layer].window.unwrap_or(0);
        self.s.attention(&self.m.config, layer, window, seqs, rows);
        self.s.offload_end_layer(layer);
        Ok(())
    }

    fn read(&mut self, buf: Buf, rows: Range<usize>, sink: &mut dyn FnMut(usize, &[f32])) {
        let s = &mut *self.s;
        s.reading(s.buf(buf));
        s.flush();
        let w = s.w(buf);
        match s.fetch(buf, rows.clone()) {
            Ok(got) => rows
                .zip(got.chunks_exact(w))
                .for_each(|(i, row)| sink(i, row)),
            Err(e) => {
                s.err.get_or_insert(e);
            }
        }
    }

    fn softcap(&mut self, buf: Buf, cap: f32, rows: usize) {
        self.s.softcap(buf, cap, rows);
    }

    fn attn_temperature(&mut self, t: AttnTemp, _seqs: &[SeqBatch<'_, CudaKv>], rows: usize) {
        self.s.attn_temperature(t, rows);
    }

    fn copy(&mut self, dst: Buf, src: Buf, rows: usize) {
        self.s.copy_rows(dst, src, rows);
    }

    fn moe_ffn(&mut self, layer: usize, act: Activation, rows: usize) {
        self.s.moe_ffn(self.m, layer, act, rows);
    }

    fn finish(&mut self) -> Result<(), ForwardError> {
        let s = &mut *self.s;
        s.flush();
        let r = s.gpu.synchronize(&s.stream);
        s.fail(r);
        match s.err.take() {
            None => Ok(()),
            Some(e) => Err(ForwardError::Device(e.to_string())),
        }
    }
}

/// The matrices that read a norm's output next: the attention's projections, the FFN's first
/// products, the output head.
fn readers(m: &Model, w: NormW) -> [Option<Mat>; 3] {
    match w {
        NormW::Attn(li) => match m.weights.layers[li].qkv {
            crate::model::Qkv::Fused(_) => [Some(Mat::Qkv(li)), None, None],
            crate::model::Qkv::Separate { .. } => {
                [Some(Mat::Q(li)), Some(Mat::K(li)), Some(Mat::V(li))]
            }
        },
        // (A mixture of experts reads it for its router first.)
        NormW::Ffn(li) if m.weights.layers[li].moe.is_some() => [None; 3],
        NormW::Ffn(li) if m.weights.layers[li].ffn_gate.is_some() => {
            [Some(Mat::Gate(li)), Some(Mat::Up(li)), None]
        }
        NormW::Ffn(li) => [Some(Mat::Up(li)), None, None],
        NormW::Output => [Some(Mat::Output), None, None],
        _ => [None; 3],
    }
}
