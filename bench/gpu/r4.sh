#!/usr/bin/env bash
# Four rows a warp for the split norm's wide consumers (`gemv_*_t1_rmsin_r4`, chosen with
# SMELT_CUDA_GEMV_R4_ROWS): the Qwen3-32B's gate|up (51200x5120) and Q|K|V (10240x5120)
# were 2-4 points nearer the copy rate with four rows in the plain GEMV's timing on an H200
# (bench/RESULTS.md 2026-11-28). Parity first (`gpu_ops check -o gemv_resnorm`: the r4
# consumer's outputs must be the r2 one's bits), then tg128 of the 32B and the 8B
# (`smelt synth`, Q4_K), default and SMELT_CUDA_GEMV_R4_ROWS=8192 alternating, ROUNDS rounds.
# Here:  strip + gzip -9 the release smelt and gpu_ops into .gpu-r4/{smelt,gpu_ops}.gz
# There: timeout 200 bash bench/gpu/r4.sh    carry [".gpu-r4"]
# Log: $OUT/r4.log; the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"
log=$out/r4.log
B=/tmp/r4; mkdir -p $B
for n in smelt gpu_ops; do gunzip -c .gpu-r4/$n.gz > $B/$n && chmod +x $B/$n; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$log"
$B/smelt synth --shape llama3-8b --quant q4_k -o /tmp/r4-8b.gguf >> "$log" 2>&1
($B/smelt synth --shape qwen3-32b --quant q4_k -o /tmp/r4-32b.gguf >> /tmp/r4-synth.log 2>&1) &
synpid=$!
($B/gpu_ops check -o gemv_resnorm > $out/r4-parity.log 2>&1) &
parpid=$!
$B/smelt bench --model /tmp/r4-8b.gguf --device cuda --prompt 8 --gen 2 --reps 1 > /dev/null 2>&1
wait $synpid $parpid
cat /tmp/r4-synth.log >> "$log"
echo "warm at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2 | cut -c1-6; }
declare -A res
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in default SMELT_CUDA_GEMV_R4_ROWS=8192; do
    e=$v; [ "$v" = default ] && e=
    for m in 32b 8b; do
      o=$(env $e $B/smelt bench --model /tmp/r4-$m.gguf --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log")
      echo "$v $m round $r: $o" >> "$log"
      res["$v $m"]+="$(echo "$o" | js decode_tok_s) "
    done
  done
  echo "round $r at $SECONDS s" | tee -a "$log"
done
echo
grep -E "^== summary" -A40 $out/r4-parity.log | grep -E "gemv_resnorm|FAIL|failing" | head -20
echo "| setting | Qwen3-32B tg128 (rounds) | 8B tg128 (rounds) |"
echo "|---|---|---|"
for v in default SMELT_CUDA_GEMV_R4_ROWS=8192; do echo "| $v | ${res["$v 32b"]} | ${res["$v 8b"]} |"; done | tee -a "$log"
