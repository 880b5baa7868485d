#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs (Rust components, the Python
# oracles, the test models), then checks formatting, lints, tests and a fuzz smoke run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step() { printf '\n==> %s\n' "$*"; }

step "toolchain components"
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "python oracles (gguf-py, ggml through llama-cpp-python)"
SMELT_PYTHON=$(scripts/oracles.sh | tail -n1)
export SMELT_PYTHON

step "ptxas (PyPI nvidia-cuda-nvcc) for the PTX assembly checks"
SMELT_PTXAS=$(scripts/ptxas.sh | tail -n1)
export SMELT_PTXAS

step "test models"
scripts/fetch-models.sh all

step "cargo fmt"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
cargo test --workspace --release

if [ -x scripts/fuzz-smoke.sh ]; then
  step "fuzz smoke run"
  scripts/fuzz-smoke.sh
fi
