//! Helpers shared by the integration tests: a little-endian byte builder for hand-crafted
//! files, the Python oracle (gguf-py) and the test models.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use smelt_gguf::{Array, GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};

/// Builds GGUF bytes by hand, for files our writer would refuse to produce.
#[derive(Default, Clone)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(self, v: u8) -> Self {
        self.raw(&[v])
    }
    pub fn u32(self, v: u32) -> Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(self, v: u64) -> Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    /// Magic, version, tensor count, kv count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        Self::new()
            .raw(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    /// A tensor info record.
    pub fn tensor(self, name: &str, shape: &[u64], ty: u32, offset: u64) -> Self {
        let mut b = self.str(name).u32(shape.len() as u32);
        for &d in shape {
            b = b.u64(d);
        }
        b.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad(mut self, align: usize) -> Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The oracle's Python, shared by every crate's tests (`smelt_oracle::python`).
pub fn python() -> PathBuf {
    smelt_oracle::python()
}

/// Runs one of the scripts in `tests/oracle/` and returns its stdout.
pub fn run_oracle(script: &str, args: &[&Path]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle")
        .join(script);
    let out = Command::new(python())
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): {}\nif gguf is missing, run scripts/oracles.sh",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("oracle output is UTF-8")
}

/// A test model fetched by `scripts/fetch-models.sh`.
pub fn model(name: &str) -> PathBuf {
    let p = workspace_root().join(".models").join(name);
    assert!(
        p.exists(),
        "test model {} missing: run scripts/fetch-models.sh all",
        p.display()
    );
    p
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// gguf-py's `ReaderField.types` for a value: the type, then for arrays the types of the
/// first element (nothing more for an empty array).
fn py_types(v: &Value, out: &mut Vec<u32>) {
    match v {
        Value::Array(a) => array_types(a, out),
        scalar => out.push(scalar_id(scalar)),
    }
}

fn array_types(a: &Array, out: &mut Vec<u32>) {
    out.push(9);
    if a.is_empty() {
        return;
    }
    match a {
        Array::Array(inner) => array_types(&inner[0], out),
        _ => out.push(elem_id(a)),
    }
}

fn scalar_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn elem_id(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

/// Every scalar in the value, flattened the way gguf-py's `contents()` flattens.
fn py_items(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Array(a) => array_items(a, out),
        Value::String(s) => out.push(hex(s.as_bytes())),
        Value::F32(x) => out.push(format!("{:08x}", x.to_bits())),
        Value::F64(x) => out.push(format!("{:016x}", x.to_bits())),
        Value::Bool(b) => out.push(u8::from(*b).to_string()),
        Value::U8(x) => out.push(x.to_string()),
        Value::I8(x) => out.push(x.to_string()),
        Value::U16(x) => out.push(x.to_string()),
        Value::I16(x) => out.push(x.to_string()),
        Value::U32(x) => out.push(x.to_string()),
        Value::I32(x) => out.push(x.to_string()),
        Value::U64(x) => out.push(x.to_string()),
        Value::I64(x) => out.push(x.to_string()),
    }
}

fn array_items(a: &Array, out: &mut Vec<String>) {
    fn all<T: Clone + Into<Value>>(v: &[T], out: &mut Vec<String>) {
        for x in v {
            py_items(&x.clone().into(), out);
        }
    }
    match a {
        Array::U8(v) => all(v, out),
        Array::I8(v) => all(v, out),
        Array::U16(v) => all(v, out),
        Array::I16(v) => all(v, out),
        Array::U32(v) => all(v, out),
        Array::I32(v) => all(v, out),
        Array::U64(v) => all(v, out),
        Array::I64(v) => all(v, out),
        Array::F32(v) => all(v, out),
        Array::F64(v) => all(v, out),
        Array::Bool(v) => all(v, out),
        Array::String(v) => out.extend(v.iter().map(|s| hex(s.as_bytes()))),
        Array::Array(v) => v.iter().for_each(|inner| array_items(inner, out)),
    }
}

/// Our view of a file in the line format `tests/oracle/gguf_py_dump.py` prints for gguf-py's.
pub fn dump(g: &Gguf) -> Vec<String> {
    let mut lines = vec![format!(
        "header\t{}\t{}\t{}",
        g.version(),
        g.alignment(),
        g.data_offset()
    )];
    for (key, value) in g.metadata().iter() {
        let mut types = Vec::new();
        py_types(value, &mut types);
        let mut items = Vec::new();
        py_items(value, &mut items);
        let types: Vec<String> = types.iter().map(u32::to_string).collect();
        lines.push(format!(
            "kv\t{}\t{}\t{}",
            hex(key.as_bytes()),
            types.join(","),
            items.join(",")
        ));
    }
    for t in g.tensors() {
        let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        let sum: u64 = g.tensor_data(t).iter().map(|&b| u64::from(b)).sum();
        lines.push(format!(
            "tensor\t{}\t{}\t{}\t{}\t{}\t{}",
            hex(t.name.as_bytes()),
            t.ty.id(),
            dims.join(","),
            t.offset,
            t.n_bytes(),
            sum
        ));
    }
    lines
}

/// Compares our reading of `path` with gguf-py's, line by line, reporting the first mismatch.
pub fn assert_matches_gguf_py(path: &Path) {
    let ours = Gguf::open(path).unwrap_or_else(|e| panic!("{e}"));
    let theirs = run_oracle("gguf_py_dump.py", &[path]);
    let theirs: Vec<&str> = theirs.lines().collect();
    let ours = dump(&ours);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(
            a.as_str(),
            *b,
            "{}: line {i} differs (ours, then gguf-py)",
            path.display()
        );
    }
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{}: line counts differ",
        path.display()
    );
}

