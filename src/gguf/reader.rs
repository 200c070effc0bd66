//! Parsing and validating a GGUF file (versions 2 and 3, little-endian).
//!
//! Layout (all integers little-endian):
//! ```text
//! "GGUF"  u32 version  u64 n_tensors  u64 n_kv
//! n_kv ×      { string key, u32 value_type, value }
//! n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//! padding to `general.alignment` (default 32)
//! data section: tensor `offset`s are relative to its start
//! ```
//! A string is a `u64` byte length followed by UTF-8 bytes. An array value is
//! `u32 elem_type, u64 count, elements`.
//!
//! The file is untrusted: every count is bounded by what the remaining bytes could hold before
//! anything is allocated, every size is computed with checked arithmetic, and every tensor's
//! data range is checked against the file and against the other tensors. Parsing never panics.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::bytes::{Backing, Cursor, TensorBytes};
use super::split;
use super::value::{type_id, Array, Value};
use super::GgufError;
use crate::quant::GgmlType;

/// `"GGUF"` as stored.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays may nest this deep (an array of arrays is depth 2). Real files never nest;
/// the bound keeps hostile files from recursing without limit.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Tables of parsed entries (key/values, tensor infos, string / bool / nested arrays) reserve at
/// most this many entries up front and then grow as entries actually parse. A count is only
/// checked against the bytes remaining, and an entry costs 3–10× its minimum encoded size in
/// memory, so reserving a bogus count in full would allocate several times the file size
/// before the first missing entry is noticed. (Fixed-size numeric arrays are read in one
/// bounds-checked slice first and allocate exactly their encoded size.)
const PREALLOCATE_MAX: usize = 4096;

/// The smallest encoded size of one key/value pair: empty key (8) + type (4) + a `u8` value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// The smallest encoded tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) +
/// offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 8 + 4 + 8;

