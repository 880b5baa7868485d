#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (issue 19), in one device call:
#  0. NCCL: where it loads from, communicator init, all-reduce sums and latency (8 KB..1 MB);
#  a. correctness: a tiny peaked-logits Llama (q8_0 and f16) greedy for 32 steps on one GPU,
#     through the sharded path on one GPU (--tp 1), on 2 GPUs (--tp 2), on the CPU and on
#     2 simulated CPU ranks: first divergence, logit gap, logits vs the CPU; then the same
#     for the Llama-3-8B-shape Q4_K (random weights: ties are possible, gaps are reported);
#  b. speed, Llama-3-8B-shape Q4_K: single-stream decode (tg128), prompt (pp512) and 32
#     sequences batched, at TP=1 (plain), --tp 1 and --tp 2, with the all-reduce time;
#  c. (MODE=full or peer, with .peer carried) llama.cpp on the same file: split none,
#     layer, row (built first, before any timing, so the build does not share the CPU).
# MODE=peer is the second run: 0, then b and c only (plain and --tp 2, single stream, 32
# sequences, --tp 2 with NCCL_PROTO=LL, and --tp 2 with SMELT_TP_SKIP_ALLREDUCE=1: the step
# without communication, a timing ablation; then a TP=2 decode timeline), no correctness
# part (run 1 had it). NO_LLAMA=1 leaves llama.cpp out (about 3 minutes less).
# MODE=ar (issue 19's custom all-reduce, ~6 minutes with llama.cpp): 0 with the peer
# all-reduce probe (sums vs the CPU twin and NCCL, latency peer vs NCCL at 8 KB..4 MB, one by
# one and from a graph); then llama.cpp's build starts in the background (niced) while the
# greedy checks run (tiny q8_0 with the CPU, Llama-3-8B-shape Q4_K: TP=2 vs TP=1 tokens, peer
# all-reduce on); then, build done, decode tg128 and pp512 at TP=1, TP=2 over NCCL only
# and TP=2 with the peer all-reduce (SMELT_TP_PEER=1: off by default until this run has
# checked and timed it); then llama.cpp none/layer/row. Not run yet (no device time was
# left in the session that wrote it): the first run of it is the first GPU check of the
# peer all-reduce. What it must print: ARPROBE lines with "sum vs twin exact , 40 calls
# exact" at every size (else the peer path is wrong: keep it off), peer vs NCCL latency
# per size (the size table `allreduce::default_max_bytes` should end where peer stops
# winning), tp_check rc=0 with "tp2 | yes" rows, and tp2-peer's tg128 above tp2-nccl's.
# Every GPU command runs under `timeout` (a rank waiting for a peer that failed spins).
#
# Here:  CARGO_TARGET_DIR=T cargo build --release -p smelt --bin smelt
#        CARGO_TARGET_DIR=T cargo build --release -p smelt-engine --example tp_check
#        mkdir -p .gpu-tp; strip+gzip both into .gpu-tp/ (smelt.gz, tp_check.gz), or
#        strip+`xz -9e` (smelt.xz, tp_check.xz: 5.7 MB, for MODE=ar beside the 50 MB .peer)
#        for MODE=full and MODE=ar also: ../shared/peer/prepare.sh .peer (50 MB)
# There: MODE=ar    bash bench/gpu/tp.sh   carry [".gpu-tp", ".peer"]   (~6 minutes)
#        MODE=quick bash bench/gpu/tp.sh   carry [".gpu-tp"]            (~3 minutes: 0, a,
#                                           and b's single-stream runs)
#        MODE=full  bash bench/gpu/tp.sh   carry [".gpu-tp", ".peer"]   (~9 minutes)
# Log: $OUT/tp.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/tp.log"
table="$out/tp-table.md"
mode=${MODE:-quick}
export NCCL_NVLS_ENABLE=0
for f in smelt tp_check; do
  # xz where the carry is tight (python's lzma, in case the machine has no xz), else gzip.
  if [ -f .gpu-tp/$f.xz ]; then
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .gpu-tp/$f.xz /tmp/$f
  else
    gunzip -c .gpu-tp/$f.gz > /tmp/$f
  fi
  chmod +x /tmp/$f
