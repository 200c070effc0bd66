//! A reranker's classification head (BERT-style sequence classification, e.g. bge-reranker),
//! as llama.cpp's rank pooling applies it to the first position's hidden state (`[CLS]`):
//! `cls.weight` `[dim, dim]` (+ `cls.bias`), tanh, then `cls.output.weight` `[dim, n_out]`
//! (+ `cls.output.bias`), `n_out` the length of `{arch}.classifier.output_labels` (1 when
//! absent). Either matrix may be missing (some rerankers project directly), not both. The
//! matrices are small (one row per pass per sequence): they are dequantized to f32 at load and
//! multiplied in f64 sums.
//!
//! Refused by name: `cls.norm` (ModernBERT's head norm) and a `{arch}.classifier.pooling_type`
//! other than cls (ModernBERT's mean over positions before the head).

use super::ModelError;
use crate::gguf::GgufFile;
use crate::quant;

/// Tensor and key names.
pub mod names {
    pub const CLS: &str = "cls.weight";
    pub const CLS_OUT: &str = "cls.output.weight";
    pub const CLS_NORM: &str = "cls.norm.weight";
    /// `{arch}.` + this: the labels of the head's outputs.
    pub const LABELS: &str = "classifier.output_labels";
    /// `{arch}.` + this: which positions the head reads (llama.cpp's pooling values).
    pub const POOLING: &str = "classifier.pooling_type";
}

/// One dense layer of the head: `out_dim` rows of `in_dim`, and a bias.
#[derive(Clone, Debug)]
pub struct Dense {
    pub in_dim: usize,
    pub out_dim: usize,
    /// Row-major `[out_dim][in_dim]`.
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl Dense {
    /// `y = W x + b`, each row's dot product summed in f64.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        debug_assert_eq!(x.len(), self.in_dim);
        (0..self.out_dim)
            .map(|r| {
                let row = &self.weight[r * self.in_dim..(r + 1) * self.in_dim];
                let dot: f64 = row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum();
                let b = self.bias.as_ref().map_or(0.0, |b| b[r] as f64);
                (dot + b) as f32
            })
            .collect()
    }
}

/// The head: optional dense + tanh, optional output projection.
#[derive(Clone, Debug)]
pub struct Classifier {
    pub dense: Option<Dense>,
    pub out: Option<Dense>,
    /// `{arch}.classifier.output_labels` (empty when the file names none).
    pub labels: Vec<String>,
}

impl Classifier {
    /// The head of `f` if it has one (`cls.weight` or `cls.output.weight`), for hidden states
    /// of `dim`.
    pub fn load(f: &GgufFile, dim: usize) -> Result<Option<Classifier>, ModelError> {
        let labels_key = f.arch_key(names::LABELS);
        let labels = match f.get(&labels_key) {
            None => Vec::new(),
            Some(v) => match v.as_array().and_then(|a| a.as_strings()) {
                Some(l) => l.to_vec(),
                None => {
                    return Err(ModelError::BadConfig(format!(
                        "'{labels_key}' is not an array of strings"
                    )))
                }
            },
        };
        let n_out = labels.len().max(1);
        let dense = dense_opt(f, names::CLS, dim, dim)?;
        let out = dense_opt(f, names::CLS_OUT, dim, n_out)?;
        if dense.is_none() && out.is_none() {
            return Ok(None);
        }
        if f.tensor_info(names::CLS_NORM).is_some() {
            return Err(ModelError::UnsupportedValue {
                key: names::CLS_NORM.to_string(),
                value: "present".to_string(),
                supported: "a classifier head without a norm (BERT-style: dense, tanh, output)",
            });
        }
        let pool_key = f.arch_key(names::POOLING);
        if let Some(p) = f.get(&pool_key) {
            if p.as_i64() != Some(2) {
                return Err(ModelError::UnsupportedValue {
                    key: pool_key,
                    value: format!("{p:?}"),
                    supported: "2 (cls: the head reads the first position)",
                });
            }
        }
        Ok(Some(Classifier { dense, out, labels }))
    }

    /// How many scores the head gives (its labels).
    pub fn n_out(&self) -> usize {
        match &self.out {
            Some(o) => o.out_dim,
            None => self.dense.as_ref().map_or(0, |d| d.out_dim),
        }
    }

    /// The head's scores of one pooled hidden state, as llama.cpp computes them: dense, tanh,
    /// output projection (each where the file has it).
    pub fn scores(&self, state: &[f32]) -> Vec<f32> {
        let mut x = state.to_vec();
        if let Some(d) = &self.dense {
            x = d.apply(&x);
            x.iter_mut().for_each(|v| *v = v.tanh());
        }
        if let Some(o) = &self.out {
            x = o.apply(&x);
        }
        x
    }
}

