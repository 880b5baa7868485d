#!/usr/bin/env bash
# Branch `qknorm` on one GPU, in one device call (issues 15 and 16): the Q/K head norms in
# place (`Backend::rms_norm_in_place`) let Qwen3, Qwen3-MoE and Gemma 3 decode take the
# one-launch rope of Q|K and the rope + KV append. Checks and timings:
#  1. gpu_ops: every op of the catalog against its CPU twin (main's harness);
#  2. cuda_parity check (the branch's) on a Gemma 3 270M cut to 6 layers (carried) and on
#     tiny synthetic qwen3 and qwen3moe models, Q8_0 and Q4_K;
#  3. qwen3-30b-a3b Q4_K (smelt synth) tg128 after 512: main's binary and the branch's,
#     interleaved, 2 rounds; then one profiled decode of each (SMELT_CUDA_PROFILE=1, launches
#     per step);
#  4. where a batched decode step goes: Llama-3-8B-shape Q4_K, 32 sequences (128-token
#     prompts, 64 steps) with SMELT_CUDA_TIMELINE=1 (graph replays, per-kernel share).
#
# Here:  build main's smelt + gpu_ops and the branch's smelt + cuda_parity (release), strip,
#        gzip into the git-ignored .gpu-a/ as smelt-main.gz, gpu_ops.gz, smelt-qk.gz,
#        cuda_parity.gz; `cuda_parity shrink .models/gemma-3-270m-q4_k_m.gguf
#        .gpu-a/gemma3-6l.gguf --layers 6 --vocab 4096`.
# There: timeout 590 bash bench/gpu/qknorm.sh    carry [".gpu-a"]
# Log: $OUT/qknorm.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/qknorm.log"
B=/tmp/qk-bin
mkdir -p $B
for b in smelt-main smelt-qk gpu_ops cuda_parity; do
  gunzip -c .gpu-a/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
table=()
M30=/tmp/qk-30b.gguf
M8=/tmp/qk-8b.gguf
(for s in "qwen3-30b-a3b $M30" "llama3-8b $M8"; do
   set -- $s
   $B/smelt-main synth --shape $1 --quant q4_k -o $2 >> /tmp/qk-synth.log 2>&1
   echo "synth $1 rc=$? at $SECONDS s" >> /tmp/qk-synth.log
 done) &
synpid=$!

echo "== 1. gpu_ops" | tee -a "$log"
timeout 200 $B/gpu_ops > /tmp/qk-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/qk-ops.out >> "$log"
fails=$(grep -c "FAIL" /tmp/qk-ops.out)
table+=("| gpu_ops, every op vs its CPU twin | $r ($fails FAIL lines) |")
grep "FAIL" /tmp/qk-ops.out | head -5 | sed 's/^/    /' >> "$log"

echo "== 2. cuda_parity (branch)" | tee -a "$log"
parity() { # file tag
  timeout 120 $B/cuda_parity check "$1" > /tmp/qk-par.out 2>&1
  cat /tmp/qk-par.out >> "$log"
  grep -q "^parity: PASS" /tmp/qk-par.out && r=PASS || r=FAIL
  table+=("| cuda_parity $2 | $r |")
}
parity .gpu-a/gemma3-6l.gguf "gemma3 270M cut to 6 layers"
for s in qwen3-tiny qwen3moe-tiny; do
  for q in q8_0 q4_k; do
    $B/smelt-qk synth --shape $s --quant $q -o /tmp/qk-$s-$q.gguf >> "$log" 2>&1
    parity /tmp/qk-$s-$q.gguf "$s $q"
  done
done
echo "parity done at $SECONDS s" | tee -a "$log"

wait $synpid
cat /tmp/qk-synth.log >> "$log"
tg() { # binary model args... -> tokens/s of the decode
  local b=$1 m=$2; shift 2
  $B/$b bench --model $m --device cuda "$@" --json 2>>"$log" | tr -d '\n' | tee -a "$log" | grep -o '"tg[0-9]*":[0-9.]*\|"decode[a-z_]*":[0-9.]*' | head -1 | cut -d: -f2
}
echo "== 3. qwen3-30b-a3b tg128, main vs qknorm" | tee -a "$log"
declare -A runs
for round in 1 2; do
  for b in smelt-main smelt-qk; do
    v=$(tg $b $M30 --prompt 512 --gen 128 --reps 1)
    echo; echo "round $round $b tg128 $v" | tee -a "$log"
    runs[$b]="${runs[$b]:-} $v"
  done
done
for b in smelt-main smelt-qk; do
  table+=("| qwen3-30b-a3b Q4_K tg128 tok/s, $b (2 rounds) | ${runs[$b]} |")
  SMELT_CUDA_PROFILE=1 $B/$b bench --model $M30 --device cuda --prompt 64 --gen 16 --reps 1 > /tmp/qk-prof.out 2>&1
  echo "-- profile $b" >> "$log"; cat /tmp/qk-prof.out >> "$log"
  { echo "-- $b"; grep -v "^\s*$" /tmp/qk-prof.out | grep -v "INFO\|WARN" | tail -22; } >> /tmp/qk-prof-sum.txt
done
rm -f $M30

echo "== 4. llama3-8b Q4_K, 32 sequences: timeline of a batched step" | tee -a "$log"
for bt in 32; do
  v=$(tg smelt-main $M8 --prompt 128 --gen 64 --reps 1 --batch $bt)
  table+=("| llama3-8b Q4_K batch $bt aggregate tok/s (no timeline) | $v |")
done
SMELT_CUDA_TIMELINE=1 $B/smelt-main bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 > /tmp/qk-tl.out 2>&1
cat /tmp/qk-tl.out >> "$log"

echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== digests (30B rounds main, qk, main, qk; then 8B)"; grep -o "\"seq_token_digests\":\[[^]]*\]" "$log" | cut -c1-80
echo "== profile summaries"; cat /tmp/qk-prof-sum.txt 2>/dev/null
echo "== timeline (batch 32)"; grep -A40 "CUDA timeline" /tmp/qk-tl.out | head -45
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
