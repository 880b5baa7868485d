#!/usr/bin/env bash
# Tensor parallelism for the hybrids (issues 16 and 19: Qwen3.5/3.6 `qwen35`, `qwen35moe` and
# `qwen3next`, Gated DeltaNet heads and their recurrent state split over the GPUs) in ONE
# device call on a 2- or 4-GPU machine (about 4-5 minutes on nvidia-h100-x4):
#  a. correctness, tp_check: greedy 32 steps at TP=1 (one GPU, and the sharded path --tp 1),
#     TP=2 and (4 GPUs) TP=4, against one GPU, and the CPU whole model and its 2 and 4
#     simulated ranks (max |dlogit| at the prompt's end vs the CPU), on tiny synthetic Q8_0
#     qwen35, qwen35moe and qwen3next models with 4 key / 8 value delta-net heads
#     (`smelt synth --delta-heads 4,8`, so 4 ranks get one key head each); a 40-token prompt
#     (token-by-token delta rule) and a 300-token one (the chunked prompt kernels, from 256
#     tokens); then the shapes' own 2 key heads at TP=2, and one row with the peer
#     all-reduce (SMELT_TP_PEER=1) beside NCCL (the other rows);
#  b. batching: `smelt bench --batch 4` on qwen3next-tiny at TP=2 (4 sequences' states on
#     every rank, decode graphs): runs, rc=0;
#  c. speed, Qwen3.6-27B-shape Q4_K (`smelt synth --shape qwen3.6-27b --quant q4_k`: 14.4 GiB
#     on disk, 16 key / 48 value delta-net heads of 128, 8 and 4 key heads a rank): pp512 and
#     tg128 at TP=1 (one GPU), TP=2 and TP=4, with the all-reduce time per token.
# NCCL_NVLS_ENABLE=0 stays set. Every GPU command runs under `timeout`.
#
# Here (once):  bash bench/gpu/tp_hybrid.sh prep
#   builds smelt and the tp_check example (release), strips and xz's them into .gpu-tphyb/.
# There:  bash bench/gpu/tp_hybrid.sh      carry [".gpu-tphyb"]    kind nvidia-h100-x4 (or -x2)
#   SKIP_27B=1 leaves c out (about 2 minutes then). PROFILE=1 (about 2 minutes): only the
#   27B, tg128 at TP=1, TP=2 and TP=4 with the peer all-reduce, then where a decode step's
#   time goes (SMELT_CUDA_PROFILE=1: GPU time per kernel) at TP=1 and TP=2, into the log
#   and its per-kernel tops into the table.
# What it must print: tp_check rc=0 for every row, with "yes" in every tp/cpu-tp row of each
# model (tokens equal to one GPU's) and small vs-cpu numbers; the batch row rc=0; the 27B
# table (tok/s, x TP=1). Log: $OUT/tp-hybrid.log; the table last (also $OUT/tp-hybrid-table.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = prep ]; then
  set -e
  T=${CARGO_TARGET_DIR:-target}
  CARGO_INCREMENTAL=0 nice -n 10 cargo build --release -p smelt --bin smelt \
    -p smelt-engine --example tp_check
  mkdir -p .gpu-tphyb
  for f in smelt examples/tp_check; do
    b=$(basename $f)
    strip -o /tmp/$b.stripped "$T/release/$f"
    xz -9e -T2 -c /tmp/$b.stripped > .gpu-tphyb/$b.xz
    rm -f /tmp/$b.stripped
  done
  ls -la .gpu-tphyb; du -sh .gpu-tphyb
  exit 0
fi

out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/tp-hybrid.log"
table="$out/tp-hybrid-table.md"
export NCCL_NVLS_ENABLE=0
# Rows run NCCL unless they say otherwise (the peer row sets it).
export SMELT_TP_PEER=0
t() { echo "$*" | tee -a "$table"; }
: > "$table"
xzcat_py() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2"; }
for f in smelt tp_check; do xzcat_py .gpu-tphyb/$f.xz /tmp/$f; chmod +x /tmp/$f; done
S=/tmp/smelt
G=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$G" -ge 4 ]; then SIZES="2 4"; GPUS=0,1,2,3; else SIZES="2"; GPUS=0,1; fi
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
  nproc; df -h /tmp | tail -1; free -g | head -2; } | tee "$log"
t "GPUs: $G x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); TP sizes: 1 $SIZES"

# smelt finds NCCL itself; where it does not, PyTorch's (as bench/gpu/tp.sh).
if [ -z "${SMELT_NCCL:-}" ]; then
  nccl=$(python3 - <<'PY'
import glob, os, site
for sp in site.getsitepackages():
    for d in glob.glob(os.path.join(sp, "nvidia", "nccl", "lib", "libnccl.so.2")):
        print(d); raise SystemExit
PY
)
  [ -n "$nccl" ] && export SMELT_NCCL=$nccl
fi
echo "SMELT_NCCL=${SMELT_NCCL:-unset: smelt searches}" | tee -a "$log"

