#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs (Rust components, the Python
# oracles, the test models), then checks formatting, lints, tests and a fuzz smoke run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Each step prints the time since the start and the disk left, so a slow or disk-hungry step
# shows in CI's log (CI stops at 90 minutes, on a disk of no fixed size).
start=$SECONDS
step() { printf '\n==> [%dm%02ds, %s free] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$(df -h --output=avail . | tail -n1 | tr -d ' ')" "$*"; }

# CI builds once from a clean clone on a disk of no fixed size (stop 25 ran out of it), so
# nothing that only a developer's rebuilds or debugger need: no incremental caches (2.3 GB),
# no debug info in the release test binaries (four fifths of each one's bytes; panics and
# assertions still name their file and line).
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_RELEASE_DEBUG=false

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
# The tests build in release: clippy's debug artifacts are not needed again.
rm -rf "${CARGO_TARGET_DIR:-target}/debug"

step "cargo test"
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
cargo test --workspace --release 2>&1 | tee "$test_log"

step "server end-to-end tests (openai client, chat page in headless chromium)"
scripts/server-tests.sh 2>&1 | tee -a "$test_log"

if [ -x scripts/fuzz-smoke.sh ]; then
  step "fuzz smoke run"
  scripts/fuzz-smoke.sh
fi

step "done"
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, i }' "$test_log"
