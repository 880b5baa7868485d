#!/usr/bin/env bash
# The hybrid and MoE models on the GPU (issue 16: Qwen3.5/3.6 and Qwen3-Next, Gated DeltaNet
# layers beside gated attention; Qwen3-30B-A3B), everything in one device call:
#  1. kernel parity: `gpu_ops -o delta` (then `gpu_ops perf -o delta`) runs the delta-net kernels (convolution + SiLU,
#     strided q/k L2 norm, the delta-rule step in both block shapes (32 state rows a block,
#     the engine's; a block a head, run 1's), the chunked prompt kernels (`delta_chunk`) over
#     ragged prompts of 1 to 512 tokens against the chunked and the token-by-token twins,
#     gated norm, column gather, split halves, sigmoid gate, the MoE router's f32 matmul)
#     against their CPU twins, then times the step kernels, the chunked kernels and the
#     router matmul (16-byte loads vs the first, scalar version) at the real shapes;
#  2. whole-model parity: `cuda_parity check` (CUDA logits vs the CPU engine and an F32
#     reference, greedy tokens, three sequences decoded together as one graph) on tiny
#     synthetic qwen35, qwen35moe and qwen3next models (Q8_0 and Q4_K; prompts of 32+
#     tokens take the chunked kernels), then two of them again with
#     SMELT_CUDA_DELTA_CHUNK_MIN=0 (every step chunked, decode rows as 1-token chunks);
#  3. speed, smelt alone while llama.cpp builds (from the carried sdist, ../shared/peer):
#     the Qwen3.6-27B hybrid's pp512 and tg128 with chunked prompts (the default) and token
#     by token (SMELT_CUDA_DELTA_CHUNK_MIN=100000); qwen3-30b-a3b's pp512 and tg128, then
#     one profiled run of it (SMELT_CUDA_PROFILE=1: GPU time per kernel of a decode step);
#     qwen3-next-80b-a3b's (about 45 GB in Q4_K, written once the 27B is deleted, in /tmp
#     or /dev/shm, wherever 48 GB are free);
#  4. llama.cpp on the 30B and the 80B files; then, when no more than LATER_BEFORE_S
#     (default 470) seconds are gone, on the 27B, written again.
#
# What it prints last: the PASS/FAIL rows (gpu_ops's; cuda_parity per tiny model), the
# kernel timings (step kernels, chunked kernels, router), the llama.cpp vs smelt rows per
# model, and the top of the 30B decode profile.
#
# Here:  bash bench/gpu/hybrid.sh pack   (release build, stripped gzipped binaries into the
#        git-ignored .gpu-dn/, and .peer/ through ../shared/peer/prepare.sh when missing)
# There: timeout 590 bash bench/gpu/hybrid.sh   carry [".gpu-dn", ".peer"]   (about 9
#        minutes; SKIP_SPEED=1: parity only, about 3 minutes; SKIP_80B=1: no 80B part)
# Log: $OUT/hybrid.log (or bench/out), the table in $OUT/hybrid-table.md, written as it goes.
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
speed="$out/hybrid-speed.md"
B=/tmp/hy-bin
mkdir -p $B
for b in smelt cuda_parity gpu_ops; do
  gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > "$table"
echo "|---|---|" >> "$table"
: > "$speed"
M27=/tmp/hy-qwen3.6-27b.gguf
M30=/tmp/hy-qwen3-30b-a3b.gguf
if [ "${SKIP_SPEED:-0}" != 1 ]; then
  # CPU work first, in the background, while the GPU checks run: the llama.cpp build
  # (its own small llama3-1b check included) and the two smaller big models.
  (bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/hy-llbuild.log 2>&1; echo "llama.cpp build rc=$? at ${SECONDS} s" >> /tmp/hy-llbuild.log) &
  llpid=$!
  (for s in qwen3.6-27b qwen3-30b-a3b; do
     t0=$SECONDS
     $B/smelt synth --shape $s --quant q4_k -o "/tmp/hy-$s.gguf" >> /tmp/hy-synth.log 2>&1
     echo "synth $s rc=$? in $((SECONDS - t0)) s" >> /tmp/hy-synth.log
   done) &
  synpid=$!
fi

