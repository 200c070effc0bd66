//! Memory that lives for a whole session: the KV cache and the scratch buffers.

pub mod kv;
pub mod offload;
pub mod scratch;

pub use kv::{
    KvBudgetError, KvCache, KvCacheError, KvLayer, KvLayout, KvOverflow, KvType, KvTypeError,
};
pub use scratch::{Scratch, ScratchSpec};
