#!/usr/bin/env bash
# The shared-tail GEMV (`gemv::Config::shared_tail`, `SMELT_CUDA_GEMV_SHARED_TAIL=1`):
# four rows a warp whose pairs share their partial last round of tiles, for rows of 5120
# weights (20 tiles: today two rows take 3 rounds of loads for 2.5 rounds of bytes). The
# Qwen3-32B-shape timeline (06:30 UTC) had its gate|up GEMV at 2.03 TB/s where the 8B's
# (4096 weights, whole rounds) reaches 2.37. In one call on one GPU:
#  1. parity: `gpu_ops -o gemv,gemv_resnorm,gemv_rope_kv` (the shared-tail kernels against
#     their twins; with rope, bit for bit the same GEMV + rope_kv_rows), `cuda_parity
#     check` on qwen3-tiny / llama3-tiny with the switch (their 256-512-wide rows share);
#  2. `smelt bench --kernels` (the rmsin / plain GEMVs at 51200x5120, 10240x5120,
#     5120x25600, 3072x3072, with and without);
#  3. Qwen3-32B-shape Q4_K tg128, off / on / off / on; Qwen3.6-27B-shape off / on; the
#     32B's timeline with it on.
# Run once (2026-11-28 06:46 UTC, bench/RESULTS.md): no gain, so the kernels and the switch
# were not kept (bench/gpu/NOTES.md describes them). Kept as the record of that run.
# Here:  bash bench/gpu/hybrid.sh pack    There: timeout 590 bash bench/gpu/shared_tail.sh
#        carry [".gpu-dn"]
# Log: $OUT/shared_tail.log; the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/shared_tail.log"; table=/tmp/st-table.md
B=/tmp/st; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 200 $B/gpu_ops -o gemv,gemv_resnorm,gemv_rope_kv > /tmp/st-ops.out 2>&1; rc=$?
cat /tmp/st-ops.out >> "$log"
echo "| gpu_ops -o gemv,gemv_resnorm,gemv_rope_kv (rc $rc) | $(grep -cE ' FAIL$' /tmp/st-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/st-ops.out) PASS |" >> $table
grep -E ' FAIL$' /tmp/st-ops.out | head -5 | sed 's/^/    /' >> $table
for m in qwen3-tiny:q4_k llama3-tiny:q8_0; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/st-$s.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  SMELT_CUDA_GEMV_SHARED_TAIL=1 timeout 100 $B/cuda_parity check $f > /tmp/st-p.out 2>&1; cat /tmp/st-p.out >> "$log"
  echo "| cuda_parity $s $q, shared tail | $(grep -E '^parity:' /tmp/st-p.out | cut -d' ' -f2) |" >> $table
done
echo "checks done at $SECONDS s" | tee -a "$log"
timeout 120 $B/smelt bench --kernels --device cuda > /tmp/st-k.out 2>&1
cat /tmp/st-k.out >> "$log"
grep -E "copy|5120|25600|3072|28672x4096" /tmp/st-k.out | sed 's/^/    /' >> $table
echo "kernels done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
run() { # label model env...
  local label=$1 m=$2; shift 2
  local o; o=$(env "$@" timeout 150 $B/smelt bench --model $m --device cuda --prompt 512 --gen 128 --reps 1 --json 2>>"$log")
  echo "$label: $o" >> "$log"
  echo "| $label | pp512 $(echo "$o" | js prompt_tok_s), tg128 $(echo "$o" | js decode_tok_s) |" >> $table
}
f=/tmp/st-32b.gguf
$B/smelt synth --shape qwen3-32b --quant q4_k -o $f 2>&1 | tail -1 | tee -a "$log"
for r in 1 2; do
  run "qwen3-32b Q4_K, today (round $r)" $f SMELT_CUDA_GEMV_SHARED_TAIL=0
  run "qwen3-32b Q4_K, shared tail (round $r)" $f SMELT_CUDA_GEMV_SHARED_TAIL=1
done
SMELT_CUDA_GEMV_SHARED_TAIL=1 SMELT_CUDA_TIMELINE=1 timeout 120 $B/smelt bench --model $f --device cuda --prompt 512 --gen 64 --reps 1 > /tmp/st-tl.out 2>&1
cp /tmp/st-tl.out "$out/timeline-qwen3-32b-st.txt"
grep -A8 "CUDA timeline" /tmp/st-tl.out | sed 's/^/    /' >> $table
rm -f $f
echo "32b done at $SECONDS s" | tee -a "$log"
f=/tmp/st-27b.gguf
$B/smelt synth --shape qwen3.6-27b --quant q4_k -o $f 2>&1 | tail -1 | tee -a "$log"
run "qwen3.6-27b Q4_K, today" $f SMELT_CUDA_GEMV_SHARED_TAIL=0
run "qwen3.6-27b Q4_K, shared tail" $f SMELT_CUDA_GEMV_SHARED_TAIL=1
rm -f $f
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
