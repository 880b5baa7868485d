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