/// Every value type, scalar and array, with edge values.
pub fn every_value() -> Metadata {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::from("llama"));
    m.insert("t.u8", Value::U8(u8::MAX));
    m.insert("t.i8", Value::I8(i8::MIN));
    m.insert("t.u16", Value::U16(u16::MAX));
    m.insert("t.i16", Value::I16(i16::MIN));
    m.insert("t.u32", Value::U32(u32::MAX));
    m.insert("t.i32", Value::I32(i32::MIN));
    m.insert("t.u64", Value::U64(u64::MAX));
    m.insert("t.i64", Value::I64(i64::MIN));
    m.insert("t.f32", Value::F32(-1.5e-30));
    m.insert("t.f64", Value::F64(std::f64::consts::PI));
    m.insert("t.f32.inf", Value::F32(f32::NEG_INFINITY));
    m.insert("t.bool.true", Value::Bool(true));
    m.insert("t.bool.false", Value::Bool(false));
    m.insert("t.string", Value::from("héllo, 世界 🦀"));
    m.insert("t.string.empty", Value::from(""));
    m.insert("t.array.u8", Value::from(vec![0u8, 1, 255]));
    m.insert("t.array.i8", Value::from(vec![-128i8, 0, 127]));
    m.insert("t.array.u16", Value::from(vec![0u16, 65535]));
    m.insert("t.array.i16", Value::from(vec![-32768i16, 32767]));
    m.insert("t.array.u32", Value::from(vec![1u32, 2, 3]));
    m.insert("t.array.i32", Value::from(vec![-1i32, 0, 1]));
    m.insert("t.array.u64", Value::from(vec![u64::MAX, 0]));
    m.insert("t.array.i64", Value::from(vec![i64::MIN, i64::MAX]));
    m.insert("t.array.f32", Value::from(vec![0.5f32, -0.0, f32::MAX]));
    m.insert(
        "t.array.f64",
        Value::from(vec![1e300f64, f64::MIN_POSITIVE]),
    );
    m.insert("t.array.bool", Value::from(vec![true, false, true]));
    m.insert(
        "t.array.string",
        Value::from(vec!["a".to_string(), String::new(), "ü".to_string()]),
    );
    m.insert("t.array.empty.u8", Value::from(Vec::<u8>::new()));
    m.insert("t.array.empty.f64", Value::from(Vec::<f64>::new()));
    m.insert("t.array.empty.string", Value::from(Vec::<String>::new()));
    m.insert("t.array.empty.array", Value::Array(Array::Array(vec![])));
    m.insert(
        "t.array.nested",
        Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![]),
            Array::I32(vec![3]),
        ])),
    );
    m.insert(
        "t.array.nested.strings",
        Value::Array(Array::Array(vec![
            Array::String(vec!["x".into(), "yz".into()]),
            Array::String(vec!["w".into()]),
        ])),
    );
    m.insert(
        "t.array.nested3",
        Value::Array(Array::Array(vec![Array::Array(vec![
            Array::U16(vec![7, 8]),
            Array::U16(vec![9]),
        ])])),
    );
    m
}

/// One tensor of every type (two rows of two blocks), a scalar, an empty and a 4-D tensor.
pub fn every_tensor() -> Vec<(TensorSpec, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        let shape = vec![2 * ty.block_size() as u64, 2];
        let spec = TensorSpec {
            name: format!("t.{}", ty.name()),
            ty,
            shape,
        };
        let data = (0..spec.n_bytes())
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        out.push((spec, data));
    }
    let extra = [
        ("scalar", GgmlType::F32, vec![]),
        ("empty", GgmlType::Q4_K, vec![256, 0]),
        ("four.d", GgmlType::F16, vec![3, 2, 2, 2]),
        ("odd.size", GgmlType::I8, vec![5]),
    ];
    for (name, ty, shape) in extra {
        let spec = TensorSpec {
            name: name.into(),
            ty,
            shape,
        };
        let data = (0..spec.n_bytes()).map(|b| b as u8 ^ 0x5a).collect();
        out.push((spec, data));
    }
    out
}

pub fn write_to_vec(m: &Metadata, tensors: &[(TensorSpec, Vec<u8>)]) -> Vec<u8> {
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), m, specs).unwrap();
    for (spec, data) in tensors {
        w.write_tensor(&spec.name, data).unwrap();
    }
    w.finish().unwrap()
}
