//! Memory that lives for a whole session: the KV cache and the scratch buffers.

pub mod kv;
pub mod scratch;

pub use kv::{KvCache, KvLayer, KvLayout, KvOverflow, KvType, KvTypeError};
pub use scratch::{Scratch, ScratchSpec};
