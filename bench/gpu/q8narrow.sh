#!/usr/bin/env bash
# qwen3next-tiny Q8_0's batched cuda_parity test fails with the narrow GEMM on (bench/RESULTS.md,
# 2026-11-27 16:50 UTC): which of its settings moves it. One short device call.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/q8narrow.sh    carry [".gpu-dn"]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=/tmp/q8n-bin; mkdir -p $B
for b in smelt cuda_parity; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
f=/tmp/q3n-q8.gguf
$B/smelt synth --shape qwen3next-tiny --quant q8_0 -o $f > /dev/null 2>&1
for e in SMELT_CUDA_GEMM_NARROW_SPLITS=1 SMELT_CUDA_GEMM_NARROW_MAX=16 SMELT_CUDA_GEMM_NARROW_MAX=32 SMELT_CUDA_GEMM_NARROW_ROWS=16 SMELT_CUDA_GEMM_NARROW_ROWS=32 SMELT_CUDA_SPLIT_FIXUP=1; do
  env $e timeout 120 $B/cuda_parity check $f > /tmp/p.out 2>&1
  echo "$e: $(grep -E '^parity:' /tmp/p.out) | $(grep 'batched max' /tmp/p.out | grep -o 'vs f32-act ref: max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1)"
done
