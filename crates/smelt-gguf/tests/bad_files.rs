//! Malformed files: each must be an error naming the field at fault, never a panic and
//! never an allocation the size of a hostile length.

mod common;

use common::Bytes;
use smelt_gguf::{GgmlType, Gguf, GgufError};

const F32: u32 = 0;
const Q4_0: u32 = 2;
const T_U8: u32 = 0;
const T_U32: u32 = 4;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;

/// Parses and expects an error whose field and message contain the given fragments.
#[track_caller]
fn expect_err(bytes: Bytes, field: &str, problem: &str) -> GgufError {
    let e = match Gguf::from_bytes(bytes.0) {
        Ok(g) => panic!("expected an error about {field}, parsed {g:?}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(
        e.field().is_some_and(|f| f.contains(field)),
        "field should contain {field:?}: {msg}"
    );
    assert!(
        msg.contains(problem),
        "message should contain {problem:?}: {msg}"
    );
    e
}

/// One f32 tensor of 4 elements, at offset 0, with data.
fn one_tensor_file(version: u32) -> Bytes {
    Bytes::header(version, 1, 1)
        .str("general.architecture")
        .u32(T_STRING)
        .str("llama")
        .tensor("w", &[4], F32, 0)
        .pad(32)
        .raw(&[0x3f; 16])
}

#[test]
fn valid_base_file_parses_in_v2_and_v3() {
    for version in [2, 3] {
        let g = Gguf::from_bytes(one_tensor_file(version).0).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.metadata().architecture(), Some("llama"));
        let t = g.tensor("w").unwrap();
        assert_eq!(g.tensor_data(t), &[0x3f; 16]);
        assert_eq!(g.data_offset() % 32, 0);
    }
}

#[test]
fn every_truncation_is_an_error() {
    let full = one_tensor_file(3).0;
    for len in 0..full.len() {
        let e = Gguf::from_bytes(full[..len].to_vec())
            .expect_err(&format!("prefix of {len} bytes parsed"));
        assert!(e.field().is_some(), "{len}: {e}");
    }
    let e = expect_err(
        Bytes(full[..full.len() - 1].to_vec()),
        "tensor 'w' (#0)",
        "runs past the end",
    );
    assert!(e.to_string().contains("[offset 128..144)"), "{e}");
}

#[test]
fn magic_and_version() {
    expect_err(Bytes::new(), "header: magic", "needs 4 bytes");
    expect_err(
        Bytes::new().raw(b"GGML").u32(3),
        "header: magic",
        "not a GGUF file",
    );
    expect_err(
        Bytes::header(1, 0, 0),
        "header: version",
        "v1 is not supported",
    );
    expect_err(
        Bytes::header(4, 0, 0),
        "header: version",
        "unsupported GGUF version 4",
    );
    expect_err(Bytes::header(0, 0, 0), "header: version", "byte-swapped");
    expect_err(
        Bytes::header(3u32.swap_bytes(), 0, 0),
        "header: version",
        "big-endian",
    );
}

#[test]
fn counts_too_large_for_the_file_fail_fast() {
    expect_err(
        Bytes::header(3, 0, u64::MAX),
        "header: metadata count",
        "cannot fit",
    );
    expect_err(
        Bytes::header(3, 1 << 40, 0),
        "header: tensor count",
        "cannot fit",
    );
    expect_err(
        Bytes::header(3, u64::MAX, 0),
        "header: tensor count",
        "cannot fit",
    );
}

#[test]
fn lengths_past_the_end_fail_before_allocating() {
    // A key claiming 2^60 bytes.
    expect_err(
        Bytes::header(3, 0, 1).u64(1 << 60).raw(&[0; 16]),
        "metadata key #0",
        "runs past the end",
    );
    // A string value claiming u64::MAX bytes.
    expect_err(
        Bytes::header(3, 0, 1).str("k").u32(T_STRING).u64(u64::MAX),
        "metadata key 'k' (#0)",
        "runs past the end",
    );
    // An array of 2^60 u64s, and of 2^62 strings and 2^62 arrays.
    for (ty, name) in [
        (T_U64, "array[u64]"),
        (T_STRING, "array[string]"),
        (T_ARRAY, "array[array]"),
    ] {
        let b = Bytes::header(3, 0, 1)
            .str("k")
            .u32(T_ARRAY)
            .u32(ty)
            .u64(1 << 60);
        let e = expect_err(b, "metadata key 'k' (#0)", "cannot fit");
        assert!(e.to_string().contains(name), "{e}");
    }
    // A string inside an array running past the end names its element.
    let b = Bytes::header(3, 0, 1)
        .str("k")
        .u32(T_ARRAY)
        .u32(T_STRING)
        .u64(2)
        .str("ok")
        .u64(1000);
    expect_err(b, "metadata key 'k' (#0)", "element #1");
    // A tensor name past the end.
    expect_err(
        Bytes::header(3, 1, 0).u64(1 << 40).raw(&[0; 20]),
        "tensor #0",
        "runs past the end",
    );
}

