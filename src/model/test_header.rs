//! The header of a minimal model file, for the architectures' configuration tests.

use super::{read_config, ModelConfig, ModelError};
use crate::gguf::{GgufFile, GgufWriter, Value};

/// A minimal header of `arch`: `blocks` blocks of width 64, a feed-forward of 128, 4 heads, a
/// vocabulary of 10.
pub(crate) struct Header {
    arch: &'static str,
    blocks: u32,
}

impl Header {
    pub(crate) const fn new(arch: &'static str, blocks: u32) -> Header {
        Header { arch, blocks }
    }

    /// The configuration of this header with `extra` keys (named without the `arch.` prefix).
    pub(crate) fn config(&self, extra: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
        let arch = self.arch;
        let mut w = GgufWriter::new();
        w.add("general.architecture", arch);
        w.add(format!("{arch}.block_count"), Value::U32(self.blocks));
        w.add(format!("{arch}.embedding_length"), Value::U32(64));
        w.add(format!("{arch}.feed_forward_length"), Value::U32(128));
        w.add(format!("{arch}.attention.head_count"), Value::U32(4));
        w.add(format!("{arch}.vocab_size"), Value::U32(10));
        for (k, v) in extra {
            w.add(format!("{arch}.{k}"), v.clone());
        }
        let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
        read_config(&f).map(|(c, _)| c)
    }
}
