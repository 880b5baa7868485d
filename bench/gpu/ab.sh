#!/usr/bin/env bash
# Interleaved A/B of CUDA decode settings on the GPU machine, in one device call: each
# round times every setting once (tg128 after a 512-token prompt, one rep), so drift of
# the machine spreads over all settings alike; the table gives each setting's median.
# Between calls (even on the same kind of GPU) tg128 moved by up to 8% in this project's
# runs, so settings are only compared within one call.
#
# Here: bench/gpu/decode.sh build (for .gpu-cuda/smelt); with --peer also
#   ../shared/peer/prepare.sh .peer
# There (device tool): bash bench/gpu/ab.sh [--peer]   carry [".gpu-cuda/smelt"] (+ ".peer")
# Environment: SETTINGS (space-separated; commas join VAR=value pairs of one setting;
# BENCH_ARGS=--flag+--flag adds flags to smelt bench, e.g. BENCH_ARGS=--host-logits;
# BIN=path times another smelt binary, e.g. the tree before a change, BIN=.gpu-old/smelt;
# default: the fusion switches), ROUNDS (default 3), DIGEST=1 (first check that every setting
# computes the first one's logits bit for bit). Output under $OUT (or bench/out): ab.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/ab.log"
B=${GPU_DIR:-.gpu-cuda}
[ -x $B/smelt ] || { echo "ab.sh: $B/smelt missing: run 'bench/gpu/decode.sh build' and carry it" >&2; exit 1; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
m=/tmp/llama3-8b-q4_k.gguf
if [ "${1:-}" = "--peer" ]; then
  echo "== llama.cpp (built here) on its own random llama3-8b Q4_K" | tee -a "$log"
  bash .peer/gpu-llamacpp.sh .peer llama3-8b Q4_K 2>&1 | tee -a "$log"
  m=/tmp/peer-llama3-8b-Q4_K.gguf
else
  $B/smelt synth --shape llama3-8b --quant q4_k -o $m > /dev/null
fi
settings=${SETTINGS:-DEFAULT=1 SMELT_CUDA_SPLIT_NORM=0 SMELT_CUDA_ATTN_COMBINE=0 SMELT_CUDA_SPLIT_NORM=0,SMELT_CUDA_ATTN_COMBINE=0}
if [ "${DIGEST:-0}" = 1 ]; then
  # Settings that must not change a bit (launch order, prefetches): the hash of every
  # logits copy under each, against the first setting's.
  first=
  for v in $settings; do
    bin=$(echo "$v" | tr ',' '\n' | sed -n 's/^BIN=//p')
    d=$(env SMELT_CUDA_DIGEST=1 ${v//,/ } ${bin:-$B/smelt} bench --model $m --device cuda --prompt 64 --gen 48 --reps 1 --host-logits 2>&1 \
      | grep "CUDA digest" || echo missing)
    first=${first:-$d}
    if [ "$d" = "$first" ]; then r=equal; else r=DIFFERENT; fi
    echo "digest $v: $r ($d)" | tee -a "$log"
  done
fi
for round in $(seq 1 "${ROUNDS:-3}"); do
  for v in $settings; do
    extra=$(echo "$v" | tr ',' '\n' | sed -n 's/^BENCH_ARGS=//p' | tr '+' ' ')
    bin=$(echo "$v" | tr ',' '\n' | sed -n 's/^BIN=//p')
    r=$(env ${v//,/ } ${bin:-$B/smelt} bench --model $m --device cuda --prompt 512 --gen 128 --reps 1 --json $extra 2>/dev/null \
      | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
    echo "round $round $v ${r:-FAILED}" | tee -a "$log"
  done
done
echo "== median tg128 per setting (tokens/s)" | tee -a "$log"
for v in $settings; do
  grep " $v " "$log" | awk '{print $4}' | sort -n | awk -v s="$v" '{a[NR]=$1} END {print "| " s " | " a[int((NR+1)/2)] " |"}' | tee -a "$log"
done
