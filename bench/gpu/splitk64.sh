#!/usr/bin/env bash
# The split-K reduce launches of 64-sequence decode steps (8.7% of the step's GPU time,
# bench/RESULTS.md 2026-11-27 19:31 UTC): the last-block fix-up instead of a reduce launch,
# and fewer splits, in interleaved rounds of `smelt bench --batch 64` on the Llama-3-8B-shape
# Q4_K (same greedy tokens required).
# Here: strip + gzip -9 the release smelt into .gpu-serve/smelt.gz   There: bash bench/gpu/splitk64.sh   carry [".gpu-serve"]
set -uo pipefail
cd "$(dirname "$0")/../.."
S=/tmp/sk-smelt; gunzip -c .gpu-serve/smelt.gz > $S && chmod +x $S
f=/tmp/sk-8b.gguf; $S synth --shape llama3-8b --quant q4_k -o $f > /dev/null 2>&1
SETTINGS=${SETTINGS:-"NONE=1 SMELT_CUDA_SPLIT_FIXUP=1 SMELT_CUDA_GEMM_NARROW_SPLITS=2 SMELT_CUDA_GEMM_NARROW_SPLITS=1"}
for s in $SETTINGS; do : > /tmp/sk-$s.txt; done
for r in 1 2; do
  for s in $SETTINGS; do
    o=$(env $s timeout 120 $S bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch ${BATCH:-64} --json 2>/dev/null)
    v=$(echo "$o" | grep -o '"batch_decode_tok_s":[0-9.]*' | cut -d: -f2); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
    echo "$v $d" >> /tmp/sk-$s.txt; echo "round $r $s: $v $d"
  done
done
echo "| setting | tok/s (2 rounds) | token digests |"; echo "|---|---|---|"
for s in $SETTINGS; do echo "| $s | $(cut -d' ' -f1 /tmp/sk-$s.txt | tr '\n' ' ') | $(cut -d' ' -f2 /tmp/sk-$s.txt | sort -u | tr '\n' ' ') |"; done
