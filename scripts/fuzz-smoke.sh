#!/usr/bin/env bash
# A short fuzz run of the GGUF reader (fuzz target `gguf_read`), as CI runs it: installs
# cargo-fuzz if missing, seeds the corpus from fuzz/seeds/ (small valid files written by
# `cargo run -p smelt-gguf --example fuzz_seeds -- fuzz/seeds`, and inputs the fuzzer once
# failed on), fuzzes for FUZZ_SECONDS
# (default 60) and fails on any crash, panic, leak, timeout or out-of-memory.
#
# The toolchain is stable-only; cargo-fuzz needs nightly flags (-Zsanitizer), which
# RUSTC_BOOTSTRAP=1 unlocks. AddressSanitizer is used when it builds; FUZZ_SANITIZER=none
# turns it off (the Rust reader has no unsafe code to check beyond the mmap).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"

secs=${FUZZ_SECONDS:-60}
sanitizer=${FUZZ_SANITIZER:-address}
target=gguf_read
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked
fi
echo "fuzz-smoke: $(cargo fuzz --version)"

corpus="corpus/$target"
mkdir -p "$corpus"
cp seeds/*.gguf "$corpus/"
echo "fuzz-smoke: corpus $root/fuzz/$corpus ($(ls "$corpus" | wc -l) files, seeded from fuzz/seeds)"

if ! cargo fuzz build -s "$sanitizer" "$target"; then
  if [ "$sanitizer" = none ]; then
    exit 1
  fi
  echo "fuzz-smoke: building with -s $sanitizer failed; retrying without a sanitizer"
  sanitizer=none
  cargo fuzz build -s none "$target"
fi

echo "fuzz-smoke: running $target for ${secs}s (sanitizer: $sanitizer)"
# -malloc_limit_mb: inputs are at most a few KB, so any allocation near this size means a
# length was trusted before being checked against the bytes present.
cargo fuzz run -s "$sanitizer" "$target" "$corpus" -- \
  -max_total_time="$secs" -max_len=4096 -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1
echo "fuzz-smoke: $target ran ${secs}s without a crash ($(ls "$corpus" | wc -l) corpus files)"
