//! The kernels' typed dispatches: each checks its sizes against the regions it is given (a
//! clear error naming the op and the binding, never a kernel reading past a buffer) and
//! records one dispatch (two for the integer product: its activations' quantizer first).

use super::arena::Region;
use super::program::Recorder;
use super::shaders::{KernelId, WeightFormat};
use super::VulkanError;
use crate::kernels::ops::{Activation, RopeKind};
use crate::quant::GgmlType;

fn need(op: &'static str, binding: &str, r: &Region, bytes: usize) -> Result<(), VulkanError> {
    if (r.len as usize) < bytes {
        return Err(VulkanError::Bounds {
            what: op,
            detail: format!("{binding} holds {} bytes, {bytes} needed", r.len),
        });
    }
    Ok(())
}

fn bad(op: &'static str, detail: String) -> VulkanError {
    VulkanError::Bounds { what: op, detail }
}

/// A product's shape: `n_tok` input rows of `cols`, `rows` outputs each, added to the output
/// (`add`) or written.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub add: bool,
}

impl Product {
    fn check(&self, op: &'static str, fmt: WeightFormat, w: &Region) -> Result<u32, VulkanError> {
        let ty = match fmt {
            WeightFormat::F32 => GgmlType::F32,
            WeightFormat::F16 => GgmlType::F16,
            WeightFormat::Q8_0 => GgmlType::Q8_0,
            WeightFormat::Q4_0 => GgmlType::Q4_0,
            WeightFormat::Q4K => GgmlType::Q4K,
            WeightFormat::Q6K => GgmlType::Q6K,
        };
        if self.cols == 0 || !self.cols.is_multiple_of(ty.block_size().max(32)) {
            return Err(bad(
                op,
                format!(
                    "rows of {} values do not split into {ty}'s blocks of 32",
                    self.cols
                ),
            ));
        }
        let rb = ty
            .row_bytes(self.cols)
            .ok_or_else(|| bad(op, format!("rows of {} values of {ty}", self.cols)))?;
        need(op, "the weights", w, rb * self.rows)?;
        Ok(rb as u32)
    }

    fn push(&self, rb: u32) -> [u32; 5] {
        [
            self.rows as u32,
            self.cols as u32,
            self.n_tok as u32,
            self.add as u32,
            rb,
        ]
    }
}

/// `y (+)= x·Wᵀ` for decode rows: one workgroup a weight row, the weights dequantized to f32.
pub fn matvec(
    rec: &mut Recorder,
    fmt: WeightFormat,
    w: Region,
    x: Region,
    y: Region,
    p: Product,
) -> Result<(), VulkanError> {
    let rb = p.check("matvec", fmt, &w)?;
    need("matvec", "x", &x, p.n_tok * p.cols * 4)?;
    need("matvec", "y", &y, p.n_tok * p.rows * 4)?;
    let groups = rec.grid(p.rows)?;
    rec.dispatch(KernelId::Matvec(fmt), &[w, x, y], &p.push(rb), groups)
}

/// `y (+)= x·Wᵀ` for prompt rows: tiles of 16 weight rows × 16 input rows.
pub fn mm(
    rec: &mut Recorder,
    fmt: WeightFormat,
    w: Region,
    x: Region,
    y: Region,
    p: Product,
) -> Result<(), VulkanError> {
    let rb = p.check("mm", fmt, &w)?;
    need("mm", "x", &x, p.n_tok * p.cols * 4)?;
    need("mm", "y", &y, p.n_tok * p.rows * 4)?;
    let (gx, gy) = (p.rows.div_ceil(16), p.n_tok.div_ceil(16));
    if gx > 65535 || gy > 65535 {
        return Err(bad("mm", format!("{} × {} tiles", gx, gy)));
    }
    rec.dispatch(
        KernelId::Mm(fmt),
        &[w, x, y],
        &p.push(rb),
        [gx as u32, gy as u32, 1],
    )
}

/// Bytes of the 8-bit activations of `n` inputs ([`quantize_q8_0`]): 36 a block of 32.
pub fn q8_bytes(n: usize) -> usize {
    n / 32 * 36
}

/// `y (+)= x·Wᵀ` as integer products: `x` quantized to 8 bits into `xq` (Q8_0's rounding),
/// then each block's integer dot (the device's packed dot instructions where it has them)
/// scaled by both blocks' scales. For Q8_0 and Q4_0 weights.
pub fn matvec_int(
    rec: &mut Recorder,
    fmt: WeightFormat,
    w: Region,
    x: Region,
    xq: Region,
    y: Region,
    p: Product,
) -> Result<(), VulkanError> {
    if !fmt.has_int() {
        return Err(VulkanError::Unsupported(format!(
            "an integer product of {fmt:?} weights"
        )));
    }
    let rb = p.check("matvec_int", fmt, &w)?;
    need("matvec_int", "x", &x, p.n_tok * p.cols * 4)?;
    need("matvec_int", "xq", &xq, q8_bytes(p.n_tok * p.cols))?;
    need("matvec_int", "y", &y, p.n_tok * p.rows * 4)?;
    let blocks = p.n_tok * p.cols / 32;
    let g = rec.grid(blocks.div_ceil(64))?;
    rec.dispatch(KernelId::QuantizeQ8_0, &[x, xq], &[blocks as u32], g)?;
    // (Eight rows a workgroup.)
    let groups = rec.grid(p.rows.div_ceil(8))?;
    rec.dispatch(KernelId::MatvecInt(fmt), &[w, xq, y], &p.push(rb), groups)
}

