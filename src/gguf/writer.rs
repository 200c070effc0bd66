//! Serializing GGUF files: metadata plus tensors with alignment padding.
//!
//! Used by tests to build minimal and deliberately broken files, and to derive test models
//! from real ones ([`GgufWriter::from_file`], then edit and [`GgufWriter::to_bytes`]).
//! The output matches llama.cpp's writer: header, key/values, tensor infos, padding to the
//! alignment, then each tensor's data padded to the alignment.

use std::path::Path;

use super::reader::{GgufFile, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::value::{Array, Value};
use crate::quant::GgmlType;

/// A tensor as it will be written. Fields are raw so tests can describe invalid tensors
/// (5 dims, unknown type ids, misaligned or overlapping offsets, data shorter than declared).
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    /// ggml `ne` order (`dims[0]` contiguous).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub type_id: u32,
    /// The offset written in the tensor info; `None` = where the data is actually placed.
    pub offset: Option<u64>,
    /// Bytes written in the data section (placed at the next aligned position).
    pub data: Vec<u8>,
}

/// Builds a GGUF file in memory.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    /// Written as the header version (3 by default; the layout is the same for 2 and 3).
    pub version: u32,
    /// Padding used for the data section. Change it with [`GgufWriter::set_alignment`] so the
    /// `general.alignment` key agrees.
    pub alignment: usize,
    metadata: Vec<(String, Value)>,
    tensors: Vec<RawTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A writer holding a copy of `file`'s metadata and tensors (data copied), to edit and
    /// write back out, e.g. to make a model with a missing tensor.
    pub fn from_file(file: &GgufFile) -> Self {
        let mut w = GgufWriter::new();
        w.version = file.version();
        w.alignment = file.alignment();
        w.metadata = file.metadata().to_vec();
        w.tensors = file
            .tensors()
            .iter()
            .map(|t| RawTensor {
                name: t.name.clone(),
                dims: t.shape.iter().map(|&d| d as u64).collect(),
                type_id: t.ty.id(),
                offset: None,
                data: file.tensor_bytes(t).to_vec(),
            })
            .collect();
        w
    }

    /// Append a key/value pair (duplicates are kept, for building invalid files).
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Replace the value of `key` in place, or append it.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        let value = value.into();
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Remove every pair with this key.
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Use `alignment` for padding and record it as `general.alignment` (u32).
    pub fn set_alignment(&mut self, alignment: u32) -> &mut Self {
        self.alignment = alignment as usize;
        self.set("general.alignment", alignment)
    }

    /// Add a well-formed tensor. `shape` is in ggml `ne` order.
    ///
    /// # Panics
    /// If `data.len()` is not the size of `shape` in `ty` (a bug in the calling test or tool;
    /// use [`GgufWriter::add_raw_tensor`] to write inconsistent tensors on purpose).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        let name = name.into();
        let n: usize = shape.iter().product();
        let expected = shape
            .first()
            .and_then(|&row| ty.row_bytes(row))
            .map(|rb| rb * (n / shape[0].max(1)));
        assert_eq!(
            Some(data.len()),
            expected,
            "tensor '{name}': {} bytes given for shape {shape:?} of type {ty}",
            data.len()
        );
        self.add_raw_tensor(RawTensor {
            name,
            dims: shape.iter().map(|&d| d as u64).collect(),
            type_id: ty.id(),
            offset: None,
            data,
        })
    }

    /// Add an F32 tensor from values.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, shape, GgmlType::F32, data)
    }

    /// Add a tensor exactly as described, valid or not.
    pub fn add_raw_tensor(&mut self, t: RawTensor) -> &mut Self {
        self.tensors.push(t);
        self
    }

    /// Remove a tensor by name (e.g. to test a model with a missing weight).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    pub fn tensors_mut(&mut self) -> &mut Vec<RawTensor> {
        &mut self.tensors
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment.max(1);
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            write_value(&mut out, v);
        }

        // Data placement: each tensor at the next aligned position of the data section.
        let mut placed = Vec::with_capacity(self.tensors.len());
        let mut pos = 0usize;
        for t in &self.tensors {
            placed.push(pos);
            pos = (pos + t.data.len()).div_ceil(align) * align;
        }
        for (t, &at) in self.tensors.iter().zip(&placed) {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&t.offset.unwrap_or(at as u64).to_le_bytes());
        }
        pad_to(&mut out, align);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad_to(&mut out, align);
        }
        out
    }

    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}

fn pad_to(out: &mut Vec<u8>, align: usize) {
    out.resize(out.len().div_ceil(align) * align, 0);
}

/// A GGUF string: `u64` length then the bytes.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    write_str_bytes(out, s.as_bytes());
}

/// A GGUF string from raw bytes (need not be UTF-8: for building invalid files).
pub fn write_str_bytes(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// A value's `u32` type id followed by its payload.
pub fn write_value(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(&v.type_id().to_le_bytes());
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
    }
}

/// An array payload: element type id, `u64` count, elements.
pub fn write_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type_id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| write_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| write_array(out, a)),
    }
}
