#!/usr/bin/env bash
# Builds what bench/fuzz/long.sh runs on a machine with no toolchain and no network, into one
# git-ignored folder (default .gpu-fuzz/):
#   bin/<target>.gz    each fuzz target, built by cargo-fuzz (debug info stripped)
#   models/*.gguf      the test models' metadata without tensors (tokenize_chat's tokenizers
#                      and chat templates; bench/fuzz/vocab_only.py with gguf-py)
#   BUILD.txt          the commit and the build command
# Usage: bash bench/fuzz/build.sh [--sanitizer none|address] [--dir .gpu-fuzz] [TARGET ...]
# The sanitizer defaults to none: the code under test is safe Rust apart from the mmap, and
# without AddressSanitizer the binaries are smaller and run about twice as fast. What ASan
# would add besides is checked anyway: each target's allocator refuses any allocation over
# 256 MB (fuzz/fuzz_targets/common/alloc_limit.rs, as -malloc_limit_mb does under ASan).
# cargo-fuzz's default build mode is kept: optimized, with debug assertions and overflow
# checks on (its -O would turn them off). Needs the models (scripts/fetch-models.sh all) and
# the oracle venv (scripts/oracles.sh) for gguf-py. Set CARGO_TARGET_DIR to build elsewhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

sanitizer=none
dir=.gpu-fuzz
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --sanitizer) sanitizer=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf_read tokenize_chat hf_folder request_json)
mkdir -p "$dir/bin" "$dir/models"

export RUSTC_BOOTSTRAP=1
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
triple=$(rustc -vV | awk '/^host:/ { print $2 }')
for t in "${targets[@]}"; do
  (cd fuzz && cargo fuzz build -s "$sanitizer" "$t")
  bin=${CARGO_TARGET_DIR:-fuzz/target}/$triple/release/$t
  [ -x "$bin" ] || bin=fuzz/target/$triple/release/$t
  strip --strip-debug -o "$dir/bin/$t" "$bin"
  gzip -9 -f "$dir/bin/$t"
done

py=${SMELT_PYTHON:-$(scripts/oracles.sh | tail -n1)}
models=${SMELT_MODELS:-.models}
for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  "$py" bench/fuzz/vocab_only.py "$models/$m" "$dir/models/$m"
done
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- crates fuzz || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ): cargo fuzz build -s $sanitizer (release, debug assertions and overflow checks on), $(rustc --version)"
} >"$dir/BUILD.txt"
du -b "$dir"/bin/*.gz "$dir"/models/* | awk '{ s += $1; print } END { printf "total %.1f MB\n", s / 1e6 }'