#[test]
fn bad_metadata_values() {
    let kv = |key: &[u8], ty: u32| {
        Bytes::header(3, 0, 1)
            .u64(key.len() as u64)
            .raw(key)
            .u32(ty)
    };
    expect_err(
        kv(b"k", T_BOOL).u8(2),
        "metadata key 'k' (#0)",
        "bool at offset",
    );
    expect_err(
        kv(b"k", T_ARRAY).u32(T_BOOL).u64(3).raw(&[0, 1, 7]),
        "metadata key 'k'",
        "element #2: bool",
    );
    expect_err(
        kv(b"k", 13).raw(&[0; 8]),
        "metadata key 'k'",
        "unknown value type id 13",
    );
    expect_err(
        kv(b"k", T_ARRAY).u32(77).u64(0),
        "metadata key 'k'",
        "unknown array element type id 77",
    );
    expect_err(
        kv(b"\xff\xfe", T_U8).u8(0),
        "metadata key #0",
        "not valid UTF-8",
    );
    expect_err(
        kv(b"k", T_STRING).u64(2).raw(b"\xc3\x28"),
        "metadata key 'k' (#0)",
        "not valid UTF-8",
    );
    expect_err(
        kv(b"", T_U8).u8(0).raw(&[0; 4]),
        "metadata key '' (#0)",
        "empty key",
    );
    let dup = Bytes::header(3, 0, 2)
        .str("a")
        .u32(T_U8)
        .u8(1)
        .str("a")
        .u32(T_U8)
        .u8(2);
    expect_err(dup, "metadata key 'a' (#1)", "duplicate key");
}

#[test]
fn deep_array_nesting_is_refused() {
    let mut b = Bytes::header(3, 0, 1).str("k").u32(T_ARRAY);
    for _ in 0..40 {
        b = b.u32(T_ARRAY).u64(1);
    }
    b = b.u32(T_U8).u64(0);
    expect_err(b, "metadata key 'k'", "nested more than 16 deep");
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    let with_align = |ty: u32, value: &[u8]| {
        Bytes::header(3, 0, 1)
            .str("general.alignment")
            .u32(ty)
            .raw(value)
    };
    expect_err(
        with_align(T_U32, &0u32.to_le_bytes()),
        "general.alignment",
        "not a non-zero power of two",
    );
    expect_err(
        with_align(T_U32, &48u32.to_le_bytes()),
        "general.alignment",
        "not a non-zero power of two",
    );
    expect_err(
        with_align(T_U64, &64u64.to_le_bytes()),
        "general.alignment",
        "must be u32, not u64",
    );
    let g = Gguf::from_bytes(with_align(T_U32, &64u32.to_le_bytes()).0).unwrap();
    assert_eq!(g.alignment(), 64);
}

/// A file with one tensor info and `data` bytes of data.
fn tensor_file(name: &str, shape: &[u64], ty: u32, offset: u64, data: usize) -> Bytes {
    Bytes::header(3, 1, 0)
        .tensor(name, shape, ty, offset)
        .pad(32)
        .raw(&vec![0; data])
}