/// One tensor's header entry, validated: known type, 1–4 non-zero dims, whole blocks per row,
/// aligned offset, data inside the file and not overlapping another tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml `ne` order: `shape[0]` is the contiguous (fastest-varying) dimension, so a weight
    /// matrix for `y = W x` with `x` of length `n_in` has `shape == [n_in, n_out]`.
    pub shape: Vec<usize>,
    pub ty: GgmlType,
    /// Offset of the data relative to the data section, as stored.
    pub offset: usize,
    pub n_elements: usize,
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Elements per row (`shape[0]`).
    pub fn row_len(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    /// Number of rows (product of `shape[1..]`).
    pub fn n_rows(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// A parsed GGUF file: header, metadata in file order, tensor infos, and the bytes behind them.
/// A split model ([`GgufFile::open_model`]) is one of these over all its parts: the first
/// part's metadata, every part's tensors.
pub struct GgufFile {
    backing: Arc<Backing>,
    /// The first part's header (with every part's tensors).
    header: Header,
    /// The parts after the first of a split model (none for one file).
    parts: Vec<Part>,
    /// Per tensor (in `tensors` order), the part holding its bytes (0: the first); empty for
    /// one file.
    tensor_part: Vec<usize>,
}

/// A further part of a split model: its bytes and where its data section starts.
struct Part {
    backing: Arc<Backing>,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("file_size", &self.file_size())
            .field("n_metadata", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map `path` read-only and parse it. Tensor data is not read (or paged in) here.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::parse(Arc::new(Backing::map(path.as_ref(), false)?))
    }

    /// [`GgufFile::open`], reading the whole file at once (the CLI's `--no-mmap`): load takes
    /// longer, the first token does not wait on page faults.
    pub fn open_preloaded(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::parse(Arc::new(Backing::map(path.as_ref(), true)?))
    }

    /// Parse an owned buffer (tests, fuzzing, files built in memory).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Arc::new(Backing::Owned(bytes)))
    }

    fn parse(backing: Arc<Backing>) -> Result<GgufFile, GgufError> {
        let header = parse_header(&backing)?;
        Ok(GgufFile {
            backing,
            header,
            parts: Vec::new(),
            tensor_part: Vec::new(),
        })
    }

    /// A model: [`GgufFile::open`], and where the file is the first part of a split model
    /// (`split.count` > 1), every other part too, as llama.cpp's loader finds and checks them
    /// ([`super::split`]). `preload` reads every part at once (`--no-mmap`).
    pub fn open_model(path: impl AsRef<Path>, preload: bool) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let mut first = Self::parse(Arc::new(Backing::map(path, preload)?))?;
        let count = first.opt_u32(split::SPLIT_COUNT)?.unwrap_or(1) as usize;
        if count <= 1 {
            return Ok(first);
        }
        let fail = |p: &Path, problem: String| GgufError::Split {
            path: p.to_path_buf(),
            problem,
        };
        let no = first.opt_u32(split::SPLIT_NO)?.unwrap_or(0) as usize;
        if no != 0 {
            let problem = format!(
                "part {} of a model split in {count}: a split model is opened by its first part (...{})",
                no + 1,
                split::suffix(0, count)
            );
            return Err(fail(path, problem));
        }
        let Some(paths) = split::part_paths(path, count) else {
            let problem = format!(
                "split.count = {count}, but the file is not named as the first part (...{})",
                split::suffix(0, count)
            );
            return Err(fail(path, problem));
        };
        first.tensor_part = vec![0; first.header.tensors.len()];
        for (i, p) in paths.iter().enumerate().skip(1) {
            if !p.is_file() {
                let problem = format!("part {} of {count} of {} is missing", i + 1, path.display());
                return Err(fail(p, problem));
            }
            let part = Self::parse(Arc::new(Backing::map(p, preload)?))
                .map_err(|e| fail(p, e.to_string()))?;
            let key_no = part
                .opt_u32(split::SPLIT_NO)
                .map_err(|e| fail(p, e.to_string()))?;
            let key_count = part
                .opt_u32(split::SPLIT_COUNT)
                .map_err(|e| fail(p, e.to_string()))?;
            if key_no != Some(i as u32) || key_count != Some(count as u32) {
                let show = |v: Option<u32>| v.map_or("missing".to_string(), |v| v.to_string());
                let problem = format!(
                    "split.no = {}, split.count = {}; part {} of {count} needs split.no = {i}, split.count = {count}",
                    show(key_no),
                    show(key_count),
                    i + 1
                );
                return Err(fail(p, problem));
            }
            first.join(part, i).map_err(|problem| fail(p, problem))?;
        }
        let want = first.opt_u64(split::SPLIT_TENSORS_COUNT)?;
        if want != Some(first.header.tensors.len() as u64) {
            let want = want.map_or("missing".to_string(), |n| n.to_string());
            let problem = format!(
                "split.tensors.count = {want}, but the {count} parts hold {} tensors",
                first.header.tensors.len()
            );
            return Err(fail(path, problem));
        }
        Ok(first)
    }

    /// Take `part`'s tensors in as part number `no` (its bytes stay in its own backing).
    fn join(&mut self, part: GgufFile, no: usize) -> Result<(), String> {
        for t in part.header.tensors {
            if self.header.tensor_index.contains_key(&t.name) {
                return Err(format!("tensor '{}' is also in an earlier part", t.name));
            }
            self.header
                .tensor_index
                .insert(t.name.clone(), self.header.tensors.len());
            self.header.tensors.push(t);
            self.tensor_part.push(no);
        }
        self.parts.push(Part {
            backing: part.backing,
            data_offset: part.header.data_offset,
        });
        Ok(())
    }

    /// How many files the model's bytes lie in (1, or a split model's parts).
    pub fn n_parts(&self) -> usize {
        1 + self.parts.len()
    }

    /// The size of each file of the model (one, or each part of a split model).
    pub fn part_sizes(&self) -> Vec<usize> {
        std::iter::once(self.backing.len())
            .chain(self.parts.iter().map(|p| p.backing.len()))
            .collect()
    }

    /// The part holding `info`'s bytes (0 for one file, or a tensor not of this file).
    pub fn tensor_part(&self, info: &TensorInfo) -> usize {
        match self.tensor_part.is_empty() {
            true => 0,
            false => self
                .header
                .tensor_index
                .get(&info.name)
                .map_or(0, |&i| self.tensor_part[i]),
        }
    }

    /// The backing and data-section offset of part `no`.
    fn part(&self, no: usize) -> (&Arc<Backing>, usize) {
        match no.checked_sub(1).and_then(|i| self.parts.get(i)) {
            Some(p) => (&p.backing, p.data_offset),
            None => (&self.backing, self.header.data_offset),
        }
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// `general.alignment`, default 32; always a power of two.
    pub fn alignment(&self) -> usize {
        self.header.alignment
    }

    /// Absolute byte offset of the data section (tensor offsets are relative to it).
    pub fn data_offset(&self) -> usize {
        self.header.data_offset
    }

    /// Bytes of the file (of every part, for a split model).
    pub fn file_size(&self) -> usize {
        self.part_sizes().iter().sum()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    /// Heap bytes of the parsed header (metadata values, tensor infos and both indexes), each
    /// allocation of `n` bytes costing `alloc(n)`. The tensor data is mapped, not counted here.
    pub fn heap_bytes(&self, alloc: &dyn Fn(usize) -> usize) -> usize {
        fn index(m: &HashMap<String, usize>, alloc: &dyn Fn(usize) -> usize) -> usize {
            // hashbrown: one allocation of `buckets` (key, value) slots plus a control byte per
            // bucket and a group's worth of trailing control bytes.
            let slot = std::mem::size_of::<(String, usize)>();
            let buckets = m
                .capacity()
                .max(1)
                .saturating_mul(8)
                .div_ceil(7)
                .next_power_of_two();
            alloc(buckets * (slot + 1) + 16) + m.keys().map(|k| alloc(k.capacity())).sum::<usize>()
        }
        alloc(self.header.metadata.capacity() * std::mem::size_of::<(String, Value)>())
            + self
                .header
                .metadata
                .iter()
                .map(|(k, v)| alloc(k.capacity()) + v.heap_bytes(alloc))
                .sum::<usize>()
            + alloc(self.header.tensors.capacity() * std::mem::size_of::<TensorInfo>())
            + self
                .header
                .tensors
                .iter()
                .map(|t| alloc(t.name.capacity()) + alloc(t.shape.capacity() * 8))
                .sum::<usize>()
            + index(&self.header.key_index, alloc)
            + index(&self.header.tensor_index, alloc)
            + alloc(self.tensor_part.capacity() * std::mem::size_of::<usize>())
            + alloc(self.parts.capacity() * std::mem::size_of::<Part>())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header
            .key_index
            .get(key)
            .map(|&i| &self.header.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// An integer of any GGUF integer type that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        int_as(key, self.require(key)?, "u32", Value::as_u32)
    }

    /// An integer of any GGUF integer type that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        int_as(key, self.require(key)?, "u64", Value::as_u64)
    }

    /// An `f32` (or `f64`, rounded).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| wrong_type(key, "f32", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong_type(key, "bool", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "string", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong_type(key, "array", v))
    }

    /// `None` if absent, the value if present with a usable type, an error otherwise.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key).map(|_| self.get_f32(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.get(key).map(|_| self.get_array(key)).transpose()
    }

    /// `general.architecture`, e.g. `llama`, `qwen3`, `gemma3`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// `"{arch}.{suffix}"`, e.g. `llama.block_count`. Hyper-parameters are namespaced by the
    /// architecture name. Without a (string) architecture the prefix is empty.
    pub fn arch_key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture().unwrap_or(""))
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The tensor's bytes, zero-copy. `info` must come from this file (its range was checked at
    /// parse time); a foreign info is clamped to the file rather than trusted.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> TensorBytes {
        let (backing, data_offset) = self.part(self.tensor_part(info));
        let size = backing.len();
        let start = data_offset.saturating_add(info.offset).min(size);
        let len = info.n_bytes.min(size - start);
        TensorBytes::new(backing.clone(), start, len)
    }

    /// Absolute byte offset of a tensor's data in its file (its part's data section start +
    /// its relative offset).
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> usize {
        self.part(self.tensor_part(info))
            .1
            .saturating_add(info.offset)
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found: found.type_name(),
    }
}

