//! Everything that can be wrong with a GGUF file, each case naming the problem and where it is.
//!
//! Byte offsets are absolute positions in the file, so a hex dump (`xxd -s OFFSET`) lands on them.

use std::path::PathBuf;

#[derive(thiserror::Error, Debug)]
pub enum GgufError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "not a GGUF file: the first four bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)"
    )]
    BadMagic { found: Vec<u8> },

    #[error("unsupported GGUF version {0} (kiln reads versions 2 and 3)")]
    UnsupportedVersion(u32),

    #[error(
        "big-endian GGUF file (version {0} byte-swapped); kiln reads little-endian files only"
    )]
    BigEndian(u32),

    #[error("file truncated: {what} at byte {offset} needs {need} bytes, only {have} remain")]
    Truncated {
        what: String,
        offset: usize,
        need: usize,
        have: usize,
    },

    /// A count (of tensors, key/value pairs, array elements) that cannot fit in the rest of the
    /// file even if every item had its minimum encoded size. Checked before allocating.
    #[error(
        "{what} at byte {offset} is {count}, but the {remaining} remaining bytes hold at most {max}"
    )]
    CountTooLarge {
        what: String,
        offset: usize,
        count: u64,
        remaining: usize,
        max: usize,
    },

    #[error("{what} at byte {offset} is not valid UTF-8: {source}")]
    InvalidUtf8 {
        what: String,
        offset: usize,
        #[source]
        source: std::str::Utf8Error,
    },

    #[error("unknown metadata value type {type_id} for key '{key}' at byte {offset}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: usize,
    },

    #[error("invalid bool byte {byte} for key '{key}' at byte {offset} (expected 0 or 1)")]
    BadBool {
        key: String,
        byte: u8,
        offset: usize,
    },

    #[error(
        "array for key '{key}' at byte {offset} is nested {depth} deep (at most {max} allowed)"
    )]
    NestingTooDeep {
        key: String,
        offset: usize,
        depth: usize,
        max: usize,
    },

    #[error("duplicate metadata key '{key}' at byte {offset}")]
    DuplicateKey { key: String, offset: usize },

    #[error("duplicate tensor name '{name}' at byte {offset}")]
    DuplicateTensor { name: String, offset: usize },

    #[error("general.alignment = {found} is not a power of two (at byte {offset})")]
    BadAlignment { found: String, offset: usize },

    #[error("tensor '{name}' (info at byte {offset}) has {n_dims} dimensions; 1 to 4 are allowed")]
    BadDimCount {
        name: String,
        n_dims: u32,
        offset: usize,
    },

    #[error("tensor '{name}' (info at byte {offset}) has a zero dimension: shape {shape:?}")]
    ZeroDim {
        name: String,
        shape: Vec<u64>,
        offset: usize,
    },

    #[error("tensor '{name}' (info at byte {offset}): the size of shape {shape:?} overflows")]
    ShapeOverflow {
        name: String,
        shape: Vec<u64>,
        offset: usize,
    },

    #[error(
        "tensor '{name}' (info at byte {offset}): ggml type {type_id} ({type_name}) is not supported"
    )]
    UnsupportedType {
        name: String,
        type_id: u32,
        type_name: &'static str,
        offset: usize,
    },

    #[error(
        "tensor '{name}' (info at byte {offset}): rows of {row} elements are not a whole number \
         of {ty} blocks ({block} elements each)"
    )]
    PartialBlock {
        name: String,
        ty: crate::quant::GgmlType,
        row: usize,
        block: usize,
        offset: usize,
    },

    #[error(
        "tensor '{name}' (info at byte {info_offset}): data offset {data_offset} is not a \
         multiple of the alignment {alignment}"
    )]
    UnalignedTensor {
        name: String,
        data_offset: u64,
        alignment: usize,
        info_offset: usize,
    },

    #[error(
        "tensor '{name}' (info at byte {info_offset}): data at bytes {start}..{end} lies past \
         the end of the file ({file_size} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_size: usize,
        info_offset: usize,
    },

    #[error(
        "tensors '{first}' (bytes {first_start}..{first_end}) and '{second}' (bytes \
         {second_start}..{second_end}) overlap"
    )]
    OverlappingTensors {
        first: String,
        first_start: usize,
        first_end: usize,
        second: String,
        second_start: usize,
        second_end: usize,
    },

    #[error("missing metadata key '{key}'")]
    MissingKey { key: String },

    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("metadata key '{key}' = {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    /// A part of a split model (`NAME-0000I-of-0000N.gguf`) missing, misnumbered or misnamed.
    #[error("{}: {problem}", path.display())]
    Split { path: PathBuf, problem: String },
}
