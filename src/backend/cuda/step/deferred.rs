//! Norms left to the products that read them. A decode step's RMS norm before narrow products
//! (the attention's projections, the FFN's first products, in models of up to 2048 wide) is
//! not launched: each block of those products normalizes and quantizes the rows itself
//! (`matvec_*_f`, `gated_*_f` with norm weights), as `rms_norm_q8` would, bit for bit. One
//! launch fewer per norm.
//!
//! The norm's output buffer is then never written. The forward pass reads it only through
//! those products, and writes it again (the next norm) before anything else reads it; the
//! session checks that: any other op that reads the buffer first launches the norm after all
//! ([`CudaSession::settle`]), and a read after the products, once the norm's input may have
//! changed, is an error instead of stale numbers.

use super::products::Epilogue;
use super::{CudaSession, Mat};
use crate::backend::cuda::gpu::Arg;
use crate::backend::cuda::weights::{DevMat, DevNorm};
use crate::backend::cuda::CudaError;
use crate::backend::NormW;
use crate::model::NormKind;

/// An RMS norm of rows `x` into `y` that the products reading `y` do themselves.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeferredNorm {
    pub(super) n: DevNorm,
    pub(super) x: u64,
    pub(super) y: u64,
    pub(super) rows: usize,
    readers: [Option<Mat>; 3],
}

impl CudaSession {
    /// Leave the norm of `rows` whole rows `x` → `y` (`x` ≠ `y`) to its readers `mats` when
    /// every one of them can take it; true if so (nothing launched).
    pub(super) fn defer_norm(
        &mut self,
        mats: [Option<Mat>; 3],
        n: DevNorm,
        x: u64,
        y: u64,
        rows: usize,
    ) -> bool {
        // Every reader takes its kernel over f32 input on y (`own_input`'s rule: narrow rows,
        // a few tokens, the switches on), over whole rows of the norm.
        let ok = n.kind == NormKind::Rms
            && x != y
            && mats[0].is_some()
            && mats.into_iter().flatten().all(|m| {
                let m = self.w.mat(m);
                m.cols == n.len && self.own_input(m.kernels.matvec_f32, m, y, rows).is_some()
            });
        if ok {
            self.settle();
            self.deferred = Some(DeferredNorm {
                n,
                x,
                y,
                rows,
                readers: mats,
            });
            self.skipped = None;
        }
        ok
    }

    /// The deferred norm whose output is `x` for `rows` rows, if there is one.
    pub(super) fn deferred_for(&self, x: u64, rows: usize) -> Option<DeferredNorm> {
        self.deferred.filter(|d| d.y == x && d.rows == rows)
    }

    /// Launch the deferred norm after all (an op other than its products reads its output).
    pub(super) fn settle(&mut self) {
        if let Some(d) = self.deferred.take() {
            if !self.norm_quantized(d.readers, d.n, d.x, 0, d.y, d.rows) {
                // (Whole rows, the norm's width: one group each.)
                self.norm_groups(d.n, d.x, 0, d.y, d.rows);
            }
        }
    }

    /// The products that read `x` are done: if it is a deferred norm's output, that buffer
    /// stays unwritten.
    pub(super) fn consumed_by(&mut self, x: u64) {
        if let Some(d) = self.deferred.take_if(|d| d.y == x) {
            self.skipped = Some(d.y);
        }
    }

    /// An op reads buffer `p`: launch a deferred norm into it; refuse to read one whose
    /// products were done without writing it.
    pub(super) fn reading(&mut self, p: u64) {
        if self.deferred.is_some_and(|d| d.y == p) {
            self.settle();
        }
        self.settle_held(p);
        if self.skipped == Some(p) {
            self.err.get_or_insert(CudaError::Driver(
                "internal: a norm's output was read after its products normalized for \
                 themselves (the forward pass must norm again before reading it)"
                    .into(),
            ));
        }
    }

    /// An op writes buffer `p`: a deferred norm that reads or writes it is launched first; a
    /// skipped output that it overwrites is whole again.
    pub(super) fn writing(&mut self, p: u64) {
        if self.deferred.is_some_and(|d| d.x == p || d.y == p) {
            self.settle();
        }
        self.settle_held(p);
        if self.skipped == Some(p) {
            self.skipped = None;
        }
    }
}

/// A post-norm held back for the residual add after it (Gemma-3 normalizes a block's output,
/// in place, before adding it to the residual stream): `add` then launches both as one
/// (`rms_norm_add_f32`, the same bits as the norm and the add).
#[derive(Clone, Copy, Debug)]
pub(super) struct PostNorm {
    n: DevNorm,
    y: u64,
    rows: usize,
}

impl CudaSession {
    /// Hold back the post-norm `w` (RMS, fusion on) of `rows` whole rows of `y`, in place, for
    /// the add that reads it; true if held (nothing launched).
    pub(super) fn defer_post_norm(&mut self, w: NormW, n: DevNorm, y: u64, rows: usize) -> bool {
        let ok = matches!(w, NormW::AttnPost(_) | NormW::FfnPost(_));
        if ok {
            // (One held at a time: an earlier one, never consumed, runs as asked.)
            if let Some(h) = self.post_norm.take() {
                self.launch_post_norm(h);
            }
            self.post_norm = Some(PostNorm { n, y, rows });
        }
        ok
    }

    /// `dst += src` over `rows` rows when `src` is the held post-norm's output: the norm and
    /// the add in one launch; true if so.
    pub(super) fn post_norm_add(&mut self, dst: u64, src: u64, rows: usize) -> bool {
        let Some(p) = self.post_norm.take_if(|p| p.y == src && p.rows == rows) else {
            return false;
        };
        let args = [
            Arg::P(dst),
            Arg::P(src),
            Arg::P(p.n.w),
            Arg::I(p.n.len as i32),
            Arg::F(p.n.eps),
        ];
        self.go("rms_norm_add_f32", rows as u32, 256, &args);
        true
    }

    /// An op other than the add reads or writes buffer `p`: launch the norms held back for
    /// ops that touch it after all (a post-norm, the head norms).
    fn settle_held(&mut self, p: u64) {
        if let Some(h) = self.post_norm.take_if(|h| h.y == p) {
            self.launch_post_norm(h);
        }
        self.settle_head_norms(p);
    }

    /// The epilogue that adds post-norm `w` of the decode-sized product of `m` over x to the
    /// residual stream `dst` (`matvec_post`: the product's last block normalizes the rows and
    /// adds them, as `rms_norm_add_f32` would), if its kernel over f32 input applies.
    pub(super) fn post_norm_epilogue(
        &self,
        w: NormW,
        m: DevMat,
        x: u64,
        dst: u64,
        rows: usize,
    ) -> Option<Epilogue<'static>> {
        let n = self.w.norm(w);
        let ok = self.post_in_products
            && n.kind == NormKind::Rms
            && n.len == m.rows
            && self.own_input(m.kernels.matvec_post, m, x, rows).is_some();
        ok.then(|| {
            Epilogue::PostNorm([
                Arg::P(dst),
                Arg::P(n.w),
                Arg::F(n.eps),
                Arg::P(self.at(self.layout.post_count)),
            ])
        })
    }

    /// The held post-norm `h` in a launch of its own (`rms_norm_f32`, in place).
    fn launch_post_norm(&mut self, h: PostNorm) {
        self.norm_groups(h.n, h.y, 0, h.y, h.rows);
    }
}
