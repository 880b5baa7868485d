#!/usr/bin/env bash
# Why `smelt bench --batch 32` of Qwen3-Next-80B-A3B Q4_K ran out of memory on an 80 GB H100
# (bench/RESULTS.md, 2026-11-27 17:00 UTC) where llama.cpp ran it: the same run at 8, 16 and
# 32 sequences and with 128-token prompt chunks, free GPU memory sampled beside each.
# There: timeout 400 bash bench/gpu/oom80b.sh    carry [".gpu-peer"]
set -uo pipefail
cd "$(dirname "$0")/../.."
S=/tmp/smelt-oom
gunzip -c .gpu-peer/smelt.gz > $S && chmod +x $S
M=/dev/shm/oom-80b.gguf
[ -s $M ] || $S synth --shape qwen3-next-80b-a3b --quant q4_k -o $M 2>&1 | tail -1
for a in "--batch 8" "--batch 16" "--batch 32" "--batch 32 --ubatch 128"; do
  (while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) > /tmp/mem.txt 2>/dev/null &
  mp=$!
  RUST_BACKTRACE=1 timeout 150 $S bench --model $M --device cuda --prompt 128 --gen 32 --reps 1 $a --json > /tmp/o.out 2> /tmp/o.err
  rc=$?
  kill $mp 2>/dev/null
  echo "== $a: rc $rc, peak used $(sort -n /tmp/mem.txt | tail -1) MiB; $(grep -o '"batch_decode_tok_s":[0-9.]*' /tmp/o.out)"
  grep -v "^\s*$" /tmp/o.err | tail -12
done
