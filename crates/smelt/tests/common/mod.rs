//! Helpers the integration tests share: run the built binary, find the test models and the
//! llama.cpp oracle.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `smelt` with `args`; returns the output whatever the exit status.
pub fn smelt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the smelt binary runs")
}

/// Runs `smelt` and fails the test, showing stderr, unless it exits 0. Returns stdout.
pub fn smelt_ok(args: &[&str]) -> String {
    let out = smelt(args);
    assert!(
        out.status.success(),
        "smelt {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A test model fetched by `scripts/fetch-models.sh`; fails loudly when missing.
pub fn model(name: &str) -> PathBuf {
    let p = repo_root().join(".models").join(name);
    assert!(
        p.exists(),
        "test model {} is missing: run scripts/fetch-models.sh all",
        p.display()
    );
    p
}

pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";
pub const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The oracle's Python, shared by every crate's tests (`smelt_oracle::python`).
pub fn python() -> PathBuf {
    smelt_oracle::python()
}

/// Greedy generation in llama.cpp: the token ids and the text.
pub struct Generated {
    pub tokens: Vec<u64>,
    pub text: String,
    pub n_vocab: u64,
}

/// `prompt` is text, or token ids when it starts with `ids:` (e.g. `ids:1,2,3`).
pub fn greedy(model: &Path, n: usize, prompt: &str) -> Generated {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/greedy.py");
    let (model_s, n_s) = (model.to_str().expect("UTF-8 path"), n.to_string());
    let mut args = vec![model_s, n_s.as_str()];
    match prompt.strip_prefix("ids:") {
        Some(ids) => args.extend(["--ids", ids]),
        None => args.extend(["--prompt", prompt]),
    };
    // Whether llama.cpp runs smelt's files, not whose bits: the host's build answers.
    let out = smelt_oracle::run_live(&script, &args);
    let stdout = &out.stdout;
    assert!(
        out.success(),
        "llama.cpp could not run {}:\n{stdout}\n{}",
        model.display(),
        out.stderr
    );
    let line = stdout.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line).expect("greedy.py prints JSON");
    Generated {
        tokens: v["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_u64().expect("token id"))
            .collect(),
        text: v["text"].as_str().unwrap_or("").to_string(),
        n_vocab: v["n_vocab"].as_u64().unwrap_or(0),
    }
}

/// Parses `smelt inspect --json`.
pub fn inspect_json(path: &Path) -> serde_json::Value {
    let out = smelt_ok(&["inspect", "--json", path.to_str().expect("UTF-8 path")]);
    serde_json::from_str(&out).expect("inspect --json prints one JSON object")
}

/// name -> (type, shape) from `inspect --json`.
pub fn tensor_types(
    j: &serde_json::Value,
) -> std::collections::BTreeMap<String, (String, Vec<u64>)> {
    j["tensors"]
        .as_array()
        .expect("tensors array")
        .iter()
        .map(|t| {
            let shape = t["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim"))
                .collect();
            (
                t["name"].as_str().expect("name").to_string(),
                (t["type"].as_str().expect("type").to_string(), shape),
            )
        })
        .collect()
}
