//! Shared by the integration tests: where the test models are, and the llama.cpp oracle's
//! recorded answers (`smelt-oracle`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A test model fetched by `scripts/fetch-models.sh all`; a missing one fails the test.
pub fn model(file: &str) -> PathBuf {
    let dir = std::env::var_os("SMELT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".models"));
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "test model {} is missing: run scripts/fetch-models.sh all",
        p.display()
    );
    p
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// Runs an oracle script from `tests/oracle/` whose answer is llama.cpp's AVX-512 build's bits
/// (live where the CPU has AVX-512, else replayed from `smelt-oracle`'s records); panics with
/// its stderr when it fails.
pub fn recorded(script: &str, args: &[&str], keep: smelt_oracle::Keep) -> smelt_oracle::Answer {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle")
        .join(script);
    let answer = smelt_oracle::run_recorded(&path, args, keep);
    assert!(
        answer.success(),
        "{script} failed (if llama_cpp is missing, run scripts/oracles.sh):\n{}",
        answer.stderr
    );
    answer
}

/// A tiny model's GGUF from `(name, shape, quantized)` tensors: the quantized ones in `ty`,
/// the rest F32, each tensor's values from `values(spec, row)` (`shape[0]` = `row` floats a
/// row), quantized row by row as the converter would.
pub fn tiny_gguf(
    m: &smelt_gguf::Metadata,
    tensors: &[(String, Vec<u64>, bool)],
    ty: smelt_gguf::GgmlType,
    mut values: impl FnMut(&smelt_gguf::TensorSpec, usize) -> Vec<f32>,
) -> smelt_gguf::Gguf {
    use smelt_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec};
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(name, shape, quant)| TensorSpec {
            name: name.clone(),
            ty: if *quant { ty } else { GgmlType::F32 },
            shape: shape.clone(),
        })
        .collect();
    let mut w = GgufWriter::new(Vec::new(), m, specs.clone()).expect("header");
    for spec in &specs {
        let row = spec.shape[0] as usize;
        let vals = values(spec, row);
        let data = if spec.ty == GgmlType::F32 {
            vals.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            let rb = spec.ty.row_bytes(row as u64).expect("row bytes") as usize;
            let mut out = vec![0u8; rb * (vals.len() / row)];
            for (src, dst) in vals.chunks(row).zip(out.chunks_mut(rb)) {
                smelt_quant::quantize_row(spec.ty, src, dst).expect("quantize");
            }
            out
        };
        w.write_tensor(&spec.name, &data).expect("tensor");
    }
    Gguf::from_bytes(w.finish().expect("finish")).expect("parse")
}
