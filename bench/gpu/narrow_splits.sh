#!/usr/bin/env bash
# Short A/B for the end of a session's device time (issue 15), one GPU: whether the
# narrow GEMM, now that its ring streams a block's K range well, wants fewer K splits
# than its wave-fill rule gives (SMELT_CUDA_GEMM_NARROW_SPLITS=4 and =2 against the
# default, Llama-3-8B-shape Q4_K, 16 and 32 sequences), and whether Q8_0's narrow GEMM
# beats the GEMV at 8 sequences (SMELT_CUDA_GEMM_NARROW_MIN=8 against the default, which
# keeps 8 tokens of Q6_K and Q8_0 on the GEMV). One round, greedy digests printed.
#
# Here:  cargo build --release -p smelt --bin smelt; strip + gzip into the git-ignored
#        .gpu-s/smelt.gz
# There: timeout 240 bash bench/gpu/narrow_splits.sh    carry [".gpu-s"]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/narrow_splits.log"
S=/tmp/ns-smelt
gunzip -c .gpu-s/smelt.gz > $S && chmod +x $S
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
$S synth --shape llama3-8b --quant q4_k -o /tmp/ns-q4_k.gguf > /tmp/ns-synth.log 2>&1 &
p1=$!
$S synth --shape llama3-8b --quant q8_0 -o /tmp/ns-q8_0.gguf >> /tmp/ns-synth.log 2>&1 &
p2=$!
wait $p1 $p2
cat /tmp/ns-synth.log >> "$log"
table=()
run() { # model batch env...
  local q=$1 bt=$2; shift 2
  local j v d
  j=$(env "$@" $S bench --model /tmp/ns-$q.gguf --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
  echo "$q batch $bt $*: $j" >> "$log"
  v=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
  d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
  echo "$q batch $bt ${*:-default}: $v tok/s, digests $d" | tee -a "$log"
  table+=("| $q, $bt sequences, ${*:-default} | ${v%.*} | $d |")
}
for bt in 32 16; do
  run q4_k $bt SMELT_CUDA_GEMM_NARROW_SPLITS=0
  run q4_k $bt SMELT_CUDA_GEMM_NARROW_SPLITS=4
  run q4_k $bt SMELT_CUDA_GEMM_NARROW_SPLITS=2
done
run q8_0 8 DEFAULT=1
run q8_0 8 SMELT_CUDA_GEMM_NARROW_MIN=8
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "| run | aggregate decode tok/s | digests |"
echo "|---|---:|---|"
printf '%s\n' "${table[@]}"
