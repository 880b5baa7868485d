#!/usr/bin/env bash
# The end-of-stop check on one GPU: every op of gpu_ops against its twin, then cuda_parity on
# the tiny synthetic model of every architecture. Here: bash bench/gpu/hybrid.sh pack;
# there: bash bench/gpu/final-check.sh   carry [".gpu-dn"]. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
B=/tmp/fb; mkdir -p $B; for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b; chmod +x $B/$b; done
SECONDS=0
timeout 300 $B/gpu_ops > $OUT/gpu_ops.log 2>&1; echo "gpu_ops rc=$? fails=$(grep -cE ' FAIL$' $OUT/gpu_ops.log) cases=$(grep -cE ' PASS$| FAIL$' $OUT/gpu_ops.log) at $SECONDS s"
for m in llama3-tiny:q8_0 qwen2-tiny:q4_k mistral-tiny:q4_k qwen3-tiny:q4_k qwen3moe-tiny:q4_k mixtral-tiny:q8_0 qwen35-tiny:q4_k qwen35moe-tiny:q8_0 qwen3next-tiny:q4_k; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/fb-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  timeout 150 $B/cuda_parity check $f > /tmp/fb-p.out 2>&1; cat /tmp/fb-p.out >> $OUT/parity.log
  echo "cuda_parity $s $q: $(grep -E '^parity:' /tmp/fb-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/fb-p.out | grep -o '([0-9.]*x)' | head -1) at $SECONDS s"
done
