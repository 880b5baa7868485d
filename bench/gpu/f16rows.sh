#!/usr/bin/env bash
# The norms and the GLU writing the narrow GEMM's f16 rows (`fused::Sink::F16Rows`) instead
# of q8_1 tiles nobody reads, for steps of 8-64 tokens: the f16 conversion launch before
# each of those GEMMs goes (the 64-sequence step's profile: `gemm_f16_act` 129 launches,
# 0.69 ms of 10.96). One device call: the fused kernels and the narrow GEMMs against their
# twins (`gpu_ops -o norm_q8,glu_q8,gemm_f16`), whole-model parity of tiny models with the
# fusion on and off, then interleaved rounds of `smelt bench --batch N` with
# SMELT_CUDA_FUSE_F16_ROWS 0 and 1 on the Llama-3-8B-shape Q4_K and Q8_0, and an eager
# profile of the 64-sequence step with it on.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/f16rows.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 3), BATCHES (default "8 16 32 64"), Q8_BATCHES (default "32 64").
# Log: $OUT/f16rows.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/f16rows.log"; table=/tmp/fr-table.md
B=/tmp/fr-bin; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 240 $B/gpu_ops -o norm_q8,glu_q8,gemm_f16 > /tmp/fr-ops.out 2>&1; rc=$?
cat /tmp/fr-ops.out >> "$log"
echo "| gpu_ops -o norm_q8,glu_q8,gemm_f16 (rc $rc) | $(grep -cE ' FAIL$' /tmp/fr-ops.out) FAIL lines; $(grep -cE '_f16 .*PASS$|F16Rows.*PASS$' /tmp/fr-ops.out) f16-sink PASS lines |" >> $table
for m in qwen3-tiny:q4_k llama3-tiny:q8_0 qwen3moe-tiny:q4_k mistral-tiny:q4_k qwen35-tiny:q4_k; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/fr-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  for v in 1 0; do
    SMELT_CUDA_FUSE_F16_ROWS=$v timeout 150 $B/cuda_parity check $f > /tmp/fr-p.out 2>&1
    cat /tmp/fr-p.out >> "$log"
    echo "| cuda_parity $s $q, F16_ROWS=$v | $(grep -E '^parity:' /tmp/fr-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/fr-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
  done
done
echo "parity done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
med() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
for q in q4_k q8_0; do
  f=/tmp/fr-8b-$q.gguf
  $B/smelt synth --shape llama3-8b --quant $q -o $f > /dev/null 2>&1
  if [ $q = q4_k ]; then batches=${BATCHES:-8 16 32 64}; else batches=${Q8_BATCHES:-32 64}; fi
  for n in $batches; do
    for v in 0 1; do : > /tmp/fr-$q-$n-$v.txt; done
    for r in $(seq ${ROUNDS:-3}); do
      for v in 0 1; do
        o=$(SMELT_CUDA_FUSE_F16_ROWS=$v timeout 120 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
        echo "$q n=$n f16rows=$v round $r: $o" >> "$log"
        x=$(echo "$o" | js batch_decode_tok_s); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
        echo "$x $d" >> /tmp/fr-$q-$n-$v.txt
      done
    done
    a=$(med /tmp/fr-$q-$n-0.txt); b=$(med /tmp/fr-$q-$n-1.txt)
    echo "| 8B $q --batch $n: F16_ROWS 0 / 1 tok/s | $a / $b ($(python3 -c "print(f'{$b/$a:.3f}x')" 2>/dev/null)); digests $(cut -d' ' -f2 /tmp/fr-$q-$n-*.txt | sort | uniq -c | tr '\n' ' ') |" >> $table
  done
  if [ $q = q4_k ]; then
    SMELT_CUDA_PROFILE=1 timeout 180 $B/smelt bench --model $f --device cuda --prompt 8 --gen 16 --reps 1 --batch 64 > /tmp/fr-prof.out 2>&1
    cat /tmp/fr-prof.out >> "$log"
    grep -E "^PROFILE|gemm_f16_act|rms_norm|glu_" /tmp/fr-prof.out | head -8 | sed 's/^/    /' >> /tmp/fr-prof.md
  fi
  rm -f $f
done
echo "done at $SECONDS s" | tee -a "$log"
cat $table /tmp/fr-prof.md 2>/dev/null | tee -a "$log"
