//! Streaming GGUF v3 writer: the header and tensor infos are computed from the specs up
//! front, then tensor data is written one tensor at a time, so a multi-gigabyte output never
//! has to sit in memory.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::read::{self, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use crate::tensor::{self, TensorSpec};
use crate::value::{Array, Value};

/// The version we write: v3 is what llama.cpp and gguf-py write and read today.
const VERSION: u32 = 3;

/// Writes one GGUF file: create it with the metadata and every tensor's spec, then call
/// [`GgufWriter::write_tensor`] for each tensor in spec order, then [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    path: Option<PathBuf>,
    specs: Vec<TensorSpec>,
    sizes: Vec<u64>,
    next: usize,
    alignment: u64,
    /// Bytes written so far, for padding.
    pos: u64,
    /// Bytes of the next tensor already written by [`GgufWriter::write_part`].
    partial: u64,
}

impl GgufWriter<BufWriter<std::fs::File>> {
    /// Creates (or truncates) `path` and writes the header.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: Vec<TensorSpec>,
    ) -> Result<Self, GgufError> {
        let path = path.as_ref();
        // Validate before touching the file, so a bad spec leaves no half-written output.
        let layout = Layout::new(metadata, &tensors, Some(path))?;
        let file =
            std::fs::File::create(path).map_err(|e| GgufError::io(Some(path), "create", e))?;
        // The file at its final size first, so no write extends it (a filesystem then
        // updates the size once, not with every write).
        let total = header(metadata, &tensors, &layout)
            .len()
            .next_multiple_of(layout.alignment as usize) as u64
            + layout.data_bytes;
        file.set_len(total)
            .map_err(|e| GgufError::io(Some(path), "size", e))?;
        Self::start(
            BufWriter::with_capacity(1 << 20, file),
            Some(path.to_path_buf()),
            metadata,
            tensors,
            layout,
        )
    }
}

/// What the specs imply: alignment, each tensor's size and its offset in the data section,
/// and the data section's size (every tensor padded to the alignment).
pub(crate) struct Layout {
    pub(crate) alignment: u64,
    pub(crate) sizes: Vec<u64>,
    pub(crate) offsets: Vec<u64>,
    pub(crate) data_bytes: u64,
}

impl Layout {
    pub(crate) fn new(
        metadata: &Metadata,
        tensors: &[TensorSpec],
        path: Option<&Path>,
    ) -> Result<Self, GgufError> {
        let err = |field: String, problem: String| GgufError::invalid(path, field, problem);
        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(v) => {
                return Err(err(
                    format!("metadata key '{ALIGNMENT_KEY}'"),
                    format!(
                        "must be a u32 non-zero power of two, got {} {v}",
                        v.type_name()
                    ),
                ))
            }
        };
        for (i, (key, value)) in metadata.iter().enumerate() {
            if key.is_empty() {
                return Err(err(format!("metadata key #{i}"), "empty key".into()));
            }
            if let Value::Array(a) = value {
                if depth(a) > read::MAX_ARRAY_DEPTH {
                    return Err(err(
                        format!("metadata key '{key}' (#{i})"),
                        format!("arrays nested more than {} deep", read::MAX_ARRAY_DEPTH),
                    ));
                }
            }
        }
        let mut seen = std::collections::HashMap::with_capacity(tensors.len());
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for (i, t) in tensors.iter().enumerate() {
            let field = || format!("tensor '{}' (#{i})", t.name);
            if let Some(first) = seen.insert(t.name.as_str(), i) {
                return Err(err(
                    field(),
                    format!("duplicate name (also tensor #{first})"),
                ));
            }
            let size = tensor::validate(&t.name, t.ty, &t.shape).map_err(|e| err(field(), e))?;
            offsets.push(offset);
            offset = offset
                .checked_add(size)
                .and_then(|o| o.checked_next_multiple_of(alignment))
                .ok_or_else(|| err(field(), "total data size overflows u64".into()))?;
            sizes.push(size);
        }
        Ok(Self {
            alignment,
            sizes,
            offsets,
            data_bytes: offset,
        })
    }
}

fn depth(a: &Array) -> usize {
    match a {
        Array::Array(inner) => 1 + inner.iter().map(depth).max().unwrap_or(0),
        _ => 1,
    }
}

impl<W: Write> GgufWriter<W> {
    /// Writes the v3 header, key-values, tensor infos and the padding before the data.
    pub fn new(w: W, metadata: &Metadata, tensors: Vec<TensorSpec>) -> Result<Self, GgufError> {
        let layout = Layout::new(metadata, &tensors, None)?;
        Self::start(w, None, metadata, tensors, layout)
    }

    fn start(
        out: W,
        path: Option<PathBuf>,
        metadata: &Metadata,
        specs: Vec<TensorSpec>,
        layout: Layout,
    ) -> Result<Self, GgufError> {
        let head = header(metadata, &specs, &layout);
        let mut w = Self {
            out,
            path,
            specs,
            sizes: layout.sizes,
            next: 0,
            alignment: layout.alignment,
            pos: 0,
            partial: 0,
        };
        w.emit(&head)?;
        w.pad()?;
        Ok(w)
    }

