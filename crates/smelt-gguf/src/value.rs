//! Metadata values: the thirteen GGUF value types, with arrays kept typed so an empty array
//! still knows what it holds (a writer must emit its element type) and nested arrays keep
//! each inner array's own type.

use std::fmt;

/// GGUF's on-disk value type ids (`enum gguf_type`).
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

    /// gguf's short name for a type id, for error messages about ids read from a file.
    pub fn name(id: u32) -> Option<&'static str> {
        Some(match id {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            BOOL => "bool",
            STRING => "string",
            ARRAY => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
            _ => return None,
        })
    }
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

/// A homogeneous metadata array. `Array(Vec<Array>)` is an array of arrays, each inner array
/// carrying its own element type (as gguf-py writes them).
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
    /// The GGUF type name: `u32`, `string`, `array[string]`, `array[array]`...
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(a) => a.type_name(),
        }
    }

    /// The on-disk type id.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            Self::U8(_) => type_id::U8,
            Self::I8(_) => type_id::I8,
            Self::U16(_) => type_id::U16,
            Self::I16(_) => type_id::I16,
            Self::U32(_) => type_id::U32,
            Self::I32(_) => type_id::I32,
            Self::U64(_) => type_id::U64,
            Self::I64(_) => type_id::I64,
            Self::F32(_) => type_id::F32,
            Self::F64(_) => type_id::F64,
            Self::Bool(_) => type_id::BOOL,
            Self::String(_) => type_id::STRING,
            Self::Array(_) => type_id::ARRAY,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type that holds a non-negative value, widened: converters disagree on
    /// which integer type a count is stored as (llama.cpp accepts several).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, widened to i64 when it fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// F32, or F64 narrowed to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::F32(v) => Some(v),
            Self::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The bool, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// Number of elements (inner arrays count as one each).
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `array[<element type>]`; arrays of arrays are `array[array]` whatever they hold.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "array[u8]",
            Self::I8(_) => "array[i8]",
            Self::U16(_) => "array[u16]",
            Self::I16(_) => "array[i16]",
            Self::U32(_) => "array[u32]",
            Self::I32(_) => "array[i32]",
            Self::U64(_) => "array[u64]",
            Self::I64(_) => "array[i64]",
            Self::F32(_) => "array[f32]",
            Self::F64(_) => "array[f64]",
            Self::Bool(_) => "array[bool]",
            Self::String(_) => "array[string]",
            Self::Array(_) => "array[array]",
        }
    }

    /// The on-disk type id of the elements.
    pub(crate) fn elem_type_id(&self) -> u32 {
        match self {
            Self::U8(_) => type_id::U8,
            Self::I8(_) => type_id::I8,
            Self::U16(_) => type_id::U16,
            Self::I16(_) => type_id::I16,
            Self::U32(_) => type_id::U32,
            Self::I32(_) => type_id::I32,
            Self::U64(_) => type_id::U64,
            Self::I64(_) => type_id::I64,
            Self::F32(_) => type_id::F32,
            Self::F64(_) => type_id::F64,
            Self::Bool(_) => type_id::BOOL,
            Self::String(_) => type_id::STRING,
            Self::Array(_) => type_id::ARRAY,
        }
    }

    /// The strings, if this is an array of strings (token lists, merges...).
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Self::String(v) => Some(v),
            _ => None,
        }
    }
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Self::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Self {
                Self::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Self {
                Self::Array(Array::$variant(v))
            }
        }
    )*};
}

impl_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::String(v.to_owned())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Self::Array(v)
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Self {
        Self::Array(v)
    }
}

/// Longest string `Display` shows before cutting it; tokenizer templates run to kilobytes.
const DISPLAY_STRING_CHARS: usize = 60;
/// Array elements `Display` shows before summarising the rest.
const DISPLAY_ARRAY_ITEMS: usize = 3;

