//! Embeddings: how a sequence's hidden states become one vector, as the reference engine pools
//! them.
//!
//! The hidden state pooled is the one the output matrix multiplies: the last block's residual
//! stream after the final norm (llama.cpp's `t_embd`, `result_norm`; its `build_pooling` reads
//! it); an encoder's (BERT), which has no final norm, is its last block's output. [`Pooling`] follows llama.cpp's `llama_pooling_type`, read from the GGUF key
//! `{arch}.pooling_type` (0 none, 1 mean, 2 cls, 3 last, 4 rank) unless overridden:
//! - `mean`: the average of every prompt position's state;
//! - `cls`: the first position's (position 0);
//! - `last`: the last position's (the models that declare it, Qwen3-Embedding and other
//!   decoder embedders, expect the tokenizer's EOS there: `tokenizer.ggml.add_eos_token`);
//! - `none`: one vector per position (`kiln embedding --pooling none`; not an OpenAI answer);
//! - `rank`: a reranker's relevance scores: the first position's state through the model's
//!   classification head ([`crate::model::classifier::Classifier`]), not normalized; only an
//!   encoder with such a head pools so.
//!
//! Vectors are then normalized as llama.cpp's `common_embd_normalize` does ([`normalize`]).

use std::ops::Range;

use crate::model::classifier::Classifier;
use crate::model::Model;

/// llama.cpp's pooling types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    None,
    Mean,
    Cls,
    Last,
    Rank,
}

/// Why a model cannot give embeddings the way it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolingError {
    #[error("pooling `{0}`: expected none, mean, cls, last or rank")]
    Unknown(String),
    #[error("rank pooling needs a reranker's classification head (cls.weight or cls.output.weight), which this model does not have")]
    NoClassifier,
    #[error("rank pooling (a reranker's classification head) is implemented for the encoders bert and nomic-bert, not for {arch}")]
    RankDecoder { arch: String },
    #[error("{key} = {value} is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)")]
    BadValue { key: String, value: i64 },
    #[error("{key} is not an integer")]
    NotInteger { key: String },
    #[error("{key} = false: this decoder attends bidirectionally, which kiln runs only for encoder architectures (bert, nomic-bert); its embeddings would be wrong")]
    NonCausal { key: String },
}

impl Pooling {
    /// `--pooling` as llama.cpp spells it.
    pub fn parse(s: &str) -> Result<Pooling, PoolingError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Ok(Pooling::Rank),
            _ => Err(PoolingError::Unknown(s.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// llama.cpp's `llama_pooling_type` value.
    fn from_value(key: &str, v: i64) -> Result<Pooling, PoolingError> {
        match v {
            -1 | 0 => Ok(Pooling::None),
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            4 => Ok(Pooling::Rank),
            value => Err(PoolingError::BadValue {
                key: key.to_string(),
                value,
            }),
        }
    }

    /// The pooling the model declares (`{arch}.pooling_type`; `none` when absent, as in
    /// llama.cpp), or `over` when given. A model that declares non-causal attention
    /// (`{arch}.attention.causal = false`, BERT-style encoders converted to a decoder
    /// architecture) is refused: kiln would pool states computed with the wrong mask.
    pub fn for_model(model: &Model, over: Option<Pooling>) -> Result<Pooling, PoolingError> {
        let f = &model.file;
        let causal = f.arch_key("attention.causal");
        let declared = f.opt_bool(&causal).ok().flatten();
        if declared == Some(false) && !model.config.arch.is_encoder() {
            return Err(PoolingError::NonCausal { key: causal });
        }
        let key = f.arch_key("pooling_type");
        let p = match (over, f.get(&key)) {
            (Some(p), _) => p,
            (None, None) => Pooling::None,
            (None, Some(v)) => match v.as_i64() {
                Some(n) => Pooling::from_value(&key, n)?,
                None => return Err(PoolingError::NotInteger { key }),
            },
        };
        if p == Pooling::Rank {
            if !model.config.arch.is_encoder() {
                let arch = f.opt_str("general.architecture").ok().flatten();
                let arch = arch.unwrap_or("this architecture").to_string();
                return Err(PoolingError::RankDecoder { arch });
            }
            if model.weights.classifier.is_none() {
                return Err(PoolingError::NoClassifier);
            }
        }
        Ok(p)
    }

    /// Which positions of `pos0..pos0 + n` (of a prompt of `len` tokens) this pooling reads.
    pub fn rows_wanted(self, pos0: usize, n: usize, len: usize) -> Range<usize> {
        let end = pos0 + n;
        let (lo, hi) = match self {
            Pooling::Mean | Pooling::None => (pos0, end),
            Pooling::Cls | Pooling::Rank => (0, 1),
            Pooling::Last => (len - 1, len),
        };
        let (lo, hi) = (lo.max(pos0), hi.min(end));
        if lo < hi {
            lo - pos0..hi - pos0
        } else {
            0..0
        }
    }

    /// Whether a cached prefix of the prompt may be reused (its hidden states are not kept:
    /// only `last` reads none of them).
    pub fn reuses_prefix(self) -> bool {
        self == Pooling::Last
    }
}

/// What an embedding request asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedSpec {
    pub pooling: Pooling,
    /// llama.cpp's `embd_normalize`: -1 none, 0 max-abs scaled to int16, 1 taxicab,
    /// 2 euclidean (the default), p > 2 the p-norm.
    pub normalize: i32,
}

/// One sequence's pooling in progress: the hidden states it reads, position by position.
#[derive(Debug, Clone)]
pub struct Pooler {
    spec: EmbedSpec,
    dim: usize,
    /// Mean: the running sum (f64); cls / last: the state; none: every position's state.
    acc: Vec<f64>,
    rows: Vec<f32>,
    seen: usize,
}

impl Pooler {
    pub fn new(spec: EmbedSpec, dim: usize) -> Pooler {
        Pooler {
            spec,
            dim,
            acc: vec![
                0.0;
                if spec.pooling == Pooling::Mean {
                    dim
                } else {
                    0
                }
            ],
            rows: Vec::new(),
            seen: 0,
        }
    }

