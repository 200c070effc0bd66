//! The executor: what the engine drives a device through, without naming it.
//!
//! An executor owns everything of one device that a model's sequences need: the weights as
//! the device reads them, a KV cache slot per sequence, the activation scratch and the logits
//! rows. The engine hands it the rows of one forward pass (several slots' tokens: decode
//! tokens, prefill chunks, verification passes) and asks for the logits it wants; it keeps
//! the tokens of each slot itself and tells the executor when a slot's cache rolls back,
//! resets or takes over another slot's prefix. The CPU's executor is
//! [`super::cpu::exec::CpuExec`], the GPU's `super::cuda::exec::CudaExec`;
//! [`super::open::executor`] makes the one a [`Device`] names.

use std::any::Any;

use super::cpu::Runtime;
use super::{cuda, Device, ForwardError, Logits, SeqBatch};
use crate::cache::{KvBudgetError, KvCache, KvCacheError, KvLayout, KvOverflow, KvType};
use crate::cache::{Scratch, ScratchSpec};

/// One slot's rows of a forward pass: its next `n_tokens` of the pass's tokens (consecutive,
/// after the previous slots'), each row computed as a decode step of it alone would be with
/// `alone` ([`SeqBatch::alone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRows {
    pub slot: usize,
    pub n_tokens: usize,
    pub alone: bool,
}

/// How an executor is sized: everything it allocates, once.
#[derive(Clone, Debug)]
pub struct ExecSpec {
    pub device: Device,
    /// KV cache slots (sequences held at once).
    pub slots: usize,
    /// Context positions of each slot.
    pub n_ctx: usize,
    /// The CPU's threads (an executor on another device keeps one thread for host work).
    pub n_threads: usize,
    /// Every slot's cache geometry.
    pub layout: KvLayout,
    pub kv_type: KvType,
    /// RAM for a slot's KV cache: past it, the cache lives in a file and a ring of layer
    /// buffers fitting this budget is streamed (None = always in RAM).
    pub kv_budget: Option<usize>,
    /// The activation rows and logits rows of one pass.
    pub scratch: ScratchSpec,
    /// Keep the CPU's single-thread attention scratch, for passes of several short decode
    /// rows (a batch runner's steps).
    pub solo: bool,
}