    /// Writes the data of the next tensor. `name` must be the next spec's name and `data`
    /// exactly its size; on error nothing is written and the writer can still be used.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        if self.partial != 0 {
            return Err(GgufError::invalid(
                self.path.as_deref(),
                format!("tensor '{name}'"),
                format!("{} bytes of it were already written in parts", self.partial),
            ));
        }
        self.write_part(name, data, true)
    }

    /// Writes the next `data.len()` bytes of the next tensor, so a tensor can be streamed in
    /// pieces (a pipelined quantizer writes each chunk of rows as it comes back). `last`
    /// says this part ends the tensor: then the parts must add up to exactly its size.
    pub fn write_part(&mut self, name: &str, data: &[u8], last: bool) -> Result<(), GgufError> {
        let Some(spec) = self.specs.get(self.next) else {
            return Err(GgufError::invalid(
                self.path.as_deref(),
                format!("tensor '{name}'"),
                format!("all {} tensors were already written", self.specs.len()),
            ));
        };
        let field = || format!("tensor '{}' (#{})", spec.name, self.next);
        if spec.name != name {
            return Err(GgufError::invalid(
                self.path.as_deref(),
                field(),
                format!("is the next tensor to write, got '{name}'"),
            ));
        }
        let size = self.sizes[self.next];
        let done = self.partial + data.len() as u64;
        if done > size || (last && done != size) {
            return Err(GgufError::invalid(
                self.path.as_deref(),
                field(),
                format!(
                    "data is {done} bytes, expected {size} ({} {:?})",
                    spec.ty, spec.shape
                ),
            ));
        }
        self.emit(data)?;
        if last {
            self.pad()?;
            self.next += 1;
            self.partial = 0;
        } else {
            self.partial = done;
        }
        Ok(())
    }

    /// Checks every tensor was written, flushes, and returns the writer.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(missing) = self.specs.get(self.next) {
            return Err(GgufError::invalid(
                self.path.as_deref(),
                format!("tensor '{}' (#{})", missing.name, self.next),
                format!(
                    "never written: only {} of {} tensors were written",
                    self.next,
                    self.specs.len()
                ),
            ));
        }
        self.out
            .flush()
            .map_err(|e| GgufError::io(self.path.as_deref(), "write", e))?;
        Ok(self.out)
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.out
            .write_all(bytes)
            .map_err(|e| GgufError::io(self.path.as_deref(), "write", e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<(), GgufError> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut n = self.pos.next_multiple_of(self.alignment) - self.pos;
        while n > 0 {
            let k = n.min(ZEROS.len() as u64);
            self.emit(&ZEROS[..k as usize])?;
            n -= k;
        }
        Ok(())
    }
}

/// The v3 header, key-values and tensor infos (without the padding before the data).
pub(crate) fn header(metadata: &Metadata, specs: &[TensorSpec], layout: &Layout) -> Vec<u8> {
    let mut head = Vec::with_capacity(4096);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(specs.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata.iter() {
        put_str(&mut head, key);
        head.extend_from_slice(&value.type_id().to_le_bytes());
        put_value(&mut head, value);
    }
    for (spec, &offset) in specs.iter().zip(&layout.offsets) {
        put_str(&mut head, &spec.name);
        head.extend_from_slice(&(spec.shape.len() as u32).to_le_bytes());
        for d in &spec.shape {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&spec.ty.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
    }
    head
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A value's body (its type id is written by the caller).
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

/// Element type, count, elements; inner arrays repeat the same layout.
fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type_id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T, const N: usize>(out: &mut Vec<u8>, v: &[T], f: impl Fn(&T) -> [u8; N]) {
        out.reserve(v.len() * N);
        for x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, |x| x.to_le_bytes()),
        Array::U16(v) => each(out, v, |x| x.to_le_bytes()),
        Array::I16(v) => each(out, v, |x| x.to_le_bytes()),
        Array::U32(v) => each(out, v, |x| x.to_le_bytes()),
        Array::I32(v) => each(out, v, |x| x.to_le_bytes()),
        Array::U64(v) => each(out, v, |x| x.to_le_bytes()),
        Array::I64(v) => each(out, v, |x| x.to_le_bytes()),
        Array::F32(v) => each(out, v, |x| x.to_le_bytes()),
        Array::F64(v) => each(out, v, |x| x.to_le_bytes()),
        Array::Bool(v) => each(out, v, |x| [u8::from(*x)]),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
    }
}

impl<W: Write> std::fmt::Debug for GgufWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("path", &self.path)
            .field("tensors", &self.specs.len())
            .field("written", &self.next)
            .field("alignment", &self.alignment)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    fn specs() -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: "a".into(),
                ty: GgmlType::F32,
                shape: vec![4, 3],
            },
            TensorSpec {
                name: "b".into(),
                ty: GgmlType::F32,
                shape: vec![5],
            },
        ]
    }

    /// A tensor written in parts is the same file as written whole; parts that overrun the
    /// tensor, or a last part that leaves it short, are refused.
    #[test]
    fn parts_make_the_same_file_as_whole_tensors() {
        let md = Metadata::new();
        let a: Vec<u8> = (0..48).collect();
        let b: Vec<u8> = (100..120).collect();
        let mut whole = GgufWriter::new(Vec::new(), &md, specs()).expect("writer");
        whole.write_tensor("a", &a).expect("a");
        whole.write_tensor("b", &b).expect("b");
        let whole = whole.finish().expect("finish");

        let mut parts = GgufWriter::new(Vec::new(), &md, specs()).expect("writer");
        parts.write_part("a", &a[..16], false).expect("a0");
        assert!(parts.write_tensor("a", &a[16..]).is_err(), "mixing");
        assert!(parts.write_part("a", &a[16..], false).is_ok());
        assert!(parts.write_part("a", &[], true).is_ok());
        assert!(
            parts.write_part("b", &b[..8], true).is_err(),
            "short last part"
        );
        assert!(parts.write_part("b", &[0; 21], false).is_err(), "overrun");
        parts.write_part("b", &b, true).expect("b");
        let parts = parts.finish().expect("finish");
        assert_eq!(whole, parts);
    }
}
