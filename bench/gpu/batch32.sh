#!/usr/bin/env bash
# The rows issue 16's table still lacked and issue 15's Qwen3-32B single stream, in one
# device call on one GPU, llama.cpp built here beside smelt (both on the same files,
# `smelt synth` Q4_K): aggregate decode of 32 sequences (128-token prompts, 128 tokens
# each) on the Qwen3.6-27B hybrid and Qwen3-Next-80B-A3B (written in /dev/shm), and
# pp512 / tg128 on Qwen3-32B. smelt runs while llama.cpp builds.
#
# Here:  mkdir -p .gpu-peer; strip + gzip -9 the release smelt into .gpu-peer/smelt.gz;
#        ../shared/peer/prepare.sh .peer (slimmed, bench/RESULTS.md 2026-11-27)
# There: timeout 590 bash bench/gpu/batch32.sh    carry [".gpu-peer", ".peer"]
# Log: $OUT/batch32.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/batch32.log"
S=/tmp/smelt-b32
gunzip -c .gpu-peer/smelt.gz > $S && chmod +x $S
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
(bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/b32-ll.log 2>&1; echo "llama.cpp build rc=$? at $SECONDS s" >> /tmp/b32-ll.log) &
llpid=$!
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
M27=/tmp/b32-27b.gguf; M32=/tmp/b32-32b.gguf; M80=/dev/shm/b32-80b.gguf
$S synth --shape qwen3.6-27b --quant q4_k -o $M27 2>&1 | tail -1 | tee -a "$log"
s27=$($S bench --model $M27 --device cuda --prompt 128 --gen 128 --reps 1 --batch 32 --json 2>>"$log" | tee -a "$log" | js batch_decode_tok_s)
$S synth --shape qwen3-32b --quant q4_k -o $M32 2>&1 | tail -1 | tee -a "$log"
r=$($S bench --model $M32 --device cuda --prompt 512 --gen 128 --reps 2 --json 2>>"$log"); echo "$r" >> "$log"
s32pp=$(echo "$r" | js prompt_tok_s); s32tg=$(echo "$r" | js decode_tok_s)
$S synth --shape qwen3-next-80b-a3b --quant q4_k -o $M80 2>&1 | tail -1 | tee -a "$log"
s80=$($S bench --model $M80 --device cuda --prompt 128 --gen 128 --reps 1 --batch 32 --json 2>>"$log" | tee -a "$log" | js batch_decode_tok_s)
echo "smelt done at $SECONDS s" | tee -a "$log"
wait $llpid
cat /tmp/b32-ll.log >> "$log"
export PYTHONPATH=/tmp/site
lb() { python3 .peer/llamacpp_batched.py "$1" 32 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p'; }
l80=$(lb $M80); rm -f $M80
l27=$(lb $M27)
l=$(python3 .peer/llamacpp_bench.py $M32 512 128 3 2>/dev/null | tee -a "$log" | grep RESULT)
l32pp=$(echo "$l" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p'); l32tg=$(echo "$l" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
echo "done at $SECONDS s" | tee -a "$log"
row() { python3 -c "a,b='$2','$3'; print(f'| $1 | {a} | {b} | ' + (f'{float(b)/float(a):.2f}x |' if a and b else '- |'))"; }
{
  echo "| work (Q4_K, smelt synth) | llama.cpp | smelt | ratio |"
  echo "|---|---:|---:|---:|"
  row "qwen3.6-27b 32 sequences, aggregate decode" "$l27" "$s27"
  row "qwen3-next-80b-a3b 32 sequences, aggregate decode" "$l80" "$s80"
  row "qwen3-32b pp512" "$l32pp" "$s32pp"
  row "qwen3-32b tg128" "$l32tg" "$s32tg"
} | tee -a "$log"
