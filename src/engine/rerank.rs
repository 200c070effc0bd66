//! Reranking: a query and a document become one prompt of a reranker (an encoder with a
//! classification head, pooled with [`super::pooling::Pooling::Rank`]), as llama-server's
//! `format_prompt_rerank` builds it:
//! - with the file's `tokenizer.chat_template.rerank`: that text, `{query}` and `{document}`
//!   replaced, tokenized with special tokens parsed and none added;
//! - otherwise `[BOS] query [EOS] [SEP] document [EOS]`, each of BOS, EOS and SEP only where
//!   the vocabulary adds it (`add_bos_token`, `add_eos_token`, `add_sep_token`; EOS falling
//!   back to SEP where the vocabulary has none), query and document tokenized as plain text.
//!
//! The relevance score is the head's first output.

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// The key of a reranker's own prompt format.
pub const TEMPLATE_KEY: &str = "tokenizer.chat_template.rerank";
/// llama.cpp's `add_sep` override.
pub const ADD_SEP_KEY: &str = "tokenizer.ggml.add_sep_token";

/// How a model's query–document prompts are made.
#[derive(Clone, Debug)]
pub struct RerankFormat {
    template: Option<String>,
    bos: Option<u32>,
    /// After the query: EOS (or SEP) where EOS is added, then SEP where it is added.
    between: Vec<u32>,
    /// After the document: EOS (or SEP) where EOS is added.
    end: Vec<u32>,
}

impl RerankFormat {
    /// The format of the model in `file`, tokenized by `tok`.
    pub fn new(tok: &Tokenizer, file: &GgufFile) -> RerankFormat {
        let ids = tok.special_ids();
        let add_sep = file
            .opt_bool(ADD_SEP_KEY)
            .ok()
            .flatten()
            .unwrap_or(tok.adds_sep());
        let eos = ids.eos.or(ids.sep);
        let eos_added = || tok.adds_eos().then_some(eos).flatten();
        let mut between: Vec<u32> = eos_added().into_iter().collect();
        between.extend(ids.sep.filter(|_| add_sep));
        RerankFormat {
            template: file
                .opt_str(TEMPLATE_KEY)
                .ok()
                .flatten()
                .map(str::to_string),
            bos: ids.bos.filter(|_| tok.adds_bos()),
            between,
            end: eos_added().into_iter().collect(),
        }
    }

    /// The prompt of `query` and `doc`.
    pub fn prompt(&self, tok: &Tokenizer, query: &str, doc: &str) -> Vec<u32> {
        if let Some(t) = &self.template {
            let text = t.replace("{query}", query).replace("{document}", doc);
            return tok.encode(&text, false, true);
        }
        let mut out: Vec<u32> = self.bos.into_iter().collect();
        out.extend(tok.encode(query, false, false));
        out.extend_from_slice(&self.between);
        out.extend(tok.encode(doc, false, false));
        out.extend_from_slice(&self.end);
        out
    }
}

/// The indices of `scores` from the most relevant down (ties in input order), at most `top_n`.
pub fn ranked(scores: &[f32], top_n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_by_score_ties_in_order() {
        let s = [0.5, 2.0, -1.0, 2.0];
        assert_eq!(ranked(&s, 10), vec![1, 3, 0, 2]);
        assert_eq!(ranked(&s, 2), vec![1, 3]);
        assert!(ranked(&s, 0).is_empty());
    }
}
