//! Parsing the header, key-values and tensor infos out of a byte slice.
//!
//! Everything is bounds-checked against the bytes actually present before anything is
//! allocated, so a hostile length (an array of 2^60 u64s, 2^40 tensors) fails at once with
//! an error instead of an allocation the size of the claim.

use std::collections::HashMap;
use std::path::Path;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::tensor::{self, TensorInfo};
use crate::value::{type_id, Array, Value};
use crate::GgmlType;

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";

/// Deepest array-of-arrays nesting we accept: each level costs a stack frame, and no real
/// file nests at all, so a hostile file must not be able to recurse without bound.
pub(crate) const MAX_ARRAY_DEPTH: usize = 16;

/// Smallest possible key-value record: key length, a 1-byte key, type id, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest possible tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// What the header says, before the data section is checked against it.
pub(crate) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub index: HashMap<String, usize>,
    pub data_offset: u64,
}

/// A position in the file's bytes; every read checks what is left and says what it wanted.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "{what} needs {n} bytes at offset {}, but the file ends after {} more",
                self.pos,
                self.remaining()
            ));
        }
        // n <= remaining, which fits in usize.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string; the length is checked before anything is copied.
    fn string(&mut self, what: &str) -> Result<String, String> {
        // The label is only formatted on error: token lists hold 100k+ strings.
        let len = self.u64("").map_err(|e| format!("{what} length{e}"))?;
        if len > self.remaining() {
            return Err(format!(
                "{what} length {len} at offset {} runs past the end of the file ({} bytes left)",
                self.pos - 8,
                self.remaining()
            ));
        }
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| format!("{what} at offset {at} is not valid UTF-8 ({e})"))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<usize, String> {
        match count.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(count as usize),
            _ => Err(format!(
                "{count} {what} cannot fit in the {} bytes left in the file (each takes at least {min_size})",
                self.remaining()
            )),
        }
    }
}

/// Splits `n * SIZE` bytes into `n` fixed-size little-endian items.
fn fixed<const SIZE: usize, T>(
    c: &mut Cursor<'_>,
    n: u64,
    what: &str,
    from: impl Fn([u8; SIZE]) -> T,
) -> Result<Vec<T>, String> {
    let n = c.check_count(n, SIZE as u64, what)?;
    let bytes = c.take((n * SIZE) as u64, what)?;
    Ok(bytes
        .chunks_exact(SIZE)
        .map(|chunk| {
            let mut a = [0u8; SIZE];
            a.copy_from_slice(chunk);
            from(a)
        })
        .collect())
}

fn bool_from(byte: u8, at: usize) -> Result<bool, String> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(format!("bool at offset {at} is {b}, not 0 or 1")),
    }
}

fn type_name(id: u32) -> String {
    match type_id::name(id) {
        Some(n) => n.to_owned(),
        None => format!("unknown type id {id}"),
    }
}

fn read_scalar(c: &mut Cursor<'_>, ty: u32) -> Result<Value, String> {
    Ok(match ty {
        type_id::U8 => Value::U8(u8::from_le_bytes(c.array("u8 value")?)),
        type_id::I8 => Value::I8(i8::from_le_bytes(c.array("i8 value")?)),
        type_id::U16 => Value::U16(u16::from_le_bytes(c.array("u16 value")?)),
        type_id::I16 => Value::I16(i16::from_le_bytes(c.array("i16 value")?)),
        type_id::U32 => Value::U32(u32::from_le_bytes(c.array("u32 value")?)),
        type_id::I32 => Value::I32(i32::from_le_bytes(c.array("i32 value")?)),
        type_id::U64 => Value::U64(u64::from_le_bytes(c.array("u64 value")?)),
        type_id::I64 => Value::I64(i64::from_le_bytes(c.array("i64 value")?)),
        type_id::F32 => Value::F32(f32::from_le_bytes(c.array("f32 value")?)),
        type_id::F64 => Value::F64(f64::from_le_bytes(c.array("f64 value")?)),
        type_id::BOOL => {
            let at = c.pos;
            let [b] = c.array("bool value")?;
            Value::Bool(bool_from(b, at)?)
        }
        type_id::STRING => Value::String(c.string("string value")?),
        type_id::ARRAY => Value::Array(read_array(c, 1)?),
        other => return Err(format!("unknown value type id {other}")),
    })
}

/// An array body: element type, count, elements. `depth` counts enclosing arrays.
fn read_array(c: &mut Cursor<'_>, depth: usize) -> Result<Array, String> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
    }
    let elem = c.u32("array element type")?;
    let n = c.u64("array length")?;
    let what = format!("array[{}] elements", type_name(elem));
    Ok(match elem {
        type_id::U8 => Array::U8(fixed(c, n, &what, u8::from_le_bytes)?),
        type_id::I8 => Array::I8(fixed(c, n, &what, i8::from_le_bytes)?),
        type_id::U16 => Array::U16(fixed(c, n, &what, u16::from_le_bytes)?),
        type_id::I16 => Array::I16(fixed(c, n, &what, i16::from_le_bytes)?),
        type_id::U32 => Array::U32(fixed(c, n, &what, u32::from_le_bytes)?),
        type_id::I32 => Array::I32(fixed(c, n, &what, i32::from_le_bytes)?),
        type_id::U64 => Array::U64(fixed(c, n, &what, u64::from_le_bytes)?),
        type_id::I64 => Array::I64(fixed(c, n, &what, i64::from_le_bytes)?),
        type_id::F32 => Array::F32(fixed(c, n, &what, f32::from_le_bytes)?),
        type_id::F64 => Array::F64(fixed(c, n, &what, f64::from_le_bytes)?),
        type_id::BOOL => {
            let start = c.pos;
            let bytes = fixed(c, n, &what, |[b]: [u8; 1]| b)?;
            let bools = bytes
                .iter()
                .enumerate()
                .map(|(i, &b)| bool_from(b, start + i).map_err(|e| format!("element #{i}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            Array::Bool(bools)
        }
        type_id::STRING => {
            let n = c.check_count(n, 8, &what)?;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(
                    c.string("string")
                        .map_err(|e| format!("element #{i}: {e}"))?,
                );
            }
            Array::String(v)
        }
        type_id::ARRAY => {
            let n = c.check_count(n, 4 + 8, &what)?;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(read_array(c, depth + 1).map_err(|e| format!("element #{i}: {e}"))?);
            }
            Array::Array(v)
        }
        other => return Err(format!("unknown array element type id {other}")),
    })
}

