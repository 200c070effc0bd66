//! The prompt products' weights, dequantized to bf16 ahead of their products on a second
//! stream (docs/gpu.md).
//!
//! A prompt-sized product dequantizes a chunk of weight rows into scratch, then multiplies it
//! (`products.rs`, `gemm`). The dequantization reads only weights, which no pass writes, so
//! nothing in the pass need come before it but the product that last read its buffer. Two
//! buffers are used in turn, and the dequantizations go on a stream of their own:
//!
//! ```text
//! chunk i, buffer b = i mod 2:
//!   second stream   waits freed[b] (the product of chunk i − 2), dequantizes, marks ready[b]
//!   session stream  waits ready[b], multiplies, marks freed[b]
//! ```
//!
//! The host issues a pass's work far ahead of the GPU, so chunk i + 1 is dequantized while
//! chunk i is multiplied (and while the norms, RoPE and attention between products run): the
//! session's stream meets only products. At the first chunk of a pass, the second stream
//! also waits for all the session's stream has issued so far (`joined`), so that it never
//! writes a buffer that earlier work, ordered only on the session's stream, may still read.
//!
//! Without a profile only (a profile times ops one at a time on the session's stream), and only
//! outside graph captures (a recorded step has no prompt-sized products: `MAX_GRAPH_ROWS`).
//! `KILN_CUDA_DEQUANT_AHEAD=0` dequantizes on the session's stream, into one buffer, as before
//! (for measuring; the layout then has one: `layout.rs`). On the software GPU a launch runs
//! when it is issued, on either stream, and events order nothing: the same work in the same
//! order.

use super::{Capture, CudaSession};
use crate::backend::cuda::gpu::{blocks_for, Arg, Gpu, Stream};
use crate::backend::cuda::pinned::Event;
use crate::backend::cuda::CudaError;

/// The second stream and its events.
pub(super) struct Ahead {
    stream: Stream,
    /// `ready[b]`: buffer b holds its chunk (recorded on the second stream).
    ready: [Event; 2],
    /// `freed[b]`: the product that read buffer b has run (recorded on the session's).
    freed: [Event; 2],
    /// The session's stream at the pass's first chunk.
    joined: Event,
    /// The pass in progress has joined.
    in_pass: bool,
}

impl Ahead {
    pub(super) fn new(gpu: &Gpu) -> Result<Ahead, CudaError> {
        let two = || -> Result<[Event; 2], CudaError> { Ok([Event::new(gpu)?, Event::new(gpu)?]) };
        Ok(Ahead {
            stream: gpu.stream_in_order()?,
            ready: two()?,
            freed: two()?,
            joined: Event::new(gpu)?,
            in_pass: false,
        })
    }
}

/// Where a chunk's dequantization went: its buffer's index, and whether the second stream
/// fills it (then the product marks it freed).
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    pub(super) buffer: usize,
    ahead: bool,
}

impl CudaSession {
    /// A new pass: the second stream joins the session's stream again at its first chunk.
    pub(super) fn ahead_begin(&mut self) {
        if let Some(a) = self.ahead.as_mut() {
            a.in_pass = false;
        }
    }

    /// Launch the dequantization `kernel` of `n` elements into the next weight buffer (`args`
    /// makes its arguments from that buffer's address), and make the session's stream wait
    /// for it: the chunk and the buffer's address. Call [`Self::chunk_read`] after the
    /// product that reads it.
    pub(super) fn dequantize_chunk(
        &mut self,
        kernel: &str,
        n: usize,
        args: impl FnOnce(u64) -> Vec<Arg>,
    ) -> Option<(Chunk, u64)> {
        let g = self.layout.gemm?;
        let buffer = self.wbf_next;
        self.wbf_next ^= usize::from(self.ahead.is_some());
        let w = self.at(g.wbf[buffer]);
        let args = args(w);
        let ahead = self.profile.is_none()
            && self.err.is_none()
            && matches!(self.capture, Capture::Direct)
            && self.ahead.is_some();
        if !ahead {
            self.elementwise(kernel, &args, n);
            return Some((Chunk { buffer, ahead }, w));
        }
        let a = self.ahead.as_mut()?;
        let mut r = Ok(());
        if !a.in_pass {
            a.in_pass = true;
            r = r
                .and_then(|()| a.joined.record(&self.stream))
                .and_then(|()| a.joined.wait_on(&a.stream));
        }
        let r = r
            .and_then(|()| a.freed[buffer].wait_on(&a.stream))
            .and_then(|()| {
                self.gpu
                    .launch(&a.stream, kernel, blocks_for(n), 256, &args)
            })
            .and_then(|()| a.ready[buffer].record(&a.stream))
            .and_then(|()| a.ready[buffer].wait_on(&self.stream));
        self.fail(r);
        Some((Chunk { buffer, ahead }, w))
    }

    /// The product reading `c`'s buffer has been issued on the session's stream: the next
    /// dequantization into it may start once that has run.
    pub(super) fn chunk_read(&mut self, c: Chunk) {
        if let (true, Some(a)) = (c.ahead, self.ahead.as_ref()) {
            let r = a.freed[c.buffer].record(&self.stream);
            self.fail(r);
        }
    }
}