fn int_as<T>(
    key: &str,
    v: &Value,
    target: &'static str,
    conv: impl Fn(&Value) -> Option<T>,
) -> Result<T, GgufError> {
    if v.as_i128().is_none() {
        return Err(wrong_type(key, target, v));
    }
    conv(v).ok_or_else(|| GgufError::OutOfRange {
        key: key.to_owned(),
        value: v.to_string(),
        target,
    })
}

/// Everything [`parse_header`] finds.
struct Header {
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf);

    // --- Fixed header. ---
    if buf.len() < 4 || buf[..4] != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        });
    }
    c.take(4, &|| "magic".into())?;
    let version = c.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => return Err(GgufError::BigEndian(v.swap_bytes())),
        v => return Err(GgufError::UnsupportedVersion(v)),
    }
    let count_pos = c.pos();
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let kv_pos = c.pos();
    let n_kv = c.u64(&|| "metadata key/value count".into())?;
    let n_kv = c.check_count(
        n_kv,
        MIN_KV_BYTES,
        &|| "metadata key/value count".into(),
        kv_pos,
    )?;
    let kv_bytes = n_kv * MIN_KV_BYTES; // cannot overflow: bounded by remaining()
    let max_tensors = (c.remaining() - kv_bytes) / MIN_TENSOR_INFO_BYTES;
    let n_tensors = match usize::try_from(n_tensors) {
        Ok(n) if n <= max_tensors => n,
        _ => {
            return Err(GgufError::CountTooLarge {
                what: "tensor count".into(),
                offset: count_pos,
                count: n_tensors,
                remaining: c.remaining(),
                max: max_tensors,
            })
        }
    };

    // --- Metadata. ---
    let mut metadata = Vec::with_capacity(n_kv.min(PREALLOCATE_MAX));
    let mut key_index = HashMap::with_capacity(n_kv.min(PREALLOCATE_MAX));
    let mut alignment_pos = 0;
    for i in 0..n_kv {
        let kv_start = c.pos();
        let key = c.string(&|| format!("metadata key #{i}"))?.to_owned();
        let value_pos = c.pos();
        let ty = c.u32(&|| format!("value type of key '{key}'"))?;
        let value = read_value(&mut c, ty, &key, value_pos, 1)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey {
                key,
                offset: kv_start,
            });
        }
        if key == "general.alignment" {
            alignment_pos = kv_start;
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            match v.as_u32() {
                Some(a) if a.is_power_of_two() => a as usize,
                _ => {
                    return Err(GgufError::BadAlignment {
                        found: format!("{v} ({})", v.type_name()),
                        offset: alignment_pos,
                    })
                }
            }
        }
    };

    // --- Tensor infos. ---
    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOCATE_MAX));
    let mut info_offsets = Vec::with_capacity(n_tensors.min(PREALLOCATE_MAX));
    let mut tensor_index = HashMap::with_capacity(n_tensors.min(PREALLOCATE_MAX));
    for i in 0..n_tensors {
        let info_start = c.pos();
        let info = read_tensor_info(&mut c, i, info_start, alignment)?;
        if tensor_index
            .insert(info.name.clone(), tensors.len())
            .is_some()
        {
            return Err(GgufError::DuplicateTensor {
                name: info.name,
                offset: info_start,
            });
        }
        tensors.push(info);
        info_offsets.push(info_start);
    }

    // --- Data section. ---
    let header_end = c.pos();
    let data_offset = header_end.div_ceil(alignment) * alignment; // ≤ 2·len: no overflow
    check_tensor_ranges(&tensors, &info_offsets, data_offset, buf.len())?;

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

