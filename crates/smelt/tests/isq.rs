//! `--isq TYPE` and Hugging Face folders through the CLI: what `smelt run --isq T` generates
//! is what `smelt run` generates on the file `smelt quantize --type T` writes (the same
//! bytes), and a folder loads anywhere a GGUF path does.

mod common;

use common::{model, smelt, smelt_ok, SMOLLM};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn run_json(model: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "run",
        "--model",
        model,
        "--prompt",
        "The three primary colors are",
        "--max-tokens",
        "12",
        "--threads",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = smelt_ok(&args);
    serde_json::from_str(out.lines().last().unwrap_or("")).expect("--json prints JSON last")
}

#[test]
fn run_isq_generates_what_the_quantized_file_generates() {
    let src = model(SMOLLM);
    let src = src.to_str().expect("UTF-8 path");
    let dir = tempfile::tempdir().expect("tempdir");
    for ty in ["q8_0", "q4_k_m"] {
        let file = dir.path().join(format!("{ty}.gguf"));
        let file = file.to_str().expect("UTF-8 path");
        smelt_ok(&["quantize", src, file, "--type", ty]);
        let want = run_json(file, &[]);
        let got = run_json(src, &["--isq", ty]);
        assert_eq!(got["tokens"], want["tokens"], "{ty}");
        assert_eq!(got["tokens"].as_array().map(Vec::len), Some(12), "{ty}");
    }
}

#[test]
fn bad_isq_and_bad_folders_are_clear_errors() {
    let src = model(SMOLLM);
    let out = smelt(&[
        "run",
        "--model",
        src.to_str().expect("UTF-8 path"),
        "--prompt",
        "x",
        "--isq",
        "q9_9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--isq") && err.contains("q9_9"), "{err}");

    let empty = tempfile::tempdir().expect("tempdir");
    let out = smelt(&[
        "run",
        "--model",
        empty.path().to_str().expect("UTF-8 path"),
        "--prompt",
        "x",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("config.json") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_hugging_face_folder_runs_with_and_without_isq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("SmolLM2-bf16");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oracle/hf_folder.py");
    let st = Command::new(common::python())
        .arg(script)
        .arg(model(SMOLLM))
        .arg(&folder)
        .status()
        .expect("runs hf_folder.py");
    assert!(st.success(), "hf_folder.py failed");
    let f = folder.to_str().expect("UTF-8 path");
    let bf16 = run_json(f, &[]);
    let q8 = run_json(f, &["--isq", "q8_0"]);
    for v in [&bf16, &q8] {
        assert_eq!(v["tokens"].as_array().map(Vec::len), Some(12), "{v}");
    }
    // Same prompt ids as the GGUF it was written from.
    let orig = run_json(model(SMOLLM).to_str().expect("UTF-8 path"), &[]);
    assert_eq!(bf16["prompt_tokens"], orig["prompt_tokens"]);
}
