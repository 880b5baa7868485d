#!/usr/bin/env bash
# Single-stream MoE decode (issue 16: Qwen3-30B-A3B at 1.17x llama.cpp, bar 1.5x), one
# device call on one GPU, main's smelt against this tree's:
#  1. gpu_ops -o moe,moefuse: the grouped GEMV (lane groups for rows of up to four tiles,
#     and the whole-warp rows again) and the fused combine + norm against their CPU twins;
#  2. cuda_parity check on tiny synthetic qwen3moe (Q8_0, Q4_K), qwen3next and qwen3 (Q4_K);
#  3. qwen3-30b-a3b Q4_K (smelt synth) tg128 after a 512-token prompt: main and this tree,
#     interleaved, 2 rounds; then this tree with SMELT_CUDA_MOE_LANES=32 (whole-warp rows)
#     and with SMELT_CUDA_SPLITS=33 (main's attention splits at this shape), once each;
#  4. the same tg128 of qwen3-32b Q4_K (two query tiles a KV head too), main and this tree;
#  5. this tree's SMELT_CUDA_TIMELINE=1 table of the 30B step.
#
# Here:  bash bench/gpu/moedecode.sh pack MAIN_SMELT   (this tree's release smelt, gpu_ops,
#        cuda_parity and MAIN_SMELT, stripped and gzipped into .gpu-moe/)
# There: timeout 590 bash bench/gpu/moedecode.sh    carry [".gpu-moe"]
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
M30=/tmp/md-30b.gguf; M32=/tmp/md-32b.gguf
($B/smelt synth --shape qwen3-30b-a3b --quant q4_k -o $M30 > /tmp/md-synth.log 2>&1
 $B/smelt synth --shape qwen3-32b --quant q4_k -o $M32 >> /tmp/md-synth.log 2>&1
 echo "synth rc=$? at $SECONDS s" >> /tmp/md-synth.log) &
synpid=$!

echo "== 1. gpu_ops -o moe,moefuse" | tee -a "$log"
timeout 150 $B/gpu_ops -o moe,moefuse > /tmp/md-ops.out 2>&1 && r=PASS || r=FAIL
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
for round in 1 2; do
  for b in smelt-main smelt; do
    j=$(tg $b $M30)
    echo "round $round $b: $(echo "$j" | js decode_tok_s) tok/s, digest $(echo "$j" | dg)" | tee -a "$log"
    table+=("| 30B round $round $b | $(echo "$j" | js decode_tok_s) | $(echo "$j" | dg) |")
  done
done
for e in SMELT_CUDA_MOE_LANES=32 SMELT_CUDA_SPLITS=33; do
  j=$(tg smelt $M30 $e)
  table+=("| 30B smelt $e | $(echo "$j" | js decode_tok_s) | $(echo "$j" | dg) |")
done
echo "== 4. qwen3-32b tg128" | tee -a "$log"
for b in smelt-main smelt; do
  j=$(tg $b $M32)
  table+=("| 32B $b | $(echo "$j" | js decode_tok_s) | $(echo "$j" | dg) |")
done
echo "== 5. timeline" | tee -a "$log"
SMELT_CUDA_TIMELINE=1 timeout 150 $B/smelt bench --model $M30 --device cuda --prompt 512 --gen 64 --reps 1 > /tmp/md-tl.out 2>&1
cat /tmp/md-tl.out >> "$log"
echo "done at $SECONDS s" | tee -a "$log"
grep -A16 "CUDA timeline" /tmp/md-tl.out
echo
echo "| run | tg128 tok/s | greedy digest |"
echo "|---|---:|---|"
printf '%s\n' "${table[@]}" | tee -a "$log"
