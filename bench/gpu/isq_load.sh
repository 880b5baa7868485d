#!/usr/bin/env bash
# ISQ at load on the GPU (issue 6): a bf16 Llama-3-8B-shaped GGUF quantized to q4_k_m by
# `smelt run --isq q4_k_m --device cuda` as it loads must generate exactly what the file
# `smelt quantize --type q4_k_m` (CPU) wrote generates on the same GPU: the GPU kernels give the
# CPU's bytes, so the two models are the same model.
#
#   bench/gpu/isq_load.sh build   # here: smelt + a small GGUF carrying SmolLM2's tokenizer
#   bench/gpu/isq_load.sh run     # on the GPU machine, carry .gpu-lead
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.gpu-lead
case "${1:-}" in
build)
    cargo build --release -p smelt
    mkdir -p "$dir"
    strip -o "$dir/smelt" target/release/smelt
    scripts/fetch-models.sh smollm2-135m >/dev/null
    "$dir/smelt" synth --shape llama3-tiny --quant q4_0 --layers 1 \
        --tokenizer-from .models/SmolLM2-135M-Instruct.Q4_1.gguf -o "$dir/tok.gguf"
    du -sh "$dir"
    ;;
run)
    smelt="$dir/smelt"
    work=${TMPDIR:-/tmp}/isq-load
    mkdir -p "$work"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    timed() { local what=$1 t0; shift; t0=$EPOCHREALTIME; "$@" | tail -1
        python3 -c "print('$what: %.1f s' % ($EPOCHREALTIME - $t0))"; }
    timed "synth bf16" "$smelt" synth --shape llama3-8b --quant bf16 \
        --tokenizer-from "$dir/tok.gguf" -o "$work/l8-bf16.gguf"
    timed "smelt quantize q4_k_m on the CPU (all cores)" "$smelt" quantize \
        "$work/l8-bf16.gguf" "$work/l8-q4km.gguf" --type q4_k_m
    ids=$(seq -s, 100 1 164)
    "$smelt" run --model "$work/l8-q4km.gguf" --device cuda --prompt-ids "$ids" --max-tokens 32 \
        --json 2>"$work/file.err" | tail -1 >"$work/file.json"
    "$smelt" run --model "$work/l8-bf16.gguf" --isq q4_k_m --device cuda --prompt-ids "$ids" \
        --max-tokens 32 --json 2>"$work/isq.err" | tail -1 >"$work/isq.json"
    cat "$work/isq.err"
    python3 - "$work/file.json" "$work/isq.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["tokens"]
b = json.load(open(sys.argv[2]))["tokens"]
same = sum(1 for _ in __import__("itertools").takewhile(lambda p: p[0] == p[1], zip(a, b)))
print(f"quantized file on cuda : {a}")
print(f"--isq on cuda          : {b}")
print(f"equal tokens: {same}/{len(a)}  ->  {'PASS' if a == b and len(a) == 32 else 'FAIL'}")
sys.exit(0 if a == b and len(a) == 32 else 1)
PY
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
