#!/usr/bin/env bash
# qwen3next-tiny Q8_0's batched parity test fails only with the narrow Q8_0 GEMM on 33-64
# token matmuls (bench/RESULTS.md 2026-11-27 18:46 UTC). A fault would fail on other random
# models of the shape too; a near-tie tipped by the f16 activations would not, and the GEMV
# path would fail on some. Five seeds, narrow GEMM on and off.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/q8seeds.sh    carry [".gpu-dn"]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=/tmp/q8s-bin; mkdir -p $B
for b in smelt cuda_parity; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
for seed in 0 1 2 3 4; do
  f=/tmp/q8s-$seed.gguf
  $B/smelt synth --shape qwen3next-tiny --quant q8_0 --seed $seed -o $f > /dev/null 2>&1
  for e in NONE=1 SMELT_CUDA_GEMM_NARROW_MAX=0; do
    env $e timeout 120 $B/cuda_parity check $f > /tmp/q8s.out 2>&1
    echo "== seed $seed $e"; grep -E "max\|cuda-cpu\||^parity" /tmp/q8s.out | sed 's/ *| vs f32-act ref:/\n      ref:/'
  done
done
