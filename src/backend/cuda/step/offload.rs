//! A KV cache offloaded to host memory (`--kv-budget` on the GPU, as `cache::offload` on the CPU): the layers of
//! the whole context live in page-locked host memory, laid out as the device cache would be
//! (sliding-window layers keep their rings on the device, as on the CPU); the device holds a
//! ring of `R` layer slots, and a second stream streams the layers through it while the
//! kernels run.
//!
//! A forward pass visits the `L` offloaded layers in order; visit `v` (counted across steps)
//! uses ring slot `v mod R`. Around offloaded layer `l`:
//!
//! ```text
//! kv_at(l)       the compute stream waits until slot (v mod R) holds layer l (its load)
//! store / attend the step's new positions are written into the slot, attention reads it
//! end_layer(l)   the copy stream waits for the attention, writes the new positions of layer
//!                l back to host memory, then loads the layer of visit v + R into the slot:
//!                layer l + R of this step (positions 0..len), or, past the last layer, layer
//!                l + R − L of the next step (positions 0..len + n)
//! ```
//!
//! So while layer `l` computes, the next `R − 1` layers are loading or loaded. The bytes the
//! attention reads are those a resident cache holds at the same offsets: results are
//! bit-identical. Positions past a later rollback are overwritten by the step that reuses
//! them before anything reads them, as in a resident cache. A step with an offloaded cache
//! runs without a graph (its copies vary with the length); it holds one sequence.

use std::ops::Range;

use super::layout::{KvLayerAt, RingLayout};
use super::CudaSession;
use crate::backend::cuda::gpu::{Gpu, Stream};
use crate::backend::cuda::pinned::{Event, HostArena, Strided};
use crate::backend::cuda::CudaError;

/// What a session with an offloaded cache keeps besides its device ring.
pub(super) struct Offload {
    /// Every layer's keys and values (`SessionLayout::kv` offsets).
    host: HostArena,
    ring: RingLayout,
    /// The stream the copies go on.
    copy: Stream,
    /// Per slot: its last load is done (recorded on `copy`); its last reader is done
    /// (recorded on the session's stream).
    loaded: Vec<Event>,
    freed: Vec<Event>,
    /// The offloaded layers, in the order a pass visits them.
    order: Vec<usize>,
    /// Offloaded layers visited so far, over every step.
    visits: usize,
    /// The layer being computed and its slot.
    current: Option<(usize, usize)>,
    /// The step's sequence: its first new position and how many it writes.
    len0: usize,
    n: usize,
}

impl Offload {
    /// The ring `ring` for a cache of layers `layers` (the offloaded ones stream through it).
    pub(super) fn new(
        gpu: &Gpu,
        ring: RingLayout,
        layers: &[KvLayerAt],
    ) -> Result<Offload, CudaError> {
        let events = || {
            (0..ring.layers)
                .map(|_| Event::new(gpu))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Offload {
            host: HostArena::new(gpu, ring.host_bytes)?,
            copy: gpu.stream()?,
            loaded: events()?,
            freed: events()?,
            order: (0..layers.len()).filter(|&l| layers[l].offloaded).collect(),
            visits: 0,
            current: None,
            len0: 0,
            n: 0,
            ring,
        })
    }

    /// Bytes of host memory the cache takes.
    pub(super) fn host_bytes(&self) -> usize {
        self.host.bytes()
    }
}

/// The rows positions `p0..p1` occupy in a layer of `rows` rows (position `p` at row
/// `p mod rows`): up to two runs.
fn runs(p0: usize, p1: usize, rows: usize) -> [Range<usize>; 2] {
    if p1 <= p0 || rows == 0 {
        return [0..0, 0..0];
    }
    if p1 - p0 >= rows {
        return [0..rows, 0..0];
    }
    let (r0, r1) = (p0 % rows, p0 % rows + (p1 - p0));
    match r1 <= rows {
        true => [r0..r1, 0..0],
        false => [r0..rows, 0..r1 - rows],
    }
}

impl CudaSession {
    /// Start a step of `n` rows of one sequence whose first new position is `len0`.
    pub(super) fn offload_begin(&mut self, n_seqs: usize, len0: usize, n: usize) {
        let Some(o) = self.offload.as_mut() else {
            return;
        };
        let r = if n_seqs != 1 {
            Err(CudaError::Unsupported(format!(
                "a step of {n_seqs} sequences over a KV cache offloaded to host memory (one only)"
            )))
        } else if o.current.is_some() || !o.visits.is_multiple_of(o.order.len()) {
            Err(CudaError::Driver(
                "the offloaded KV cache's ring is out of step (a pass stopped between layers)"
                    .into(),
            ))
        } else {
            (o.len0, o.n) = (len0, n);
            Ok(())
        };
        self.fail(r);
    }

