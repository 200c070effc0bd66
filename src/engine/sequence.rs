//! What a session and the batch runner share about a sequence: why its generation stopped,
//! the prefix its cached tokens share with new ones, and masked logits. (Its KV cache is a
//! slot of the device's executor, `backend::exec`.)

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_new` tokens were generated.
    Length,
    /// The context filled up.
    ContextFull,
    /// The caller asked to stop (Ctrl-C, a closed connection).
    Cancelled,
}

/// Length of the common prefix of a sequence's cached tokens and `tokens`.
pub fn common_prefix(cached: &[u32], tokens: &[u32]) -> usize {
    cached
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count()
}

/// Set the logits of `tokens` to -inf, so that no sampler picks them (`--ignore-eos`).
pub fn mask_logits(row: &mut [f32], tokens: &[u32]) {
    for &t in tokens {
        if let Some(l) = row.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}
