//! Metadata values. Arrays are typed (`Vec<f32>`, `Vec<String>`, ...) rather than `Vec<Value>`
//! so a 262,144-entry vocabulary is one allocation per column and the tokenizer can borrow
//! `&[String]` / `&[f32]` slices directly.

use std::fmt;

/// GGUF metadata value type ids (`enum gguf_type`).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array: all elements share one type. Nested arrays are allowed (bounded depth).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// The GGUF type name: `u32`, `f32`, `string`, `array[string]`, ...
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(a) => a.type_name(),
        }
    }

    /// The GGUF type id this value is written with.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F32(_) => type_id::F32,
            Value::F64(_) => type_id::F64,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
        }
    }

    /// Any integer value as `i128` (wide enough for every GGUF integer type), else `None`.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer value that fits in `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer value that fits in `u32`.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An `f32` or `f64` value (the latter rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Value {
    /// Heap bytes this value owns, each allocation of `n` bytes costing `alloc(n)` (the
    /// allocator's chunk size; see the memory plan).
    pub fn heap_bytes(&self, alloc: &dyn Fn(usize) -> usize) -> usize {
        match self {
            Value::String(s) => alloc(s.capacity()),
            Value::Array(a) => a.heap_bytes(alloc),
            _ => 0,
        }
    }
}

impl Array {
    /// Heap bytes this array owns (its buffer, and each string's or nested array's).
    pub fn heap_bytes(&self, alloc: &dyn Fn(usize) -> usize) -> usize {
        fn buf<T>(v: &Vec<T>, alloc: &dyn Fn(usize) -> usize) -> usize {
            alloc(v.capacity() * std::mem::size_of::<T>())
        }
        match self {
            Array::U8(v) => buf(v, alloc),
            Array::I8(v) => buf(v, alloc),
            Array::U16(v) => buf(v, alloc),
            Array::I16(v) => buf(v, alloc),
            Array::U32(v) => buf(v, alloc),
            Array::I32(v) => buf(v, alloc),
            Array::U64(v) => buf(v, alloc),
            Array::I64(v) => buf(v, alloc),
            Array::F32(v) => buf(v, alloc),
            Array::F64(v) => buf(v, alloc),
            Array::Bool(v) => buf(v, alloc),
            Array::String(v) => {
                buf(v, alloc) + v.iter().map(|s| alloc(s.capacity())).sum::<usize>()
            }
            Array::Array(v) => buf(v, alloc) + v.iter().map(|a| a.heap_bytes(alloc)).sum::<usize>(),
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type name including the element type, e.g. `array[string]`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "array[u8]",
            Array::I8(_) => "array[i8]",
            Array::U16(_) => "array[u16]",
            Array::I16(_) => "array[i16]",
            Array::U32(_) => "array[u32]",
            Array::I32(_) => "array[i32]",
            Array::U64(_) => "array[u64]",
            Array::I64(_) => "array[i64]",
            Array::F32(_) => "array[f32]",
            Array::F64(_) => "array[f64]",
            Array::Bool(_) => "array[bool]",
            Array::String(_) => "array[string]",
            Array::Array(_) => "array[array]",
        }
    }

    /// The element type id this array is written with.
    pub(crate) fn elem_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => type_id::U8,
            Array::I8(_) => type_id::I8,
            Array::U16(_) => type_id::U16,
            Array::I16(_) => type_id::I16,
            Array::U32(_) => type_id::U32,
            Array::I32(_) => type_id::I32,
            Array::U64(_) => type_id::U64,
            Array::I64(_) => type_id::I64,
            Array::F32(_) => type_id::F32,
            Array::F64(_) => type_id::F64,
            Array::Bool(_) => type_id::BOOL,
            Array::String(_) => type_id::STRING,
            Array::Array(_) => type_id::ARRAY,
        }
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            Array::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            Array::I32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u32s(&self) -> Option<&[u32]> {
        match self {
            Array::U32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bools(&self) -> Option<&[bool]> {
        match self {
            Array::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// Every element as `i64` when the array holds integers that all fit (per-layer head
    /// counts, for example, may be stored as `i32` or `u32`).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy + TryInto<i64>>(v: &[T]) -> Option<Vec<i64>> {
            v.iter().map(|&x| x.try_into().ok()).collect()
        }
        match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => None,
        }
    }
}

/// Arrays longer than this print their first elements and a count.
const DISPLAY_ITEMS: usize = 8;

fn fmt_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    each: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().take(DISPLAY_ITEMS).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, item)?;
    }
    if items.len() > DISPLAY_ITEMS {
        write!(f, ", ... ({} items)", items.len())?;
    }
    f.write_str("]")
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn plain<T: fmt::Display>(f: &mut fmt::Formatter<'_>, x: &T) -> fmt::Result {
            write!(f, "{x}")
        }
        match self {
            Array::U8(v) => fmt_list(f, v, plain),
            Array::I8(v) => fmt_list(f, v, plain),
            Array::U16(v) => fmt_list(f, v, plain),
            Array::I16(v) => fmt_list(f, v, plain),
            Array::U32(v) => fmt_list(f, v, plain),
            Array::I32(v) => fmt_list(f, v, plain),
            Array::U64(v) => fmt_list(f, v, plain),
            Array::I64(v) => fmt_list(f, v, plain),
            Array::F32(v) => fmt_list(f, v, plain),
            Array::F64(v) => fmt_list(f, v, plain),
            Array::Bool(v) => fmt_list(f, v, plain),
            Array::String(v) => fmt_list(f, v, |f, s| write!(f, "{s:?}")),
            Array::Array(v) => fmt_list(f, v, plain),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => f.write_str(s),
            Value::Array(a) => write!(f, "{a}"),
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Array { Array::$v(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value { Value::Array(Array::$v(x)) }
        }
    )*};
}

from_scalar!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_conversions_respect_range() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(7).as_u32(), Some(7));
        assert_eq!(Value::U64(1 << 40).as_u32(), None);
        assert_eq!(Value::U64(1 << 40).as_u64(), Some(1 << 40));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
    }

    #[test]
    fn display_abbreviates_long_arrays() {
        let v: Value = (0..1000u32).collect::<Vec<_>>().into();
        assert_eq!(v.to_string(), "[0, 1, 2, 3, 4, 5, 6, 7, ... (1000 items)]");
        let s: Value = vec!["a", "b\n"].into();
        assert_eq!(s.to_string(), r#"["a", "b\n"]"#);
        assert_eq!(s.type_name(), "array[string]");
    }

    #[test]
    fn typed_slices() {
        let a = Array::F32(vec![1.0, 2.0]);
        assert_eq!(a.as_f32s(), Some(&[1.0f32, 2.0][..]));
        assert_eq!(a.as_strings(), None);
        assert_eq!(Array::I32(vec![-3]).to_i64s(), Some(vec![-3]));
        assert_eq!(Array::U64(vec![u64::MAX]).to_i64s(), None);
    }
}
