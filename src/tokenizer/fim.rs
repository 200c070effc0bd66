//! Fill-in-the-middle prompts: a code model trained with FIM tokens writes the text that goes
//! between a prefix and a suffix (an editor's text before and after the cursor).
//!
//! The prompt is llama-server's (`format_infill`, what `/infill` sends), token for token, in
//! the repository-level pattern of Qwen2.5-Coder (arXiv 2409.12186):
//!
//! ```text
//! [FIM_REP]myproject\n                 (when the vocabulary has FIM_REP)
//! [FIM_SEP]filename0\n extra text 0     (per extra chunk; without FIM_SEP, "\n\n--- snippet ---\n\n")
//! ...
//! [FIM_SEP]filename\n                   (when the vocabulary has FIM_SEP)
//! [BOS][FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]
//! ```
//!
//! Without [`InfillParts::repository`] (a completion's `suffix`, as Ollama's templates write
//! it) only the last line.
//!
//! `spm` order (`--spm-infill`) puts `[FIM_SUF]suffix` before `[FIM_PRE]prefix prompt`. BOS
//! (where the vocabulary adds one) comes after the extra context, as llama-server puts it.
//! Texts are tokenized without BOS and without parsing special-token text: a file's
//! `<|endoftext|>` is code, not a control token.

use super::Tokenizer;

/// The FIM tokens of a vocabulary (`tokenizer.ggml.fim_*_token_id`, else found by their text as
/// llama.cpp does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: u32,
    pub suf: u32,
    pub mid: u32,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

/// A vocabulary without the three tokens a FIM prompt needs. The message is llama-server's,
/// which clients match on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("Infill is not supported by this model: {missing}(the vocabulary has no fill-in-the-middle tokens)")]
pub struct NoFimTokens {
    missing: String,
}

/// One extra file of context (`input_extra`, as llama-server reads it: `filename` "tmp" when
/// not given).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct ExtraChunk {
    #[serde(default = "ExtraChunk::unnamed")]
    pub filename: String,
    pub text: String,
}

impl ExtraChunk {
    fn unnamed() -> String {
        "tmp".into()
    }
}

/// What a FIM prompt is made of, tokenized: the text before the cursor, after it, and an
/// optional start of the answer (`prompt`), with the extra files.
#[derive(Clone, Debug, Default)]
pub struct InfillParts<'a> {
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
    pub prompt: Vec<u32>,
    pub extra: &'a [ExtraChunk],
    /// The repository lines (FIM_REP, FIM_SEP) before the prefix: llama-server's `/infill`.
    pub repository: bool,
}

/// How much of each part fits (llama-server's split, with its default `n_predict` of −1): the
/// prefix's last `3/4 n_batch` tokens, the suffix's first `n_batch/4 - 2 - prompt` tokens, and
/// the extra context's last `n_ctx - n_batch + 2` tokens, or fewer where the whole prompt would
/// not leave a token of the context free (llama-server then refuses the request).
#[derive(Clone, Copy, Debug)]
pub struct InfillBudget {
    pub n_batch: usize,
    pub n_ctx: usize,
    /// Suffix first (`--spm-infill`).
    pub spm: bool,
}

impl InfillBudget {
    /// llama-server's logical batch (2048).
    pub const N_BATCH: usize = 2048;

    /// The split of a context of `n_ctx`: llama-server's batch, or half the context where
    /// that is less (llama-server would give a short context's prefix more room than it has,
    /// and the extra files none).
    pub fn new(n_ctx: usize, spm: bool) -> InfillBudget {
        InfillBudget {
            n_batch: Self::N_BATCH.min(n_ctx / 2),
            n_ctx,
            spm,
        }
    }
}

impl Tokenizer {
    /// The vocabulary's FIM tokens, or which of the three needed are missing.
    pub fn fim_tokens(&self) -> Result<FimTokens, NoFimTokens> {
        let ids = &self.ids;
        let needed = [
            (ids.fim_pre, "prefix"),
            (ids.fim_suf, "suffix"),
            (ids.fim_mid, "middle"),
        ];
        match (ids.fim_pre, ids.fim_suf, ids.fim_mid) {
            (Some(pre), Some(suf), Some(mid)) => Ok(FimTokens {
                pre,
                suf,
                mid,
                rep: ids.fim_rep,
                sep: ids.fim_sep,
            }),
            _ => Err(NoFimTokens {
                missing: (needed.iter().filter(|(id, _)| id.is_none()))
                    .map(|(_, what)| format!("{what} token is missing. "))
                    .collect(),
            }),
        }
    }

    /// The FIM prompt (module docs) for `parts`, cut to `budget`.
    #[must_use]
    pub fn infill_prompt(
        &self,
        fim: &FimTokens,
        parts: &InfillParts,
        budget: InfillBudget,
    ) -> Vec<u32> {
        let plain = |text: &str| self.encode(text, false, false);
        let mut extra = Vec::new();
        let (rep, sep) = match parts.repository {
            true => (fim.rep, fim.sep),
            false => (None, None),
        };
        if let Some(rep) = rep {
            extra.push(rep);
            extra.extend(plain("myproject\n"));
        }
        for chunk in parts.extra {
            match sep {
                Some(sep) => {
                    extra.push(sep);
                    extra.extend(plain(&format!("{}\n", chunk.filename)));
                }
                None => extra.extend(plain("\n\n--- snippet ---\n\n")),
            }
            extra.extend(plain(&chunk.text));
        }
        if let Some(sep) = sep {
            extra.push(sep);
            extra.extend(plain("filename\n"));
        }

        let n_batch = budget.n_batch;
        let prefix_take = parts.prefix.len().min(3 * (n_batch / 4));
        let suffix_room = (n_batch / 4).saturating_sub(2 + parts.prompt.len());
        let suffix_take = parts.suffix.len().min(suffix_room);
        let bos = usize::from(self.add_bos && self.ids.bos.is_some());
        let rest = bos + prefix_take + parts.prompt.len() + suffix_take + 3;
        let extra_take = extra
            .len()
            .min((budget.n_ctx + 2).saturating_sub(n_batch))
            .min(budget.n_ctx.saturating_sub(rest + 1));

        let mut prefix = vec![fim.pre];
        prefix.extend_from_slice(&parts.prefix[parts.prefix.len() - prefix_take..]);
        prefix.extend_from_slice(&parts.prompt);
        let mut suffix = vec![fim.suf];
        suffix.extend_from_slice(&parts.suffix[..suffix_take]);
        let (first, second) = match budget.spm {
            true => (suffix, prefix),
            false => (prefix, suffix),
        };

        let mut ids = Vec::with_capacity(extra_take + first.len() + second.len() + 2);
        ids.extend_from_slice(&extra[extra.len() - extra_take..]);
        if self.add_bos {
            ids.extend(self.ids.bos);
        }
        ids.extend(first);
        ids.extend(second);
        ids.push(fim.mid);
        ids
    }
}
