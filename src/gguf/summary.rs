//! A model's headline figures, computed from its GGUF header (what `kiln inspect` prints).
//!
//! Building a summary never fails: a missing key is `None`, and a key present with an unusable
//! type is `None` plus a line in `warnings`, so odd files can still be inspected.

use serde::Serialize;

use super::{GgufError, GgufFile, TensorInfo};

/// Bytes and tensor count of one block format.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FormatStats {
    /// llama.cpp's name, e.g. `Q4_K`.
    #[serde(rename = "type")]
    pub ty: String,
    pub tensors: usize,
    pub elements: u64,
    pub bytes: u64,
}

/// One tensor, as listed by `kiln inspect --tensors`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorRow {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    /// ggml `ne` order (`shape[0]` contiguous).
    pub shape: Vec<usize>,
    /// Relative to the data section, as stored.
    pub offset: usize,
    /// Absolute position in the file.
    pub file_offset: usize,
    pub bytes: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSummary {
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub gguf_version: u32,
    /// Sum of every tensor's element count (as llama.cpp's `n_params`: all tensors, a tied
    /// output embedding counted once because it is stored once).
    pub parameters: u64,
    pub context_length: Option<u64>,
    pub layers: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub embedding_dim: Option<u64>,
    pub ffn_dim: Option<u64>,
    /// `{arch}.attention.key_length`, only when the file gives it.
    pub head_dim: Option<u64>,
    pub rope_freq_base: Option<f32>,
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), ...
    pub tokenizer_model: Option<String>,
    /// `tokenizer.ggml.pre`: the pre-tokenizer regex family.
    pub tokenizer_pre: Option<String>,
    pub vocab_size: Option<u64>,
    pub chat_template: bool,
    pub tensor_count: usize,
    /// Per block format, most bytes first.
    pub formats: Vec<FormatStats>,
    /// Bytes of tensor data (sum over tensors, padding excluded).
    pub tensor_bytes: u64,
    pub file_size: u64,
    pub data_offset: u64,
    pub alignment: u64,
    /// Keys present with a type the summary could not use.
    pub warnings: Vec<String>,
}

impl ModelSummary {
    pub fn from_file(f: &GgufFile) -> ModelSummary {
        let mut warnings = Vec::new();
        let architecture =
            keep(&mut warnings, f.opt_str("general.architecture")).map(str::to_owned);
        let name = keep(&mut warnings, f.opt_str("general.name")).map(str::to_owned);
        let arch_u64 = |suffix: &str| count(f, &f.arch_key(suffix));
        let context_length = keep(&mut warnings, arch_u64("context_length"));
        let layers = keep(&mut warnings, arch_u64("block_count"));
        let heads = keep(&mut warnings, arch_u64("attention.head_count"));
        let kv_heads = keep(&mut warnings, arch_u64("attention.head_count_kv"));
        let embedding_dim = keep(&mut warnings, arch_u64("embedding_length"));
        let ffn_dim = keep(&mut warnings, arch_u64("feed_forward_length"));
        let head_dim = keep(&mut warnings, arch_u64("attention.key_length"));
        let rope_freq_base = keep(&mut warnings, f.opt_f32(&f.arch_key("rope.freq_base")));
        let tokenizer_model =
            keep(&mut warnings, f.opt_str("tokenizer.ggml.model")).map(str::to_owned);
        let tokenizer_pre = keep(&mut warnings, f.opt_str("tokenizer.ggml.pre")).map(str::to_owned);
        let vocab_size = match keep(&mut warnings, f.opt_array("tokenizer.ggml.tokens")) {
            Some(tokens) => Some(tokens.len() as u64),
            None => keep(&mut warnings, arch_u64("vocab_size")),
        };
        let chat_template = f.get("tokenizer.chat_template").is_some();

        let mut formats: Vec<FormatStats> = Vec::new();
        for t in f.tensors() {
            let name = t.ty.name();
            let i = match formats.iter().position(|s| s.ty == name) {
                Some(i) => i,
                None => {
                    formats.push(FormatStats {
                        ty: name.to_owned(),
                        tensors: 0,
                        elements: 0,
                        bytes: 0,
                    });
                    formats.len() - 1
                }
            };
            formats[i].tensors += 1;
            formats[i].elements += t.n_elements as u64;
            formats[i].bytes += t.n_bytes as u64;
        }
        formats.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.ty.cmp(&b.ty)));

        ModelSummary {
            architecture,
            name,
            gguf_version: f.version(),
            parameters: f.tensors().iter().map(|t| t.n_elements as u64).sum(),
            context_length,
            layers,
            heads,
            kv_heads,
            embedding_dim,
            ffn_dim,
            head_dim,
            rope_freq_base,
            tokenizer_model,
            tokenizer_pre,
            vocab_size,
            chat_template,
            tensor_count: f.tensors().len(),
            tensor_bytes: formats.iter().map(|s| s.bytes).sum(),
            formats,
            file_size: f.file_size() as u64,
            data_offset: f.data_offset() as u64,
            alignment: f.alignment() as u64,
            warnings,
        }
    }
}