/// Parses everything up to the data section and checks each tensor's range against `buf`.
pub(crate) fn parse(buf: &[u8], file: Option<&Path>) -> Result<Header, GgufError> {
    let err = |field: &str, problem: String| GgufError::invalid(file, field, problem);
    let mut c = Cursor { buf, pos: 0 };

    let magic: [u8; 4] = c.array("magic").map_err(|e| err("header: magic", e))?;
    if &magic != MAGIC {
        return Err(err(
            "header: magic",
            format!(
                "not a GGUF file: starts with {:?} ({:02x?}), expected \"GGUF\"",
                String::from_utf8_lossy(&magic),
                magic
            ),
        ));
    }
    let version = c.u32("version").map_err(|e| err("header: version", e))?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(err(
                "header: version",
                "GGUF v1 is not supported (only v2 and v3); re-convert the model".into(),
            ))
        }
        v if v & 0xFFFF == 0 => {
            return Err(err(
                "header: version",
                format!("version {v:#010x} looks byte-swapped: big-endian GGUF is not supported"),
            ))
        }
        v => {
            return Err(err(
                "header: version",
                format!("unsupported GGUF version {v} (only v2 and v3)"),
            ))
        }
    }
    let n_tensors = c
        .u64("tensor count")
        .map_err(|e| err("header: tensor count", e))?;
    let n_kv = c
        .u64("metadata count")
        .map_err(|e| err("header: metadata count", e))?;
    let n_kv = c
        .check_count(n_kv, MIN_KV_BYTES, "metadata entries")
        .map_err(|e| err("header: metadata count", e))?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key = c
            .string("key")
            .map_err(|e| err(&format!("metadata key #{i}"), e))?;
        let field = format!("metadata key '{key}' (#{i})");
        if key.is_empty() {
            return Err(err(&field, "empty key".into()));
        }
        if metadata.contains_key(&key) {
            return Err(err(&field, "duplicate key".into()));
        }
        let ty = c.u32("value type").map_err(|e| err(&field, e))?;
        let value = read_scalar(&mut c, ty).map_err(|e| err(&field, e))?;
        metadata.insert(key, value);
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(Value::U32(a)) => {
            return Err(err(
                &format!("metadata key '{ALIGNMENT_KEY}'"),
                format!("alignment {a} is not a non-zero power of two"),
            ))
        }
        Some(v) => {
            return Err(err(
                &format!("metadata key '{ALIGNMENT_KEY}'"),
                format!("must be u32, not {}", v.type_name()),
            ))
        }
    };

    // Checked after the key-values: only now is the remaining size known.
    let n_tensors = c
        .check_count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor infos")
        .map_err(|e| err("header: tensor count", e))?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c
            .string("name")
            .map_err(|e| err(&format!("tensor #{i}"), e))?;
        let field = format!("tensor '{name}' (#{i})");
        if let Some(first) = index.get(&name) {
            return Err(err(
                &field,
                format!("duplicate name (also tensor #{first})"),
            ));
        }
        let n_dims = c.u32("n_dims").map_err(|e| err(&field, e))?;
        if n_dims as usize > tensor::MAX_DIMS {
            return Err(err(
                &field,
                format!(
                    "{n_dims} dimensions; ggml allows at most {}",
                    tensor::MAX_DIMS
                ),
            ));
        }
        let shape = fixed(&mut c, n_dims.into(), "dimensions", u64::from_le_bytes)
            .map_err(|e| err(&field, e))?;
        let type_id = c.u32("type").map_err(|e| err(&field, e))?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| err(&field, format!("unknown ggml type id {type_id}")))?;
        let offset = c.u64("data offset").map_err(|e| err(&field, e))?;
        tensor::validate(&name, ty, &shape).map_err(|e| err(&field, e))?;
        if !offset.is_multiple_of(alignment) {
            return Err(err(
                &field,
                format!("data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        index.insert(name.clone(), i);
        tensors.push(TensorInfo {
            name,
            ty,
            shape,
            offset,
        });
    }

    let file_len = buf.len() as u64;
    // pos <= len and alignment <= 2^31, so this cannot overflow u64.
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    if !tensors.is_empty() && data_offset > file_len {
        return Err(err(
            "data section",
            format!(
                "starts at offset {data_offset} (aligned to {alignment}), past the end of the file ({file_len} bytes)"
            ),
        ));
    }
    for (i, t) in tensors.iter().enumerate() {
        let bytes = t.n_bytes();
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(err(
                    &format!("tensor '{}' (#{i})", t.name),
                    format!(
                        "data [offset {}..{}) runs past the end of the file ({file_len} bytes)",
                        data_offset as u128 + t.offset as u128,
                        data_offset as u128 + t.offset as u128 + bytes as u128
                    ),
                ))
            }
        }
    }

    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        index,
        data_offset,
    })
}
