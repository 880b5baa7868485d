#!/usr/bin/env bash
# The hybrid models on the GPU (issue 16: Qwen3.5/3.6 and Qwen3-Next, Gated DeltaNet
# layers beside gated attention), everything in one device call:
#  1. kernel parity: `gpu_ops -o delta` runs the delta-net kernels (convolution + SiLU,
#     strided q/k L2 norm, the delta-rule step over decode rows and prompt chunks of several
#     sequences at their own state addresses, gated norm, column gather, split halves,
#     sigmoid gate) against their CPU twins, then `gpu_ops perf -o delta` times the step
#     kernel at the 27B shape;
#  2. whole-model parity: `cuda_parity check` (CUDA logits vs the CPU engine and an F32
#     reference, greedy tokens, three sequences decoded together as one graph) on tiny
#     synthetic qwen35, qwen35moe and qwen3next models (`smelt synth --shape *-tiny`, Q8_0
#     and Q4_K);
#  3. speed against llama.cpp built in this call (from the carried sdist, ../shared/peer),
#     both on the same `smelt synth` Q4_K file: pp512, tg128 and 32 sequences' aggregate
#     decode, for qwen3-next-80b-a3b (about 45 GB in Q4_K: fits an 80 GB card; written in
#     the background from the start) then, when time is left (LATER_BEFORE_S, default 450 s
#     gone by: the llama.cpp build takes about 350 s), the dense 27B hybrid (qwen3.6-27b; the
#     80B file is deleted first for disk room). H100, run 1: the 27B part took 33 s.
#
# What it prints last: a table of PASS/FAIL rows (gpu_ops's delta rows; cuda_parity per
# tiny model), the step kernel's timings, then llama.cpp vs smelt rows per model.
#
# Here:  bash bench/gpu/hybrid.sh pack   (release build, stripped gzipped binaries into the
#        git-ignored .gpu-dn/, and .peer/ through ../shared/peer/prepare.sh when missing)
# There: bash bench/gpu/hybrid.sh        carry [".gpu-dn", ".peer"]   (about 9 minutes;
#        SKIP_SPEED=1: parity only, about 2 minutes; SHAPES="qwen3.6-27b" to time only that
#        one)
# Log: $OUT/hybrid.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  set -e
  cargo build --release -p smelt --bin smelt -p smelt-engine --example cuda_parity \
    -p smelt-kernels --example gpu_ops
  t=${CARGO_TARGET_DIR:-target}/release
  mkdir -p .gpu-dn
  for b in "$t/smelt" "$t/examples/cuda_parity" "$t/examples/gpu_ops"; do
    strip -o "/tmp/$(basename "$b")" "$b"
    gzip -9 -c "/tmp/$(basename "$b")" > ".gpu-dn/$(basename "$b").gz"
  done
  [ -s .peer/llcpp.tgz ] || bash ../shared/peer/prepare.sh .peer
  du -sh .gpu-dn .peer
  exit 0
fi
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/hybrid.log"
table="$out/hybrid-table.md"
B=/tmp/hy-bin
mkdir -p $B
for b in smelt cuda_parity gpu_ops; do
  gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > "$table"
echo "|---|---|" >> "$table"
shapes=${SHAPES:-qwen3-next-80b-a3b qwen3.6-27b}
first=${shapes%% *}
if [ "${SKIP_SPEED:-0}" != 1 ]; then
  # CPU work first, in the background, while the GPU checks run: the llama.cpp build
  # (its own small llama3-1b check included) and the first big model.
  (bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/hy-llbuild.log 2>&1; echo "llama.cpp build rc=$?" >> /tmp/hy-llbuild.log) &
  llpid=$!
  (t0=$SECONDS; $B/smelt synth --shape "$first" --quant q4_k -o "/tmp/hy-$first.gguf" > /tmp/hy-synth.log 2>&1; echo "synth $first rc=$? in $((SECONDS - t0)) s" >> /tmp/hy-synth.log) &
  synpid=$!
fi

echo "== 1. kernel parity (gpu_ops -o delta)" | tee -a "$log"
$B/gpu_ops -o delta 2>&1 | tee -a "$log" > /tmp/hy-ops.out && r=PASS || r=FAIL
echo "| delta-net kernels vs CPU twins (gpu_ops -o delta) | $r |" >> "$table"
grep "^| delta" /tmp/hy-ops.out | sed 's/^/    /' >> "$table"
$B/gpu_ops perf -o delta 2>&1 | tee -a "$log" > /tmp/hy-ops-perf.out
step_speed=$(grep "^| delta step\|^|---|---|---:|---:|" /tmp/hy-ops-perf.out)