/// RMSNorm of `groups` groups of `n` values: `y = x / sqrt(mean(x²) + eps) · w` (`w` of `n`),
/// the squares summed in f64 where the device has it (the CPU's sum: the same values bit for
/// bit), else in f32.
pub fn rms_norm(
    rec: &mut Recorder,
    x: Region,
    w: Region,
    y: Region,
    n: usize,
    groups: usize,
    eps: f32,
) -> Result<(), VulkanError> {
    need("rms_norm", "x", &x, n * groups * 4)?;
    need("rms_norm", "the weights", &w, n * 4)?;
    need("rms_norm", "y", &y, n * groups * 4)?;
    let g = rec.grid(groups)?;
    let id = if rec.device().float64 {
        KernelId::RmsNormF64
    } else {
        KernelId::RmsNorm
    };
    rec.dispatch(id, &[x, w, y], &[n as u32, groups as u32, eps.to_bits()], g)
}

/// A RoPE's shape and constants (no YaRN, no frequency factors: refused by the caller).
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs {
    pub kind: RopeKind,
    pub rows: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Rotated values of a head (the first `n_dims`).
    pub n_dims: usize,
    /// Values a row of the buffer.
    pub stride: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub mscale: f32,
}

/// Rotate the heads of `v` in place, row `j` at position `pos[j]` (u32, the step's data).
pub fn rope(rec: &mut Recorder, v: Region, pos: Region, a: RopeArgs) -> Result<(), VulkanError> {
    if a.n_dims == 0
        || !a.n_dims.is_multiple_of(2)
        || a.n_dims > a.head_dim
        || a.heads * a.head_dim > a.stride
    {
        return Err(bad(
            "rope",
            format!(
                "{} rotated of heads of {} ({} a row of {})",
                a.n_dims, a.head_dim, a.heads, a.stride
            ),
        ));
    }
    need("rope", "the rows", &v, a.rows * a.stride * 4)?;
    need("rope", "the positions", &pos, a.rows * 4)?;
    // As the CPU's `Rope::cos_sin` computes it.
    let theta_scale = a.freq_base.powf(-2.0 / a.n_dims as f32);
    let n = a.rows * a.heads * a.n_dims / 2;
    let g = rec.grid(n.div_ceil(64))?;
    let push = [
        a.rows as u32,
        a.heads as u32,
        a.head_dim as u32,
        a.n_dims as u32,
        (a.kind == RopeKind::Neox) as u32,
        a.stride as u32,
        theta_scale.to_bits(),
        a.freq_scale.to_bits(),
        a.mscale.to_bits(),
    ];
    rec.dispatch(KernelId::Rope, &[v, pos], &push, g)
}

/// Store `rows` rows of `width` f32 values of `src` into the f16 `cache` (rows of `width`), row
/// `j` at cache row `pos[j]`.
pub fn store_kv(
    rec: &mut Recorder,
    src: Region,
    cache: Region,
    pos: Region,
    rows: usize,
    width: usize,
    cache_rows: usize,
) -> Result<(), VulkanError> {
    if !width.is_multiple_of(2) {
        return Err(bad("store_kv", format!("rows of {width} values (odd)")));
    }
    need("store_kv", "the rows", &src, rows * width * 4)?;
    need("store_kv", "the cache", &cache, cache_rows * width * 2)?;
    need("store_kv", "the positions", &pos, rows * 4)?;
    let g = rec.grid((rows * width / 2).div_ceil(64))?;
    rec.dispatch(
        KernelId::StoreKv,
        &[src, cache, pos],
        &[rows as u32, width as u32],
        g,
    )
}

/// Decode attention's shape.
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub rows: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Rows each cache holds.
    pub cache_rows: usize,
    pub scale: f32,
}

