//! The GPU's executor: the model's weights on the device (shared by the executors of one
//! model alive at once), a [`CudaSession`] whose KV cache has a slot per sequence, and each
//! slot's position; passes run the forward pass over [`CudaStep`] (decode steps replayed as
//! CUDA graphs), and greedy decoding takes the argmax on the device.

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

use super::{CudaError, CudaKv, CudaSession, CudaSizes, CudaStep, DeviceWeights, Gpu};
use crate::backend::cpu::Runtime;
use crate::backend::exec::SlotRows;
use crate::backend::exec::{recycle, slot_views, ExecError, ExecSpec, Executor, HasExecutor};
use crate::backend::{ForwardError, Logits, SeqBatch};
use crate::cache::Slots;
use crate::model::forward::forward_batch;
use crate::model::Model;

/// The GPU's weights, session and slots.
pub struct CudaExec {
    model: Arc<Model>,
    s: Box<CudaSession>,
    slots: Slots<CudaKv>,
    /// The allocation of a pass's sequence views.
    seqs: Vec<SeqBatch<'static, CudaKv>>,
    /// `[vocab]`: the last token's logits, copied back by [`Executor::fetch_logits`].
    logits: Vec<f32>,
    /// One thread, for host work.
    rt: Runtime,
}

impl CudaExec {
    /// An executor on the GPU, calling `progress(bytes done, bytes in all)` while the weights
    /// go there (not at all when another executor of the model already put them there).
    pub fn new(
        model: Arc<Model>,
        spec: &ExecSpec,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<CudaExec, ExecError> {
        let s = cuda_session(&model, spec, progress)?;
        let n_slots = spec.slots.max(1);
        Ok(CudaExec {
            slots: Slots::device(n_slots, &spec.layout),
            seqs: Vec::with_capacity(n_slots),
            logits: vec![0.0; model.config.vocab_size],
            rt: Runtime::new(1),
            s,
            model,
        })
    }
}

/// A session's buffers and KV cache on the GPU for `spec.slots` sequences (the weights
/// uploaded first, unless another session of the model already holds them there).
pub fn cuda_session(
    model: &Arc<Model>,
    spec: &ExecSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<CudaSession>, ExecError> {
    if model.config.arch.is_encoder() {
        return Err(ExecError::Encoder {
            arch: model.config.arch_name.clone(),
            what: "the CUDA backend does not run encoders; use --device cpu",
        });
    }
    let ring = spec.layout.offload_ring(spec.kv_type, spec.kv_budget)?;
    let gpu = super::open()?;
    let w = device_weights(&gpu, model, progress)?;
    let sizes = cuda_sizes(spec, ring);
    Ok(Box::new(CudaSession::new(
        gpu,
        w,
        model,
        sizes,
        &spec.layout,
    )?))
}

/// How the GPU session of an executor so specified is sized (`ring`: the layers of an
/// offloaded KV cache the device holds, `KvLayout::offload_ring`). The memory plan sizes the
/// device's allocations with this.
pub fn cuda_sizes(spec: &ExecSpec, ring: Option<usize>) -> CudaSizes {
    CudaSizes {
        max_rows: spec.scratch.max_tokens,
        logit_rows: spec.scratch.logit_rows,
        n_ctx: spec.n_ctx.max(1),
        slots: spec.slots.max(1),
        kv_type: spec.kv_type,
        kv_ring: ring,
    }
}

/// `m`'s weights on `gpu`: uploaded by the first session of a model, shared by the sessions
/// alive at the same time (freed with the last of them).
fn device_weights(
    gpu: &Gpu,
    m: &Arc<Model>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Arc<DeviceWeights>, CudaError> {
    type Resident = Vec<(Weak<Model>, Weak<DeviceWeights>)>;
    static RESIDENT: Mutex<Resident> = Mutex::new(Vec::new());
    let mut r = RESIDENT.lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|(m, w)| m.strong_count() > 0 && w.strong_count() > 0);
    let same = |(w, _): &&(Weak<Model>, Weak<DeviceWeights>)| w.as_ptr() == Arc::as_ptr(m);
    if let Some(dw) = r.iter().find(same).and_then(|(_, d)| d.upgrade()) {
        return Ok(dw);
    }
    let dw = Arc::new(DeviceWeights::upload(gpu, m, progress)?);
    r.push((Arc::downgrade(m), Arc::downgrade(&dw)));
    Ok(dw)
}

fn device(e: CudaError) -> ForwardError {
    ForwardError::Device(e.to_string())
}

impl Executor for CudaExec {
    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn max_rows(&self) -> usize {
        self.s.sizes().max_rows
    }

    fn forward(
        &mut self,
        rows: &[SlotRows],
        tokens: &[u32],
        want: Logits<'_>,
        _solo: bool,
    ) -> Result<(), ForwardError> {
        let mut views = slot_views(std::mem::take(&mut self.seqs), &mut self.slots, rows)?;
        let m = &*self.model;
        let step = &mut CudaStep { m, s: &mut self.s };
        let r = forward_batch(m, step, &mut views, tokens, want);
        self.seqs = recycle(views);
        r
    }

    fn fetch_logits(&mut self) -> Result<(), ForwardError> {
        let l = self.s.logits(0..1).map_err(device)?;
        self.logits.copy_from_slice(l);
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
        self.s.argmax(out.len(), out).map_err(device)
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

    fn share_threads(&mut self, _target: &dyn Executor) {
        // (Its one host thread is its own.)
    }

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

/// The GPU's own settings and counters, on whatever holds an executor (nothing, `None`,
/// where it runs on another device).
pub trait OnCuda: HasExecutor {
    /// The session on the GPU, if the executor runs there.
    fn cuda(&self) -> Option<&CudaSession> {
        let e = self.executor().as_any().downcast_ref::<CudaExec>()?;
        Some(&e.s)
    }

    fn cuda_mut(&mut self) -> Option<&mut CudaSession> {
        let e = self
            .executor_mut()
            .as_any_mut()
            .downcast_mut::<CudaExec>()?;
        Some(&mut e.s)
    }

    /// Record decode steps as CUDA graphs (the default) or launch every op (for comparison).
    fn set_cuda_graphs(&mut self, on: bool) {
        if let Some(s) = self.cuda_mut() {
            s.use_graphs = on;
        }
    }

    /// Fuse ops on the GPU (the default) or launch each alone (for comparison).
    fn set_cuda_fusion(&mut self, on: bool) {
        if let Some(s) = self.cuda_mut() {
            s.set_fusion(on);
        }
    }

    /// The CPU's f16 attention arithmetic on short decode contexts, or f32
    /// (`KILN_CUDA_MIRROR=0`).
    fn set_cuda_mirror(&mut self, on: bool) {
        if let Some(s) = self.cuda_mut() {
            s.set_mirror(on);
        }
    }
}

impl<T: HasExecutor + ?Sized> OnCuda for T {}
