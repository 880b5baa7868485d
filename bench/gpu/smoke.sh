#!/usr/bin/env bash
# After a change to how the backend drives its kernels (launches, arguments, dispatch),
# everything that exercises a launch path, in one device call: kernel parity (gpu_ops:
# every op of the catalog against its CPU twin),
# whole-model CUDA-vs-CPU parity of the cut real models (cuda_parity), the GPU quantizer
# byte-identical to the CPU's (smelt quantize --device cuda vs cpu), the GEMV bench path
# (smelt bench --kernels), and prompt/decode/batched speed of a Llama-3-8B-shape Q4_K so a
# slowdown shows.
#
# Here:  bash bench/gpu/gemm.sh build, then gzip -9 .gpu-lead/smelt, .gpu-lead/cuda_parity and .gpu-lead/gpu_ops
#        (the carry limit), with the cut models in .gpu-lead
# There: bash bench/gpu/smoke.sh    carry [".gpu-lead"]
# Log: $OUT/smoke.log (or bench/out), a PASS/FAIL table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/smoke.log"
B=.gpu-lead
for f in smelt cuda_parity gpu_ops; do
  [ -f $B/$f.gz ] && { gunzip -c $B/$f.gz > /tmp/$f; chmod +x /tmp/$f; } || cp $B/$f /tmp/$f
done
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
table=()
check() { # name command...
  local name=$1; shift
  echo "== $name" | tee -a "$log"
  if "$@" >> "$log" 2>&1; then table+=("| $name | PASS |"); else table+=("| $name | FAIL |"); fi
  tail -3 "$log"
}
check "gpu_ops (every op vs its CPU twin)" /tmp/gpu_ops
check "cuda_parity" /tmp/cuda_parity check $(ls $B/*.gguf)
/tmp/smelt synth --shape llama3-tiny --quant f16 -o /tmp/f16.gguf > /dev/null 2>&1
isq() {
  /tmp/smelt quantize /tmp/f16.gguf /tmp/q-gpu.gguf --type q4_k_m --device cuda &&
  /tmp/smelt quantize /tmp/f16.gguf /tmp/q-cpu.gguf --type q4_k_m --device cpu &&
  cmp /tmp/q-gpu.gguf /tmp/q-cpu.gguf
}
check "quantize cuda == cpu (q4_k_m)" isq
check "smelt bench --kernels" /tmp/smelt bench --kernels
m=/tmp/llama3-8b-q4_k.gguf
/tmp/smelt synth --shape llama3-8b --quant q4_k -o $m > /dev/null 2>&1
for a in "--prompt 512 --gen 128 --reps 2" "--prompt 128 --gen 128 --reps 1 --batch 32"; do
  r=$(/tmp/smelt bench --model $m --device cuda $a --json 2>>"$log" | tr -d '\n')
  echo "bench $a: $r" | tee -a "$log"
  table+=("| bench $a | $(echo "$r" | grep -o '"\(prompt\|decode\|batch_decode\)_tok_s":[0-9.]*' | tr '\n' ' ') |")
done
echo "== table" | tee -a "$log"
printf '%s\n' "| check | result |" "|---|---|" "${table[@]}" | tee -a "$log"