impl TensorRow {
    pub fn new(f: &GgufFile, t: &TensorInfo) -> TensorRow {
        TensorRow {
            name: t.name.clone(),
            ty: t.ty.name().to_owned(),
            shape: t.shape.clone(),
            offset: t.offset,
            file_offset: f.tensor_file_offset(t),
            bytes: t.n_bytes,
        }
    }
}

/// The value, or `None` with the error noted in `warnings`.
fn keep<T>(warnings: &mut Vec<String>, r: Result<Option<T>, GgufError>) -> Option<T> {
    r.unwrap_or_else(|e| {
        warnings.push(e.to_string());
        None
    })
}

/// A count that some architectures store per layer (an integer array): the largest entry.
fn count(f: &GgufFile, key: &str) -> Result<Option<u64>, GgufError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => match v.as_array().and_then(|a| a.to_i64s()) {
            Some(per_layer) => Ok(per_layer
                .into_iter()
                .max()
                .and_then(|m| u64::try_from(m).ok())),
            None => f.get_u64(key).map(Some),
        },
    }
}

/// `134.5 M`, `1.24 B`, `977 K`: parameter counts as people quote them.
pub fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} K", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// `93.81 MiB`: byte sizes in binary units.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, GgufWriter};
    use crate::quant::GgmlType;

    #[test]
    fn summary_of_a_small_file() {
        let mut w = GgufWriter::new();
        w.add("general.architecture", "qwen3")
            .add("general.name", "tiny")
            .add("qwen3.block_count", 2u32)
            .add("qwen3.context_length", 64u64)
            .add("qwen3.attention.head_count", Array::I32(vec![4, 8])) // per layer
            .add("qwen3.attention.head_count_kv", 2u32)
            .add("qwen3.embedding_length", 32u32)
            .add("qwen3.attention.key_length", 16u32)
            .add("qwen3.rope.freq_base", "oops") // wrong type: a warning, not a failure
            .add("tokenizer.ggml.model", "gpt2")
            .add("tokenizer.ggml.tokens", vec!["a", "b", "c"])
            .add("tokenizer.chat_template", "{{ x }}");
        w.add_f32_tensor("a", &[4, 2], &[0.0; 8]);
        w.add_tensor("b", &[32, 3], GgmlType::Q8_0, vec![0; 3 * 34]);
        w.add_tensor("c", &[32], GgmlType::Q8_0, vec![0; 34]);
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let s = ModelSummary::from_file(&f);
        assert_eq!(s.architecture.as_deref(), Some("qwen3"));
        assert_eq!(s.parameters, 8 + 96 + 32);
        assert_eq!(s.layers, Some(2));
        assert_eq!(s.heads, Some(8));
        assert_eq!(s.kv_heads, Some(2));
        assert_eq!(s.head_dim, Some(16));
        assert_eq!(s.ffn_dim, None);
        assert_eq!(s.rope_freq_base, None);
        assert_eq!(s.warnings.len(), 1);
        assert!(
            s.warnings[0].contains("qwen3.rope.freq_base"),
            "{:?}",
            s.warnings
        );
        assert_eq!(s.vocab_size, Some(3));
        assert!(s.chat_template);
        assert_eq!(s.tensor_count, 3);
        assert_eq!(s.formats[0].ty, "Q8_0");
        assert_eq!((s.formats[0].tensors, s.formats[0].bytes), (2, 136));
        assert_eq!((s.formats[1].ty.as_str(), s.formats[1].bytes), ("F32", 32));
        assert_eq!(s.tensor_bytes, 168);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["formats"][0]["type"], "Q8_0");
        assert_eq!(json["parameters"], 136);
    }

    #[test]
    fn human_units() {
        assert_eq!(human_count(134_515_008), "134.5 M");
        assert_eq!(human_count(1_235_814_400), "1.24 B");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_bytes(98_362_432), "93.81 MiB");
        assert_eq!(human_bytes(10), "10 B");
    }
}
