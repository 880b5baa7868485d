#!/usr/bin/env bash
# The f16 GEMM for Q6_K and Q8_0 prompts (Q4_K's already took it; Q8_0 prompts were 0.97x
# llama.cpp on the int8 GEMM and Q4_K_M's 1.43x). One short device call: the f16 GEMMs of
# every type against their twins on two ragged shapes (`gpu_ops -o gemm_f16`, the narrow
# GEMMs of the same weights too), then `smelt bench` pp512 on Llama-3-8B-shape Q8_0 and
# Q4_K_M files with SMELT_CUDA_GEMM_F16_UNMEASURED 0 (those types' prompts on the int8 GEMM,
# the default until this run) and 1, interleaved. If the kernels pass and win, add Q6_K
# and Q8_0 to `gemm::f16::MEASURED`.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/prompt_f16.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 1). Log: $OUT/prompt_f16.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/prompt_f16.log"; table=/tmp/pf-table.md
B=/tmp/pf-bin; mkdir -p $B
for b in smelt gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 120 $B/gpu_ops -o gemm_f16 -s "517x1280 x 129,37x4096 x 200" > /tmp/pf-ops.out 2>&1; rc=$?
cat /tmp/pf-ops.out >> "$log"
echo "| gpu_ops -o gemm_f16 (2 shapes, rc $rc) | $(grep -cE ' FAIL$' /tmp/pf-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/pf-ops.out) PASS lines; f16 GEMM PASS lines: q4_k $(grep -cE 'gemm_f16_q4_k.* PASS$' /tmp/pf-ops.out), q6_k $(grep -cE 'gemm_f16_q6_k.* PASS$' /tmp/pf-ops.out), q8_0 $(grep -cE 'gemm_f16_q8_0.* PASS$' /tmp/pf-ops.out) |" >> $table
grep -E ' FAIL$' /tmp/pf-ops.out | head -5 | sed 's/^/    /' >> $table
echo "gpu_ops done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
for q in q8_0 q4_k_m; do
  f=/tmp/pf-8b-$q.gguf
  $B/smelt synth --shape llama3-8b --quant $q -o $f > /dev/null 2>&1
  for r in $(seq ${ROUNDS:-1}); do
    for v in 0 1; do
      o=$(SMELT_CUDA_GEMM_F16_UNMEASURED=$v timeout 60 $B/smelt bench --model $f --device cuda --prompt 512 --gen 16 --reps 2 --json 2>>"$log")
      echo "$q unmeasured=$v round $r: $o" >> "$log"
      echo "| 8B $q pp512 / tg, F16_UNMEASURED=$v | $(echo "$o" | js prompt_tok_s) / $(echo "$o" | js decode_tok_s) |" >> $table
    done
  done
  rm -f $f
  echo "$q done at $SECONDS s" | tee -a "$log"
done
cat $table | tee -a "$log"