/// `o` = each row's attention over cache rows `first[j]..first[j] + lens[j]`: `lens` holds the
/// rows' lengths, then their first rows (u32, the step's data; within `cache_rows`, which the
/// host checks when it writes them).
pub fn attn_decode(
    rec: &mut Recorder,
    q: Region,
    (kc, vc): (Region, Region),
    lens: Region,
    o: Region,
    a: AttnArgs,
) -> Result<(), VulkanError> {
    if a.head_dim == 0 || a.head_dim > 256 || !a.head_dim.is_multiple_of(2) {
        return Err(bad(
            "attn_decode",
            format!("heads of {} values (2 to 256, even)", a.head_dim),
        ));
    }
    if a.kv_heads == 0 || !a.heads.is_multiple_of(a.kv_heads) {
        return Err(bad(
            "attn_decode",
            format!("{} query heads over {} KV heads", a.heads, a.kv_heads),
        ));
    }
    let width = a.rows * a.heads * a.head_dim * 4;
    need("attn_decode", "q", &q, width)?;
    need("attn_decode", "o", &o, width)?;
    need("attn_decode", "the lengths", &lens, a.rows * 8)?;
    let cache = a.cache_rows * a.kv_heads * a.head_dim * 2;
    need("attn_decode", "the K cache", &kc, cache)?;
    need("attn_decode", "the V cache", &vc, cache)?;
    let g = rec.grid(a.rows * a.heads)?;
    let push = [
        a.rows as u32,
        a.heads as u32,
        a.kv_heads as u32,
        a.head_dim as u32,
        a.scale.to_bits(),
    ];
    rec.dispatch(KernelId::AttnDecode, &[q, kc, vc, lens, o], &push, g)
}

/// `gate = act(gate) · up` over `n` values.
pub fn glu(
    rec: &mut Recorder,
    gate: Region,
    up: Region,
    n: usize,
    act: Activation,
) -> Result<(), VulkanError> {
    need("glu", "gate", &gate, n * 4)?;
    need("glu", "up", &up, n * 4)?;
    let g = rec.grid(n.div_ceil(64))?;
    let gelu = (act == Activation::GeluTanh) as u32;
    rec.dispatch(KernelId::Glu, &[gate, up], &[n as u32, gelu], g)
}

/// `y += x` over `n` values.
pub fn add(rec: &mut Recorder, y: Region, x: Region, n: usize) -> Result<(), VulkanError> {
    need("add", "y", &y, n * 4)?;
    need("add", "x", &x, n * 4)?;
    let g = rec.grid(n.div_ceil(64))?;
    rec.dispatch(KernelId::Add, &[y, x], &[n as u32], g)
}

/// `y[r][c] += b[c]` over `rows` rows of `width` values (a product's bias).
pub fn bias(
    rec: &mut Recorder,
    y: Region,
    b: Region,
    rows: usize,
    width: usize,
) -> Result<(), VulkanError> {
    let n = rows * width;
    need("bias", "y", &y, n * 4)?;
    need("bias", "b", &b, width * 4)?;
    let g = rec.grid(n.div_ceil(64))?;
    rec.dispatch(KernelId::Bias, &[y, b], &[n as u32, width as u32], g)
}

/// `y *= s` over `n` values.
pub fn scale(rec: &mut Recorder, y: Region, n: usize, s: f32) -> Result<(), VulkanError> {
    need("scale", "y", &y, n * 4)?;
    let g = rec.grid(n.div_ceil(64))?;
    rec.dispatch(KernelId::Scale, &[y], &[n as u32, s.to_bits()], g)
}

/// `out[j]` = the index of the largest of row `j`'s `n` values (the sampler's `argmax`).
pub fn argmax(
    rec: &mut Recorder,
    x: Region,
    out: Region,
    rows: usize,
    n: usize,
) -> Result<(), VulkanError> {
    need("argmax", "x", &x, rows * n * 4)?;
    need("argmax", "out", &out, rows * 4)?;
    let g = rec.grid(rows)?;
    rec.dispatch(KernelId::Argmax, &[x, out], &[rows as u32, n as u32], g)
}

/// `x[j]` = row `tokens[j]` of the embedding matrix `w` (`vocab` rows of `cols`, in `fmt`) ·
/// `scale`, for `rows` rows (the ids are the step's data, checked below `vocab` by the host).
#[allow(clippy::too_many_arguments)]
pub fn embed(
    rec: &mut Recorder,
    fmt: WeightFormat,
    w: Region,
    tokens: Region,
    x: Region,
    (rows, cols, vocab): (usize, usize, usize),
    scale: f32,
) -> Result<(), VulkanError> {
    let p = Product {
        rows: vocab,
        cols,
        n_tok: rows,
        add: false,
    };
    let rb = p.check("embed", fmt, &w)?;
    need("embed", "the token ids", &tokens, rows * 4)?;
    need("embed", "x", &x, rows * cols * 4)?;
    let g = rec.grid((rows * cols / 32).div_ceil(64))?;
    let push = [rows as u32, cols as u32, rb, scale.to_bits()];
    rec.dispatch(KernelId::Embed(fmt), &[w, tokens, x], &push, g)
}

/// `dst[i]` = row `idx[i]` of `src` (rows of `n`), for `rows` rows (the indices are data,
/// checked by the host against `src`'s rows).
pub fn gather(
    rec: &mut Recorder,
    src: Region,
    idx: Region,
    dst: Region,
    rows: usize,
    n: usize,
) -> Result<(), VulkanError> {
    need("gather", "the indices", &idx, rows * 4)?;
    need("gather", "dst", &dst, rows * n * 4)?;
    let g = rec.grid((rows * n).div_ceil(64))?;
    rec.dispatch(
        KernelId::Gather,
        &[src, idx, dst],
        &[rows as u32, n as u32],
        g,
    )
}