echo "== 2. whole-model parity (cuda_parity)" | tee -a "$log"
for shape in qwen35-tiny qwen35moe-tiny qwen3next-tiny; do
  for q in q8_0 q4_k; do
    f=/tmp/hy-$shape-$q.gguf
    if ! $B/smelt synth --shape $shape --quant $q -o $f >> "$log" 2>&1; then
      echo "| synth $shape $q | FAIL |" >> "$table"
      continue
    fi
    $B/cuda_parity check "$f" 2>&1 | tee -a "$log" > /tmp/hy-parity.out
    grep -q "^parity: PASS" /tmp/hy-parity.out && r=PASS || r=FAIL
    echo "| cuda_parity $shape $q | $r |" >> "$table"
  done
done
# The CLI's path on a tiny model: prompts, then four sequences decoded together (graphs).
if $B/smelt bench --model /tmp/hy-qwen3next-tiny-q8_0.gguf --device cuda --prompt 40 --gen 16 --reps 1 --batch 4 >> "$log" 2>&1; then
  echo "| smelt bench --device cuda --batch 4 (qwen3next-tiny) | PASS |" >> "$table"
else
  echo "| smelt bench --device cuda --batch 4 (qwen3next-tiny) | FAIL (see log) |" >> "$table"
fi
echo "parity done at ${SECONDS} s" | tee -a "$log"

if [ "${SKIP_SPEED:-0}" != 1 ]; then
  wait $llpid; tail -5 /tmp/hy-llbuild.log | tee -a "$log"
  export PYTHONPATH=/tmp/site
  row() {
    local r
    r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
    echo "| $1 | $2 | $3 | $r |" >> "$table"
  }
  js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
  for shape in $shapes; do
    M=/tmp/hy-$shape.gguf
    if [ "$shape" != "$first" ]; then
      if [ "$SECONDS" -gt "${LATER_BEFORE_S:-450}" ]; then
        echo "| $shape | left out: ${SECONDS} s gone by (SHAPES=$shape runs it alone) | | |" >> "$table"
        continue
      fi
      rm -f /tmp/hy-*.gguf
      t0=$SECONDS
      $B/smelt synth --shape "$shape" --quant q4_k -o "$M" > /tmp/hy-synth.log 2>&1
      echo "synth $shape rc=$? in $((SECONDS - t0)) s" >> /tmp/hy-synth.log
    else
      wait $synpid
    fi
    tail -2 /tmp/hy-synth.log | tee -a "$log"
    if [ ! -s "$M" ]; then
      echo "| $shape | synth failed | | |" >> "$table"
      continue
    fi
    echo "== 3. speed, $shape Q4_K ($(du -h "$M" | cut -f1)) at ${SECONDS} s" | tee -a "$log"
    echo "| work ($shape Q4_K) | llama.cpp | smelt | ratio |" >> "$table"
    echo "|---|---:|---:|---:|" >> "$table"
    lc=$(python3 .peer/llamacpp_bench.py $M 512 128 2 2>>"$log" | tee -a "$log" | grep RESULT)
    lc_pp=$(echo "$lc" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')
    lc_tg=$(echo "$lc" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
    r=$($B/smelt bench --model $M --device cuda --prompt 512 --gen 128 --reps 2 --json 2>>"$log"); echo "$r" >> "$log"
    row "pp512 (tok/s)" "$lc_pp" "$(echo "$r" | js prompt_tok_s)"
    row "tg128 (tok/s)" "$lc_tg" "$(echo "$r" | js decode_tok_s)"
    lcb=$(python3 .peer/llamacpp_batched.py $M 32 128 64 2>>"$log" | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
    r=$($B/smelt bench --model $M --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 --json 2>>"$log"); echo "$r" >> "$log"
    row "32 sequences, aggregate decode (tok/s)" "$lcb" "$(echo "$r" | js batch_decode_tok_s)"
    echo "$shape done at ${SECONDS} s" | tee -a "$log"
  done
  if [ "${PROFILE:-0}" = 1 ] && [ -s "/tmp/hy-$first.gguf" ]; then
    SMELT_CUDA_PROFILE=1 $B/smelt bench --model "/tmp/hy-$first.gguf" --device cuda --prompt 16 --gen 32 --reps 1 >> "$log" 2>&1 || true
  fi
fi
if [ -n "${step_speed:-}" ]; then
  echo "" >> "$table"
  echo "$step_speed" >> "$table"
fi
echo "== table (${SECONDS} s)" | tee -a "$log"
cat "$table" | tee -a "$log"
