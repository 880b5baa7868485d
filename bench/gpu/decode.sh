#!/usr/bin/env bash
# Whole-model decode on the GPU machine, in one device call: CUDA-vs-CPU parity on both
# real models, GEMV bandwidth, and decode speed on Llama-3-8B-shape Q4_K (optionally
# against llama.cpp built in the same call).
#
# Here (builds; no CUDA toolkit needed):
#   bench/gpu/decode.sh build     # smelt + cuda_parity stripped into .gpu-cuda/, and the two
#                                 # real models cut to fit the call's 64 MiB (first layers and
#                                 # first 8192 embedding rows, bytes as in the files)
#   ../shared/peer/prepare.sh .peer   # once, only for the peer run
# There (through the device tool, carry [".gpu-cuda"], or [".gpu-cuda/smelt", ".peer"] for
# the peer: its sources leave no room for the parity models):
#   bash bench/gpu/decode.sh run [--peer]
# Environment: GPU_DIR (the carry folder, default .gpu-cuda), PARITY_MODELS (files to check),
# SKIP_KERNELS=1, VARIANTS (VAR=value settings whose logits must be bit-equal to the
# default's and which are timed beside it; default: the SMELT_CUDA_PDL settings and
# SMELT_CUDA_ROPE_KV=0; commas join settings of one variant), SKIP_VARIANTS=1 (no fused-off / graphs-off rows), TIMED (settings
# timed beside the default without the digest check: they compute other bits), SMELT_NCU=1 (per-kernel GPU time of two decode steps through Nsight
# Compute). The run always ends with SMELT_CUDA_PROFILE's per-kernel table (no Nsight needed).
#
# Logs under $OUT (or bench/out): decode.log; table last.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-run}" in
  build)
    cargo build --release -p smelt --bin smelt
    cargo build --release -p smelt-engine --example cuda_parity
    B=${GPU_DIR:-.gpu-cuda}
    mkdir -p $B
    strip -o $B/smelt target/release/smelt
    strip -o $B/cuda_parity target/release/examples/cuda_parity
    P=target/release/examples/cuda_parity
    # SmolLM2: 4 of 30 layers. Gemma 3: 6 of 18 (layer 5 is a global-attention layer),
    # sliding window 24 so the 40-token prompt crosses it.
    $P shrink .models/SmolLM2-135M-Instruct.Q4_1.gguf $B/smollm2-4l.gguf --layers 4 --vocab 8192
    $P shrink .models/gemma-3-270m-q4_k_m.gguf $B/gemma3-6l.gguf --layers 6 --vocab 8192 --window 24
    du -sh $B
    ;;
  run)
    shift || true
    peer=0
    [ "${1:-}" = "--peer" ] && peer=1
    out=${OUT:-bench/out}
    mkdir -p "$out"
    log="$out/decode.log"
    B=${GPU_DIR:-.gpu-cuda}
    [ -x $B/smelt ] || { echo "decode.sh: $B/smelt missing: run 'bench/gpu/decode.sh build' and carry $B" >&2; exit 1; }
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader || true; } | tee "$log"
    status=0
    # The peer's sources fill most of a call's 64 MiB: a --peer call carries only
    # .gpu-cuda/smelt and skips the parity models when they are not there.
    models=${PARITY_MODELS:-$B/smollm2-4l.gguf $B/gemma3-6l.gguf}
    if [ -x $B/cuda_parity ] && ls $models >/dev/null 2>&1; then
      echo "== parity: CUDA vs CPU, whole model" | tee -a "$log"
      $B/cuda_parity check $models 2>&1 | tee -a "$log" || status=1
    else
      echo "== parity: skipped (no $models here)" | tee -a "$log"
    fi
    if [ "${SKIP_KERNELS:-0}" != 1 ]; then
      echo "== GEMV bandwidth at Llama-3-8B shapes" | tee -a "$log"
      $B/smelt bench --kernels --device cuda 2>&1 | tee -a "$log" || status=1
    fi
    m=/tmp/llama3-8b-q4_k.gguf
    if [ $peer = 1 ]; then
      echo "== llama.cpp (built here) on its own random llama3-8b Q4_K" | tee -a "$log"
      bash .peer/gpu-llamacpp.sh .peer llama3-8b Q4_K 2>&1 | tee -a "$log" || status=1
      m=/tmp/peer-llama3-8b-Q4_K.gguf
    else
      echo "== smelt synth llama3-8b q4_k" | tee -a "$log"
      t0=$SECONDS
      $B/smelt synth --shape llama3-8b --quant q4_k -o $m 2>&1 | tail -3 | tee -a "$log"
      echo "synth took $((SECONDS - t0)) s" | tee -a "$log"
    fi
    echo "== smelt bench on $m" | tee -a "$log"
    $B/smelt bench --model $m --device cuda --prompt 512 --gen 128 --reps 3 --json 2>&1 | tee -a "$log" "$out/bench.json" || status=1
    if [ "${SMELT_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
      echo "== ncu: GPU time per kernel over ~2 decode steps (graphs off, prompt 16)" | tee -a "$log"
      SMELT_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
        --launch-skip 4200 --launch-count 1300 \
        $B/smelt bench --model $m --device cuda --prompt 16 --gen 40 --reps 1 > "$out/ncu.csv" 2>/dev/null || true
      python3 bench/gpu/ncu_summary.py "$out/ncu.csv" 2>&1 | tee -a "$log" || true
    fi
    echo "== GPU time per kernel of eager decode steps (SMELT_CUDA_PROFILE=1, no Nsight)" | tee -a "$log"
    SMELT_CUDA_PROFILE=1 $B/smelt bench --model $m --device cuda --prompt 512 --gen 16 --reps 1 2>&1 \
      | grep -E "^(PROFILE|\|)" | tee -a "$log" || status=1
    # Launch settings that must not change a bit: SMELT_CUDA_PDL (programmatic dependent
    # launch, see smelt_cuda::Gpu::launch) and SMELT_CUDA_ROPE_KV=0 (rope and KV append
    # unfused). SMELT_CUDA_DIGEST hashes the bits of every logits copy: a race between
    # kernels, or a fused kernel off by a bit, would change it. Then tg128 under each.
    variants=${VARIANTS-SMELT_CUDA_PDL=0 SMELT_CUDA_PDL=launch SMELT_CUDA_PDL=gemv SMELT_CUDA_PDL=small SMELT_CUDA_PDL=prefetch SMELT_CUDA_ROPE_KV=0}
    echo "== logits digest under each setting (must be equal)" | tee -a "$log"
    for v in DEFAULT=1 $variants; do
      env SMELT_CUDA_DIGEST=1 ${v//,/ } $B/smelt bench --model $m --device cuda --prompt 64 --gen 48 --reps 1 --host-logits 2>&1 \
        | grep "CUDA digest" > "$out/digest.txt" || status=1
      [ $v = DEFAULT=1 ] && cp "$out/digest.txt" "$out/digest-default.txt"
      if [ -s "$out/digest.txt" ] && cmp -s "$out/digest-default.txt" "$out/digest.txt"; then
        echo "digest $v: equal ($(cat "$out/digest.txt"))" | tee -a "$log"
      else
        echo "digest $v: DIFFERENT or missing ($(cat "$out/digest.txt"))" | tee -a "$log"; status=1
      fi
    done
    # TIMED: settings timed beside the default whose bits may differ (another computation,
    # e.g. SMELT_CUDA_SPLIT_NORM=0 rounds the norm once more).
    for v in $variants ${TIMED:-}; do
      echo "== same, $v" | tee -a "$log"
      env ${v//,/ } $B/smelt bench --model $m --device cuda --prompt 512 --gen 128 --reps 3 --json 2>&1 | tee -a "$log" || status=1
    done
    if [ "${SKIP_VARIANTS:-0}" != 1 ]; then
      echo "== same, norms not fused with the q8_1 quantization (SMELT_CUDA_FUSED=0)" | tee -a "$log"
      SMELT_CUDA_FUSED=0 $B/smelt bench --model $m --device cuda --prompt 512 --gen 128 --reps 3 --json 2>&1 | tee -a "$log" || status=1
      echo "== same, CUDA graphs off (every decode step launched op by op)" | tee -a "$log"
      SMELT_CUDA_GRAPHS=0 $B/smelt bench --model $m --device cuda --prompt 512 --gen 64 --reps 1 --json 2>&1 | tee -a "$log" || status=1
    fi
    echo "== summary" | tee -a "$log"
    grep -E "^(prompt|greedy|3 seq|parity|device copy|digest|== same)|RESULT|decode_tok_s|\| q4_K|\| q6_K|\| q8_0" "$log" | tee -a "$out/summary.txt" || true
    exit $status
    ;;
  *)
    echo "usage: bench/gpu/decode.sh {build|run [--peer]}" >&2
    exit 2
    ;;
esac
