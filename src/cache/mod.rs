//! Memory that lives for a whole session: the KV cache and the scratch buffers.

pub mod kv;
pub mod layout;
pub mod offload;
pub mod scratch;
pub mod slots;

/// The cache's element types, defined beside the attention kernel that reads them.
pub use crate::kernels::kv_type::{self, KvLayer, KvType, KvTypeError};
pub use kv::{KvCache, KvCacheError, KvOverflow, KvWindowError};
pub use layout::{KvBudgetError, KvLayout, KvWindow};
pub use scratch::{Scratch, ScratchSpec};
pub use slots::{SeqCache, SlotKv, Slots};
