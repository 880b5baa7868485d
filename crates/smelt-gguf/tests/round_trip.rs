//! Writer -> reader round trips: every value type (nested and empty arrays included), every
//! tensor type, custom alignment, and the writer's refusals.

mod common;

use common::{every_tensor, every_value, write_to_vec};

use smelt_gguf::{Array, GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};

/// Metadata only our own types can express: arrays of arrays of different element types.
fn mixed_nesting() -> Value {
    Value::Array(Array::Array(vec![
        Array::U8(vec![1]),
        Array::String(vec!["s".into()]),
        Array::Bool(vec![]),
        Array::Array(vec![Array::F64(vec![2.0])]),
    ]))
}

fn assert_round_trip(g: &Gguf, m: &Metadata, tensors: &[(TensorSpec, Vec<u8>)]) {
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata(), m);
    let keys: Vec<_> = g.metadata().iter().map(|(k, _)| k).collect();
    let want: Vec<_> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, want, "file order is kept");
    assert_eq!(g.tensors().len(), tensors.len());
    for ((spec, data), t) in tensors.iter().zip(g.tensors()) {
        assert_eq!(
            (&t.name, t.ty, &t.shape),
            (&spec.name, spec.ty, &spec.shape)
        );
        assert_eq!(t.offset % g.alignment(), 0, "{}", t.name);
        assert_eq!(g.tensor_data(t), data.as_slice(), "{}", t.name);
        assert_eq!(g.tensor(&t.name), Some(t));
    }
    assert_eq!(g.data_offset() % g.alignment(), 0);
}

#[test]
fn every_value_and_tensor_type_round_trips() {
    let mut m = every_value();
    m.insert("t.array.mixed", mixed_nesting());
    let tensors = every_tensor();
    let bytes = write_to_vec(&m, &tensors);
    let g = Gguf::from_bytes(bytes.clone()).unwrap();
    assert_round_trip(&g, &m, &tensors);
    // Padding after the last tensor too, as gguf-py and ggml write it.
    assert_eq!(bytes.len() % 32, 0);
}

#[test]
fn nan_keeps_its_bits() {
    let nan = f32::from_bits(0x7fc0_1234);
    let mut m = Metadata::new();
    m.insert("nan", Value::F32(nan));
    m.insert(
        "nans",
        Value::from(vec![f64::from_bits(0x7ff8_0000_0000_0001)]),
    );
    let g = Gguf::from_bytes(write_to_vec(&m, &[])).unwrap();
    assert!(matches!(g.metadata().get("nan"), Some(Value::F32(x)) if x.to_bits() == 0x7fc0_1234));
    assert!(matches!(
        g.metadata().get("nans"),
        Some(Value::Array(Array::F64(v))) if v[0].to_bits() == 0x7ff8_0000_0000_0001
    ));
}

#[test]
fn custom_alignment_is_honoured() {
    for align in [1u32, 8, 64, 4096] {
        let mut m = Metadata::new();
        m.insert("general.alignment", Value::U32(align));
        let tensors = every_tensor();
        let bytes = write_to_vec(&m, &tensors);
        let g = Gguf::from_bytes(bytes.clone()).unwrap();
        assert_eq!(g.alignment(), u64::from(align));
        assert_round_trip(&g, &m, &tensors);
        assert_eq!(bytes.len() as u64 % u64::from(align), 0);
        if align == 1 {
            // Tightly packed: every tensor starts where the previous one ends.
            let mut end = 0;
            for t in g.tensors() {
                assert_eq!(t.offset, end);
                end += t.n_bytes();
            }
        }
    }
}

#[test]
fn create_then_open_through_mmap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    let m = every_value();
    let tensors = every_tensor();
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::create(&path, &m, specs).unwrap();
    for (spec, data) in &tensors {
        w.write_tensor(&spec.name, data).unwrap();
    }
    w.finish().unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.path(), Some(path.as_path()));
    assert_round_trip(&g, &m, &tensors);
    assert_eq!(g.file_size(), std::fs::metadata(&path).unwrap().len());
}

