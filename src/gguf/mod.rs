//! The GGUF file format (versions 2 and 3), read over a memory map.
//!
//! [`GgufFile::open`] maps the file, parses and validates the header (metadata and tensor
//! infos) and leaves the tensor data in place: [`GgufFile::tensor_bytes`] hands out zero-copy
//! views. Files are treated as hostile input — see [`reader`] for what is checked.
//! [`GgufWriter`] builds files (for tests and derived test models). A model split across
//! files ([`split`]) opens as one with [`GgufFile::open_model`].

mod bytes;
mod error;
pub mod reader;
pub mod split;
pub mod summary;
mod value;
pub mod writer;

pub use bytes::{whole_pages, TensorBytes, PAGE};
pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use summary::{FormatStats, ModelSummary, TensorRow};
pub use value::{Array, Value};
pub use writer::{GgufWriter, RawTensor};

#[cfg(test)]
mod tests;
