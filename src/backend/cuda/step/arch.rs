//! The ops some architectures add to LLaMA's block: Gemma-2's soft cap of the output logits,
//! Mistral-3's attention temperature (the queries scaled by a factor of their position), and
//! the FFN's input copied from the stream where a block has no input norm (OLMo-2, EXAONE 4).
//! Each is the CPU's arithmetic on the device (kernels/elementwise.cu).

use super::{Arg, Buf, CudaSession};
use crate::kernels::ops::AttnTemp;

impl CudaSession {
    /// `buf = cap · tanh(buf / cap)` over `rows` rows (`softcap_f32`: `x · (1 / cap)`, as
    /// the CPU's `softcap_inplace` multiplies by the inverse).
    pub(super) fn softcap(&mut self, buf: Buf, cap: f32, rows: usize) {
        let p = self.buf(buf);
        self.reading(p);
        self.writes(buf);
        self.xq_holds = None;
        let n = rows * self.w(buf);
        let args = [Arg::P(p), Arg::F(1.0 / cap), Arg::F(cap), Arg::L(n as i64)];
        self.elementwise("softcap_f32", &args, n);
    }

    /// `Q[j] *= t.factor(position of row j)`, the factor computed on the device from the
    /// step's positions (a recorded step replays it at the next positions) as
    /// [`AttnTemp::factor`] computes it (`attn_temp_f32`).
    pub(super) fn attn_temperature(&mut self, t: AttnTemp, rows: usize) {
        let p = self.buf(Buf::Q);
        self.reading(p);
        self.writes(Buf::Q);
        self.xq_holds = None;
        let width = self.w(Buf::Q);
        let n = rows * width;
        let args = [
            Arg::P(p),
            Arg::P(self.at(self.layout.pos)),
            Arg::I(width as i32),
            Arg::F(t.scale),
            Arg::I(t.floor as i32),
            Arg::L(n as i64),
        ];
        self.elementwise("attn_temp_f32", &args, n);
    }

    /// `dst = src` over `rows` rows.
    pub(super) fn copy_rows(&mut self, dst: Buf, src: Buf, rows: usize) {
        let (d, x) = (self.buf(dst), self.buf(src));
        self.reading(x);
        self.writes(dst);
        self.xq_holds = None;
        let n = rows * self.w(dst);
        self.elementwise("copy_f32", &[Arg::P(d), Arg::P(x), Arg::L(n as i64)], n);
    }
}