    /// Device addresses of layer `layer`'s keys and values: in the cache, or (offloaded) in
    /// its ring slot, once the slot holds it.
    pub(super) fn kv_at(&mut self, layer: usize) -> (u64, u64) {
        let at = self.layout.kv[layer];
        let Some(o) = self.offload.as_mut().filter(|_| at.offloaded) else {
            return (self.kv.ptr(at.k), self.kv.ptr(at.v));
        };
        let slot = match o.current {
            Some((l, slot)) if l == layer => Ok(slot),
            _ if o.order[o.visits % o.order.len()] != layer => Err(CudaError::Driver(format!(
                "layer {layer} of an offloaded KV cache visited out of order"
            ))),
            _ => {
                let slot = o.visits % o.ring.layers;
                o.current = Some((layer, slot));
                o.loaded[slot].wait_on(&self.stream).map(|()| slot)
            }
        };
        let base = o.ring.at + o.ring.slot_bytes * slot.as_ref().copied().unwrap_or(0);
        self.fail(slot.map(|_| ()));
        (self.kv.ptr(base), self.kv.ptr(base + RingLayout::v_at(&at)))
    }

    /// After layer `layer`'s attention (offloaded): write its new positions back to host
    /// memory, then load the layer that visits its slot next.
    pub(super) fn offload_end_layer(&mut self, layer: usize) {
        let Some(o) = self.offload.as_mut() else {
            return;
        };
        if !self.layout.kv[layer].offloaded {
            return;
        }
        let Some((l, slot)) = o.current.take().filter(|&(l, _)| l == layer) else {
            let e = CudaError::Driver(format!(
                "layer {layer} of an offloaded KV cache ended unstarted"
            ));
            return self.fail(Err(e));
        };
        let (len0, n, layers) = (o.len0, o.n, o.order.len());
        let ahead = o.visits % layers + o.ring.layers;
        o.visits += 1;
        let (next, upto) = match ahead < layers {
            true => (o.order[ahead], len0),
            false => (o.order[ahead - layers], len0 + n),
        };
        let r = self.stream_slot(slot, (l, len0..len0 + n), (next, upto));
        self.fail(r);
    }

    /// Once the attention reading slot `slot` is done: write positions `back.1` of layer
    /// `back.0` from it to host memory, then load positions `0..load.1` of layer `load.0`.
    fn stream_slot(
        &mut self,
        slot: usize,
        back: (usize, Range<usize>),
        load: (usize, usize),
    ) -> Result<(), CudaError> {
        if let Some(o) = &self.offload {
            o.freed[slot].record(&self.stream)?;
            o.freed[slot].wait_on(&o.copy)?;
        }
        self.layer_copy(back.0, slot, back.1, false)?;
        self.layer_copy(load.0, slot, 0..load.1, true)?;
        match &self.offload {
            Some(o) => o.loaded[slot].record(&o.copy),
            None => Ok(()),
        }
    }

    /// Copy positions `pos` of layer `layer` between host memory and ring slot `slot`: every
    /// kv head's rows, keys and values (`up`: to the device).
    fn layer_copy(
        &mut self,
        layer: usize,
        slot: usize,
        pos: Range<usize>,
        up: bool,
    ) -> Result<(), CudaError> {
        let at: KvLayerAt = self.layout.kv[layer];
        let (heads, (row_k, row_v)) = (self.layout.kv_heads, self.layout.row_bytes);
        let Some(o) = self.offload.as_mut() else {
            return Ok(());
        };
        let base = o.ring.at + slot * o.ring.slot_bytes;
        let parts = [
            (at.k, base, row_k),
            (at.v, base + RingLayout::v_at(&at), row_v),
        ];
        for run in runs(pos.start, pos.end, at.rows) {
            for (host, dev, row) in parts {
                let c = Strided {
                    dev_off: dev + run.start * row,
                    host_off: host + run.start * row,
                    width: run.len() * row,
                    height: heads,
                    pitch: at.rows * row,
                };
                match up {
                    true => o.host.to_device(&o.copy, &self.kv, c)?,
                    false => o.host.from_device(&o.copy, &self.kv, c)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_cover_the_positions_of_a_ring_once() {
        for rows in [1, 5, 64] {
            for p0 in 0..3 * rows {
                for p1 in p0..p0 + 2 * rows {
                    let mut want: Vec<usize> = (p0..p1).map(|p| p % rows).collect();
                    want.sort_unstable();
                    want.dedup();
                    let mut got: Vec<usize> = runs(p0, p1, rows).into_iter().flatten().collect();
                    got.sort_unstable();
                    assert_eq!(got, want, "positions {p0}..{p1} over {rows} rows");
                }
            }
        }
    }
}