echo "== 1. kernel parity (gpu_ops -o delta)" | tee -a "$log"
timeout 240 $B/gpu_ops -o delta 2>&1 | tee -a "$log" > /tmp/hy-ops.out && r=PASS || r=FAIL
echo "| delta-net kernels + router matmul vs CPU twins (gpu_ops -o delta) | $r |" >> "$table"
grep "^| delta\|^| router" /tmp/hy-ops.out | grep -v "us / layer\|x [0-9]* |\| us |" | sed 's/^/    /' >> "$table"
timeout 240 $B/gpu_ops perf -o delta 2>&1 | tee -a "$log" > /tmp/hy-ops-perf.out
kernel_speed=$(grep "^| delta step\|^| delta chunked\|^| router f32 matmul, 1 token\|^| qwen3\|^| shared-expert\|^|---|---|---:|" /tmp/hy-ops-perf.out | grep -v "| [0-9]* | [0-9.e-]* |")

echo "== 2. whole-model parity (cuda_parity)" | tee -a "$log"
parity() { # shape quant [env]
  local f=/tmp/hy-$1-$2.gguf tag="$1 $2${3:+ ($3)}"
  if [ ! -s "$f" ] && ! $B/smelt synth --shape $1 --quant $2 -o $f >> "$log" 2>&1; then
    echo "| synth $1 $2 | FAIL |" >> "$table"
    return
  fi
  env ${3:-} timeout 120 $B/cuda_parity check "$f" 2>&1 | tee -a "$log" > /tmp/hy-parity.out
  grep -q "^parity: PASS" /tmp/hy-parity.out && r=PASS || r=FAIL
  echo "| cuda_parity $tag | $r |" >> "$table"
}
for shape in qwen35-tiny qwen35moe-tiny qwen3next-tiny; do
  for q in q8_0 q4_k; do
    parity $shape $q
  done
done
parity qwen35-tiny q8_0 SMELT_CUDA_DELTA_CHUNK_MIN=0
parity qwen3next-tiny q4_k SMELT_CUDA_DELTA_CHUNK_MIN=0
# The CLI's path on a tiny model: prompts, then four sequences decoded together (graphs).
if timeout 60 $B/smelt bench --model /tmp/hy-qwen3next-tiny-q8_0.gguf --device cuda --prompt 40 --gen 16 --reps 1 --batch 4 >> "$log" 2>&1; then
  echo "| smelt bench --device cuda --batch 4 (qwen3next-tiny) | PASS |" >> "$table"
else
  echo "| smelt bench --device cuda --batch 4 (qwen3next-tiny) | FAIL (see log) |" >> "$table"
fi
rm -f /tmp/hy-*-tiny-*.gguf
echo "parity done at ${SECONDS} s" | tee -a "$log"