/// `name` (`[in_dim, out_dim]`) and its `.bias` (`[out_dim]`) dequantized, if the file has it.
fn dense_opt(
    f: &GgufFile,
    name: &str,
    in_dim: usize,
    out_dim: usize,
) -> Result<Option<Dense>, ModelError> {
    let Some(weight) = tensor(f, name, &[in_dim, out_dim])? else {
        return Ok(None);
    };
    let bias_name = name.replace(".weight", ".bias");
    let bias = tensor(f, &bias_name, &[out_dim])?;
    Ok(Some(Dense {
        in_dim,
        out_dim,
        weight,
        bias,
    }))
}

/// Tensor `name` of `shape` as f32, if present.
fn tensor(f: &GgufFile, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
    let Some(info) = f.tensor_info(name) else {
        return Ok(None);
    };
    if info.shape != shape {
        return Err(ModelError::BadShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            found: info.shape.clone(),
            ty: info.ty,
        });
    }
    let mut out = vec![0.0f32; shape.iter().product()];
    quant::dequantize_row(info.ty, &f.tensor_bytes(info), &mut out).map_err(|e| {
        ModelError::UnsupportedType {
            name: name.to_string(),
            ty: info.ty,
            reason: e.to_string(),
        }
    })?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, Value};

    fn file(edit: impl Fn(&mut GgufWriter)) -> GgufFile {
        let mut w = GgufWriter::new();
        w.add("general.architecture", "bert");
        edit(&mut w);
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn dense_tanh_output() {
        // dim 2: dense = [[1, 0], [0, 2]] + [0, 1], tanh, out = [[1, -1]] + [0.5].
        let f = file(|w| {
            w.add_f32_tensor(names::CLS, &[2, 2], &[1.0, 0.0, 0.0, 2.0]);
            w.add_f32_tensor("cls.bias", &[2], &[0.0, 1.0]);
            w.add_f32_tensor(names::CLS_OUT, &[2, 1], &[1.0, -1.0]);
            w.add_f32_tensor("cls.output.bias", &[1], &[0.5]);
        });
        let c = Classifier::load(&f, 2).unwrap().expect("a head");
        assert_eq!(c.n_out(), 1);
        let x = [0.3f32, -0.2];
        let want = (0.3f32).tanh() - (2.0f32 * -0.2 + 1.0).tanh() + 0.5;
        let got = c.scores(&x);
        assert_eq!(got.len(), 1);
        assert!((got[0] - want).abs() < 1e-6, "{got:?} vs {want}");
    }

    #[test]
    fn labels_size_the_output_and_no_head_is_none() {
        let f = file(|w| {
            w.add(
                "bert.classifier.output_labels",
                Value::from(vec!["no", "yes"]),
            );
            w.add_f32_tensor(names::CLS_OUT, &[2, 2], &[1.0, 0.0, 0.0, 1.0]);
        });
        let c = Classifier::load(&f, 2).unwrap().unwrap();
        assert_eq!(c.labels, ["no", "yes"]);
        assert_eq!(
            c.scores(&[0.25, -4.0]),
            vec![0.25, -4.0],
            "no dense: no tanh"
        );
        assert!(Classifier::load(&file(|_| {}), 2).unwrap().is_none());
    }

    #[test]
    fn refusals_name_the_tensor_or_key() {
        let wrong = file(|w| {
            w.add_f32_tensor(names::CLS, &[2, 3], &[0.0; 6]);
        });
        let e = Classifier::load(&wrong, 2).unwrap_err().to_string();
        assert!(e.contains("cls.weight"), "{e}");
        let labels = file(|w| {
            w.add_f32_tensor(names::CLS_OUT, &[2, 1], &[0.0; 2]);
            w.add(
                "bert.classifier.output_labels",
                Value::from(vec!["a", "b", "c"]),
            );
        });
        let e = Classifier::load(&labels, 2).unwrap_err().to_string();
        assert!(e.contains("cls.output.weight"), "{e}");
        let norm = file(|w| {
            w.add_f32_tensor(names::CLS, &[2, 2], &[0.0; 4]);
            w.add_f32_tensor(names::CLS_NORM, &[2], &[1.0; 2]);
        });
        let e = Classifier::load(&norm, 2).unwrap_err().to_string();
        assert!(e.contains("cls.norm"), "{e}");
        let mean = file(|w| {
            w.add_f32_tensor(names::CLS, &[2, 2], &[0.0; 4]);
            w.add("bert.classifier.pooling_type", Value::U32(1));
        });
        let e = Classifier::load(&mean, 2).unwrap_err().to_string();
        assert!(e.contains("bert.classifier.pooling_type"), "{e}");
    }
}