/// Read one value of type `ty` (already consumed) for `key`. `depth` counts array nesting.
fn read_value(
    c: &mut Cursor,
    ty: u32,
    key: &str,
    type_pos: usize,
    depth: usize,
) -> Result<Value, GgufError> {
    let what = || format!("value of key '{key}'");
    Ok(match ty {
        type_id::U8 => Value::U8(c.u8(&what)?),
        type_id::I8 => Value::I8(c.u8(&what)? as i8),
        type_id::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        type_id::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        type_id::U32 => Value::U32(c.u32(&what)?),
        type_id::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        type_id::U64 => Value::U64(c.u64(&what)?),
        type_id::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        type_id::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        type_id::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        type_id::BOOL => Value::Bool(read_bool(c, key)?),
        type_id::STRING => Value::String(c.string(&what)?.to_owned()),
        type_id::ARRAY => Value::Array(read_array(c, key, depth)?),
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                type_id: other,
                offset: type_pos,
            })
        }
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool, GgufError> {
    let pos = c.pos();
    match c.u8(&|| format!("bool value of key '{key}'"))? {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::BadBool {
            key: key.to_owned(),
            byte,
            offset: pos,
        }),
    }
}

/// Minimum encoded bytes of one array element of type `ty` (for bounding counts).
fn min_elem_size(ty: u32) -> Option<usize> {
    Some(match ty {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,    // the length prefix
        type_id::ARRAY => 4 + 8, // element type + count
        _ => return None,
    })
}

