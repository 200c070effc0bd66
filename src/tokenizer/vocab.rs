//! The vocabulary: token texts, attributes and scores, plus a text -> id index.
//!
//! Token texts live in one string blob with an offset table instead of one `String` each, and
//! the index is an open-addressing table of ids that compares against the blob: for Gemma's
//! 262,144 tokens that is ~3 MB of text plus 2 MB of index, no per-token allocations.

/// Token attributes, as llama.cpp's `llama_token_attr` bits. A GGUF `token_type` maps to one of
/// them; llama.cpp then adjusts some by token text (see `Tokenizer::from_config`).
pub mod attr {
    /// Type 0 or an unknown type: decodes to nothing.
    pub const UNDEFINED: u16 = 0;
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;

    /// GGUF `tokenizer.ggml.token_type` value -> attribute.
    pub fn from_token_type(t: i32) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

const EMPTY: u32 = u32::MAX;

/// A multiplicative hash over 8-byte words (FxHash-style) with a final avalanche, so that both
/// the low bits (slot) and the high bits (tag) are well mixed.
#[inline]
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    // Avalanche (murmur3's finaliser).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[derive(Debug)]
pub(crate) struct Vocab {
    /// All token texts back to back.
    blob: String,
    /// `offsets[id]..offsets[id + 1]` is token `id`'s text; `len() + 1` entries.
    offsets: Vec<u32>,
    /// Open-addressing index: a power-of-two number of slots holding `(token id, high 32 bits
    /// of its hash)` or `EMPTY` ids. The hash bits reject most probes without touching the
    /// (cache-cold) text blob.
    slots: Vec<(u32, u32)>,
    /// Longest token text in bytes: longer lookups fail without hashing.
    max_len: usize,
    /// Per-token attribute bits ([`attr`]).
    pub attrs: Vec<u16>,
    /// Per-token scores (SentencePiece merge priority); all zero when the file has none.
    pub scores: Vec<f32>,
}

/// Why a vocabulary could not be indexed.
#[derive(Debug)]
pub(crate) enum VocabBuildError {
    Duplicate { id: u32, first: u32, text: String },
    TooLarge,
}

impl Vocab {
    /// Index `texts`. Every text must be unique (llama.cpp asserts the same).
    pub fn new(
        texts: Vec<String>,
        attrs: Vec<u16>,
        scores: Vec<f32>,
    ) -> Result<Vocab, VocabBuildError> {
        let n = texts.len();
        let total: usize = texts.iter().map(|t| t.len()).sum();
        if total > u32::MAX as usize || n >= u32::MAX as usize {
            return Err(VocabBuildError::TooLarge);
        }
        let mut blob = String::with_capacity(total);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for t in &texts {
            blob.push_str(t);
            offsets.push(blob.len() as u32);
        }
        drop(texts);
        let n_slots = (n.max(1) * 2).next_power_of_two();
        let mut vocab = Vocab {
            blob,
            offsets,
            slots: vec![(EMPTY, 0); n_slots],
            max_len: 0,
            attrs,
            scores,
        };
        for id in 0..n as u32 {
            let mask = vocab.slots.len() - 1;
            let text = vocab.text(id);
            let h = hash_bytes(text.as_bytes());
            let mut i = h as usize & mask;
            loop {
                let (s, _) = vocab.slots[i];
                if s == EMPTY {
                    vocab.slots[i] = (id, (h >> 32) as u32);
                    break;
                }
                if vocab.text(s) == text {
                    return Err(VocabBuildError::Duplicate {
                        id,
                        first: s,
                        text: text.to_string(),
                    });
                }
                i = (i + 1) & mask;
            }
        }
        vocab.max_len = (0..n as u32)
            .map(|id| vocab.text(id).len())
            .max()
            .unwrap_or(0);
        Ok(vocab)
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The longest token text, in bytes.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The text of token `id` (in the vocabulary's own encoding: byte-level or with `▁`).
    #[inline]
    pub fn text(&self, id: u32) -> &str {
        let (a, b) = (self.offsets[id as usize], self.offsets[id as usize + 1]);
        &self.blob[a as usize..b as usize]
    }

    /// The id of the token whose text is exactly `text`.
    #[inline]
    pub fn lookup(&self, text: &str) -> Option<u32> {
        self.lookup_bytes(text.as_bytes())
    }

    #[inline]
    pub fn lookup_bytes(&self, text: &[u8]) -> Option<u32> {
        if text.len() > self.max_len {
            return None;
        }
        let mask = self.slots.len() - 1;
        let h = hash_bytes(text);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & mask;
        loop {
            let (s, t) = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if t == tag && self.text(s).as_bytes() == text {
                return Some(s);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn attr(&self, id: u32) -> u16 {
        self.attrs[id as usize]
    }

    #[inline]
    pub fn has_attr(&self, id: u32, bits: u16) -> bool {
        self.attrs[id as usize] & bits != 0
    }

    /// Bytes owned by the tables.
    pub fn heap_bytes(&self) -> usize {
        self.blob.capacity()
            + self.offsets.capacity() * 4
            + self.slots.capacity() * 8
            + self.attrs.capacity() * 2
            + self.scores.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(texts: &[&str]) -> Result<Vocab, VocabBuildError> {
        let n = texts.len();
        Vocab::new(
            texts.iter().map(|s| s.to_string()).collect(),
            vec![attr::NORMAL; n],
            vec![0.0; n],
        )
    }

    #[test]
    fn lookup_finds_every_token() {
        let texts: Vec<String> = (0..5000).map(|i| format!("tok{i}")).collect();
        let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
        let v = vocab(&refs).unwrap();
        assert_eq!(v.len(), 5000);
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(v.lookup(t), Some(i as u32));
            assert_eq!(v.text(i as u32), t);
        }
        assert_eq!(v.lookup("tok5000"), None);
        assert_eq!(v.lookup(""), None);
    }

    #[test]
    fn duplicates_are_rejected() {
        match vocab(&["a", "b", "a"]) {
            Err(VocabBuildError::Duplicate {
                id: 2, first: 0, ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