if [ "${SKIP_SPEED:-0}" != 1 ]; then
  js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
  row() { # label llama.cpp smelt
    local r
    r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
    echo "| $1 | $2 | $3 | $r |" >> "$speed"
  }
  sbench() { # model [env] -> json line
    env ${2:-} timeout 150 $B/smelt bench --model "$1" --device cuda --prompt 512 --gen 128 --reps 2 --json 2>>"$log" | tee -a "$log"
  }
  lbench() { # model reps -> "pp tg"
    local l
    l=$(timeout 150 python3 .peer/llamacpp_bench.py "$1" 512 128 "$2" 2>>"$log" | tee -a "$log" | grep RESULT)
    echo "$(echo "$l" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p') $(echo "$l" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')"
  }
  wait $synpid
  cat /tmp/hy-synth.log | tee -a "$log"
  echo "== 3. smelt alone at ${SECONDS} s" | tee -a "$log"
  s27c=""; s27t=""; s30=""; s80=""
  if [ -s $M27 ]; then
    s27c=$(sbench $M27)
    s27t=$(sbench $M27 SMELT_CUDA_DELTA_CHUNK_MIN=100000)
  fi
  rm -f $M27
  if [ -s $M30 ]; then
    s30=$(sbench $M30)
    SMELT_CUDA_PROFILE=1 timeout 120 $B/smelt bench --model $M30 --device cuda --prompt 16 --gen 32 --reps 1 > /tmp/hy-prof.out 2>&1
    cat /tmp/hy-prof.out >> "$log"
  fi
  # The 80B (about 45 GB) where there is room for it beside the 30B: /tmp, else /dev/shm.
  M80=""
  if [ "${SKIP_80B:-0}" != 1 ]; then
    for d in /tmp /dev/shm; do
      avail=$(df -k --output=avail "$d" 2>/dev/null | tail -1)
      echo "free in $d: $((${avail:-0} / 1048576)) GiB" | tee -a "$log"
      if [ "${avail:-0}" -gt $((48 * 1048576)) ]; then M80=$d/hy-qwen3-next-80b-a3b.gguf; break; fi
    done
  fi
  if [ -n "$M80" ]; then
    t0=$SECONDS
    $B/smelt synth --shape qwen3-next-80b-a3b --quant q4_k -o $M80 >> "$log" 2>&1
    echo "synth qwen3-next-80b-a3b into $M80 rc=$? in $((SECONDS - t0)) s" | tee -a "$log"
    [ -s "$M80" ] && s80=$(timeout 150 $B/smelt bench --model $M80 --device cuda --prompt 512 --gen 128 --reps 1 --json 2>>"$log" | tee -a "$log")
  fi
  echo "smelt alone done at ${SECONDS} s" | tee -a "$log"
  export PYTHONPATH=/tmp/site
  wait $llpid; tail -3 /tmp/hy-llbuild.log | tee -a "$log"
  echo "== 4. llama.cpp at ${SECONDS} s" | tee -a "$log"
  echo "| work (Q4_K, \`smelt synth\`) | llama.cpp | smelt | ratio |" >> "$speed"
  echo "|---|---:|---:|---:|" >> "$speed"
  if [ -s $M30 ]; then
    read -r lpp ltg <<< "$(lbench $M30 2)"
    row "qwen3-30b-a3b pp512" "$lpp" "$(echo "$s30" | js prompt_tok_s)"
    row "qwen3-30b-a3b tg128" "$ltg" "$(echo "$s30" | js decode_tok_s)"
  else
    echo "| qwen3-30b-a3b | synth failed | | |" >> "$speed"
  fi
  rm -f $M30
  if [ -n "$M80" ] && [ -s "$M80" ]; then
    read -r lpp ltg <<< "$(lbench $M80 1)"
    row "qwen3-next-80b-a3b pp512" "$lpp" "$(echo "$s80" | js prompt_tok_s)"
    row "qwen3-next-80b-a3b tg128" "$ltg" "$(echo "$s80" | js decode_tok_s)"
  else
    echo "| qwen3-next-80b-a3b | left out (SKIP_80B=1, no room, or synth failed: see log) | | |" >> "$speed"
  fi
  [ -n "$M80" ] && rm -f "$M80"
  # llama.cpp on the 27B last, when time is left (the file is written again: it made room
  # for the 80B).
  lpp=""; ltg=""
  if [ "$SECONDS" -lt "${LATER_BEFORE_S:-470}" ]; then
    $B/smelt synth --shape qwen3.6-27b --quant q4_k -o $M27 >> "$log" 2>&1
    [ -s $M27 ] && read -r lpp ltg <<< "$(lbench $M27 1)"
    rm -f $M27
  else
    echo "llama.cpp on the 27B left out: ${SECONDS} s gone by" | tee -a "$log"
  fi
  row "qwen3.6-27b pp512, chunked prompt (default)" "$lpp" "$(echo "$s27c" | js prompt_tok_s)"
  row "qwen3.6-27b pp512, token by token (SMELT_CUDA_DELTA_CHUNK_MIN=100000)" "$lpp" "$(echo "$s27t" | js prompt_tok_s)"
  row "qwen3.6-27b tg128 (chunked-prompt run)" "$ltg" "$(echo "$s27c" | js decode_tok_s)"
  row "qwen3.6-27b tg128 (token-by-token run)" "$ltg" "$(echo "$s27t" | js decode_tok_s)"
  echo "speed done at ${SECONDS} s" | tee -a "$log"
fi
echo "== table (${SECONDS} s)" | tee -a "$log"
{
  cat "$table"
  echo
  [ -n "${kernel_speed:-}" ] && echo "$kernel_speed"
  echo
  cat "$speed"
  if [ -s /tmp/hy-prof.out ]; then
    echo
    echo "qwen3-30b-a3b decode profile (SMELT_CUDA_PROFILE=1, top 24):"
    grep -A26 "^PROFILE:" /tmp/hy-prof.out | head -27
  fi
} > "$out/hybrid-final.md"
cat "$out/hybrid-final.md" | tee -a "$log"
