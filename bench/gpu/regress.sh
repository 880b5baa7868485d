#!/usr/bin/env bash
# Single-stream decode, the tree of several days side by side on one GPU: which commit
# made the 8B and 32B decode slower between 2026-11-26 and 2026-11-27 (H100: 8B 454-460 ->
# 441 on llama.cpp's file, 32B 129 -> 117-121; H200: 8B 522.6 -> 496).
# Each binary in .gpu-reg (smelt-<commit>, stripped, gzip) is warmed once (its PTX JIT, all
# in parallel), then ROUNDS (default 2) interleaved rounds of `smelt bench --prompt 512
# --gen 128 --reps 3` on the 8B and the 32B shape (Q4_K, `smelt synth`; the newest binary
# writes both), plus the newest binary with each setting of VARIANTS ("NAME=VALUE ...",
# one setting per run).
# With .gpu-reg/gpu_ops.gz (this tree's harness) the one-token GEMV layouts too: `gpu_ops
# check -o gemv_tune` (their parity) and `perf -o gemv_tune` (Q4_K at both models' decode
# shapes), run while the warm-ups JIT.
# Here:  strip + gzip -9 each binary into .gpu-reg/smelt-<commit>.gz
# There: HEAD=smelt-<newest> timeout 590 bash bench/gpu/regress.sh    carry [".gpu-reg"]
#        (HEAD names the binary that writes the files and runs the VARIANTS)
# Log: $OUT/regress.log; the table last (tok/s a round, each binary's median).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"
log=$out/regress.log
B=/tmp/reg; mkdir -p $B
export CUDA_CACHE_MAXSIZE=4294967296
SECONDS=0
bins=()
if [ -s .gpu-reg/gpu_ops.gz ]; then
  gunzip -c .gpu-reg/gpu_ops.gz > $B/gpu_ops && chmod +x $B/gpu_ops
  ( $B/gpu_ops check -o gemv_tune > $out/gemv-tune-check.log 2>&1
    $B/gpu_ops perf -o gemv_tune > $out/gemv-tune.log 2>&1 ) &
  tunepid=$!
fi
for f in .gpu-reg/smelt-*.gz; do n=$(basename "$f" .gz); gunzip -c "$f" > $B/$n && chmod +x $B/$n; bins+=("$n"); done
head=${HEAD:-${bins[-1]}}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "binaries: ${bins[*]}; files by $head"; } | tee "$log"
$B/$head synth --shape llama3-8b --quant q4_k -o /tmp/reg-8b.gguf >> "$log" 2>&1
$B/$head synth --shape qwen3-32b --quant q4_k -o /tmp/reg-32b.gguf >> "$log" 2>&1
warm=()
for n in "${bins[@]}"; do
  ( $B/$n bench --model /tmp/reg-8b.gguf --device cuda --prompt 8 --gen 2 --reps 1 > /dev/null 2>&1 ) &
  warm+=($!)
done
wait "${warm[@]}"
echo "warm at $SECONDS s" | tee -a "$log"
[ -n "${tunepid:-}" ] && { wait $tunepid; echo "gemv_tune done at $SECONDS s" | tee -a "$log"; }
runs=()
for n in "${bins[@]}"; do runs+=("$n|"); done
for v in ${VARIANTS:-}; do runs+=("$head|$v"); done
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
declare -A res
for r in $(seq 1 "${ROUNDS:-2}"); do
  for run in "${runs[@]}"; do
    n=${run%%|*}; v=${run#*|}
    for m in 8b 32b; do
      o=$(env $v $B/$n bench --model /tmp/reg-$m.gguf --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log")
      echo "$run $m round $r: $o" >> "$log"
      res["$run $m"]+="$(echo "$o" | js decode_tok_s | cut -c1-6) "
    done
  done
  echo "round $r at $SECONDS s" | tee -a "$log"
done
echo
if [ -n "${tunepid:-}" ]; then
  grep -E "FAIL|^== summary|PASS.*FAIL|passed|failed" $out/gemv-tune-check.log | tail -3
  sed -n '/one-token GEMV layouts/,$p' $out/gemv-tune.log
fi
echo "| binary / setting | 8B tg128 (rounds) | 32B tg128 (rounds) |"
echo "|---|---|---|"
for run in "${runs[@]}"; do
  echo "| $run | ${res["$run 8b"]} | ${res["$run 32b"]} |"
done | tee -a "$log"