/// Read `count` fixed-size little-endian elements in one bounds check.
fn read_fixed<const N: usize, T>(
    c: &mut Cursor,
    count: usize,
    key: &str,
    from_le: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // count ≤ remaining / N was checked, so the product cannot overflow.
    let bytes = c.take(count * N, &|| format!("array of key '{key}'"))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            from_le(a)
        })
        .collect())
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array, GgufError> {
    let start = c.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_owned(),
            offset: start,
            depth,
            max: MAX_ARRAY_DEPTH,
        });
    }
    let ty = c.u32(&|| format!("array element type of key '{key}'"))?;
    let Some(min) = min_elem_size(ty) else {
        return Err(GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id: ty,
            offset: start,
        });
    };
    let count_pos = c.pos();
    let count = c.u64(&|| format!("array length of key '{key}'"))?;
    let n = c.check_count(
        count,
        min,
        &|| format!("array length of key '{key}'"),
        count_pos,
    )?;
    Ok(match ty {
        type_id::U8 => Array::U8(c.take(n, &|| format!("array of key '{key}'"))?.to_vec()),
        type_id::I8 => Array::I8(read_fixed(c, n, key, i8::from_le_bytes)?),
        type_id::U16 => Array::U16(read_fixed(c, n, key, u16::from_le_bytes)?),
        type_id::I16 => Array::I16(read_fixed(c, n, key, i16::from_le_bytes)?),
        type_id::U32 => Array::U32(read_fixed(c, n, key, u32::from_le_bytes)?),
        type_id::I32 => Array::I32(read_fixed(c, n, key, i32::from_le_bytes)?),
        type_id::U64 => Array::U64(read_fixed(c, n, key, u64::from_le_bytes)?),
        type_id::I64 => Array::I64(read_fixed(c, n, key, i64::from_le_bytes)?),
        type_id::F32 => Array::F32(read_fixed(c, n, key, f32::from_le_bytes)?),
        type_id::F64 => Array::F64(read_fixed(c, n, key, f64::from_le_bytes)?),
        type_id::BOOL => {
            let mut v = Vec::with_capacity(n.min(PREALLOCATE_MAX));
            for _ in 0..n {
                v.push(read_bool(c, key)?);
            }
            Array::Bool(v)
        }
        type_id::STRING => {
            let mut v = Vec::with_capacity(n.min(PREALLOCATE_MAX));
            for i in 0..n {
                v.push(
                    c.string(&|| format!("string #{i} of key '{key}'"))?
                        .to_owned(),
                );
            }
            Array::String(v)
        }
        type_id::ARRAY => {
            let mut v = Vec::with_capacity(n.min(PREALLOCATE_MAX));
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
        _ => unreachable!("min_elem_size accepted only known types"),
    })
}

