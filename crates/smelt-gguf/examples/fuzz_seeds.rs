//! Writes the small valid GGUF files that seed the `gguf_read` fuzz corpus (`fuzz/seeds/`):
//! `cargo run -p smelt-gguf --example fuzz_seeds -- fuzz/seeds`.
//!
//! Small on purpose: the fuzzer mutates bytes, so a seed that reaches every record type in a
//! few hundred bytes explores far more than a real model would.

use std::path::PathBuf;

use smelt_gguf::{Array, GgmlType, GgufError, GgufWriter, Metadata, TensorSpec, Value};

fn write(
    dir: &std::path::Path,
    name: &str,
    m: &Metadata,
    tensors: &[(&str, GgmlType, &[u64])],
) -> Result<(), GgufError> {
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|&(name, ty, shape)| TensorSpec {
            name: name.into(),
            ty,
            shape: shape.to_vec(),
        })
        .collect();
    let mut w = GgufWriter::create(dir.join(name), m, specs.clone())?;
    for (i, s) in specs.iter().enumerate() {
        let data: Vec<u8> = (0..s.n_bytes())
            .map(|b| (b as u8).wrapping_add(i as u8))
            .collect();
        w.write_tensor(&s.name, &data)?;
    }
    w.finish()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/seeds".into()),
    );
    std::fs::create_dir_all(&dir)?;

    let mut scalars = Metadata::new();
    scalars.insert("general.architecture", Value::from("llama"));
    scalars.insert("a", Value::U8(1));
    scalars.insert("b", Value::I8(-1));
    scalars.insert("c", Value::U16(2));
    scalars.insert("d", Value::I16(-2));
    scalars.insert("e", Value::U32(3));
    scalars.insert("f", Value::I32(-3));
    scalars.insert("g", Value::U64(4));
    scalars.insert("h", Value::I64(-4));
    scalars.insert("i", Value::F32(0.5));
    scalars.insert("j", Value::F64(0.25));
    scalars.insert("k", Value::Bool(true));
    scalars.insert("l", Value::from("str"));
    write(
        &dir,
        "scalars.gguf",
        &scalars,
        &[("w", GgmlType::F32, &[4])],
    )?;

    let mut arrays = Metadata::new();
    arrays.insert("u8", Value::from(vec![1u8, 2]));
    arrays.insert("f32", Value::from(vec![1.0f32]));
    arrays.insert("bool", Value::from(vec![true, false]));
    arrays.insert("str", Value::from(vec!["a".to_string(), "bc".to_string()]));
    arrays.insert("empty", Value::from(Vec::<u64>::new()));
    arrays.insert(
        "nested",
        Value::Array(Array::Array(vec![
            Array::I32(vec![1]),
            Array::Array(vec![Array::String(vec!["x".into()])]),
        ])),
    );
    write(&dir, "arrays.gguf", &arrays, &[])?;

    let mut aligned = Metadata::new();
    aligned.insert("general.alignment", Value::U32(8));
    write(
        &dir,
        "tensors.gguf",
        &aligned,
        &[
            ("q", GgmlType::Q4_0, &[32, 2]),
            ("k", GgmlType::Q8_0, &[32]),
            ("s", GgmlType::F16, &[]),
            ("z", GgmlType::I8, &[3, 0, 2, 1]),
        ],
    )?;

    write(&dir, "empty.gguf", &Metadata::new(), &[])?;

    // v2 has v3's layout; only the version field differs.
    let mut v2 = std::fs::read(dir.join("scalars.gguf"))?;
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(dir.join("scalars-v2.gguf"), v2)?;
    println!("wrote seeds to {}", dir.display());
    Ok(())
}
