//! Memory that lives for a whole session: the KV cache and the scratch buffers.

pub mod kv;
pub mod scratch;

pub use kv::{KvCache, KvLayout, KvOverflow};
pub use scratch::{Scratch, ScratchSpec};
