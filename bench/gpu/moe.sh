#!/usr/bin/env bash
# Mixture-of-experts on the GPU (issue 16), everything in one device call:
#  1. op parity: `gpu_ops -o moe` runs the CUDA backend's router matmul, router (softmax and
#     sigmoid top-k), grouped expert GEMV (per token and per slot inputs, 1 to 300 tokens,
#     8 to 512 experts, skewed routes), the grouped tensor-core GEMM (`gemm::grouped`, the
#     Q4_K and Q6_K cases again with every step forced onto it) and combine against their CPU
#     twins; then (`--speed`, left out with SKIP_SPEED=1) one layer's expert matmuls at
#     the Qwen3-30B-A3B shape on the grouped GEMV and on the grouped GEMM, 32-1024 tokens;
#  2. whole-model parity: `cuda_parity check` (CUDA logits vs the CPU engine and an F32
#     reference, greedy tokens, batched decode) on tiny synthetic qwen3moe and Mixtral
#     models (`smelt synth --shape qwen3moe-tiny|mixtral-tiny`, Q8_0 and Q4_K), the Q4_K
#     ones also with every expert matmul on the grouped GEMM (SMELT_CUDA_MOE_GEMM_MIN=0);
#  3. speed: `smelt synth --shape qwen3-30b-a3b --quant q4_k`, then llama.cpp (built here
#     from the carried sdist, ../shared/peer) and smelt on that same file: pp512, tg128 and
#     32 sequences' aggregate decode; smelt's pp512 twice: as by default (expert matmuls on
#     the grouped GEMV: the grouped GEMM stays off until this script has measured it) and
#     with the grouped GEMM at 16+ slots an expert (SMELT_CUDA_MOE_GEMM_MIN=16, or
#     MOE_GEMM_MIN=n to try another rule).
#
# What it prints last: a table of PASS/FAIL rows (gpu_ops's moe ops, "grouped gemm" and "moe
# block gemm" among them; cuda_parity per tiny model, plain and "grouped GEMM everywhere"),
# then llama.cpp vs smelt rows (pp512 on the GEMV and on the grouped GEMM, tg128, 32
# sequences), then `gpu_ops perf -o moe`'s per-layer table (tokens, slots an expert, grouped GEMV us,
# grouped GEMM us, GEMM/GEMV): the data to set the default of SMELT_CUDA_MOE_GEMM_MIN
# (CudaOptions::moe_gemm_min_per_expert) from.
#
# Here:  bash bench/gpu/moe.sh pack     (release build, stripped gzipped binaries into the
#        git-ignored .gpu-moe/, and .peer/ through ../shared/peer/prepare.sh when missing)
# There: bash bench/gpu/moe.sh          carry [".gpu-moe", ".peer"]   (about 10 minutes;
#        SKIP_SPEED=1: parity only, about 1 minute; the 32-sequence rows are left out when
#        more than BATCH_AFTER_S seconds (default 390) have gone by then)
# Log: $OUT/moe.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  set -e
  cargo build --release -p smelt --bin smelt -p smelt-engine --example cuda_parity -p smelt-kernels --example gpu_ops
  t=${CARGO_TARGET_DIR:-target}/release
  mkdir -p .gpu-moe
  for b in "$t/smelt" "$t/examples/cuda_parity" "$t/examples/gpu_ops"; do
    strip -o "/tmp/$(basename "$b")" "$b"
    gzip -9 -c "/tmp/$(basename "$b")" > ".gpu-moe/$(basename "$b").gz"
  done
  [ -s .peer/llcpp.tgz ] || bash ../shared/peer/prepare.sh .peer
  du -sh .gpu-moe .peer
  exit 0
fi
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/moe.log"
table="$out/moe-table.md"
B=/tmp/moe-bin
mkdir -p $B
for b in smelt cuda_parity gpu_ops; do
  gunzip -c .gpu-moe/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > "$table"
echo "|---|---|" >> "$table"
M=/tmp/moe-q30.gguf
if [ "${SKIP_SPEED:-0}" != 1 ]; then
  # CPU work first, in the background, while the GPU checks run.
  (bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/moe-llbuild.log 2>&1; echo "llama.cpp build rc=$?" >> /tmp/moe-llbuild.log) &
  llpid=$!
  ($B/smelt synth --shape qwen3-30b-a3b --quant q4_k -o $M > /tmp/moe-synth.log 2>&1; echo "synth rc=$?" >> /tmp/moe-synth.log) &
  synpid=$!
fi

