#!/usr/bin/env bash
# A group's members (Q|K|V, gate|up; a delta-net layer's projection pairs) of 8-64 tokens as
# one narrow GEMM launch whose split reduce writes each member apart (`gemm::members`,
# `SMELT_CUDA_GROUP_GEMM=0` to compare): K and V of the Llama-3-8B shape were 9 us launches
# of 8 splits with a reduce each. One device call: the narrow GEMMs and the member reduce
# against their twins (`gpu_ops -o gemm_f16`), whole-model parity of tiny models with the
# grouping on and off, interleaved rounds of `smelt bench --batch N` with it off and on
# (Llama-3-8B shape, Q4_K, Q4_K_M and Q8_0), and an eager profile of the 64-sequence step.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/groupgemm.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 3), BATCHES (default "8 16 32 64"), Q8_BATCHES (default "32 64").
# Log: $OUT/groupgemm.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/groupgemm.log"; table=/tmp/gg-table.md
B=/tmp/gg-bin; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 240 $B/gpu_ops -o gemm_f16 > /tmp/gg-ops.out 2>&1; rc=$?
cat /tmp/gg-ops.out >> "$log"
echo "| gpu_ops -o gemm_f16 (rc $rc) | $(grep -cE ' FAIL$' /tmp/gg-ops.out) FAIL lines; $(grep -cE 'gemm_reduce_members.*PASS$' /tmp/gg-ops.out) member-reduce PASS lines |" >> $table
for m in qwen3-tiny:q4_k llama3-tiny:q8_0 llama3-tiny:q4_k_m qwen3moe-tiny:q4_k qwen35-tiny:q4_k qwen3next-tiny:q8_0; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/gg-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  for v in 1 0; do
    SMELT_CUDA_GROUP_GEMM=$v timeout 150 $B/cuda_parity check $f > /tmp/gg-p.out 2>&1
    cat /tmp/gg-p.out >> "$log"
    echo "| cuda_parity $s $q, GROUP_GEMM=$v | $(grep -E '^parity:' /tmp/gg-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/gg-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
  done
done
echo "parity done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
med() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
for q in q4_k q4_k_m q8_0; do
  f=/tmp/gg-8b-$q.gguf
  $B/smelt synth --shape llama3-8b --quant $q -o $f > /dev/null 2>&1
  if [ $q = q4_k ]; then batches=${BATCHES:-8 16 32 64}; else batches=${Q8_BATCHES:-32 64}; fi
  for n in $batches; do
    for v in 0 1; do : > /tmp/gg-$q-$n-$v.txt; done
    for r in $(seq ${ROUNDS:-3}); do
      for v in 0 1; do
        o=$(SMELT_CUDA_GROUP_GEMM=$v timeout 120 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
        echo "$q n=$n groupgemm=$v round $r: $o" >> "$log"
        x=$(echo "$o" | js batch_decode_tok_s); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
        echo "$x $d" >> /tmp/gg-$q-$n-$v.txt
      done
    done
    a=$(med /tmp/gg-$q-$n-0.txt); b=$(med /tmp/gg-$q-$n-1.txt)
    echo "| 8B $q --batch $n: GROUP_GEMM 0 / 1 tok/s | $a / $b ($(python3 -c "print(f'{$b/$a:.3f}x')" 2>/dev/null)); digests $(cut -d' ' -f2 /tmp/gg-$q-$n-*.txt | sort | uniq -c | tr '\n' ' ') |" >> $table
  done
  if [ $q = q4_k ]; then
    SMELT_CUDA_PROFILE=1 timeout 180 $B/smelt bench --model $f --device cuda --prompt 8 --gen 16 --reps 1 --batch 64 > /tmp/gg-prof.out 2>&1
    cat /tmp/gg-prof.out >> "$log"
    grep -E "^PROFILE|^\| (gemm|attention|add_rms|rope)" /tmp/gg-prof.out | head -12 >> /tmp/gg-prof.md
  fi
  rm -f $f
done
echo "done at $SECONDS s" | tee -a "$log"
cat $table /tmp/gg-prof.md 2>/dev/null | tee -a "$log"
