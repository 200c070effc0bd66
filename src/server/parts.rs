//! One answer split into parts as the engine's text comes: its text, its reasoning and its tool
//! calls, one part open at a time. Anthropic's content blocks and the Responses API's output
//! items are such parts; each API renders the same [`PartStep`]s.

use serde_json::Value;

use super::respond::{Answers, Delta, Ev};
use crate::engine::scheduler::{FinishReason, Finished};

/// A part as it begins.
pub(super) enum Part {
    /// The answer's text.
    Text,
    /// The model's reasoning (where it is separated).
    Reasoning,
    /// A tool call, with its id and the function's name.
    Call { id: String, name: String },
}

/// The kind of the open part.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Reasoning,
    Call,
}

/// What the answer does next.
pub(super) enum PartStep {
    /// A part begins.
    Open(Part),
    /// More of the open part: its text, or its call's arguments' JSON text.
    More(String),
    /// The open part ends.
    Close,
    /// The answer ends.
    End(Finished),
    /// The engine refused the request.
    Error(String),
    /// The server's shutdown grace period ended ([`super::respond::cut_error`]).
    Cut,
}

/// One answer (choice 0) in parts.
pub(super) struct Parts {
    answers: Answers,
    /// The open part.
    open: Option<Kind>,
    /// Whitespace not yet in a text part: one opens at its first other character, and
    /// whitespace before a call, reasoning or the end is dropped (Anthropic refuses blank text
    /// blocks when a client sends the turn back).
    space: String,
}

impl Parts {
    pub(super) fn new(answers: Answers) -> Parts {
        Parts {
            answers,
            open: None,
            space: String::new(),
        }
    }

    /// Every choice's state (choice 0 is the one in parts).
    pub(super) fn answers(&self) -> &Answers {
        &self.answers
    }

    /// The steps one engine event makes; whether it was the last.
    pub(super) fn on(&mut self, ev: Ev, out: &mut Vec<PartStep>) -> bool {
        match ev {
            Ev::Logprobs(_) => false,
            Ev::Text(t) => {
                for d in self.answers.pieces(0, Some(&t)) {
                    self.piece(d, out);
                }
                false
            }
            Ev::Cut => {
                out.push(PartStep::Cut);
                true
            }
            Ev::Done(f) => {
                if let FinishReason::Error(e) = &f.reason {
                    out.push(PartStep::Error(e.clone()));
                    return true;
                }
                for d in self.answers.pieces(0, None) {
                    self.piece(d, out);
                }
                if self.open.take().is_some() {
                    out.push(PartStep::Close);
                }
                out.push(PartStep::End(f));
                true
            }
        }
    }

    /// Close the open part, if any, and open one of `kind`.
    fn open(&mut self, kind: Kind, part: Part, out: &mut Vec<PartStep>) {
        if self.open.is_some() {
            out.push(PartStep::Close);
        }
        self.open = Some(kind);
        out.push(PartStep::Open(part));
    }

    fn piece(&mut self, d: Delta, out: &mut Vec<PartStep>) {
        match d {
            Delta::Content(t) if self.open == Some(Kind::Text) => out.push(PartStep::More(t)),
            Delta::Content(t) if t.trim().is_empty() => self.space.push_str(&t),
            Delta::Content(t) => {
                self.open(Kind::Text, Part::Text, out);
                out.push(PartStep::More(std::mem::take(&mut self.space) + &t));
            }
            Delta::Reasoning(t) if self.open == Some(Kind::Reasoning) => {
                out.push(PartStep::More(t))
            }
            Delta::Reasoning(t) if t.trim().is_empty() => {}
            Delta::Reasoning(t) => {
                self.space.clear();
                self.open(Kind::Reasoning, Part::Reasoning, out);
                out.push(PartStep::More(t.trim_start().to_owned()));
            }
            Delta::Call(c) => {
                let f = &c["function"];
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    self.space.clear();
                    let part = Part::Call {
                        id: id.to_owned(),
                        name: f["name"].as_str().unwrap_or("").to_owned(),
                    };
                    self.open(Kind::Call, part, out);
                }
                if let Some(a) = f["arguments"].as_str().filter(|a| !a.is_empty()) {
                    out.push(PartStep::More(a.to_owned()));
                }
            }
        }
    }
}