fails=0
PROFILE=${PROFILE:-0}
if [ "$PROFILE" != 1 ]; then
echo "== a. correctness" | tee -a "$log"
check() { # name file [extra args...]
  local name=$1 f=$2; shift 2
  echo "-- $name" | tee -a "$table" >> "$log"
  timeout 150 /tmp/tp_check $f --gpus $GPUS --steps 32 "$@" > /tmp/tc.out 2>>"$log"
  local rc=$?; cat /tmp/tc.out >> "$log"
  grep '^|' /tmp/tc.out | grep -v '^|---' | grep -v '^| run' >> "$table"
  grep 'FAIL' /tmp/tc.out | tee -a "$table" > /dev/null
  [ $rc = 0 ] || fails=$((fails + 1))
  t "tp_check rc=$rc"
}
t "| run | tokens = one GPU's | first divergence | ref logit gap there | max dlogit vs cpu | ms/token |"
t "|---|---|---|---|---|---|"
for m in qwen35 qwen35moe qwen3next; do
  $S synth --shape $m-tiny --quant q8_0 --delta-heads 4,8 -o /tmp/$m-k4.gguf >> "$log" 2>&1 || t "synth $m-tiny failed"
  $S synth --shape $m-tiny --quant q8_0 -o /tmp/$m-k2.gguf >> "$log" 2>&1 || t "synth $m-tiny (2 key heads) failed"
  check "$m-tiny q8_0, 4 key heads, 40-token prompt" /tmp/$m-k4.gguf --ranks ${SIZES// /,} --prompt 40 --cpu
  check "$m-tiny q8_0, 4 key heads, 300-token prompt (chunked kernels)" /tmp/$m-k4.gguf --ranks ${SIZES// /,} --prompt 300 --cpu
  check "$m-tiny q8_0, its own 2 key heads, TP=2, 40-token prompt" /tmp/$m-k2.gguf --ranks 2 --prompt 40
done
SMELT_TP_PEER=1 check "qwen35moe-tiny q8_0, 4 key heads, peer all-reduce, 300-token prompt" /tmp/qwen35moe-k4.gguf --ranks ${SIZES// /,} --prompt 300

echo "== b. batching" | tee -a "$log"
timeout 120 $S bench --model /tmp/qwen3next-k4.gguf --device cuda:0,1 --tp 2 --batch 4 --prompt 64 --gen 32 --reps 1 >> "$log" 2>&1
rc=$?; [ $rc = 0 ] || fails=$((fails + 1))
t "smelt bench --batch 4 qwen3next-tiny tp=2: rc=$rc"
fi

if [ "${SKIP_27B:-0}" != 1 ]; then
  echo "== c. speed, Qwen3.6-27B-shape Q4_K ($SECONDS s)" | tee -a "$log"
  m27=/tmp/qwen3.6-27b-q4_k.gguf
  ts=$SECONDS
  timeout 200 $S synth --shape qwen3.6-27b --quant q4_k -o $m27 >> "$log" 2>&1
  rc=$?
  t ""
  t "27B synth: rc=$rc, $(du -h $m27 2>/dev/null | cut -f1) in $((SECONDS - ts)) s"
  js() { grep -o "\"$1\":[0-9.e-]*" | head -1 | cut -d: -f2; }
  jq_s() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx\n", a / b; else print "-" }'; }
  row() { # name args
    local name=$1 a=$2 r pp tg
    r=$(timeout 150 $S bench --model $m27 $a --prompt 512 --gen 128 --reps 2 --json 2>>"$log" | tr -d '\n')
    echo "$name: $r" >> "$log"
    pp=$(echo "$r" | js prompt_tok_s); tg=$(echo "$r" | js decode_tok_s)
    if [ "$name" = tp1 ]; then pp0=$pp; tg0=$tg; fi
    t "| $name | ${pp%.*} | ${tg%.*} | $(echo "$r" | js decode_ms_per_token | cut -c1-5) | $(echo "$r" | jq_s all_reduce) | $(echo "$r" | js all_reduce_ms_per_step | cut -c1-5) | pp $(ratio "$pp" "${pp0:-}") tg $(ratio "$tg" "${tg0:-}") |"
  }
  if [ $rc = 0 ]; then
    t "| qwen3.6-27b q4_k | pp512 tok/s | tg128 tok/s | ms/token | all-reduce | ms a token in all-reduce | vs TP=1 |"
    t "|---|---:|---:|---:|---|---:|---|"
    pp0=; tg0=
    row tp1 "--device cuda:0"
    for n in $SIZES; do
      d=cuda:$(seq -s, 0 $((n - 1)))
      [ "$PROFILE" = 1 ] || row tp$n-nccl "--device $d --tp $n"
      { [ $n = 2 ] || [ "$PROFILE" = 1 ]; } && SMELT_TP_PEER=1 row tp$n-peer "--device $d --tp $n"
    done
    if [ "$PROFILE" = 1 ]; then
      for a in "--device cuda:0" "--device cuda:0,1 --tp 2"; do
        echo "== profile: $a" | tee -a "$log" > /tmp/prof.out
        SMELT_TP_PEER=1 SMELT_CUDA_PROFILE=1 timeout 120 $S bench --model $m27 $a --prompt 64 --gen 16 --reps 1 >> /tmp/prof.out 2>&1
        cat /tmp/prof.out >> "$log"
        t ""; t "profile $a (last 50 lines: the per-kernel tables, printed as each rank ends)"; tail -50 /tmp/prof.out >> "$table"
      done
    fi
  fi
  rm -f $m27
fi
t "failed checks: $fails; wall: $SECONDS s"
echo "== table" | tee -a "$log"
cat "$table"