/// Why an executor could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    KvBudget(#[from] KvBudgetError),
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
    #[error(transparent)]
    Device(#[from] cuda::CudaError),
    #[error(transparent)]
    Vulkan(#[from] super::vulkan::VulkanError),
    /// The device does not run encoders (embedding models).
    #[error("'{arch}' is an encoder (an embedding model): {what}")]
    Encoder { arch: String, what: &'static str },
}

/// The slot methods of an [`Executor`] whose slots are a `slots: cache::Slots` field: lengths,
/// fit checks, rollbacks and resets kept the same way on every device (`copy_prefix` is the
/// device's own: it moves the rows).
macro_rules! slot_bookkeeping {
    () => {
        fn kv_len(&self, slot: usize) -> usize {
            self.slots.kv_len(slot)
        }

        fn check_fits(&self, slot: usize, n: usize) -> Result<(), crate::cache::KvOverflow> {
            self.slots.check_fits(slot, n)
        }

        fn rollback(&mut self, slot: usize, n: usize) -> usize {
            self.slots.rollback(slot, n)
        }

        fn reset(&mut self, slot: usize) {
            self.slots.reset(slot);
        }
    };
}
pub(crate) use slot_bookkeeping;

/// A device's weights, KV slots and scratch, driven by the engine one forward pass at a time.
pub trait Executor: Send {
    /// KV cache slots.
    fn n_slots(&self) -> usize;

    /// Most tokens of one forward pass.
    fn max_rows(&self) -> usize;

    /// Run `tokens` after each listed slot's cached ones (`rows` by increasing slot, their
    /// `n_tokens` summing to `tokens.len()`) as one forward pass, advancing their caches.
    /// [`Logits::Last`] and [`Logits::Kept`] leave their rows' logits on the device, for
    /// [`Executor::fetch_logits`] or [`Executor::argmax`]. With `solo`, the CPU may run a
    /// pass of short decode rows' attention one sequence per thread (same bits).
    fn forward(
        &mut self,
        rows: &[SlotRows],
        tokens: &[u32],
        want: Logits<'_>,
        solo: bool,
    ) -> Result<(), ForwardError>;

    /// Bring the first logits row of the last [`Logits::Last`] or [`Logits::Kept`] pass to
    /// [`Executor::logits`].
    fn fetch_logits(&mut self) -> Result<(), ForwardError>;

    /// `[vocab]`: the logits [`Executor::fetch_logits`] brought.
    fn logits(&self) -> &[f32];

    fn logits_mut(&mut self) -> &mut [f32];

    /// Whether [`Executor::argmax`] saves bringing the logits over (they live on a device).
    fn argmax_on_device(&self) -> bool;

    /// The most likely token of each of the first `out.len()` logits rows of the last
    /// [`Logits::Last`] or [`Logits::Kept`] pass, computed where the logits are (the first of
    /// equals, NaN lowest: [`crate::sampler::argmax`]).
    fn argmax(&mut self, out: &mut [u32]) -> Result<(), ForwardError>;

    /// Positions held by slot `slot`'s cache.
    fn kv_len(&self, slot: usize) -> usize;

    /// Refuse `n` more tokens that would not fit slot `slot`'s cache.
    fn check_fits(&self, slot: usize, n: usize) -> Result<(), KvOverflow>;

    /// Keep the first `n` positions of slot `slot`; returns how many are kept (fewer where
    /// its sliding-window rings no longer hold the window before `n`: see
    /// [`KvCache::rollback`]).
    fn rollback(&mut self, slot: usize, n: usize) -> usize;

    /// Forget slot `slot`'s cache.
    fn reset(&mut self, slot: usize);

    /// Make slot `dst`'s cache hold the first `n` positions of slot `src`'s (`dst != src`;
    /// `n` at most what `src` holds); returns how many it holds (0 where `src`'s rings no
    /// longer hold the window before `n`, or the device failed).
    fn copy_prefix(&mut self, dst: usize, src: usize, n: usize) -> usize;

    /// The CPU's threads.
    fn runtime(&self) -> &Runtime;

    /// Run on `target`'s CPU threads where both run there (a draft model's executor, stepped
    /// between `target`'s passes from the same thread: two pools would each keep their
    /// workers spinning while the other's run).
    fn share_threads(&mut self, target: &dyn Executor);

    /// Bytes of the KV caches of every slot.
    fn kv_bytes(&self) -> usize;

    /// Bytes of the scratch in host memory (what the memory plan's "scratch (activations)"
    /// counts; a device's is device memory).
    fn host_scratch_bytes(&self) -> usize;

    /// Slot `slot`'s cache where it is a [`KvCache`] (in RAM or a file).
    fn kv_cache(&self, _slot: usize) -> Option<&KvCache> {
        None
    }

    /// The scratch buffers where they are in host memory.
    fn scratch(&self) -> Option<&Scratch> {
        None
    }

    /// This executor as its own type (a device's own settings and counters).
    fn as_any(&self) -> &dyn Any;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What holds an executor (a session, a batch runner): a device's own settings reach it
/// through this (`backend::cuda::exec::OnCuda`).
pub trait HasExecutor {
    fn executor(&self) -> &dyn Executor;
    fn executor_mut(&mut self) -> &mut dyn Executor;
}

/// The views of the slots in `rows` (by increasing slot) over `slots`, in `buf`'s allocation.
pub fn slot_views<'a, K>(
    buf: Vec<SeqBatch<'static, K>>,
    slots: &'a mut [K],
    rows: &[SlotRows],
) -> Result<Vec<SeqBatch<'a, K>>, ForwardError> {
    let n_slots = slots.len();
    let mut views = recycle(buf);
    let mut next = rows.iter().peekable();
    for (i, kv) in slots.iter_mut().enumerate() {
        if let Some(r) = next.next_if(|r| r.slot == i) {
            views.push(SeqBatch {
                kv,
                n_tokens: r.n_tokens,
                alone: r.alone,
            });
        }
    }
    if views.len() != rows.len() {
        return Err(ForwardError::Device(format!(
            "a pass's slots must be distinct, increasing and below {n_slots}"
        )));
    }
    Ok(views)
}

/// An empty vector of sequence views for another lifetime, keeping the allocation: the items'
/// types differ only in lifetimes, so `collect` reuses the buffer in place (no value crosses:
/// the vector is emptied first). `tests/decode_alloc.rs` checks that a step allocates nothing.
pub fn recycle<'b, K>(mut v: Vec<SeqBatch<'_, K>>) -> Vec<SeqBatch<'b, K>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(slots: &[(usize, usize)]) -> Vec<SlotRows> {
        slots
            .iter()
            .map(|&(slot, n_tokens)| SlotRows {
                slot,
                n_tokens,
                alone: slot == 2,
            })
            .collect()
    }

    #[test]
    fn a_pass_views_its_slots_in_order() {
        let mut slots = [10u32, 11, 12, 13];
        let views = slot_views(Vec::with_capacity(4), &mut slots, &rows(&[(0, 3), (2, 1)]));
        let views = views.unwrap();
        let seen: Vec<_> = views.iter().map(|v| (*v.kv, v.n_tokens, v.alone)).collect();
        assert_eq!(seen, [(10, 3, false), (12, 1, true)]);
        // The allocation comes back empty, for the next pass.
        let back: Vec<SeqBatch<'static, u32>> = recycle(views);
        assert!(back.is_empty() && back.capacity() >= 4);
    }

    #[test]
    fn a_pass_with_slots_out_of_order_repeated_or_missing_is_refused() {
        let mut slots = [0u32; 3];
        for bad in [&[(1, 1), (0, 1)][..], &[(1, 1), (1, 1)], &[(3, 1)]] {
            let r = slot_views(Vec::new(), &mut slots, &rows(bad));
            assert!(
                matches!(r, Err(ForwardError::Device(ref m)) if m.contains("increasing")),
                "{bad:?}"
            );
        }
    }
}