/// Read and validate one tensor info (everything that does not depend on other tensors).
fn read_tensor_info(
    c: &mut Cursor,
    index: usize,
    info_start: usize,
    alignment: usize,
) -> Result<TensorInfo, GgufError> {
    let name = c.string(&|| format!("name of tensor #{index}"))?.to_owned();
    let what = |field: &str| format!("{field} of tensor '{name}'");
    let n_dims = c.u32(&|| what("n_dims"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            name,
            n_dims,
            offset: info_start,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&|| what("shape"))?);
    }
    let type_id = c.u32(&|| what("type"))?;
    let offset = c.u64(&|| what("data offset"))?;

    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            name,
            shape: dims,
            offset: info_start,
        });
    }
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnsupportedType {
            name,
            type_id,
            type_name: GgmlType::name_of_id(type_id),
            offset: info_start,
        });
    };
    let overflow = |name: String, dims: Vec<u64>| GgufError::ShapeOverflow {
        name,
        shape: dims,
        offset: info_start,
    };
    // Sizes must fit in i64 as in ggml (and in usize here).
    let shape: Option<Vec<usize>> = dims
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d <= i64::MAX as usize))
        .collect();
    let Some(shape) = shape else {
        return Err(overflow(name, dims));
    };
    let n_elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(n_elements) = n_elements.filter(|&n| n <= i64::MAX as usize) else {
        return Err(overflow(name, dims));
    };
    if shape[0] % ty.block_size() != 0 {
        return Err(GgufError::PartialBlock {
            name,
            ty,
            row: shape[0],
            block: ty.block_size(),
            offset: info_start,
        });
    }
    let n_bytes = ty
        .row_bytes(shape[0])
        .and_then(|row| row.checked_mul(n_elements / shape[0]));
    let Some(n_bytes) = n_bytes else {
        return Err(overflow(name, dims));
    };
    if offset % alignment as u64 != 0 {
        return Err(GgufError::UnalignedTensor {
            name,
            data_offset: offset,
            alignment,
            info_offset: info_start,
        });
    }
    let Ok(offset) = usize::try_from(offset) else {
        return Err(GgufError::TensorOutOfBounds {
            name,
            start: offset,
            end: offset,
            file_size: c.remaining() + c.pos(),
            info_offset: info_start,
        });
    };
    Ok(TensorInfo {
        name,
        shape,
        ty,
        offset,
        n_elements,
        n_bytes,
    })
}

/// Every tensor's data must lie inside the file, and no two may overlap.
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    info_offsets: &[usize],
    data_offset: usize,
    file_size: usize,
) -> Result<(), GgufError> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let start = data_offset as u128 + t.offset as u128;
        let end = start + t.n_bytes as u128;
        if end > file_size as u128 {
            let clamp = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start: clamp(start),
                end: clamp(end),
                file_size,
                info_offset: info_offsets[i],
            });
        }
        ranges.push((start as usize, end as usize, i));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((s0, e0, i0), (s1, e1, i1)) = (w[0], w[1]);
        if s1 < e0 {
            return Err(GgufError::OverlappingTensors {
                first: tensors[i0].name.clone(),
                first_start: s0,
                first_end: e0,
                second: tensors[i1].name.clone(),
                second_start: s1,
                second_end: e1,
            });
        }
    }
    Ok(())
}
