#!/usr/bin/env bash
# Where a Qwen3-32B-shape single-stream decode step goes (issue 15's 1.8x row, 1.46x at
# stop 33), beside the Llama-3-8B shape's step, in one call on one GPU: `smelt synth` of
# both (Q4_K), tg128 of each, then SMELT_CUDA_TIMELINE=1 (graph replays, per-kernel run
# time) of each. No llama.cpp here: its 32B tg128 (82.7) and 8B tg128 (283) are on record.
#
# Here:  mkdir -p .gpu-tl; strip + gzip -9 the release smelt into .gpu-tl/smelt.gz
# There: timeout 400 bash bench/gpu/timeline32.sh    carry [".gpu-tl"]
# Log: $OUT/timeline32.log (or bench/out); the tables last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/timeline32.log"
S=/tmp/smelt-tl
gunzip -c .gpu-tl/smelt.gz > $S && chmod +x $S
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
rows=()
for shape in qwen3-32b llama3-8b; do
  m=/tmp/tl-$shape.gguf
  $S synth --shape $shape --quant q4_k -o $m 2>&1 | tail -1 | tee -a "$log"
  r=$($S bench --model $m --device cuda --prompt 512 --gen 128 --reps 2 --json 2>>"$log"); echo "$r" >> "$log"
  rows+=("| $shape Q4_K | $(echo "$r" | js prompt_tok_s) | $(echo "$r" | js decode_tok_s) |")
  SMELT_CUDA_TIMELINE=1 $S bench --model $m --device cuda --prompt 512 --gen 64 --reps 1 > /tmp/tl.out 2>&1
  cp /tmp/tl.out "$out/timeline-$shape.txt"
  cat /tmp/tl.out >> "$log"
  rm -f $m
  echo "$shape done at $SECONDS s" | tee -a "$log"
done
for shape in qwen3-32b llama3-8b; do
  echo "== timeline $shape (top)"; grep -A40 -i "timeline" "$out/timeline-$shape.txt" | head -46
done
echo
echo "| model | pp512 | tg128 |"
echo "|---|---:|---:|"
printf '%s\n' "${rows[@]}" | tee -a "$log"
