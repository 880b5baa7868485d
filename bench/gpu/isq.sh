#!/usr/bin/env bash
# GPU quantization (ISQ, issue 6) in one device call: parity of every GPU quantize kernel
# with smelt-quant's CPU bytes, GPU speed (4096x14336 bf16 to each type; a whole
# Qwen3-32B-shaped bf16 model to Q6_K), candle-core's CPU QTensor::quantize and smelt's
# CPU path on one 4096x14336 tensor on the same machine (scaled to the model), and
# `smelt quantize --device cuda` against the CPU on small synthesized GGUFs, byte for byte.
#
# Here (builds; no CUDA toolkit needed):
#   bench/gpu/isq.sh build     # example + smelt + bench/candle-quant, stripped into .gpu-quant/
# There (through the device tool, carry [".gpu-quant"]):
#   bash bench/gpu/isq.sh run  # prints the tables last; full log under $OUT as isq.log
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.gpu-quant
case "${1:-run}" in
  build)
    cargo build --release --example gpu_ops -p smelt-kernels
    cargo build --release -p smelt
    cargo build --release --manifest-path bench/candle-quant/Cargo.toml
    mkdir -p "$dir"
    strip -o "$dir/gpu_ops" target/release/examples/gpu_ops
    strip -o "$dir/smelt" target/release/smelt
    strip -o "$dir/candle-quant" bench/candle-quant/target/release/candle-quant
    du -sh "$dir"/*
    ;;
  run)
    out=${OUT:-bench/out}
    mkdir -p "$out"
    log="$out/isq.log"
    for b in gpu_ops smelt candle-quant; do
      if [ ! -x "$dir/$b" ]; then
        echo "isq.sh: $dir/$b is missing: run 'bench/gpu/isq.sh build' here first and carry $dir" >&2
        exit 1
      fi
    done
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true;
      echo "cpu: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"; } | tee "$log"
    status=0

    echo "== GPU parity and speed (gpu_ops -o isq_quantize, with the 4096x14336 tensor) ==" | tee -a "$log"
    "$dir/gpu_ops" -o isq_quantize 2>&1 | tee "$out/check.log" | tee -a "$log" || status=1
    "$dir/gpu_ops" -o isq_quantize -s 4096x14336 2>&1 | tee -a "$out/check.log" | tee -a "$log" | tail -4 || status=1
    "$dir/gpu_ops" perf -o isq_quantize 2>&1 | tee -a "$out/check.log" | tee -a "$log" || status=1

    echo "== smelt quantize --device cuda vs cpu (byte-identical files) ==" | tee -a "$log"
    tmp=$(mktemp -d)
    for src in bf16 f16 f32; do
      "$dir/smelt" synth --shape qwen2-tiny --quant "$src" -o "$tmp/m-$src.gguf" >/dev/null 2>&1
      for ty in q6_k q4_k_m q8_0 q2_k q5_1 q3_k_s; do
        "$dir/smelt" quantize "$tmp/m-$src.gguf" "$tmp/cpu.gguf" --type "$ty" >/dev/null 2>&1
        "$dir/smelt" quantize "$tmp/m-$src.gguf" "$tmp/gpu.gguf" --type "$ty" --device cuda 2>"$tmp/err" >/dev/null || { cat "$tmp/err"; }
        if cmp -s "$tmp/cpu.gguf" "$tmp/gpu.gguf"; then r=SAME; else r=DIFFERENT; status=1; fi
        echo "$src -> $ty: $r" | tee -a "$log"
      done
    done
    "$dir/smelt" synth --shape qwen2.5-0.5b --layers 4 --quant bf16 -o "$tmp/big.gguf" >/dev/null 2>&1
    t0=$(date +%s.%N); "$dir/smelt" quantize "$tmp/big.gguf" "$tmp/cpu.gguf" --type q6_k >/dev/null 2>&1; t1=$(date +%s.%N)
    "$dir/smelt" quantize "$tmp/big.gguf" "$tmp/gpu.gguf" --type q6_k --device cuda >/dev/null 2>&1; t2=$(date +%s.%N)
    if cmp -s "$tmp/cpu.gguf" "$tmp/gpu.gguf"; then r=SAME; else r=DIFFERENT; status=1; fi
    printf 'qwen2.5-0.5b (4 layers) bf16 -> q6_k: %s; smelt quantize cpu %.2f s, cuda %.2f s (whole command: mmap, GPU init, transfers, write)\n' \
      "$r" "$(awk "BEGIN{print $t1 - $t0}")" "$(awk "BEGIN{print $t2 - $t1}")" | tee -a "$log"
    rm -rf "$tmp"

    echo "== CPU on this machine: candle-core QTensor::quantize vs smelt (4096x14336 f32 -> Q6_K) ==" | tee -a "$log"
    cq=$(mktemp -d)
    "$dir/candle-quant" --out "$cq" --runs 1 --types q6_k 2>&1 | tail -n 3 | tee -a "$log" || status=1
    model_s=$(awk '/^MODEL_Q6K_SECONDS/ {print $2}' "$out/check.log")
    weights=$(awk '/^MODEL_WEIGHTS/ {print $2}' "$out/check.log")
    python3 - "$cq/rust.json" "${model_s:-nan}" "${weights:-0}" <<'EOF' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
gpu_s, weights = float(sys.argv[2]), int(sys.argv[3])
t = r["types"][0]
n = r["rows"] * r["cols"]
scale = weights / n
rows = [("smelt GPU (measured, whole model)", gpu_s)]
rows.append(("candle QTensor::quantize, 1 tensor x %.1f" % scale, t["candle_ms"] / 1e3 * scale))
if "smelt_ms" in t:
    rows.append(("smelt CPU, %d threads, 1 tensor x %.1f" % (r["threads"], scale), t["smelt_ms"] / 1e3 * scale))
    rows.append(("smelt CPU, 1 thread, 1 tensor x %.1f" % scale, t["smelt_1t_ms"] / 1e3 * scale))
print("\nQwen3-32B-shaped model (%.2f G weights, bf16) to Q6_K, disk excluded:" % (weights / 1e9))
print("| path | seconds | GPU speed-up |")
print("| --- | --- | --- |")
for name, s in rows:
    print("| %s | %.2f | %.1fx |" % (name, s, s / gpu_s if gpu_s > 0 else float("nan")))
EOF
    rm -rf "$cq"
    echo "== parity summary ==" | tee -a "$log"
    grep -E '^\| isq |^gpu_ops:' "$out/check.log" | tee -a "$log" || true
    grep -A12 'speed: bf16' "$out/check.log" | tee -a "$log" || true
    grep 'matrices' "$out/check.log" | tee -a "$log" || true
    exit "$status"
    ;;
  *)
    echo "usage: bench/gpu/isq.sh {build|run}" >&2
    exit 2
    ;;
esac