done
S=/tmp/smelt
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
  nvidia-smi topo -m 2>/dev/null | head -4 || true; } | tee "$log"
: > "$table"
t() { echo "$*" | tee -a "$table"; }

# MODE=ar (see the header). Defined before use; everything it prints to the table ends
# the log.
ar_mode() {
  grep -h "ARPROBE" "$log" | tee -a "$table" > /dev/null
  m=/tmp/llama3-8b-q4_k.gguf
  repo=$(pwd)
  if [ -d .peer ] && [ "${NO_LLAMA:-0}" != 1 ]; then
    echo "== c0. llama.cpp build (background, niced)" | tee -a "$log"
    ( cd /tmp && tar xzf "$repo/.peer/llcpp.tgz" &&
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$repo"/.peer/*.whl &&
      CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-28} \
      nice -n 19 python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/site ./llama_cpp_python-*/ ) \
      > /tmp/llbuild.log 2>&1 && touch /tmp/llama-built &
    llpid=$!
  fi
  echo "== a. greedy: tiny q8_0 (with the CPU), Llama-3-8B-shape Q4_K" | tee -a "$log"
  $S synth --shape llama3-tiny --quant q8_0 --layers 4 -o /tmp/tiny-q8_0.gguf >> "$log" 2>&1
  $S synth --shape llama3-8b --quant q4_k -o $m >> "$log" 2>&1 || echo "synth failed" | tee -a "$table"
  for f in /tmp/tiny-q8_0.gguf $m; do
    extra=; [ $f = /tmp/tiny-q8_0.gguf ] && extra=--cpu
    echo "-- $(basename $f) greedy 32 steps (peer all-reduce on)" | tee -a "$table"
    SMELT_TP_PEER=1 timeout 240 /tmp/tp_check $f --gpus 0,1 --steps 32 --prompt 40 $extra > /tmp/tc.out 2>>"$log"
    rc=$?; cat /tmp/tc.out >> "$log"
    grep '^|' /tmp/tc.out >> "$table"; grep 'FAIL' /tmp/tc.out | tee -a "$table"
    echo "tp_check rc=$rc" | tee -a "$table"
  done
  if [ -n "${llpid:-}" ]; then
    echo "== waiting for the llama.cpp build" | tee -a "$log"
    wait $llpid; tail -3 /tmp/llbuild.log >> "$log"
  fi
  echo "== b. speed, Llama-3-8B-shape Q4_K" | tee -a "$log"
  js() { grep -o "\"$1\":[0-9.e-]*" | head -1 | cut -d: -f2; }
  jq_s() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
  t ""
  t "| llama3-8b q4_k | pp512 tok/s | tg128 tok/s | all-reduce | all-reduce us (1 token) | ms/step in all-reduce | vs TP=1 |"
  t "|---|---:|---:|---|---:|---:|---|"
  for cfg in "tp1|--device cuda:0|" "tp2-nccl|--device cuda:0,1 --tp 2|" "tp2-peer|--device cuda:0,1 --tp 2|1"; do
    name=${cfg%%|*}; rest=${cfg#*|}; a=${rest%%|*}; peer=${rest#*|}
    if [ -n "$peer" ]; then export SMELT_TP_PEER=1; else unset SMELT_TP_PEER; fi
    r1=$(timeout 150 $S bench --model $m $a --prompt 512 --gen 128 --reps 3 --json 2>>"$log" | tr -d '\n')
    echo "$name: $r1" >> "$log"
    pp=$(echo "$r1" | js prompt_tok_s); tg=$(echo "$r1" | js decode_tok_s)
    [ "$name" = tp1 ] && { pp0=$pp; tg0=$tg; }
    ratio=$(python3 -c "
def r(a, b):
    try: return f'{float(a)/float(b):.2f}x'
    except Exception: return '-'
print('pp', r('$pp', '${pp0:-}'), 'tg', r('$tg', '${tg0:-}'))")
    t "| $name | ${pp%.*} | ${tg%.*} | $(echo "$r1" | jq_s all_reduce) | $(echo "$r1" | js all_reduce_us) | $(echo "$r1" | js all_reduce_ms_per_step) | $ratio |"
  done
  unset SMELT_TP_PEER
  if [ -f /tmp/llama-built ]; then
    echo "== c. llama.cpp on the same file" | tee -a "$log"
    export PYTHONPATH=/tmp/site
    t ""
    t "| llama.cpp split | pp512 tok/s | tg128 tok/s |"
    t "|---|---:|---:|"
    for sm in none layer row; do
      r=$(timeout 120 python3 bench/gpu/tp_llamacpp.py $m $sm 512 128 3 2>>"$log" | grep RESULT); echo "$r" >> "$log"
      t "| $sm | $(echo "$r" | sed -n 's/.*pp512: \([0-9.]*\).*/\1/p') | $(echo "$r" | sed -n 's/.*tg128: \([0-9.]*\).*/\1/p') |"
    done
  elif [ -d .peer ] && [ "${NO_LLAMA:-0}" != 1 ]; then
    t "llama.cpp build failed (tail of its log above)"; tail -20 /tmp/llbuild.log >> "$log"
  fi
  echo "== table" | tee -a "$log"
  cat "$table" | tee -a "$log"
}

echo "== 0. NCCL (found by smelt's own search) and the peer all-reduce" | tee -a "$log"
timeout 200 /tmp/tp_check --nccl-probe --gpus 0,1 2>&1 | tee -a "$log"
if ! grep -q "NCCLPROBE loaded" "$log"; then
  # Not found on its own: point at PyTorch's copy and say so.
  lib=$(python3 - <<'PY'
import glob, importlib.util, os, site
c = []
try:
    s = importlib.util.find_spec("nvidia.nccl")
    c += [os.path.join(p, "lib", "libnccl.so.2") for p in (s.submodule_search_locations or [])]
except Exception:
    pass
for sp in site.getsitepackages():
    c += glob.glob(os.path.join(sp, "nvidia", "nccl", "lib", "libnccl.so.2"))
print(next((x for x in c if os.path.isfile(x)), ""))
PY
)
  echo "smelt's search found no NCCL; python says: ${lib:-nothing}" | tee -a "$log"
  export SMELT_NCCL=$lib
  timeout 200 /tmp/tp_check --nccl-probe --gpus 0,1 2>&1 | tee -a "$log"
fi
t "NCCL: $(grep -h 'NCCLPROBE loaded' "$log" | tail -1 | sed 's/NCCLPROBE //')"
grep -h "NCCLPROBE all-reduce" "$log" | sed 's/NCCLPROBE /NCCL /' >> "$table"
if [ "$mode" = ar ]; then
  ar_mode
  exit 0
fi

m=/tmp/llama3-8b-q4_k.gguf
if [ "$mode" != quick ] && [ -d .peer ] && [ "${NO_LLAMA:-0}" != 1 ]; then
  echo "== c0. llama.cpp build (before any timing)" | tee -a "$log"
  # The build of .peer/gpu-llamacpp.sh (about 3 minutes), without its own model and timing.
  repo=$(pwd)
  ( cd /tmp && tar xzf "$repo/.peer/llcpp.tgz" &&
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$repo"/.peer/*.whl &&
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-32} \
    python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/site ./llama_cpp_python-*/ ) \
    >> "$log" 2>&1 && touch /tmp/llama-built || echo "llama.cpp build failed" | tee -a "$table"