#[test]
fn bad_tensor_infos() {
    let field = "tensor 'blk.0.attn_q.weight' (#0)";
    let name = "blk.0.attn_q.weight";
    expect_err(
        tensor_file(name, &[1, 1, 1, 1, 1], F32, 0, 4),
        field,
        "5 dimensions",
    );
    expect_err(tensor_file(name, &[u64::MAX], F32, 0, 4), field, "negative");
    expect_err(
        tensor_file(name, &[1 << 32, 1 << 32], F32, 0, 4),
        field,
        "more than 2^63-1 elements",
    );
    expect_err(
        tensor_file(name, &[1 << 62], 28, 0, 4),
        field,
        "more than 2^64 bytes",
    );
    expect_err(
        tensor_file(name, &[33, 2], Q4_0, 0, 64),
        field,
        "not a multiple of q4_0's block size 32",
    );
    expect_err(
        tensor_file(name, &[4], 4, 0, 16),
        field,
        "unknown ggml type id 4",
    );
    expect_err(
        tensor_file(name, &[4], 1000, 0, 16),
        field,
        "unknown ggml type id 1000",
    );
    expect_err(
        tensor_file(name, &[4], F32, 8, 64),
        field,
        "not a multiple of the alignment 32",
    );
    expect_err(
        tensor_file(name, &[4], F32, 1 << 40, 64),
        field,
        "runs past the end of the file",
    );
    expect_err(
        tensor_file(name, &[4], F32, u64::MAX - 31, 64),
        field,
        "runs past the end of the file",
    );
    expect_err(
        tensor_file(name, &[4], F32, 0, 15),
        field,
        "runs past the end of the file (111 bytes)",
    );
    expect_err(
        tensor_file(&"x".repeat(64), &[4], F32, 0, 16),
        "tensor 'xxx",
        "ggml allows at most 63",
    );
    let bad_name = Bytes::header(3, 1, 0)
        .u64(2)
        .raw(b"\xff\xff")
        .u32(1)
        .u64(4)
        .u32(F32)
        .u64(0);
    expect_err(bad_name, "tensor #0", "not valid UTF-8");
    let dup = Bytes::header(3, 2, 0)
        .tensor("a", &[4], F32, 0)
        .tensor("a", &[4], F32, 32)
        .pad(32)
        .raw(&[0; 64]);
    expect_err(dup, "tensor 'a' (#1)", "duplicate name (also tensor #0)");
    // The data section itself past the end of the file.
    let b = Bytes::header(3, 1, 0).tensor("a", &[0], F32, 0);
    expect_err(b, "data section", "past the end of the file");
}

#[test]
fn ggml_shape_rules_that_are_allowed() {
    // Zero dimensions is a scalar; a zero-size dimension is an empty tensor.
    let b = Bytes::header(3, 2, 0)
        .tensor("scalar", &[], F32, 0)
        .tensor("empty", &[0, 1 << 40], F32, 32)
        .pad(32)
        .raw(&[1, 2, 3, 4])
        .pad(32);
    let g = Gguf::from_bytes(b.0).unwrap();
    let s = g.tensor("scalar").unwrap();
    assert_eq!((s.n_elements(), g.tensor_data(s)), (1, &[1u8, 2, 3, 4][..]));
    let e = g.tensor("empty").unwrap();
    assert_eq!((e.n_elements(), g.tensor_data(e).len()), (0, 0));

    // Overlapping tensors are allowed (ggml allows views sharing data).
    let b = Bytes::header(3, 2, 0)
        .tensor("a", &[8], F32, 0)
        .tensor("b", &[4], F32, 0)
        .pad(32)
        .raw(&[7; 32]);
    let g = Gguf::from_bytes(b.0).unwrap();
    assert_eq!(g.tensor_data(&g.tensors()[1]), &[7; 16]);
    assert_eq!(g.tensors()[1].ty, GgmlType::F32);

    // No tensors: the data section may start past the end of a file that ends with the infos.
    let g = Gguf::from_bytes(Bytes::header(3, 0, 1).str("k").u32(T_U8).u8(1).0).unwrap();
    assert_eq!(g.data_offset(), 64);
    assert!(g.tensors().is_empty());
}

#[test]
fn errors_from_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(
        &path,
        tensor_file("blk.0.attn_q.weight", &[4], F32, 64, 16).0,
    )
    .unwrap();
    let e = Gguf::open(&path).unwrap_err();
    let msg = e.to_string();
    assert_eq!(
        msg,
        format!(
            "{}: tensor 'blk.0.attn_q.weight' (#0): data [offset 160..176) runs past the end of the file (112 bytes)",
            path.display()
        )
    );
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert_eq!(e.file(), Some(path.as_path()));

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let msg = Gguf::open(&empty).unwrap_err().to_string();
    assert!(msg.contains("empty.gguf: header: magic"), "{msg}");

    let missing = dir.path().join("missing.gguf");
    let e = Gguf::open(&missing).unwrap_err();
    assert!(matches!(e, GgufError::Io { op: "open", .. }), "{e}");
    assert!(e.to_string().contains("missing.gguf: open: "), "{e}");
}
