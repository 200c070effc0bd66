//! The CPU's executor: a KV cache per slot (in RAM, or a file streamed through a ring of layer
//! buffers), the scratch of one pass and the thread pool; passes run the forward pass over
//! the CPU backend ([`crate::model::forward::forward_batch_cpu`]).

use std::any::Any;
use std::sync::Arc;

use crate::backend::cpu::Runtime;
use crate::backend::exec::{recycle, slot_views, ExecError, ExecSpec, Executor, SlotRows};
use crate::backend::{ForwardError, Logits, SeqBatch};
use crate::cache::{KvCache, KvCacheError, Scratch, Slots};
use crate::kernels::attention::SoloAttention;
use crate::model::forward::forward_batch_cpu;
use crate::model::Model;

/// The CPU's weights (the model's own), caches and scratch.
pub struct CpuExec {
    model: Arc<Model>,
    rt: Runtime,
    scratch: Scratch,
    /// Single-thread attention scratch per pool thread, for passes of short decode rows.
    solo: Option<SoloAttention>,
    slots: Slots<KvCache>,
    /// The allocation of a pass's sequence views.
    seqs: Vec<SeqBatch<'static>>,
}

impl CpuExec {
    pub fn new(model: Arc<Model>, spec: &ExecSpec) -> Result<CpuExec, ExecError> {
        let c = &model.config;
        let (layout, ty) = (&spec.layout, spec.kv_type);
        let ring = layout.offload_ring(ty, spec.kv_budget)?;
        let slots = (0..spec.slots.max(1))
            .map(|_| match ring {
                None => KvCache::with_type(layout.clone(), ty).map_err(KvCacheError::Type),
                Some(r) => KvCache::offloaded(layout.clone(), ty, r),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let solo = spec.solo.then(|| {
            SoloAttention::new(
                c.n_heads,
                c.n_kv_heads,
                c.head_dim_k,
                c.head_dim_v,
                spec.n_threads,
                ty,
            )
        });
        Ok(CpuExec {
            rt: Runtime::new(spec.n_threads),
            scratch: Scratch::new(c, spec.scratch),
            solo,
            seqs: Vec::with_capacity(slots.len()),
            slots: Slots::new(slots),
            model,
        })
    }
}

impl Executor for CpuExec {
    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn max_rows(&self) -> usize {
        self.scratch.spec.max_tokens
    }

    fn forward(
        &mut self,
        rows: &[SlotRows],
        tokens: &[u32],
        want: Logits<'_>,
        solo: bool,
    ) -> Result<(), ForwardError> {
        let mut views = slot_views(std::mem::take(&mut self.seqs), &mut self.slots, rows)?;
        let solo = if solo { self.solo.as_mut() } else { None };
        let (m, rt, s) = (&*self.model, &self.rt, &mut self.scratch);
        let r = forward_batch_cpu(m, rt, &mut views, s, tokens, want, solo);
        self.seqs = recycle(views);
        r
    }

    fn fetch_logits(&mut self) -> Result<(), ForwardError> {
        // (The pass wrote them in host memory.)
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        &self.scratch.logits[..self.model.config.vocab_size]
    }

    fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.scratch.logits[..self.model.config.vocab_size]
    }

    fn argmax_on_device(&self) -> bool {
        false
    }

    fn argmax(&mut self, out: &mut [u32]) -> Result<(), ForwardError> {
        let v = self.model.config.vocab_size;
        for (o, row) in out.iter_mut().zip(self.scratch.logits.chunks(v)) {
            *o = crate::sampler::argmax(row);
        }
        Ok(())
    }

    crate::backend::exec::slot_bookkeeping!();

    fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> usize {
        self.slots.copy_prefix(dst, src, n, |d, s, n| {
            d.copy_prefix_from(s, n)
                .expect("slots share one layout, so a prefix of one fits another")
        })
    }

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn share_threads(&mut self, target: &dyn Executor) {
        if target.as_any().is::<CpuExec>() {
            self.rt = target.runtime().sharing();
        }
    }

    fn kv_bytes(&self) -> usize {
        self.slots.iter().map(KvCache::bytes).sum()
    }

    fn host_scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    fn kv_cache(&self, slot: usize) -> Option<&KvCache> {
        self.slots.get(slot)
    }

    fn scratch(&self) -> Option<&Scratch> {
        Some(&self.scratch)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