fi

if [ "$mode" != peer ]; then
echo "== a. correctness: tiny peaked Llama" | tee -a "$log"
for q in q8_0 q4_0; do
  $S synth --shape llama3-tiny --quant $q --layers 4 -o /tmp/tiny-$q.gguf >> "$log" 2>&1
  echo "-- llama3-tiny 4 layers $q" | tee -a "$log" "$table"
  /tmp/tp_check /tmp/tiny-$q.gguf --gpus 0,1 --steps 32 --prompt 40 --cpu > /tmp/tc.out 2>>"$log"
  rc=$?; cat /tmp/tc.out >> "$log"
  grep '^|' /tmp/tc.out >> "$table"; grep 'FAIL' /tmp/tc.out | tee -a "$table"
  echo "tp_check rc=$rc" | tee -a "$table"
done

fi

echo "== b. Llama-3-8B-shape Q4_K" | tee -a "$log"
$S synth --shape llama3-8b --quant q4_k -o $m >> "$log" 2>&1 || echo "synth failed" | tee -a "$table"
if [ "$mode" = full ]; then
  echo "-- llama3-8b q4_k greedy (random weights)" | tee -a "$table"
  /tmp/tp_check $m --gpus 0,1 --steps 32 --prompt 40 > /tmp/tc.out 2>>"$log"
  rc=$?; cat /tmp/tc.out >> "$log"; grep '^|' /tmp/tc.out >> "$table"; echo "tp_check rc=$rc" | tee -a "$table"