#[test]
fn empty_file_round_trips() {
    let g = Gguf::from_bytes(write_to_vec(&Metadata::new(), &[])).unwrap();
    assert!(g.metadata().is_empty() && g.tensors().is_empty());
}

fn spec(name: &str, ty: GgmlType, shape: &[u64]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        ty,
        shape: shape.to_vec(),
    }
}

#[track_caller]
fn refused(m: &Metadata, specs: Vec<TensorSpec>, field: &str, problem: &str) {
    let e = match GgufWriter::new(Vec::new(), m, specs) {
        Ok(_) => panic!("writer accepted a bad spec ({field})"),
        Err(e) => e,
    };
    assert_eq!(e.field(), Some(field), "{e}");
    assert!(e.to_string().contains(problem), "{e}");
}

#[test]
fn writer_refuses_what_readers_would_reject() {
    let m = Metadata::new();
    refused(
        &m,
        vec![
            spec("a", GgmlType::F32, &[1]),
            spec("a", GgmlType::F32, &[1]),
        ],
        "tensor 'a' (#1)",
        "duplicate name",
    );
    refused(
        &m,
        vec![spec("q", GgmlType::Q4_K, &[100])],
        "tensor 'q' (#0)",
        "block size 256",
    );
    refused(
        &m,
        vec![spec("d", GgmlType::F32, &[1; 5])],
        "tensor 'd' (#0)",
        "5 dimensions",
    );
    refused(
        &m,
        vec![spec(&"n".repeat(64), GgmlType::F32, &[1])],
        &format!("tensor '{}' (#0)", "n".repeat(64)),
        "at most 63",
    );
    for bad in [Value::U32(0), Value::U32(24), Value::U64(32)] {
        let mut m = Metadata::new();
        m.insert("general.alignment", bad);
        refused(
            &m,
            vec![],
            "metadata key 'general.alignment'",
            "power of two",
        );
    }
    let mut m = Metadata::new();
    m.insert("", Value::U8(0));
    refused(&m, vec![], "metadata key #0", "empty key");
    let mut deep = Array::U8(vec![]);
    for _ in 0..16 {
        deep = Array::Array(vec![deep]);
    }
    let mut m = Metadata::new();
    m.insert("deep", Value::Array(deep));
    refused(
        &m,
        vec![],
        "metadata key 'deep' (#0)",
        "nested more than 16 deep",
    );
}

#[test]
fn writer_checks_order_length_and_completeness() {
    let specs = vec![
        spec("a", GgmlType::F32, &[2]),
        spec("b", GgmlType::Q8_0, &[32]),
    ];
    let mut w = GgufWriter::new(Vec::new(), &Metadata::new(), specs.clone()).unwrap();
    let e = w.write_tensor("b", &[0; 34]).unwrap_err();
    assert_eq!(e.field(), Some("tensor 'a' (#0)"));
    assert!(
        e.to_string().contains("next tensor to write, got 'b'"),
        "{e}"
    );
    let e = w.write_tensor("a", &[0; 7]).unwrap_err();
    assert!(e.to_string().contains("data is 7 bytes, expected 8"), "{e}");
    // Errors leave the writer usable.
    w.write_tensor("a", &[1; 8]).unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.field(), Some("tensor 'b' (#1)"));
    assert!(
        e.to_string().contains("only 1 of 2 tensors were written"),
        "{e}"
    );

    let mut w = GgufWriter::new(Vec::new(), &Metadata::new(), specs).unwrap();
    w.write_tensor("a", &[1; 8]).unwrap();
    w.write_tensor("b", &[2; 34]).unwrap();
    let e = w.write_tensor("c", &[]).unwrap_err();
    assert!(
        e.to_string().contains("all 2 tensors were already written"),
        "{e}"
    );
    let bytes = w.finish().unwrap();
    let g = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(g.tensor_data(g.tensor("b").unwrap()), &[2; 34]);
}

#[test]
fn create_does_not_touch_the_file_for_a_bad_spec() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.gguf");
    let bad = vec![spec("q", GgmlType::Q4_0, &[3])];
    let e = GgufWriter::create(&path, &Metadata::new(), bad).unwrap_err();
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
    assert!(!path.exists());
}
