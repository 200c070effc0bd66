//! Incremental detokenization for streaming output.
//!
//! A token can end in the middle of a UTF-8 character (byte-fallback tokens always carry one
//! byte; byte-level BPE tokens split multi-byte characters freely), so text is released only up
//! to the last complete character. Invalid bytes become U+FFFD exactly where
//! `String::from_utf8_lossy` on the whole output would put them, so the concatenation of
//! everything returned equals [`Tokenizer::decode`] of all the ids.

use super::Tokenizer;

/// Turns a stream of token ids into text pieces that never split a character.
///
/// ```text
/// let mut dec = StreamDecoder::new(&tokenizer);
/// for id in generated { if let Some(text) = dec.push(id) { print!("{text}") } }
/// if let Some(text) = dec.flush() { print!("{text}") }
/// ```
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    /// Bytes of an incomplete character carried to the next push.
    pending: Vec<u8>,
    /// Whether the next token is the first (llama.cpp strips its leading space when the
    /// vocabulary adds a space prefix).
    first: bool,
}

impl<'t> StreamDecoder<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
            first: true,
        }
    }

    /// Add one token; returns the newly completed text, if any.
    ///
    /// Decoders with llama.cpp's `clean_spaces` (e.g. `gpt-2` pre-tokenizer vocabularies) tidy
    /// spaces across token boundaries in [`Tokenizer::decode`]; the stream does not, so there
    /// the concatenation can differ from `decode` in those spaces.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let mut out = String::new();
        self.push_into(id, &mut out);
        (!out.is_empty()).then_some(out)
    }

    /// [`StreamDecoder::push`] appending the completed text to `out` (no allocation once
    /// `out` and the decoder's buffer have grown to a token's size).
    pub fn push_into(&mut self, id: u32, out: &mut String) {
        let mut piece = self.tokenizer.token_bytes(id);
        if self.first && self.tokenizer.add_space_prefix && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        self.first = false;
        self.pending.extend_from_slice(piece);
        self.take_complete(out);
    }

    /// End of stream: whatever is left, with incomplete characters replaced by U+FFFD.
    pub fn flush(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(text)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self, out: &mut String) {
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid_up_to` bytes are valid UTF-8.
                    out.push_str(
                        std::str::from_utf8(&self.pending[consumed..consumed + valid])
                            .unwrap_or_default(),
                    );
                    consumed += valid;
                    match e.error_len() {
                        // An invalid sequence: replace it, as from_utf8_lossy would.
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += len;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..consumed);
    }
}
