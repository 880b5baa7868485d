#!/usr/bin/env bash
# llama.cpp and smelt side by side on the GPU machine, in one device call, on llama.cpp's
# own random Llama-3-8B-shape file: prompt (pp512, pp4096), single-stream decode (tg128),
# aggregate decode of 8/32/64 sequences (llama.cpp's C API with N sequences, `smelt bench
# --batch N`), and the batch-invariant mode (SMELT_CUDA_BATCH_INVARIANT=1): its speed, and
# each sequence's greedy tokens (digests) alone, among 8 and among 64, prompt in one chunk
# and in chunks of 16.
#
# Here:  ../shared/peer/prepare.sh .peer; mkdir -p .gpu-peer; gzip -9 -c SMELT > .gpu-peer/smelt.gz
#        (and, to check the GEMMs too, gzip -9 -c GPU_OPS > .gpu-peer/gpu_ops.gz)
# There: bash bench/gpu/peer.sh    carry [".gpu-peer", ".peer"]   (about 8 minutes)
# Environment there: QUANT (Q4_K, Q6_K or Q8_0; default Q4_K), SHAPE (default llama3-8b),
# SKIP_INVARIANT=1. Log: $OUT/peer.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/peer.log"
table="$out/peer-table.md"
q=${QUANT:-Q4_K}
shape=${SHAPE:-llama3-8b}
S=/tmp/smelt
gunzip -c .gpu-peer/smelt.gz > $S && chmod +x $S
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
echo "== llama.cpp build + pp512/tg128" | tee -a "$log"
bash .peer/gpu-llamacpp.sh .peer "$shape" "$q" 2>&1 | tee -a "$log"
m=/tmp/peer-$shape-$q.gguf
export PYTHONPATH=/tmp/site
echo "| work | llama.cpp | smelt | ratio |" > "$table"
echo "|---|---:|---:|---:|" >> "$table"
lc_pp512=$(grep "RESULT" "$log" | tail -1 | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')
lc_tg=$(grep "RESULT" "$log" | tail -1 | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
lc_pp4096=$(python3 .peer/llamacpp_bench.py $m 4096 16 2 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*pp4096: \([0-9.]*\) tok\/s.*/\1/p')
row() { # name llama smelt
  local r
  r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
  echo "| $1 | $2 | $3 | $r |" | tee -a "$table"
}
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
r=$($S bench --model $m --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
row "pp512 (tok/s)" "$lc_pp512" "$(echo "$r" | js prompt_tok_s)"
row "tg128 (tok/s)" "$lc_tg" "$(echo "$r" | js decode_tok_s)"
r=$($S bench --model $m --device cuda --prompt 4096 --gen 16 --reps 2 --json 2>>"$log"); echo "$r" >> "$log"
row "pp4096 (tok/s)" "$lc_pp4096" "$(echo "$r" | js prompt_tok_s)"
for n in 8 32 64; do
  lc=$(python3 .peer/llamacpp_batched.py $m $n 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
  r=$($S bench --model $m --device cuda --prompt 128 --gen 128 --reps 1 --batch $n --json 2>>"$log"); echo "$r" >> "$log"
  row "$n sequences, aggregate decode (tok/s)" "$lc" "$(echo "$r" | js batch_decode_tok_s)"
done
if [ "${SKIP_INVARIANT:-0}" != 1 ]; then
  echo "== batch-invariant mode" | tee -a "$log"
  export SMELT_CUDA_BATCH_INVARIANT=1
  r=$($S bench --model $m --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  row "invariant: pp512" "$lc_pp512" "$(echo "$r" | js prompt_tok_s)"
  row "invariant: tg128" "$lc_tg" "$(echo "$r" | js decode_tok_s)"
  for n in 1 8 64; do
    r=$($S bench --model $m --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log"); echo "$r" >> "$log"
    d=$(echo "$r" | grep -o '"seq_token_digests":\["[0-9a-f]*' | sed 's/.*\["//')
    echo "invariant: batch $n: first sequence's digest $d, aggregate $(echo "$r" | js batch_decode_tok_s) tok/s" | tee -a "$log" "$table"
  done
  r=$($S bench --model $m --device cuda --prompt 128 --gen 64 --reps 1 --batch 8 --ubatch 16 --json 2>>"$log"); echo "$r" >> "$log"
  d=$(echo "$r" | grep -o '"seq_token_digests":\["[0-9a-f]*' | sed 's/.*\["//')
  echo "invariant: batch 8, prompts in chunks of 16: first sequence's digest $d" | tee -a "$log" "$table"
  unset SMELT_CUDA_BATCH_INVARIANT
fi
if [ -s .gpu-peer/gpu_ops.gz ]; then
  echo "== gpu_ops -o gemm (GEMM parity for every weight type)" | tee -a "$log"
  gunzip -c .gpu-peer/gpu_ops.gz > /tmp/gpu_ops && chmod +x /tmp/gpu_ops
  /tmp/gpu_ops -o gemm 2>&1 | tee -a "$log" | sed -n '/^== summary/,$p' | tee -a "$table"
fi
echo "== table ($q $shape)" | tee -a "$log"
cat "$table" | tee -a "$log"