echo "== 1. op parity (gpu_ops -o moe)" | tee -a "$log"
$B/gpu_ops -o moe 2>&1 | tee -a "$log" > /tmp/moe-check.out && r=PASS || r=FAIL
echo "| MoE ops vs CPU twins (gpu_ops -o moe) | $r |" >> "$table"
sed -n '/^== summary/,$p' /tmp/moe-check.out | grep "^|" | sed 's/^/    /' >> "$table"
if [ "${SKIP_SPEED:-0}" != 1 ]; then
  $B/gpu_ops perf -o moe 2>&1 | tee -a "$log" > /tmp/moe-perf.out
  moe_speed=$(sed -n '/^== perf/,/^== seconds/p' /tmp/moe-perf.out | grep -v "^== seconds")
fi

echo "== 2. whole-model parity (cuda_parity)" | tee -a "$log"
models=()
for shape in qwen3moe-tiny mixtral-tiny; do
  for q in q8_0 q4_k; do
    f=/tmp/moe-$shape-$q.gguf
    if $B/smelt synth --shape $shape --quant $q -o $f >> "$log" 2>&1; then
      models+=("$f")
    else
      echo "| synth $shape $q | FAIL |" >> "$table"
    fi
  done
done
for f in "${models[@]}"; do
  $B/cuda_parity check "$f" 2>&1 | tee -a "$log" > /tmp/moe-parity.out
  grep -q "^parity: PASS" /tmp/moe-parity.out && r=PASS || r=FAIL
  echo "| cuda_parity $(basename "$f" .gguf) | $r |" >> "$table"
  case "$f" in
    *q4_k*)
      echo "-- $(basename "$f") with every expert matmul on the grouped GEMM" | tee -a "$log"
      SMELT_CUDA_MOE_GEMM_MIN=0 $B/cuda_parity check "$f" 2>&1 | tee -a "$log" > /tmp/moe-parity.out
      grep -q "^parity: PASS" /tmp/moe-parity.out && r=PASS || r=FAIL
      echo "| cuda_parity $(basename "$f" .gguf), grouped GEMM everywhere | $r |" >> "$table"
      ;;
  esac
done

if [ "${SKIP_SPEED:-0}" != 1 ]; then
  echo "== 3. speed, qwen3-30b-a3b Q4_K" | tee -a "$log"
  wait $synpid; cat /tmp/moe-synth.log | tail -3 | tee -a "$log"
  wait $llpid; tail -5 /tmp/moe-llbuild.log | tee -a "$log"
  export PYTHONPATH=/tmp/site
  echo "| work (qwen3-30b-a3b Q4_K) | llama.cpp | smelt | ratio |" >> "$table"
  echo "|---|---:|---:|---:|" >> "$table"
  row() {
    local r
    r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
    echo "| $1 | $2 | $3 | $r |" >> "$table"
  }
  js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
  lc=$(python3 .peer/llamacpp_bench.py $M 512 128 3 2>>"$log" | tee -a "$log" | grep RESULT)
  lc_pp=$(echo "$lc" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')
  lc_tg=$(echo "$lc" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
  r=$($B/smelt bench --model $M --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  row "pp512 (tok/s), experts on the grouped GEMV (default)" "$lc_pp" "$(echo "$r" | js prompt_tok_s)"
  row "tg128 (tok/s)" "$lc_tg" "$(echo "$r" | js decode_tok_s)"
  # The grouped GEMM (off by default until measured) at its first rule: 16+ slots an
  # expert (gemm::grouped::MIN_PER_EXPERT; a 512-token prompt of this shape has 32).
  r=$(SMELT_CUDA_MOE_GEMM_MIN=${MOE_GEMM_MIN:-16} $B/smelt bench --model $M --device cuda --prompt 512 --gen 4 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  row "pp512 (tok/s), grouped GEMM (SMELT_CUDA_MOE_GEMM_MIN=${MOE_GEMM_MIN:-16})" "$lc_pp" "$(echo "$r" | js prompt_tok_s)"
  if [ "$SECONDS" -lt "${BATCH_AFTER_S:-390}" ]; then
    lcb=$(python3 .peer/llamacpp_batched.py $M 32 128 64 2>>"$log" | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
    r=$($B/smelt bench --model $M --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 --json 2>>"$log"); echo "$r" >> "$log"
    row "32 sequences, aggregate decode (tok/s)" "$lcb" "$(echo "$r" | js batch_decode_tok_s)"
  else
    echo "| 32 sequences | left out: ${SECONDS} s gone by | | |" >> "$table"
  fi
  if [ "${PROFILE:-0}" = 1 ]; then
    SMELT_CUDA_PROFILE=1 $B/smelt bench --model $M --device cuda --prompt 16 --gen 32 --reps 1 >> "$log" 2>&1 || true
  fi
fi
if [ -n "${moe_speed:-}" ]; then
  echo "" >> "$table"
  echo "$moe_speed" >> "$table"
fi
echo "== table" | tee -a "$log"
cat "$table" | tee -a "$log"
