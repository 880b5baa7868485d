#!/usr/bin/env bash
# The f16 GEMM against the int8 GEMM on the GPU machine, in one device call: kernel parity
# and speed side by side (gpu_ops check/perf -o gemm_f16), whole-model CUDA-vs-CPU parity with the
# int8 path and with every many-token Q4_K matmul on the f16 path (cuda_parity), then smelt
# with and without the f16 path (SMELT_CUDA_GEMM_F16_MIN) interleaved round by round on a
# Llama-3-8B-shape Q4_K: pp512, pp4096 and aggregate decode of 16, 32 and 64 sequences.
# Only ratios within this call count.
#
# Here:  bash bench/gpu/gemm.sh build (into .gpu-lead)
# There: bash bench/gpu/gemm_f16.sh    carry [".gpu-lead"]
# Environment there: ROUNDS (default 2), CASES (default "pp512 pp4096 b16 b32 b64"),
# F16_MIN (the f16 side's SMELT_CUDA_GEMM_F16_MIN; default: the engine's measured rule,
# gemm::f16::preferred), SKIP_KERNELS=1,
# SKIP_PARITY=1; A_ENV / B_ENV (the two sides' settings, default the int8 and the f16
# GEMM; e.g. A_ENV=SMELT_CUDA_GEMM_NARROW_MAX=0 B_ENV= compares the narrow GEMM's batches
# with the int8 GEMM's). Log: $OUT/gemm_f16.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/gemm_f16.log"
B=.gpu-lead
for f in smelt cuda_parity; do
  if [ -f $B/$f.gz ]; then gunzip -c $B/$f.gz > /tmp/$f-new; chmod +x /tmp/$f-new; else cp $B/$f /tmp/$f-new; fi
done
[ -f $B/gpu_ops.gz ] && gunzip -c $B/gpu_ops.gz > /tmp/gpu_ops-new && chmod +x /tmp/gpu_ops-new || cp $B/gpu_ops /tmp/gpu_ops-new
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
status=0
f16min=${F16_MIN:-16}
f16env=${F16_MIN:+SMELT_CUDA_GEMM_F16_MIN=$F16_MIN}
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  echo "== gpu_ops -o gemm_f16, then perf -o gemm_f16" | tee -a "$log"
  /tmp/gpu_ops-new -o gemm_f16 2>&1 | tee -a "$log" | sed -n '/^== summary/,$p' || status=1
  /tmp/gpu_ops-new perf -o gemm_f16 2>&1 | tee -a "$log" | sed -n '/^== perf/,/^== seconds/p' || status=1
fi
if [ "${SKIP_PARITY:-0}" != 1 ]; then
  echo "== cuda_parity, int8 GEMM" | tee -a "$log"
  SMELT_CUDA_GEMM_NARROW_MAX=0 /tmp/cuda_parity-new check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | grep -E "spread ids|FAIL|PASS" | cut -c1-200 || status=1
  echo "== cuda_parity, f16 GEMM from $f16min tokens" | tee -a "$log"
  SMELT_CUDA_GEMM_NARROW_MAX=0 SMELT_CUDA_GEMM_F16_MIN=$f16min /tmp/cuda_parity-new check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | grep -E "spread ids|FAIL|PASS" | cut -c1-200 || status=1
  echo "== cuda_parity, narrow GEMM from 1 to 64 tokens" | tee -a "$log"
  SMELT_CUDA_GEMM_MIN=1 SMELT_CUDA_GEMM_NARROW_MAX=64 /tmp/cuda_parity-new check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | grep -E "spread ids|FAIL|PASS" | cut -c1-200 || status=1
  echo "== cuda_parity, batch-wide f16 GEMM from 1 to 64 tokens" | tee -a "$log"
  SMELT_CUDA_GEMM_MIN=1 SMELT_CUDA_GEMM_SMALL_MAX=64 /tmp/cuda_parity-new check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | grep -E "spread ids|FAIL|PASS" | cut -c1-200 || status=1
fi
m=/tmp/llama3-8b-q4_k.gguf
/tmp/smelt-new synth --shape llama3-8b --quant q4_k -o $m > /dev/null
bench() { # case [env...] -> number
  local c=$1; shift
  case $c in
    pp*) env "$@" /tmp/smelt-new bench --model $m --device cuda --prompt ${c#pp} --gen 1 --reps 2 --json 2>/dev/null | tr -d '\n' | grep -o '"prompt_tok_s":[0-9.]*' | cut -d: -f2 ;;
    b*) env "$@" /tmp/smelt-new bench --model $m --device cuda --prompt 128 --gen 128 --reps 1 --batch ${c#b} --json 2>/dev/null | tr -d '\n' | grep -o '"batch_decode_tok_s":[0-9.]*' | cut -d: -f2 ;;
  esac
}
table="$out/gemm_f16-table.md"
a_env=${A_ENV-SMELT_CUDA_GEMM_F16_MIN=1000000000}
b_env=${B_ENV-$f16env}
echo "| case | round | A ($a_env) tok/s | B ($b_env) tok/s | B/A |" > "$table"
echo "|---|---|---|---|---|" >> "$table"
for r in $(seq ${ROUNDS:-2}); do
  for c in ${CASES:-pp512 pp4096 b16 b32 b64}; do
    a=$(bench $c $a_env)
    b=$(bench $c $b_env)
    ratio=$(python3 -c "print(f'{float(\"${b:-nan}\")/float(\"${a:-nan}\"):.3f}')" 2>/dev/null || echo nan)
    echo "| $c | $r | ${a:-FAILED} | ${b:-FAILED} | $ratio |" | tee -a "$log" >> "$table"
  done
done
echo "== table" | tee -a "$log"
sed -n '/== summary: f16 GEMM/,/parity failures/p' "$log"
grep -E "PASS|FAIL" "$log" | cut -c1-160 | tail -8
tee -a "$log" < "$table"
exit $status
