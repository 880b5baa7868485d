#!/usr/bin/env bash
# A short fuzz run of every fuzz target, as CI runs it: installs cargo-fuzz if missing, seeds
# each target's corpus from fuzz/seeds/, fuzzes each for a while and fails on any crash,
# panic, leak, timeout or out-of-memory. The targets:
#   gguf_read      the GGUF reader (seeds: fuzz/seeds/*.gguf, small valid files written by
#                  `cargo run -p smelt-gguf --example fuzz_seeds -- fuzz/seeds`, and inputs
#                  the fuzzer once failed on)
#   tokenize_chat  the tokenizers and chat templates of the test models (needs
#                  scripts/fetch-models.sh all); seeds from fuzz/seeds/make_seeds.py, as for
#   hf_folder      the Hugging Face folder loader (config.json, tokenizer.json, safetensors)
#   request_json   the OpenAI request bodies `smelt serve` parses (crate smelt-openai alone:
#                  no server, engine or HTTP stack to build under instrumentation)
# Usage: scripts/fuzz-smoke.sh [TARGET ...]   (default: all). FUZZ_SECONDS sets the time per
# target (default 60 for gguf_read, 30 for the others); FUZZ_RUNS=N runs N executions per
# target instead (the longer runs of bench/RESULTS.md).
#
# The toolchain is stable-only; cargo-fuzz needs nightly flags (-Zsanitizer), which
# RUSTC_BOOTSTRAP=1 unlocks. AddressSanitizer is used when it builds; FUZZ_SANITIZER=none
# turns it off (the Rust code under test has no unsafe code to check beyond the mmap).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"

sanitizer=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1
export SMELT_MODELS=${SMELT_MODELS:-$root/.models}
if [ $# -gt 0 ]; then targets=("$@"); else targets=(gguf_read tokenize_chat hf_folder request_json); fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked
fi
echo "fuzz-smoke: $(cargo fuzz --version)"

build() {
  for t in "${targets[@]}"; do
    cargo fuzz build -s "$sanitizer" "$t" || return 1
  done
}
if ! build; then
  [ "$sanitizer" != none ] || exit 1
  echo "fuzz-smoke: building with -s $sanitizer failed; retrying without a sanitizer"
  sanitizer=none
  build
fi

for target in "${targets[@]}"; do
  corpus="corpus/$target"
  mkdir -p "$corpus"
  case $target in
    gguf_read) cp seeds/*.gguf "$corpus/"; secs=${FUZZ_SECONDS:-60}; max_len=4096 ;;
    hf_folder) cp seeds/$target/* "$corpus/"; secs=${FUZZ_SECONDS:-30}; max_len=16384 ;;
    *) cp seeds/$target/* "$corpus/"; secs=${FUZZ_SECONDS:-30}; max_len=4096 ;;
  esac
  if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); what="$FUZZ_RUNS executions"
  else limit=(-max_total_time="$secs"); what="${secs}s"; fi
  echo "fuzz-smoke: running $target for $what (sanitizer: $sanitizer, corpus $(ls "$corpus" | wc -l) files)"
  # -malloc_limit_mb: inputs are at most a few KB, so any allocation near this size means a
  # length was trusted before being checked against the bytes present.
  cargo fuzz run -s "$sanitizer" "$target" "$corpus" -- \
    "${limit[@]}" -max_len="$max_len" -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1
  echo "fuzz-smoke: $target ran $what without a crash ($(ls "$corpus" | wc -l) corpus files)"
done
