//! Speculative decoding flags (llama.cpp's names): `--spec-type ngram-simple` (prompt lookup)
//! or `-md` / `--model-draft` (a smaller model of the same vocabulary), `--draft-max`,
//! `--draft-min`, `--draft-p-min`, `--spec-ngram-size-n`.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use super::common::{self, Loaded, ModelArgs};
use kiln::engine::slot_drafter::SlotDrafter;
use kiln::engine::speculative::{draft_context, NgramDrafter, SpecStats};
use kiln::engine::{Engine, SessionOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecType {
    /// No speculation.
    None,
    /// Prompt lookup: the tokens that followed the last occurrence of the context's last n
    /// tokens (no second model).
    NgramSimple,
    /// A draft model (--model-draft) decoding greedily.
    DraftSimple,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Speculative decoding")]
pub struct SpecArgs {
    /// Speculative decoding: each token is evaluated with guesses of the next ones in one pass
    /// and the guesses the sampler agrees with are kept (the same output, fewer passes).
    /// Default: draft-simple with --model-draft, none without.
    #[arg(long = "spec-type", value_enum)]
    pub spec_type: Option<SpecType>,
    /// Draft model (a GGUF path or a pulled model's name) of the same vocabulary (llama.cpp's
    /// -md).
    #[arg(long = "model-draft", value_name = "MODEL")]
    pub model_draft: Option<String>,
    /// Most draft tokens verified per pass.
    #[arg(long = "draft-max", visible_aliases = ["draft", "draft-n"], default_value_t = 16)]
    pub draft_max: usize,
    /// Fewer drafts than this are not verified (the token is decoded alone).
    #[arg(long = "draft-min", visible_alias = "draft-n-min", default_value_t = 1)]
    pub draft_min: usize,
    /// The draft model stops guessing where its most likely token is less likely than this
    /// [default: 0.8].
    #[arg(long = "draft-p-min")]
    pub draft_p_min: Option<f32>,
    /// ngram-simple: the length of the n-gram looked up (the context's last n tokens).
    #[arg(long = "spec-ngram-size-n", default_value_t = 3)]
    pub ngram_n: usize,
    /// The draft model's context (llama.cpp's -cd): at most -c (default: -c, or the draft's
    /// training context where shorter). A history past it decodes without drafts.
    #[arg(long = "ctx-size-draft", value_name = "N")]
    pub ctx_size_draft: Option<usize>,
}

/// `--draft-p-min`'s default (llama.cpp's).
const DRAFT_P_MIN: f32 = 0.8;

/// Most drafts a pass may verify (`--draft-max`): the pass's logits take `draft_max + 1` rows
/// of the vocabulary.
pub const MAX_DRAFTS: usize = 128;

impl SpecArgs {
    fn kind(&self) -> SpecType {
        match (self.spec_type, &self.model_draft) {
            (Some(t), _) => t,
            (None, Some(_)) => SpecType::DraftSimple,
            (None, None) => SpecType::None,
        }
    }

    /// Check the flags before anything is loaded; whether they ask for speculation.
    pub fn check(&self) -> Result<bool> {
        if let Some(p) = self.draft_p_min.filter(|p| !(0.0..=1.0).contains(p)) {
            bail!("--draft-p-min {p} is not a probability");
        }
        if !(1..=MAX_DRAFTS).contains(&self.draft_max) {
            bail!("--draft-max must be from 1 to {MAX_DRAFTS}");
        }
        if self.ctx_size_draft.is_some() && self.model_draft.is_none() {
            bail!("--ctx-size-draft is for a draft model (--model-draft)");
        }
        let on = match (self.kind(), &self.model_draft) {
            (SpecType::None, Some(_)) => bail!("--model-draft with --spec-type none"),
            (SpecType::None, None) => false,
            (SpecType::NgramSimple, Some(_)) => {
                bail!("--model-draft is for --spec-type draft-simple, not ngram-simple")
            }
            (SpecType::NgramSimple, None) if self.ngram_n == 0 => {
                bail!("--spec-ngram-size-n must be at least 1")
            }
            (SpecType::DraftSimple, None) => bail!("--spec-type draft-simple needs --model-draft"),
            _ => true,
        };
        Ok(on)
    }

    /// Check `kiln serve`'s flags before anything is loaded; whether they ask for
    /// speculation.
    pub fn serve_check(&self) -> Result<bool> {
        if self.draft_p_min.is_some() && self.model_draft.is_none() {
            bail!("--draft-p-min is for a draft model (--model-draft)");
        }
        self.check()
    }

    /// `kiln serve`'s speculation: prompt lookup, or a draft model (loaded beside `target`)
    /// with a slot per sequence slot.
    pub fn serve(
        &self,
        args: &ModelArgs,
        target: &Loaded,
    ) -> Result<Option<kiln::server::ServeSpeculation>> {
        if !self.serve_check()? {
            return Ok(None);
        }
        let draft = match &self.model_draft {
            None => None,
            Some(name) => Some(kiln::server::ServeDraftModel {
                model: self.load_draft(name, target, args)?.model,
                p_min: self.draft_p_min.unwrap_or(DRAFT_P_MIN),
                n_ctx: self.ctx_size_draft,
            }),
        };
        Ok(Some(kiln::server::ServeSpeculation {
            ngram_n: self.ngram_n,
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            draft,
        }))
    }

    /// The engine of `target` with the speculation the flags ask for (whether they ask for
    /// one): its runner verifies up to `--draft-max` drafts a pass; drafts come from prompt
    /// lookup or a draft model's runner, stepped on the engine's threads.
    pub fn engine<'t>(&self, target: &'t Loaded, args: &ModelArgs) -> Result<(Engine<'t>, bool)> {
        let on = self.check()?;
        let opts = common::session_options(target, args)?;
        let draft_max = if on { self.draft_max } else { 0 };
        let runner = common::new_runner(&target.model, &opts, draft_max)?;
        let mut engine = Engine::new(runner, &target.tokenizer)?;
        if !on {
            return Ok((engine, false));
        }
        match &self.model_draft {
            None => engine.speculate(
                NgramDrafter::new(self.ngram_n, self.ngram_n),
                self.draft_min,
            ),
            Some(name) => {
                let draft = self.load_draft(name, target, args)?;
                let n_ctx = draft_context(opts.n_ctx, self.ctx_size_draft, &draft.model.config);
                let dopts = SessionOptions {
                    n_ctx,
                    kv_budget: None,
                    ..opts
                };
                let runner = common::new_runner(&draft.model, &dopts, 0)?;
                let p_min = self.draft_p_min.unwrap_or(DRAFT_P_MIN);
                let drafter = SlotDrafter::new(runner, engine.runner(), p_min)?;
                engine.speculate(drafter, self.draft_min);
            }
        }
        Ok((engine, true))
    }

    /// The draft model `name`, loaded as `args` load models, of `target`'s vocabulary.
    fn load_draft(&self, name: &str, target: &Loaded, args: &ModelArgs) -> Result<Loaded> {
        let mut dargs = args.clone();
        dargs.model = Some(name.to_string());
        dargs.hf_repo = None;
        let draft = common::load(&dargs).context("loading the draft model")?;
        same_vocabulary(target, &draft)?;
        Ok(draft)
    }
}

/// A draft model must spell every token as the target does: its guesses are the target's ids.
fn same_vocabulary(target: &Loaded, draft: &Loaded) -> Result<()> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    let (nt, nd) = (
        target.model.config.vocab_size,
        draft.model.config.vocab_size,
    );
    if nt != nd || t.vocab_size() != d.vocab_size() {
        bail!(
            "the draft model {} has a vocabulary of {nd} tokens, the model {nt}: a draft must share the model's vocabulary",
            draft.path.display()
        );
    }
    if let Some(id) = (0..t.vocab_size() as u32).find(|&i| t.token_text(i) != d.token_text(i)) {
        bail!(
            "the draft model {} spells token {id} {:?}, the model {:?}: a draft must share the model's vocabulary",
            draft.path.display(),
            d.token_text(id),
            t.token_text(id)
        );
    }
    Ok(())
}

/// The line `-v` and `--json` report: passes, drafts and how many were accepted.
pub fn describe(s: &SpecStats) -> String {
    let rate = if s.drafted > 0 {
        100.0 * s.accepted as f64 / s.drafted as f64
    } else {
        0.0
    };
    format!(
        "{} verification passes, {} draft tokens, {} accepted ({rate:.1}%)",
        s.passes, s.drafted, s.accepted
    )
}
