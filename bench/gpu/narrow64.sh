#!/usr/bin/env bash
# The narrow GEMM's 64-token blocks (`gemm::narrow::WIDTHS`): batched decode of 33-64
# sequences ran as two 32-token blocks, each unpacking every weight again (the 64-sequence
# step's profile: the narrow GEMM 59% of its time, bench/RESULTS.md 2026-11-27 19:10 UTC).
# One device call: the narrow kernels against their twins (`gpu_ops -o gemm_f16`: every
# width and layout on ragged shapes), whole-model parity with 64-token blocks, then
# interleaved rounds of `smelt bench --batch N` with SMELT_CUDA_GEMM_NARROW_WIDTH 32 and 64
# on Llama-3-8B-shape Q4_K and Q8_0 (one `smelt synth` file each).
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/narrow64.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 2), BATCHES (default "40 64"). Log: $OUT/narrow64.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/narrow64.log"; table=/tmp/n64-table.md
B=/tmp/n64-bin; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 200 $B/gpu_ops -o gemm_f16 > /tmp/n64-ops.out 2>&1; rc=$?
cat /tmp/n64-ops.out >> "$log"
echo "| gpu_ops -o gemm_f16 (rc $rc) | $(grep -cE ' FAIL$' /tmp/n64-ops.out) FAIL lines; $(grep -c 'narrow64' /tmp/n64-ops.out) narrow64 lines |" >> $table
for m in qwen3-tiny:q4_k qwen3next-tiny:q8_0 llama3-tiny:q8_0; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/n64-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  SMELT_CUDA_GEMM_NARROW_WIDTH=64 timeout 120 $B/cuda_parity check $f > /tmp/n64-p.out 2>&1
  cat /tmp/n64-p.out >> "$log"
  echo "| cuda_parity $s $q, WIDTH=64 | $(grep -E '^parity:' /tmp/n64-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/n64-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
done
echo "parity done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
for q in q4_k q8_0; do
  f=/tmp/n64-8b-$q.gguf
  $B/smelt synth --shape llama3-8b --quant $q -o $f > /dev/null 2>&1
  for n in ${BATCHES:-40 64}; do
    for w in 32 64; do : > /tmp/n64-$q-$n-$w.txt; done
    for r in $(seq ${ROUNDS:-2}); do
      for w in 32 64; do
        o=$(SMELT_CUDA_GEMM_NARROW_WIDTH=$w timeout 120 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
        echo "$q n=$n w=$w round $r: $o" >> "$log"
        v=$(echo "$o" | js batch_decode_tok_s); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
        echo "$v $d" >> /tmp/n64-$q-$n-$w.txt
      done
    done
    med() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
    a=$(med /tmp/n64-$q-$n-32.txt); b=$(med /tmp/n64-$q-$n-64.txt)
    da=$(cut -d' ' -f2 /tmp/n64-$q-$n-32.txt | sort -u | tr '\n' ' '); db=$(cut -d' ' -f2 /tmp/n64-$q-$n-64.txt | sort -u | tr '\n' ' ')
    echo "| 8B $q --batch $n: width 32 / 64 tok/s (digests) | $a ($da) / $b ($db): $(python3 -c "print(f'{$b/$a:.3f}x')" 2>/dev/null) |" >> $table
  done
  rm -f $f
done
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
