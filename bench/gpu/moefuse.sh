#!/usr/bin/env bash
# Branch `moefuse` on one GPU, in one device call (issue 16: Qwen3-30B-A3B decode was
# 1.16x llama.cpp, launch bound): the MoE router as one launch (split-norm FFN norm + its
# q8_1 tiles, f32 router matmul, top-k in the last block: `moe_router_softmax`) and the
# combine + residual add + next layer's norm + q8_1 as one (`moe_combine_add_rms_norm_q8_1`),
# three launches a MoE layer less; and the Q and K head norms of a decode row as one launch
# (`rms_norm_pair`, Qwen3 and Gemma 3 too). Checks and timings:
#  1. gpu_ops -o moe,norm: the new kernels against their CPU twins (`moefuse`; `norm`:
#     `rms_norm_pair` also bit for bit against two `rms_norm` launches), and the engine's
#     MoE ops and whole MoE block through the CUDA backend (`moe`, which now routes a decode
#     row with the fused router);
#  2. cuda_parity check (the branch's) on tiny synthetic qwen3moe and mixtral (Q8_0, Q4_K)
#     and qwen35moe (Q4_K: a shared expert, so the router fuses and the combine does not),
#     and qwen3 (dense, Q4_K: the paired head norms), then qwen3moe Q4_K again with
#     SMELT_CUDA_MOE_FUSE=0 SMELT_CUDA_HEAD_NORMS=0 (the unfused paths, as a control);
#  3. qwen3-30b-a3b Q4_K (smelt synth) tg128 after a 512-token prompt: main's binary and the
#     branch's, interleaved, 2 rounds, and the branch's with both fusions off once; then
#     one profiled decode of main and of the branch (SMELT_CUDA_PROFILE=1: launches and GPU
#     time per kernel a step);
#  4. llama.cpp (built here from the carried sdist while 1-3 run) on the same file, when
#     .peer is carried: pp512 and tg128, for the ratio.
#
# Here:  bash bench/gpu/moefuse.sh pack-main   (on main's commit: its release smelt into
#                                                .gpu-moefuse/smelt-main.gz)
#        bash bench/gpu/moefuse.sh pack        (on this branch: smelt, cuda_parity, gpu_ops)
#        cp -r ../main/.peer .peer  (or ../shared/peer/prepare.sh .peer)
# There: timeout 590 bash bench/gpu/moefuse.sh    carry [".gpu-moefuse", ".peer"]
#        (about 5 minutes; without .peer, no llama.cpp rows)
# Log: $OUT/moefuse.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  pack-main)
    set -e
    cargo build --release -p smelt --bin smelt
    t=${CARGO_TARGET_DIR:-target}/release
    mkdir -p .gpu-moefuse
    strip -o /tmp/moefuse-smelt-main "$t/smelt"
    gzip -9 -c /tmp/moefuse-smelt-main > .gpu-moefuse/smelt-main.gz
    du -sh .gpu-moefuse
    exit 0
    ;;
  pack)
    set -e
    cargo build --release -p smelt --bin smelt -p smelt-engine --example cuda_parity \
      -p smelt-kernels --example gpu_ops
    t=${CARGO_TARGET_DIR:-target}/release
    mkdir -p .gpu-moefuse
    for b in smelt examples/cuda_parity examples/gpu_ops; do
      n=$(basename "$b")
      strip -o "/tmp/moefuse-$n" "$t/$b"
      gzip -9 -c "/tmp/moefuse-$n" > ".gpu-moefuse/$n.gz"
    done
    du -sh .gpu-moefuse
    exit 0
    ;;
esac
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/moefuse.log"
B=/tmp/mf-bin
mkdir -p $B
for b in smelt-main smelt gpu_ops cuda_parity; do
  gunzip -c .gpu-moefuse/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
table=()
M30=/tmp/mf-30b.gguf
($B/smelt synth --shape qwen3-30b-a3b --quant q4_k -o $M30 > /tmp/mf-synth.log 2>&1
 echo "synth rc=$? at $SECONDS s" >> /tmp/mf-synth.log) &
synpid=$!
llpid=""
if [ -s .peer/llcpp.tgz ]; then
  (bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/mf-llbuild.log 2>&1
   echo "llama.cpp build rc=$? at $SECONDS s" >> /tmp/mf-llbuild.log) &
  llpid=$!
fi

echo "== 1. gpu_ops -o moe,norm" | tee -a "$log"
timeout 150 $B/gpu_ops -o moe,norm > /tmp/mf-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/mf-ops.out >> "$log"
table+=("| gpu_ops -o moe,norm (moefuse kernels, rms_norm_pair vs twins; engine MoE ops and block) | $r ($(grep -c " FAIL$" /tmp/mf-ops.out) FAIL lines) |")
while IFS= read -r l; do table+=("    $l"); done < <(sed -n '/^== summary/,$p' /tmp/mf-ops.out | grep "^| " | grep -v "^| op \|^|---" | head -30)

