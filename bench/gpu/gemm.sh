#!/usr/bin/env bash
# The tensor-core GEMM on the GPU machine, in one device call: kernel parity and speed
# (gpu_ops check/perf -o gemm), whole-model CUDA-vs-CPU parity of prompt logits (cuda_parity, whose
# 40-token prompts now run through the GEMM), and prompt/decode speed of a Llama-3-8B-shape
# Q4_K with the GEMM and without it (SMELT_CUDA_GEMM_MIN past every prompt), optionally
# beside llama.cpp built in the same call.
#
# Here:  bash bench/gpu/gemm.sh build     # stripped binaries + cut-down models into .gpu-lead
#        ../shared/peer/prepare.sh .peer  # once, only for --peer
# There: bash bench/gpu/gemm.sh run [--peer]   carry [".gpu-lead"] (+ ".peer")
# Environment there: PROMPTS (default "512 4096"), MINS (SMELT_CUDA_GEMM_MIN values to time,
# default "default"), PROFILE=0, SKIP_KERNELS=1, SKIP_PARITY=1, FLASH_SEQS (SMELT_CUDA_FLASH_SEQS
# values for the batches), LONG (long prompts, e.g. 32000: time to first token), QUANTS (other
# weight types of the same shape, e.g. q8_0), BATCHES
# (aggregate decode with `smelt bench --batch N` when the binary has it, default "8 32 64").
# Log: $OUT/gemm.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${GPU_DIR:-.gpu-lead}
case "${1:-run}" in
  build)
    set -e
    cargo build --release -p smelt --bin smelt
    cargo build --release -p smelt-kernels --example gpu_ops
    cargo build --release -p smelt-engine --example cuda_parity
    T=${CARGO_TARGET_DIR:-target}/release
    mkdir -p $B
    strip -o $B/smelt $T/smelt
    strip -o $B/gpu_ops $T/examples/gpu_ops
    strip -o $B/cuda_parity $T/examples/cuda_parity
    $T/examples/cuda_parity shrink .models/SmolLM2-135M-Instruct.Q4_1.gguf $B/smollm2-4l.gguf --layers 4 --vocab 8192
    $T/examples/cuda_parity shrink .models/gemma-3-270m-q4_k_m.gguf $B/gemma3-6l.gguf --layers 6 --vocab 8192 --window 24
    du -sh $B
    ;;
  run)
    shift || true
    out=${OUT:-bench/out}
    mkdir -p "$out"
    log="$out/gemm.log"
    table="$out/gemm-table.md"
    : > "$table"
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
    status=0
    if [ "${SKIP_KERNELS:-0}" != 1 ]; then
      echo "== gpu_ops -o gemm (parity), gpu_ops perf -o gemm (speed)" | tee -a "$log"
      $B/gpu_ops -o gemm 2>&1 | tee -a "$log" | sed -n '/^== summary/,$p' || status=1
      $B/gpu_ops perf -o gemm 2>&1 | tee -a "$log" | sed -n '/^== perf/,/^== seconds/p' || status=1
    fi
    if [ "${SKIP_PARITY:-0}" != 1 ] && [ -s $B/gemma3-6l.gguf ]; then
      echo "== cuda_parity (prompt rows through the GEMM)" | tee -a "$log"
      $B/cuda_parity check $(ls $B/*.gguf) 2>&1 | tee -a "$log" | tail -25 || status=1
    fi
    if [ "${SKIP_PARITY:-0}" != 1 ]; then
      echo "== gpu_ops -o attention (split and prompt attention, every head size)" | tee -a "$log"
      $B/gpu_ops -o attention 2>&1 | tee -a "$log" | sed -n '/^== summary/,$p' || status=1
    fi
    m=/tmp/llama3-8b-q4_k.gguf
    if [ "${1:-}" = "--peer" ]; then
      echo "== llama.cpp (built here) on its own random llama3-8b Q4_K" | tee -a "$log"
      bash .peer/gpu-llamacpp.sh .peer llama3-8b Q4_K 2>&1 | tee -a "$log"
      m=/tmp/peer-llama3-8b-Q4_K.gguf
      echo "| llama.cpp | $(grep RESULT "$log" | tail -1) |" >> "$table"
    else
      $B/smelt synth --shape llama3-8b --quant q4_k -o $m > /dev/null
    fi
    for p in ${PROMPTS:-512 4096}; do
      for min in ${MINS:-default}; do
        env $( [ $min = default ] || echo SMELT_CUDA_GEMM_MIN=$min ) \
          $B/smelt bench --model $m --device cuda --prompt $p --gen 32 --reps 2 --json > /tmp/b.json 2>/tmp/b.err
        r=$(tr -d '\n' < /tmp/b.json)
        echo "bench prompt=$p gemm_min=$min: ${r:-FAILED $(tail -3 /tmp/b.err)}" | tee -a "$log"
        echo "| smelt pp$p gemm_min=$min | $(echo "$r" | grep -o '"prompt_tok_s":[0-9.]*') $(echo "$r" | grep -o '"decode_tok_s":[0-9.]*') |" >> "$table"
      done
    done
    if [ "${PROFILE:-1}" = 1 ]; then
      echo "== per-kernel GPU time of a 512-token prompt (SMELT_CUDA_PROFILE=all, eager)" | tee -a "$log"
      SMELT_CUDA_PROFILE=all $B/smelt bench --model $m --device cuda --prompt 512 --gen 1 --reps 1 2>&1 | tail -30 | tee -a "$log"
    fi
    if $B/smelt bench --help 2>/dev/null | grep -q -- '--batch'; then
      for n in ${BATCHES:-8 32 64}; do
        for f in ${FLASH_SEQS:-default}; do
          r=$(env $( [ $f = default ] || echo SMELT_CUDA_FLASH_SEQS=$f ) \
            $B/smelt bench --model $m --device cuda --prompt 128 --gen 128 --reps 1 --batch $n --json 2>/tmp/b.err | tr -d '\n')
          echo "bench batch=$n flash_seqs=$f: ${r:-FAILED $(tail -3 /tmp/b.err)}" | tee -a "$log"
          echo "| smelt batch $n flash_seqs=$f | $(echo "$r" | grep -o '"batch_decode_tok_s":[0-9.]*') |" >> "$table"
        done
      done
    fi
    for p in ${LONG:-}; do
      r=$($B/smelt bench --model $m --device cuda --prompt $p --gen 8 --reps 1 --json 2>/tmp/b.err | tr -d '\n')
      echo "bench long prompt=$p: ${r:-FAILED $(tail -3 /tmp/b.err)}" | tee -a "$log"
      echo "| smelt pp$p | $(echo "$r" | grep -o '"prompt_tok_s":[0-9.]*') $(echo "$r" | grep -o '"ttft_ms":[0-9.]*') |" >> "$table"
    done
    for qt in ${QUANTS:-}; do
      mq=/tmp/llama3-8b-$qt.gguf
      $B/smelt synth --shape llama3-8b --quant $qt -o $mq > /dev/null
      r=$($B/smelt bench --model $mq --device cuda --prompt 512 --gen 64 --reps 2 --json 2>/tmp/b.err | tr -d '\n')
      echo "bench $qt: ${r:-FAILED $(tail -3 /tmp/b.err)}" | tee -a "$log"
      echo "| smelt $qt pp512/tg64 | $(echo "$r" | grep -o '"prompt_tok_s":[0-9.]*') $(echo "$r" | grep -o '"decode_tok_s":[0-9.]*') |" >> "$table"
      r=$($B/smelt bench --model $mq --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 --json 2>/tmp/b.err | tr -d '\n')
      echo "| smelt $qt batch 32 | $(echo "$r" | grep -o '"batch_decode_tok_s":[0-9.]*') |" >> "$table"
      rm -f $mq
    done
    echo "== table" | tee -a "$log"
    grep -A40 "summary: GEMM" "$log" | grep "^|" | tee -a "$log" || true
    tee -a "$log" < "$table"
    exit $status
    ;;
esac