fn write_str_short(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in s.chars().take(DISPLAY_STRING_CHARS) {
        write!(f, "{}", c.escape_debug())?;
    }
    f.write_str("\"")?;
    if s.chars().nth(DISPLAY_STRING_CHARS).is_some() {
        write!(f, "... ({} bytes)", s.len())?;
    }
    Ok(())
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::U8(v) => write!(f, "{v}"),
            Self::I8(v) => write!(f, "{v}"),
            Self::U16(v) => write!(f, "{v}"),
            Self::I16(v) => write!(f, "{v}"),
            Self::U32(v) => write!(f, "{v}"),
            Self::I32(v) => write!(f, "{v}"),
            Self::U64(v) => write!(f, "{v}"),
            Self::I64(v) => write!(f, "{v}"),
            // Debug switches to exponent form for tiny and huge values (1e-6, not 0.000001).
            Self::F32(v) => write!(f, "{v:?}"),
            Self::F64(v) => write!(f, "{v:?}"),
            Self::Bool(v) => write!(f, "{v}"),
            Self::String(s) => write_str_short(f, s),
            Self::Array(a) => write!(f, "{a}"),
        }
    }
}

fn write_items<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    mut one: impl FnMut(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().take(DISPLAY_ARRAY_ITEMS).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        one(f, item)?;
    }
    if items.len() > DISPLAY_ARRAY_ITEMS {
        write!(f, ", ... {} items", items.len())?;
    }
    f.write_str("]")
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn plain<T: fmt::Display>(f: &mut fmt::Formatter<'_>, v: &T) -> fmt::Result {
            write!(f, "{v}")
        }
        fn float<T: fmt::Debug>(f: &mut fmt::Formatter<'_>, v: &T) -> fmt::Result {
            write!(f, "{v:?}")
        }
        match self {
            Self::U8(v) => write_items(f, v, plain),
            Self::I8(v) => write_items(f, v, plain),
            Self::U16(v) => write_items(f, v, plain),
            Self::I16(v) => write_items(f, v, plain),
            Self::U32(v) => write_items(f, v, plain),
            Self::I32(v) => write_items(f, v, plain),
            Self::U64(v) => write_items(f, v, plain),
            Self::I64(v) => write_items(f, v, plain),
            Self::F32(v) => write_items(f, v, float),
            Self::F64(v) => write_items(f, v, float),
            Self::Bool(v) => write_items(f, v, plain),
            Self::String(v) => write_items(f, v, |f, s| write_str_short(f, s)),
            Self::Array(v) => write_items(f, v, plain),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_short() {
        assert_eq!(Value::U32(7).to_string(), "7");
        assert_eq!(Value::F32(1e-6).to_string(), "1e-6");
        assert_eq!(Value::F64(10000.0).to_string(), "10000.0");
        assert_eq!(Value::from(vec![0.5f32, 1e-30]).to_string(), "[0.5, 1e-30]");
        assert_eq!(Value::from("llama").to_string(), "\"llama\"");
        assert_eq!(Value::from(vec![1u32, 2]).to_string(), "[1, 2]");
        assert_eq!(
            Value::from(vec![1i32, 2, 3, 4, 5]).to_string(),
            "[1, 2, 3, ... 5 items]"
        );
        let long = "x".repeat(100);
        let shown = Value::String(long).to_string();
        assert!(
            shown.starts_with("\"xxxx") && shown.ends_with("... (100 bytes)"),
            "{shown}"
        );
        let nested = Value::Array(Array::Array(vec![
            Array::U8(vec![1]),
            Array::String(vec![]),
        ]));
        assert_eq!(nested.to_string(), "[[1], []]");
        assert_eq!(Value::from("a\nb").to_string(), "\"a\\nb\"");
    }

    #[test]
    fn type_names_and_conversions() {
        assert_eq!(
            Value::from(vec!["a".to_string()]).type_name(),
            "array[string]"
        );
        assert_eq!(
            Value::Array(Array::Array(vec![])).type_name(),
            "array[array]"
        );
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(5).as_u64(), Some(5));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::Bool(true).as_bool(), Some(true));
        assert!(Array::F32(vec![]).is_empty());
    }
}
