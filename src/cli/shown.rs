//! What of an answer the terminal shows (`kiln run`, `kiln chat`): for a model that answers in
//! harmony's channels (gpt-oss), the `final` channel, without the `analysis` channel's
//! reasoning or the markup; for every other model, the text as it is generated.

use kiln::tokenizer::{ReasoningSplitter, ReasoningStyle, Split, Tokenizer};

/// Filters the pieces of one answer ([`Shown::push`], then [`Shown::finish`]).
pub struct Shown {
    /// Harmony's splitter (`None`: everything is shown).
    splitter: Option<ReasoningSplitter>,
    split: Split,
}

impl Shown {
    /// For an answer to a prompt rendered by `tok`'s chat template (`templated`), or to a raw
    /// prompt (shown as it is).
    pub fn new(tok: &Tokenizer, templated: bool) -> Shown {
        let harmony = templated
            && tok
                .chat_template()
                .is_some_and(|t| ReasoningStyle::from_template(t) == ReasoningStyle::Harmony);
        Shown {
            splitter: harmony.then(|| ReasoningSplitter::new(ReasoningStyle::Harmony, false)),
            split: Split::default(),
        }
    }

    /// The text to show for the next piece of the answer.
    pub fn push<'a>(&'a mut self, piece: &'a str) -> &'a str {
        match self.splitter.as_mut() {
            None => piece,
            Some(s) => {
                self.split = Split::default();
                s.push(piece, &mut self.split);
                &self.split.content
            }
        }
    }

    /// The text held back at the end of the answer.
    pub fn finish(&mut self) -> &str {
        self.split = Split::default();
        if let Some(s) = self.splitter.as_mut() {
            s.finish(&mut self.split);
        }
        &self.split.content
    }
}
