//! Interoperability with gguf-py (the reference Python implementation): we read what its
//! GGUFWriter writes, and its GGUFReader reads what we write, field for field.

mod common;

use common::{assert_matches_gguf_py, every_tensor, every_value, run_oracle};
use smelt_gguf::{Array, GgmlType, Gguf, GgufWriter, Value};

#[test]
fn we_read_what_gguf_py_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("from_gguf_py.gguf");
    run_oracle("gguf_py_write.py", &[&path]);
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 64);
    let m = g.metadata();
    assert_eq!(m.architecture(), Some("llama"));
    let expect = [
        ("t.u8", Value::U8(255)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(65535)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(u32::MAX)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(0.1)),
        ("t.f64", Value::F64(0.1)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::from("héllo 🦀")),
        ("t.array.u8", Value::from(vec![1u8, 2, 255])),
        ("t.array.i8", Value::from(vec![-1i8, 2])),
        ("t.array.u16", Value::from(vec![65535u16])),
        ("t.array.i16", Value::from(vec![-2i16, 3])),
        ("t.array.u32", Value::from(vec![7u32, 8])),
        ("t.array.i32", Value::from(vec![-7i32, 8])),
        ("t.array.u64", Value::from(vec![u64::MAX])),
        ("t.array.i64", Value::from(vec![i64::MIN])),
        ("t.array.f32", Value::from(vec![0.5f32, -2.25])),
        ("t.array.f64", Value::from(vec![0.1f64, 1e300])),
        ("t.array.bool", Value::from(vec![true, false])),
        (
            "t.array.string",
            Value::from(vec!["a".to_string(), String::new(), "ü".to_string()]),
        ),
        (
            "t.array.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::I32(vec![3]),
            ])),
        ),
        (
            "t.array.nested.strings",
            Value::Array(Array::Array(vec![
                Array::String(vec!["x".into(), "yz".into()]),
                Array::String(vec!["w".into()]),
            ])),
        ),
    ];
    for (key, want) in &expect {
        assert_eq!(m.get(key), Some(want), "{key}");
    }
    assert_eq!(m.get("general.alignment"), Some(&Value::U32(64)));

    let t = g.tensor("f32").unwrap();
    assert_eq!((t.ty, t.shape.as_slice()), (GgmlType::F32, &[3, 2][..]));
    let floats: Vec<f32> = g
        .tensor_data(t)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let q = g.tensor("q8_0").unwrap();
    assert_eq!((q.ty, q.shape.as_slice()), (GgmlType::Q8_0, &[32, 2][..]));
    assert_eq!(g.tensor_data(q), (0..68).collect::<Vec<u8>>());
    assert_eq!(g.tensor("f16").unwrap().shape, [2]);
    assert_eq!(g.tensor("i32").unwrap().ty, GgmlType::I32);
    for t in g.tensors() {
        assert_eq!(t.offset % 64, 0);
    }

    assert_matches_gguf_py(&path);
}

#[test]
fn gguf_py_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    for align in [None, Some(128u32)] {
        let path = dir.path().join(format!("ours_{align:?}.gguf"));
        let mut m = every_value();
        if let Some(a) = align {
            m.insert("general.alignment", Value::U32(a));
        }
        let tensors = every_tensor();
        let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
        let mut w = GgufWriter::create(&path, &m, specs).unwrap();
        for (spec, data) in &tensors {
            w.write_tensor(&spec.name, data).unwrap();
        }
        w.finish().unwrap();
        assert_matches_gguf_py(&path);
    }
}

/// v2 has v3's layout (v1's u32 lengths are gone); a hand-made v2 file with arrays, a
/// custom alignment and quantized tensors reads the same in both implementations.
#[test]
fn hand_made_v2_file_reads_like_gguf_py() {
    let b = common::Bytes::header(2, 2, 3)
        .str("general.architecture")
        .u32(8)
        .str("llama")
        .str("general.alignment")
        .u32(4)
        .u32(16)
        .str("llama.ids")
        .u32(9)
        .u32(4)
        .u64(3)
        .u32(7)
        .u32(8)
        .u32(9)
        .tensor("tok", &[32, 2], 8, 0)
        .tensor("norm", &[3], 0, 80)
        .pad(16)
        .raw(&[1; 68])
        .pad(16)
        .raw(&[2; 12]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.gguf");
    std::fs::write(&path, &b.0).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!((g.version(), g.alignment()), (2, 16));
    assert_eq!(
        g.metadata().get("llama.ids"),
        Some(&Value::from(vec![7u32, 8, 9]))
    );
    let tok = g.tensor("tok").unwrap();
    assert_eq!(
        (tok.ty, g.tensor_data(tok)),
        (GgmlType::Q8_0, &[1u8; 68][..])
    );
    let norm = g.tensor("norm").unwrap();
    assert_eq!(g.tensor_data(norm), &[2u8; 12]);
    assert_matches_gguf_py(&path);
}
