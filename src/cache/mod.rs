//! Memory that lives for a whole session: the KV cache and the scratch buffers.

pub mod kv;
pub mod kv_type;
pub mod layout;
pub mod offload;
pub mod scratch;

pub use kv::{KvCache, KvCacheError, KvOverflow, KvWindowError};
pub use kv_type::{KvLayer, KvType, KvTypeError};
pub use layout::{KvBudgetError, KvLayout, KvWindow};
pub use scratch::{Scratch, ScratchSpec};
