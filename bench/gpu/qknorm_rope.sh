#!/usr/bin/env bash
# The Q and K head norms inside the rope + KV append's launch (`rope_kv_rows_*_qknorm`, the
# fused op `Backend::head_norms_rope_kv_write`; `SMELT_CUDA_HEAD_NORMS_ROPE=0` is the two
# launches of before), in one short call on one GPU:
#  1. `gpu_ops -o rope_kv_rows`: the new kernels against their twin (ragged steps, head
#     sizes 64-256, frequency factors), beside the plain ones;
#  2. `cuda_parity check` on tiny qwen3 and qwen3moe Q4_K (head norms), default on
#     (PARITY="" skips it);
#  3. Qwen3-30B-A3B-shape Q4_K tg128, off / on / off / on.
# Here:  bash bench/gpu/hybrid.sh pack    There: timeout 400 bash bench/gpu/qknorm_rope.sh
#        carry [".gpu-dn"]
# Log: $OUT/qknorm_rope.log; the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/qknorm_rope.log"; table=/tmp/qk-table.md
B=/tmp/qk; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 120 $B/gpu_ops -o rope_kv_rows > /tmp/qk-ops.out 2>&1; rc=$?
cat /tmp/qk-ops.out >> "$log"
echo "| gpu_ops -o rope_kv_rows (rc $rc) | $(grep -cE ' FAIL$' /tmp/qk-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/qk-ops.out) PASS |" >> $table
grep -E "^\| rope_kv_rows" /tmp/qk-ops.out | sed 's/^/    /' >> $table
for m in ${PARITY-qwen3-tiny qwen3moe-tiny}; do
  f=/tmp/qk-$m.gguf
  $B/smelt synth --shape $m --quant q4_k -o $f > /dev/null 2>&1
  timeout 100 $B/cuda_parity check $f > /tmp/qk-p.out 2>&1; cat /tmp/qk-p.out >> "$log"
  echo "| cuda_parity $m q4_k | $(grep -E '^parity:' /tmp/qk-p.out | cut -d' ' -f2) |" >> $table
done
echo "checks done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
f=/tmp/qk-30b.gguf
$B/smelt synth --shape qwen3-30b-a3b --quant q4_k -o $f 2>&1 | tail -1 | tee -a "$log"
for r in 1 2; do
  for v in 0 1; do
    o=$(SMELT_CUDA_HEAD_NORMS_ROPE=$v timeout 90 $B/smelt bench --model $f --device cuda --prompt 512 --gen 128 --reps 1 --json 2>>"$log")
    echo "30b norms-in-rope=$v round $r: $o" >> "$log"
    echo "| qwen3-30b-a3b Q4_K, head norms in the rope launch = $v (round $r) | pp512 $(echo "$o" | js prompt_tok_s), tg128 $(echo "$o" | js decode_tok_s) |" >> $table
  done
done
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
