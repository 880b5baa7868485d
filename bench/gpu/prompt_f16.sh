#!/usr/bin/env bash
# Two paths built on 2026-11-28 without a GPU, off until this run: the f16 GEMM for Q6_K and
# Q8_0 prompts (Q4_K's already took it; Q8_0 prompts were 0.97x llama.cpp on the int8 GEMM
# and Q4_K_M's 1.43x), and the GLU inside gate|up's split reduce at 8-32 tokens
# (`SMELT_CUDA_GLU_REDUCE=1`). One short device call: the f16 GEMMs of every type and the
# member reduces (the GLU one against the unfused kernels, bit for bit) on a few ragged
# shapes (`gpu_ops -o gemm_f16`), then `smelt bench` pp512 on Llama-3-8B-shape Q8_0 and
# Q4_K_M files with SMELT_CUDA_GEMM_F16_UNMEASURED 0 (those types' prompts on the int8 GEMM,
# the default until this run) and 1, interleaved. If the kernels pass and win, add Q6_K
# and Q8_0 to `gemm::f16::MEASURED`; then `smelt bench --batch 8/16/32` on the Q4_K file
# with SMELT_CUDA_GLU_REDUCE 0 and 1 (the same greedy tokens expected: same bits); if it
# wins, turn `fuse.glu_reduce` on.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/prompt_f16.sh    carry [".gpu-dn"]
# Ran 2026-11-28 03:24 (bench/RESULTS.md); both paths are the default since, and
# SMELT_CUDA_GEMM_F16_UNMEASURED is gone (every f16 type measured): kept as the run's record.
# Environment: ROUNDS (default 1). Log: $OUT/prompt_f16.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/prompt_f16.log"; table=/tmp/pf-table.md
B=/tmp/pf-bin; mkdir -p $B
for b in smelt gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 150 $B/gpu_ops -o gemm_f16 -s "517x1280 x 129,37x4096 x 200,1024x768 x 24" > /tmp/pf-ops.out 2>&1; rc=$?
cat /tmp/pf-ops.out >> "$log"
echo "| gpu_ops -o gemm_f16 (3 shapes, rc $rc) | $(grep -cE ' FAIL$' /tmp/pf-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/pf-ops.out) PASS lines; f16 GEMM PASS lines: q4_k $(grep -cE 'gemm_f16_q4_k.* PASS$' /tmp/pf-ops.out), q6_k $(grep -cE 'gemm_f16_q6_k.* PASS$' /tmp/pf-ops.out), q8_0 $(grep -cE 'gemm_f16_q8_0.* PASS$' /tmp/pf-ops.out) |" >> $table
echo "| GLU reduce lines (PASS / FAIL) | $(grep -E 'reduce_members_glu.* PASS$' /tmp/pf-ops.out | wc -l) / $(grep -E 'reduce_members_glu.* FAIL$' /tmp/pf-ops.out | wc -l) |" >> $table
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
f=/tmp/pf-8b-q4_k.gguf
$B/smelt synth --shape llama3-8b --quant q4_k -o $f > /dev/null 2>&1
for n in 8 16 32; do
  for v in 0 1; do
    o=$(SMELT_CUDA_GLU_REDUCE=$v timeout 60 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
    echo "q4_k n=$n glu_reduce=$v: $o" >> "$log"
    d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
    echo "| 8B q4_k --batch $n, GLU_REDUCE=$v | $(echo "$o" | js batch_decode_tok_s) tok/s, digests $d |" >> $table
  done
done
rm -f $f
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