fi
js() { grep -o "\"$1\":[0-9.e-]*" | head -1 | cut -d: -f2; }
t ""
t "| llama3-8b q4_k | pp512 tok/s | tg128 tok/s | 32 seqs decode tok/s | all-reduce us (1 token) | all-reduce ms/step (1 token) | vs plain |"
t "|---|---:|---:|---:|---:|---:|---|"
cfgs=("plain:--device cuda:0" "tp1:--device cuda:0 --tp 1" "tp2:--device cuda:0,1 --tp 2")
[ "$mode" = peer ] && cfgs=("plain:--device cuda:0" "tp2:--device cuda:0,1 --tp 2" "tp2-LL:--device cuda:0,1 --tp 2" "tp2-no-allreduce:--device cuda:0,1 --tp 2")
for cfg in "${cfgs[@]}"; do
  name=${cfg%%:*}; a=${cfg#*:}
  if [ "$name" = tp2-LL ]; then export NCCL_PROTO=LL; else unset NCCL_PROTO; fi
  # Timing ablation: the step without communication (wrong outputs), what a faster
  # all-reduce could approach.
  if [ "$name" = tp2-no-allreduce ]; then export SMELT_TP_SKIP_ALLREDUCE=1; else unset SMELT_TP_SKIP_ALLREDUCE; fi
  r1=$($S bench --model $m $a --prompt 512 --gen 128 --reps 3 --json 2>>"$log" | tr -d '\n'); echo "$name single: $r1" >> "$log"
  r2=
  if [ "$mode" != quick ]; then
    r2=$($S bench --model $m $a --prompt 128 --gen 64 --reps 1 --batch 32 --json 2>>"$log" | tr -d '\n'); echo "$name batch32: $r2" >> "$log"
  fi
  pp=$(echo "$r1" | js prompt_tok_s); tg=$(echo "$r1" | js decode_tok_s); bt=$(echo "$r2" | js batch_decode_tok_s)
  [ "$name" = plain ] && { pp0=$pp; tg0=$tg; bt0=$bt; }
  ratio=$(python3 -c "
def r(a, b):
    try: return f'{float(a)/float(b):.2f}x'
    except Exception: return '-'
print('pp', r('$pp', '${pp0:-}'), 'tg', r('$tg', '${tg0:-}'), 'batch', r('$bt', '${bt0:-}'))")
  t "| $name | ${pp%.*} | ${tg%.*} | ${bt%.*} | $(echo "$r1" | js all_reduce_us) | $(echo "$r1" | js all_reduce_ms_per_step) | $ratio |"
done
unset NCCL_PROTO SMELT_TP_SKIP_ALLREDUCE
if [ "$mode" = peer ]; then
  # Where a TP=2 decode step's time goes (each rank's kernels; NCCL's are the gaps).
  SMELT_CUDA_TIMELINE=1 $S bench --model $m --device cuda:0,1 --tp 2 --prompt 64 --gen 64 --reps 1 > /tmp/tl.out 2>&1
  cat /tmp/tl.out >> "$log"
fi

if [ -f /tmp/llama-built ]; then
  echo "== c. llama.cpp on the same file" | tee -a "$log"
  export PYTHONPATH=/tmp/site
  t ""
  t "| llama.cpp split | pp512 tok/s | tg128 tok/s |"
  t "|---|---:|---:|"
  for sm in none layer row; do
    r=$(python3 bench/gpu/tp_llamacpp.py $m $sm 512 128 3 2>>"$log" | grep RESULT); echo "$r" >> "$log"
    t "| $sm | $(echo "$r" | sed -n 's/.*pp512: \([0-9.]*\).*/\1/p') | $(echo "$r" | sed -n 's/.*tg128: \([0-9.]*\).*/\1/p') |"
  done
fi
echo "== table" | tee -a "$log"
cat "$table" | tee -a "$log"