    pub fn spec(&self) -> EmbedSpec {
        self.spec
    }

    /// The final-normed hidden state of one position that [`Pooling::rows_wanted`] asked for.
    pub fn add(&mut self, state: &[f32]) {
        debug_assert_eq!(state.len(), self.dim);
        self.seen += 1;
        match self.spec.pooling {
            Pooling::Mean => {
                for (a, &x) in self.acc.iter_mut().zip(state) {
                    *a += x as f64;
                }
            }
            Pooling::Cls | Pooling::Last | Pooling::Rank => {
                self.rows.clear();
                self.rows.extend_from_slice(state);
            }
            Pooling::None => self.rows.extend_from_slice(state),
        }
    }

    /// The embedding: one normalized vector (`none`: one per position, each normalized);
    /// `rank`: the scores of `head` (the model's classification head), not normalized.
    pub fn finish(self, head: Option<&Classifier>) -> Result<Vec<Vec<f32>>, PoolingError> {
        if self.spec.pooling == Pooling::Rank {
            let head = head.ok_or(PoolingError::NoClassifier)?;
            return Ok(vec![head.scores(&self.rows)]);
        }
        let mut rows: Vec<Vec<f32>> = match self.spec.pooling {
            Pooling::Mean => {
                let n = self.seen.max(1) as f64;
                vec![self.acc.iter().map(|&s| (s / n) as f32).collect()]
            }
            _ => self
                .rows
                .chunks_exact(self.dim.max(1))
                .map(<[f32]>::to_vec)
                .collect(),
        };
        for r in &mut rows {
            normalize(r, self.spec.normalize);
        }
        Ok(rows)
    }
}

/// Normalize `v` in place as llama.cpp's `common_embd_normalize` does: `norm` -1 leaves it, 0
/// scales the largest magnitude to 32760 (int16 range), 2 divides by the euclidean length,
/// any other p by the p-norm (1: taxicab). A zero vector stays zero.
pub fn normalize(v: &mut [f32], norm: i32) {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => v.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        2 => v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}

/// Cosine similarity of two vectors (f64 sums; 0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pooling: Pooling, normalize: i32) -> EmbedSpec {
        EmbedSpec { pooling, normalize }
    }

    #[test]
    fn parses_llama_cpp_names() {
        assert_eq!(Pooling::parse("mean"), Ok(Pooling::Mean));
        assert_eq!(Pooling::parse("CLS"), Ok(Pooling::Cls));
        assert_eq!(Pooling::parse("last"), Ok(Pooling::Last));
        assert_eq!(Pooling::parse("none"), Ok(Pooling::None));
        assert_eq!(Pooling::parse("rank"), Ok(Pooling::Rank));
        assert!(matches!(
            Pooling::parse("max"),
            Err(PoolingError::Unknown(_))
        ));
        assert_eq!(Pooling::from_value("k", 1), Ok(Pooling::Mean));
        assert_eq!(Pooling::from_value("k", 4), Ok(Pooling::Rank));
        assert!(matches!(
            Pooling::from_value("k", 9),
            Err(PoolingError::BadValue { value: 9, .. })
        ));
    }

    #[test]
    fn rows_wanted_per_chunk() {
        // A 10-token prompt in chunks 0..4, 4..8, 8..10.
        let chunks = [(0, 4), (4, 4), (8, 2)];
        let got = |p: Pooling| -> Vec<Range<usize>> {
            chunks
                .iter()
                .map(|&(p0, n)| p.rows_wanted(p0, n, 10))
                .collect()
        };
        assert_eq!(got(Pooling::Mean), vec![0..4, 0..4, 0..2]);
        assert_eq!(got(Pooling::Cls), vec![0..1, 0..0, 0..0]);
        assert_eq!(got(Pooling::Rank), vec![0..1, 0..0, 0..0]);
        assert_eq!(got(Pooling::Last), vec![0..0, 0..0, 1..2]);
        assert_eq!(got(Pooling::None), vec![0..4, 0..4, 0..2]);
    }

    #[test]
    fn pools_and_normalizes() {
        let states = [[1.0f32, 2.0, 2.0], [3.0, 0.0, 4.0], [0.0, 0.0, 1.0]];
        let run = |p: Pooling, norm: i32| {
            let mut pool = Pooler::new(spec(p, norm), 3);
            for (i, s) in states.iter().enumerate() {
                if !p.rows_wanted(i, 1, 3).is_empty() {
                    pool.add(s);
                }
            }
            pool.finish(None).unwrap()
        };
        assert_eq!(
            run(Pooling::Mean, -1),
            vec![vec![4.0 / 3.0, 2.0 / 3.0, 7.0 / 3.0]]
        );
        assert_eq!(
            run(Pooling::Cls, 2),
            vec![vec![1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0]]
        );
        assert_eq!(run(Pooling::Last, -1), vec![vec![0.0, 0.0, 1.0]]);
        let none = run(Pooling::None, 2);
        assert_eq!(none.len(), 3);
        assert_eq!(none[1], vec![0.6, 0.0, 0.8]);
    }

    #[test]
    fn rank_scores_the_first_state_through_the_head() {
        use crate::model::classifier::Dense;
        let head = Classifier {
            dense: None,
            out: Some(Dense {
                in_dim: 2,
                out_dim: 1,
                weight: vec![2.0, -1.0],
                bias: Some(vec![0.5]),
            }),
            labels: Vec::new(),
        };
        let mut pool = Pooler::new(spec(Pooling::Rank, 2), 2);
        for (i, s) in [[3.0f32, 1.0], [7.0, 7.0]].iter().enumerate() {
            if !Pooling::Rank.rows_wanted(i, 1, 2).is_empty() {
                pool.add(s);
            }
        }
        // 2·3 − 1 + 0.5, not normalized.
        assert_eq!(pool.clone().finish(Some(&head)), Ok(vec![vec![5.5]]));
        assert_eq!(pool.finish(None), Err(PoolingError::NoClassifier));
    }

    #[test]
    fn normalizations_match_llama_cpp() {
        let mut v = vec![3.0f32, -4.0];
        normalize(&mut v, 2);
        assert_eq!(v, vec![0.6, -0.8]);
        let mut v = vec![1.0f32, -3.0];
        normalize(&mut v, 1);
        assert_eq!(v, vec![0.25, -0.75]);
        let mut v = vec![0.5f32, -1.0];
        normalize(&mut v, 0);
        assert_eq!(v, vec![16380.0, -32760.0]);
        let mut v = vec![0.0f32; 4];
        normalize(&mut v, 2);
        assert_eq!(v, vec![0.0; 4], "a zero vector stays zero");
        let mut v = vec![1.0f32, 1.0];
        normalize(&mut v, 4);
        let n4 = 2.0f32.powf(0.25);
        assert!((v[0] - 1.0 / n4).abs() < 1e-6);
    }

    #[test]
    fn cosine_similarity() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
