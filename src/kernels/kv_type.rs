//! Element types of the KV cache and the view of one layer the attention kernel reads.

use half::f16;

use crate::quant::blocks::{BlockQ8_0, QK};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    /// IEEE half precision (2 bytes per value).
    #[default]
    F16,
    /// Blocks of 32 values: an f16 scale and 32 signed bytes (34 bytes per 32 values).
    Q8_0,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one head's row of `head_dim` values (`head_dim` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => head_dim * 2,
            KvType::Q8_0 => head_dim.div_ceil(QK) * std::mem::size_of::<BlockQ8_0>(),
        }
    }

    /// Can a head of `head_dim` values be stored in this type?
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KvTypeError> {
        match self {
            KvType::Q8_0 if !head_dim.is_multiple_of(QK) => Err(KvTypeError::HeadDim {
                ty: self.name(),
                head_dim,
                block: QK,
            }),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = KvTypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(KvTypeError::Unknown(s.to_owned())),
        }
    }
}

/// A KV cache type that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvTypeError {
    #[error("unknown KV cache type {0:?} (expected f16 or q8_0)")]
    Unknown(String),
    #[error(
        "a {ty} KV cache needs a head dimension divisible by {block}; this model's is {head_dim}"
    )]
    HeadDim {
        ty: &'static str,
        head_dim: usize,
        block: usize,
    },
}

/// One layer of the cache as the attention kernel reads it: rows of `[n_kv_heads, rows]`
/// (`rows`: the context, or a sliding-window ring's), each `head_dim` values in the cache's
/// type.
#[derive(Clone, Copy, Debug)]
pub enum KvLayer<'a> {
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Q8_0 {
        keys: &'a [BlockQ8_0],
        values: &'a [BlockQ8_0],
    },
}

/// Which half of a layer's cache [`KvLayer::rows_f16`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSide {
    Keys,
    Values,
}

impl<'a> KvLayer<'a> {
    /// Rows `lo..hi` (row = head · rows + row of the position) of `head_dim` keys or values
    /// as f16: borrowed from an f16 cache, dequantized into `buf` from a Q8_0 one.
    #[inline]
    pub fn rows_f16<'b>(
        &self,
        side: KvSide,
        rows: std::ops::Range<usize>,
        head_dim: usize,
        buf: &'b mut [f16],
    ) -> &'b [f16]
    where
        'a: 'b,
    {
        let keys = side == KvSide::Keys;
        match *self {
            KvLayer::F16 { keys: k, values: v } => {
                &(if keys { k } else { v })[rows.start * head_dim..rows.end * head_dim]
            }
            KvLayer::Q8_0 { keys: k, values: v } => {
                dequant_rows(if keys { k } else { v }, rows, head_dim, buf)
            }
        }
    }

    /// Rows of `head_dim_k`/`head_dim_v` values it holds, checked against a geometry.
    pub fn holds(&self, rows: usize, head_dim_k: usize, head_dim_v: usize) -> bool {
        match *self {
            KvLayer::F16 { keys, values } => {
                keys.len() >= rows * head_dim_k && values.len() >= rows * head_dim_v
            }
            KvLayer::Q8_0 { keys, values } => {
                keys.len() * QK >= rows * head_dim_k && values.len() * QK >= rows * head_dim_v
            }
        }
    }

    pub fn ty(&self) -> KvType {
        match self {
            KvLayer::F16 { .. } => KvType::F16,
            KvLayer::Q8_0 { .. } => KvType::Q8_0,
        }
    }
}

/// Dequantize rows `rows` of `head_dim` values (`head_dim / 32` blocks each) into `buf`:
/// `x = f16(d · q)`, the product in f32 rounded once to f16.
fn dequant_rows<'b>(
    blocks: &[BlockQ8_0],
    rows: std::ops::Range<usize>,
    head_dim: usize,
    buf: &'b mut [f16],
) -> &'b [f16] {
    let bpr = head_dim / QK;
    let n = rows.len() * head_dim;
    let out = &mut buf[..n];
    let src = &blocks[rows.start * bpr..rows.end * bpr];
    dequant_q8_0_f16(src, out);
    out
}

/// Q8_0 blocks to f16: `f16(d · q)` per value.
pub fn dequant_q8_0_f16(blocks: &[BlockQ8_0], out: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    assert_eq!(blocks.len() * QK, out.len());
    let mut tmp = [0.0f32; QK];
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (t, &q) in tmp.iter_mut().zip(&b.qs) {
            *t = q as f32 * d;
        }
        o.convert_from_f32_slice(&tmp);
    }
}
