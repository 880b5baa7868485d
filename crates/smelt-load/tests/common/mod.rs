//! What the Hugging Face folder tests share: the repository root, the oracle's Python, a
//! scratch copy of a folder to break, and loading one that must fail.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use smelt_gguf::{GgmlType, Gguf};
use smelt_load::CpuQuantizer;

/// The CPU engine's last-token logits of `g` on a fixed 24-token prompt: what the folder
/// tests compare, bit for bit, between a folder and the GGUF it must equal.
pub fn last_logits(g: Gguf) -> Vec<f32> {
    let opts = smelt_engine::EngineOptions {
        kv_tokens: 64,
        ..smelt_engine::EngineOptions::default()
    };
    let mut e =
        smelt_engine::Engine::from_gguf(std::sync::Arc::new(g), &opts).expect("engine loads");
    let prompt: Vec<u32> = (0..24u32).map(|i| 7 + 1013 * i % 49_000).collect();
    let s = e.new_sequence();
    e.forward(&[smelt_engine::SeqInput {
        seq: s,
        tokens: prompt,
        logits: smelt_engine::Logits::Last,
    }])
    .expect("forward")[0][0]
        .clone()
}

/// An ISQ plan that puts every bf16 matrix (the 3-D experts included) in one type: enough
/// to test ISQ of a folder's converted tensors; llama.cpp's rules are the CLI's plan.
pub struct EveryMatrix(pub GgmlType);

impl smelt_load::Planner for EveryMatrix {
    fn plan(
        &self,
        _: &smelt_gguf::Metadata,
        tensors: &[smelt_load::SourceTensor],
    ) -> Result<smelt_load::IsqPlan, String> {
        Ok(smelt_load::IsqPlan {
            types: tensors
                .iter()
                .map(|t| match t.shape.len() {
                    2 | 3 if t.ty == GgmlType::BF16 => self.0,
                    _ => t.ty,
                })
                .collect(),
            file_type: 7,
        })
    }
}

/// Keys that describe the file rather than the model.
pub const DESCRIPTIVE: &[&str] = &["general.name", "general.type"];

/// Every metadata key of `orig` is `conv`'s, and `conv` has no other (the descriptive keys
/// apart).
pub fn assert_same_metadata(orig: &Gguf, conv: &Gguf) {
    let (om, cm) = (orig.metadata(), conv.metadata());
    for (k, v) in om.iter() {
        if !DESCRIPTIVE.contains(&k) {
            assert_eq!(cm.get(k), Some(v), "metadata key {k}");
        }
    }
    for (k, _) in cm.iter() {
        assert!(
            om.get(k).is_some() || DESCRIPTIVE.contains(&k),
            "converted GGUF has extra key {k}"
        );
    }
}

/// `conv` has `orig`'s tensors: the same names, types, shapes and bytes.
pub fn assert_same_tensors(orig: &Gguf, conv: &Gguf) {
    assert_eq!(orig.tensors().len(), conv.tensors().len());
    for t in orig.tensors() {
        let c = conv
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!((c.ty, &c.shape), (t.ty, &t.shape), "{}", t.name);
        assert!(
            conv.tensor_data(c) == orig.tensor_data(t),
            "{}: bytes differ",
            t.name
        );
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The oracle's Python, shared by every crate's tests (`smelt_oracle::python`).
pub fn python() -> PathBuf {
    smelt_oracle::python()
}

/// SmolLM2's GGUF, which the folders are written from.
pub fn smollm2_path() -> PathBuf {
    let p = root().join(".models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "test model {} is missing: run scripts/fetch-models.sh all",
        p.display()
    );
    p
}

/// A scratch copy of a folder: small files copied (to be edited), big ones linked.
pub fn scratch(src: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(src).expect("reads folder") {
        let p = e.expect("entry").path();
        let dst = dir.path().join(p.file_name().expect("name"));
        if p.extension().is_some_and(|x| x == "safetensors") {
            std::os::unix::fs::symlink(&p, &dst).expect("links");
        } else {
            std::fs::copy(&p, &dst).expect("copies");
        }
    }
    dir
}

pub fn load_err(dir: &Path) -> String {
    match smelt_load::open(dir, None, &CpuQuantizer) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e.to_string(),
    }
}

pub fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("reads")).expect("json");
    f(&mut v);
    std::fs::write(path, v.to_string()).expect("writes");
}

/// Tensor `name` of `q8` (an ISQ Q8_0 load) is smelt-quant's Q8_0 of `bf16`'s (the same
/// folder loaded as it is), byte for byte.
pub fn assert_q8_0_of_bf16(bf16: &Gguf, q8: &Gguf, name: &str) {
    let t = bf16.tensor(name).expect("in the bf16 load");
    let q = q8.tensor(name).expect("same tensors");
    assert_eq!((q.ty, &q.shape), (GgmlType::Q8_0, &t.shape), "{name}");
    let mut f = vec![0f32; t.n_elements() as usize];
    smelt_quant::dequantize_row(GgmlType::BF16, bf16.tensor_data(t), &mut f).expect("bf16");
    let want = smelt_quant::quantize_tensor(GgmlType::Q8_0, &f, t.row_len() as usize, Some(1))
        .expect("quantizes");
    assert!(q8.tensor_data(q) == &want[..], "{name}: ISQ bytes differ");
}
