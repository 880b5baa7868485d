#!/usr/bin/env bash
# A GEMM change on the GPU machine, in one device call: the GEMM variants timed against
# each other (gpu_ops -o gemm_variants, which also checks they give identical outputs),
# the kernels' parity (gpu_ops -o gemv,gemm), whole-model parity (cuda_parity), then smelt before
# and after the change interleaved round by round on a Llama-3-8B-shape Q4_K: pp512,
# pp4096, and aggregate decode of 32 and 64 sequences. Only ratios within this call count.
#
# Here:  bash bench/gpu/gemm.sh build (into .gpu-lead); the binary before the change,
#        gzipped, as .gpu-old/smelt.gz
# There: bash bench/gpu/gemm_ab.sh    carry [".gpu-lead", ".gpu-old"]
# Environment there: ROUNDS (default 2), SKIP_KERNELS=1, SKIP_PARITY=1, CASES (default
# "pp512 pp4096 b32 b64"), QUANT (the model's weight type, default q4_k), GEMM=1 (also
# gpu_ops perf -o gemm's speed table), VARIANTS=0 (skip gemm_variants). smelt, gpu_ops and
# cuda_parity may be gzipped. Log: $OUT/gemm_ab.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/gemm_ab.log"
B=.gpu-lead
for f in smelt cuda_parity gpu_ops; do
  [ -f $B/$f.gz ] && { gunzip -c $B/$f.gz > /tmp/$f-new; chmod +x /tmp/$f-new; } || cp $B/$f /tmp/$f-new
done
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
[ -f .gpu-old/smelt.gz ] && { gunzip -c .gpu-old/smelt.gz > /tmp/smelt-old; chmod +x /tmp/smelt-old; }
status=0
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  if [ "${VARIANTS:-1}" = 1 ]; then
    echo "== gpu_ops -o gemm_variants" | tee -a "$log"
    /tmp/gpu_ops-new -o gemm_variants 2>&1 | tee -a "$log" | sed -n '/^== summary/,$p' || status=1
  fi
  if [ "${GEMM:-0}" = 1 ]; then
    echo "== gpu_ops perf -o gemm" | tee -a "$log"
    /tmp/gpu_ops-new perf -o gemm 2>&1 | tee -a "$log" | sed -n '/^== perf/,/^== seconds/p' || status=1
  fi
  echo "== gpu_ops -o gemv,gemm (the GEMVs and the GEMMs)" | tee -a "$log"
  /tmp/gpu_ops-new -o gemv,gemm 2>&1 | tee -a "$log" | tail -3 || status=1
fi
if [ "${SKIP_PARITY:-0}" != 1 ]; then
  echo "== cuda_parity" | tee -a "$log"
  /tmp/cuda_parity-new check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | grep -E "spread ids|FAIL|PASS" | cut -c1-200 || status=1
fi
m=/tmp/llama3-8b-${QUANT:-q4_k}.gguf
/tmp/smelt-new synth --shape llama3-8b --quant ${QUANT:-q4_k} -o $m > /dev/null
bench() { # bin case -> number
  case $2 in
    pp*) $1 bench --model $m --device cuda --prompt ${2#pp} --gen 1 --reps 2 --json 2>/dev/null | tr -d '\n' | grep -o '"prompt_tok_s":[0-9.]*' | cut -d: -f2 ;;
    b*) $1 bench --model $m --device cuda --prompt 128 --gen 128 --reps 1 --batch ${2#b} --json 2>/dev/null | tr -d '\n' | grep -o '"batch_decode_tok_s":[0-9.]*' | cut -d: -f2 ;;
  esac
}
table="$out/gemm_ab-table.md"
echo "| case | round | before tok/s | after tok/s | after/before |" > "$table"
echo "|---|---|---|---|---|" >> "$table"
for r in $(seq ${ROUNDS:-2}); do
  for c in ${CASES:-pp512 pp4096 b32 b64}; do
    a=$( [ -x /tmp/smelt-old ] && bench /tmp/smelt-old $c || echo nan)
    b=$(bench /tmp/smelt-new $c)
    ratio=$(python3 -c "print(f'{float(\"${b:-nan}\")/float(\"${a:-nan}\"):.3f}')" 2>/dev/null || echo nan)
    echo "| $c | $r | ${a:-FAILED} | ${b:-FAILED} | $ratio |" | tee -a "$log" >> "$table"
  done
done
echo "== table" | tee -a "$log"
sed -n '/== GEMM variants/,/variant outputs/p' "$log" | grep "^|\|differ"
grep "parity failures\|GEMM parity\|worst" "$log" | tail -5
tee -a "$log" < "$table"
exit $status
