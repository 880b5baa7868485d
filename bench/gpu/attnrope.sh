#!/usr/bin/env bash
# Two fusions for steps of many rows (issue 15), measured against their switches in one call:
# - `rope_kv_rows`: a step's rope of Q, rope of K and KV append as one kernel
#   (`SMELT_CUDA_ROPE_KV_ROWS=0`: three launches a layer, as before);
# - the attention writing the output projection's f16 rows itself (combine, reduce, prompt
#   kernel; `SMELT_CUDA_ATTN_F16_ROWS=0`: q8_1 tiles nobody reads, then a conversion launch).
# The kernels against their twins (`gpu_ops`), whole-model parity of tiny models (head size
# 80 included: the generic attention), interleaved rounds of `smelt bench --batch N` with
# the four settings on the Llama-3-8B-shape Q4_K, one default `smelt bench`, and an eager
# profile of the 64-sequence step.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/attnrope.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 2), BATCHES (default "8 16 32 64").
# Log: $OUT/attnrope.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/attnrope.log"; table=/tmp/ar-table.md
B=/tmp/ar-bin; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
ops=rope,rope_kv,rope_kv_rows,attention,attention_prompt,attention_reduce_q8,gemv_rope_kv
timeout 240 $B/gpu_ops -o $ops > /tmp/ar-ops.out 2>&1; rc=$?
cat /tmp/ar-ops.out >> "$log"
echo "| gpu_ops -o $ops (rc $rc) | $(grep -cE ' FAIL$' /tmp/ar-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/ar-ops.out) PASS lines |" >> $table
grep -E ' FAIL$' /tmp/ar-ops.out | head -5 | sed 's/^/    /' >> $table
echo "gpu_ops done at $SECONDS s" | tee -a "$log"
for m in llama3-tiny:q4_k qwen3-tiny:q4_k qwen35-tiny:q4_k mistral-tiny:q4_k qwen2-tiny:q4_k qwen3-tiny:q8_0:80; do
  IFS=: read -r s q hd <<< "$m"; f=/tmp/ar-$s-$q-${hd:-0}.gguf
  $B/smelt synth --shape $s --quant $q ${hd:+--head-dim $hd} -o $f > /dev/null 2>&1
  for v in 1 0; do
    SMELT_CUDA_ROPE_KV_ROWS=$v SMELT_CUDA_ATTN_F16_ROWS=$v timeout 150 $B/cuda_parity check $f > /tmp/ar-p.out 2>&1
    cat /tmp/ar-p.out >> "$log"
    echo "| cuda_parity $s $q ${hd:+hd $hd}, fusions=$v | $(grep -E '^parity:' /tmp/ar-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/ar-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
  done
  rm -f $f
done
echo "parity done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
med() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
f=/tmp/ar-8b-q4_k.gguf
$B/smelt synth --shape llama3-8b --quant q4_k -o $f > /dev/null 2>&1
# Settings: rope_kv_rows attn_f16_rows.
sets="11 01 10 00"
for n in ${BATCHES:-8 16 32 64}; do
  for v in $sets; do : > /tmp/ar-$n-$v.txt; done
  for r in $(seq ${ROUNDS:-2}); do
    for v in $sets; do
      o=$(SMELT_CUDA_ROPE_KV_ROWS=${v:0:1} SMELT_CUDA_ATTN_F16_ROWS=${v:1:1} timeout 120 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
      echo "n=$n set=$v round $r: $o" >> "$log"
      x=$(echo "$o" | js batch_decode_tok_s); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
      echo "$x $d" >> /tmp/ar-$n-$v.txt
    done
  done
  a=$(med /tmp/ar-$n-00.txt)
  row="| 8B Q4_K --batch $n tok/s: both off $a"
  for v in 10 01 11; do
    b=$(med /tmp/ar-$n-$v.txt)
    row="$row; rope_kv_rows=${v:0:1} attn_f16=${v:1:1} $b ($(python3 -c "print(f'{$b/$a:.3f}x')" 2>/dev/null))"
  done
  echo "$row; digests $(cut -d' ' -f2 /tmp/ar-$n-*.txt | sort | uniq -c | tr '\n' ' ') |" >> $table
done
echo "bench done at $SECONDS s" | tee -a "$log"
o=$(timeout 150 $B/smelt bench --model $f --device cuda --json 2>>"$log"); echo "default bench: $o" >> "$log"
echo "| 8B Q4_K smelt bench (pp512 / tg128 tok/s) | $(echo "$o" | js prompt_tok_s) / $(echo "$o" | js decode_tok_s) |" >> $table
SMELT_CUDA_PROFILE=1 timeout 180 $B/smelt bench --model $f --device cuda --prompt 8 --gen 16 --reps 1 --batch 64 > /tmp/ar-prof.out 2>&1
cat /tmp/ar-prof.out >> "$log"
grep -E "^PROFILE|rope|kv_append|attention|gemm_f16_act|quantize_q8_1" /tmp/ar-prof.out | head -12 | sed 's/^/    /' > /tmp/ar-prof.md
rm -f $f
echo "done at $SECONDS s" | tee -a "$log"
cat $table /tmp/ar-prof.md 2>/dev/null | tee -a "$log"