echo "== 2. cuda_parity (branch)" | tee -a "$log"
parity() { # file tag [env]
  env ${3:-} timeout 120 $B/cuda_parity check "$1" > /tmp/mf-par.out 2>&1
  cat /tmp/mf-par.out >> "$log"
  grep -q "^parity: PASS" /tmp/mf-par.out && r=PASS || r=FAIL
  table+=("| cuda_parity $2 | $r |")
}
for s in "qwen3moe-tiny q8_0" "qwen3moe-tiny q4_k" "mixtral-tiny q8_0" "mixtral-tiny q4_k" "qwen35moe-tiny q4_k" "qwen3-tiny q4_k"; do
  set -- $s
  f=/tmp/mf-$1-$2.gguf
  $B/smelt synth --shape $1 --quant $2 -o $f >> "$log" 2>&1 || table+=("| synth $1 $2 | FAIL |")
  parity $f "$1 $2"
done
parity /tmp/mf-qwen3moe-tiny-q4_k.gguf "qwen3moe-tiny q4_k, fusions off" "SMELT_CUDA_MOE_FUSE=0 SMELT_CUDA_HEAD_NORMS=0"
echo "parity done at $SECONDS s" | tee -a "$log"

wait $synpid
cat /tmp/mf-synth.log >> "$log"
tg() { # binary model [env] -> the JSON line
  env ${3:-} timeout 120 $B/$1 bench --model $2 --device cuda --prompt 512 --gen 128 --reps 1 --json 2>>"$log" | tr -d '\n' | tee -a "$log"
  echo >> "$log"
}
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
echo "== 3. qwen3-30b-a3b tg128, main vs moefuse" | tee -a "$log"
declare -A runs
declare -A digests
for round in 1 2; do
  for b in smelt-main smelt; do
    j=$(tg $b $M30)
    v=$(echo "$j" | js decode_tok_s)
    echo "round $round $b tg128 $v" | tee -a "$log"
    runs[$b]="${runs[$b]:-} $v"
    digests[$b]="${digests[$b]:-} $(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | cut -c22-40)"
  done
done
j=$(tg smelt $M30 "SMELT_CUDA_MOE_FUSE=0 SMELT_CUDA_HEAD_NORMS=0")
off=$(echo "$j" | js decode_tok_s)
pp=$(echo "$j" | js prompt_tok_s)
table+=("| qwen3-30b-a3b Q4_K tg128 tok/s, main (2 rounds) | ${runs[smelt-main]} |")
table+=("| qwen3-30b-a3b Q4_K tg128 tok/s, moefuse (2 rounds) | ${runs[smelt]} |")
table+=("| qwen3-30b-a3b Q4_K tg128 tok/s, moefuse with SMELT_CUDA_MOE_FUSE=0 SMELT_CUDA_HEAD_NORMS=0 | $off |")
table+=("| greedy digests main / moefuse | ${digests[smelt-main]} / ${digests[smelt]} |")
for b in smelt-main smelt; do
  SMELT_CUDA_PROFILE=1 timeout 120 $B/$b bench --model $M30 --device cuda --prompt 64 --gen 16 --reps 1 > /tmp/mf-prof-$b.out 2>&1
  echo "-- profile $b" >> "$log"; cat /tmp/mf-prof-$b.out >> "$log"
done

if [ -n "$llpid" ]; then
  echo "== 4. llama.cpp on the same file" | tee -a "$log"
  wait $llpid; tail -3 /tmp/mf-llbuild.log | tee -a "$log"
  export PYTHONPATH=/tmp/site
  l=$(timeout 150 python3 .peer/llamacpp_bench.py $M30 512 128 2 2>>"$log" | tee -a "$log" | grep RESULT)
  lpp=$(echo "$l" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')
  ltg=$(echo "$l" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
  best=$(echo ${runs[smelt]} | tr ' ' '\n' | sort -n | tail -1)
  ratio=$(python3 -c "a,b='$ltg','$best'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
  table+=("| llama.cpp tg128 / pp512 tok/s (same file) | $ltg / $lpp |")
  table+=("| moefuse tg128 (best round) / llama.cpp | $ratio |")
  table+=("| moefuse pp512 (fusions-off run; prompts do not take them) | $pp |")
fi
rm -f $M30 /tmp/mf-*-tiny-*.gguf
echo "done at $SECONDS s" | tee -a "$log"
echo
for b in smelt-main smelt; do
  echo "== profile $b (SMELT_CUDA_PROFILE=1, eager decode)"
  grep -A22 "^PROFILE:" /tmp/mf-prof-$b.out | head -23
done
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
