#!/usr/bin/env bash
# Single-stream MoE decode (issue 16: Qwen3-30B-A3B at 1.17x llama.cpp, bar 1.5x), one
# device call on one GPU, main's smelt against this tree's:
#  1. gpu_ops -o moe,moefuse: the grouped GEMV (lane groups for rows of up to four tiles,
#     and the whole-warp rows again), the fused router and combine + norm against their
#     CPU twins;
#  2. cuda_parity check on tiny synthetic qwen3moe (Q8_0, Q4_K), qwen3next and qwen3 (Q4_K);
#  3. qwen3-30b-a3b Q4_K (smelt synth) tg128 after a 512-token prompt: main and this tree,
#     ROUNDS rounds (default 1) interleaved; then this tree with each of VARIANTS
#     (environment settings, default SMELT_CUDA_SPLITS=8) once;
#  4. this tree's SMELT_CUDA_TIMELINE=1 table of the 30B step (with TL_ENV's settings);
#  5. with .peer carried: llama.cpp built here (in the background from the start) on the
#     same file: pp512, tg128 and 32 sequences' aggregate decode, smelt's beside them.
#
# Here:  bash bench/gpu/moedecode.sh pack MAIN_SMELT   (this tree's release smelt, gpu_ops,
#        cuda_parity and MAIN_SMELT, stripped and gzipped into .gpu-moe/)
# There: timeout 590 bash bench/gpu/moedecode.sh    carry [".gpu-moe", ".peer"]
# Log: $OUT/moedecode.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  set -e
  t=${CARGO_TARGET_DIR:-target}/release
  mkdir -p .gpu-moe
  for b in smelt examples/cuda_parity examples/gpu_ops; do
    n=$(basename "$b")
    strip -o "/tmp/moe-$n" "$t/$b"
    gzip -9 -c "/tmp/moe-$n" > ".gpu-moe/$n.gz"
  done
  strip -o /tmp/moe-smelt-main "${2:?main smelt}"
  gzip -9 -c /tmp/moe-smelt-main > .gpu-moe/smelt-main.gz
  du -sh .gpu-moe
  exit 0
fi
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/moedecode.log"
B=/tmp/md-bin
mkdir -p $B
for b in smelt-main smelt gpu_ops cuda_parity; do
  gunzip -c .gpu-moe/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
table=()
M30=/tmp/md-30b.gguf
($B/smelt synth --shape qwen3-30b-a3b --quant q4_k -o $M30 > /tmp/md-synth.log 2>&1
 echo "synth rc=$? at $SECONDS s" >> /tmp/md-synth.log) &
synpid=$!
llpid=""
if [ -s .peer/llcpp.tgz ]; then
  (bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/md-ll.log 2>&1
   echo "llama.cpp build rc=$? at $SECONDS s" >> /tmp/md-ll.log) &
  llpid=$!
fi

echo "== 1. gpu_ops -o moe,moefuse" | tee -a "$log"
timeout 300 $B/gpu_ops -o moe,moefuse > /tmp/md-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/md-ops.out >> "$log"
table+=("| gpu_ops -o moe,moefuse | $r ($(grep -c " FAIL$" /tmp/md-ops.out) FAIL lines) |")
while IFS= read -r l; do table+=("    $l"); done < <(sed -n '/^== summary/,$p' /tmp/md-ops.out | grep "^| " | grep -v "^| op \|^|---" | head -30)

echo "== 2. cuda_parity" | tee -a "$log"
for s in "qwen3moe-tiny q8_0" "qwen3moe-tiny q4_k" "qwen3next-tiny q4_k" "qwen3-tiny q4_k"; do
  set -- $s
  f=/tmp/md-$1-$2.gguf
  $B/smelt synth --shape $1 --quant $2 -o $f >> "$log" 2>&1 || table+=("| synth $1 $2 | FAIL |")
  timeout 120 $B/cuda_parity check "$f" > /tmp/md-par.out 2>&1
  cat /tmp/md-par.out >> "$log"
  grep -q "^parity: PASS" /tmp/md-par.out && r=PASS || r=FAIL
  table+=("| cuda_parity $1 $2 | $r |")
done
echo "parity done at $SECONDS s" | tee -a "$log"

wait $synpid
cat /tmp/md-synth.log >> "$log"
tg() { # binary model [env] -> the JSON line
  env ${3:-} timeout 150 $B/$1 bench --model $2 --device cuda --prompt 512 --gen 128 --reps 1 --json 2>>"$log" | tr -d '\n' | tee -a "$log"
  echo >> "$log"
}
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
dg() { grep -o '"seq_token_digests":\[[^]]*\]' | cut -c22-37; }
echo "== 3. qwen3-30b-a3b tg128" | tee -a "$log"
for round in $(seq 1 ${ROUNDS:-1}); do
  for b in smelt-main smelt; do
    j=$(tg $b $M30)
    echo "round $round $b: $(echo "$j" | js decode_tok_s) tok/s, digest $(echo "$j" | dg)" | tee -a "$log"
    table+=("| 30B round $round $b | $(echo "$j" | js decode_tok_s) | $(echo "$j" | dg) |")
  done
done
for e in ${VARIANTS:-SMELT_CUDA_SPLITS=8}; do
  j=$(tg smelt $M30 $e)
  table+=("| 30B smelt $e | $(echo "$j" | js decode_tok_s) | $(echo "$j" | dg) |")
done
echo "== 4. timeline" | tee -a "$log"
env ${TL_ENV:-SMELT_NONE=1} SMELT_CUDA_TIMELINE=1 timeout 150 $B/smelt bench --model $M30 --device cuda --prompt 512 --gen 64 --reps 1 > /tmp/md-tl.out 2>&1
cat /tmp/md-tl.out >> "$log"
peer=()
if [ -n "$llpid" ]; then
  echo "== 5. llama.cpp beside smelt" | tee -a "$log"
  wait $llpid
  cat /tmp/md-ll.log >> "$log"
  export PYTHONPATH=/tmp/site
  prow() { # name llama smelt
    local r
    r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
    peer+=("| $1 | $2 | $3 | $r |")
  }
  l=$(python3 .peer/llamacpp_bench.py $M30 512 128 3 2>/dev/null | tee -a "$log" | grep RESULT)
  r=$($B/smelt bench --model $M30 --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  prow "qwen3-30b-a3b Q4_K pp512" "$(echo "$l" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js prompt_tok_s)"
  prow "qwen3-30b-a3b Q4_K tg128" "$(echo "$l" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js decode_tok_s)"
  l=$(python3 .peer/llamacpp_batched.py $M30 32 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
  r=$($B/smelt bench --model $M30 --device cuda --prompt 128 --gen 128 --reps 1 --batch 32 --json 2>>"$log"); echo "$r" >> "$log"
  prow "qwen3-30b-a3b Q4_K 32 sequences, aggregate decode" "$l" "$(echo "$r" | js batch_decode_tok_s)"
fi
echo "done at $SECONDS s" | tee -a "$log"
grep -A16 "CUDA timeline" /tmp/md-tl.out
echo
echo "| run | tg128 tok/s | greedy digest |"
echo "|---|---:|---|"
printf '%s\n' "${table[@]}" | tee -a "$log"
if [ ${#peer[@]} -gt 0 ]; then
  echo
  echo "| work | llama.cpp | smelt | ratio |"
  echo "|---|---:|---:|---:|"
  printf '%s\n' "${peer[@]}" | tee -a "$log"
fi
