#!/usr/bin/env bash
# Parity and speed of the op kernels (smelt_kernels::ops) on the GPU machine, in one call.
#
# Here (builds; no CUDA toolkit needed):
#   bench/gpu/ops.sh build     # cargo build the check, strip it into .gpu-ops/
# GPU_DIR names another carry folder than .gpu-ops (both steps).
# There (through the device tool, carry [".gpu-ops"]):
#   bash bench/gpu/ops.sh run  # parity vs the CPU twins, then timings, tables last
#
# The check generates the ops' PTX, loads it through the driver (cudarc, dynamic loading),
# checks every kernel against its CPU twin on fresh random inputs with poisoned outputs and
# ragged shapes, then times attention at Llama-3-8B decode shape and the other ops at 8B
# shapes. Full log under $OUT (or bench/out) as ops.log. Exit status 1 on a parity failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-run}" in
  build)
    cargo build --release --example ops_check -p smelt-kernels
    D=${GPU_DIR:-.gpu-ops}
    mkdir -p $D
    strip -o $D/ops_check target/release/examples/ops_check
    ls -l $D/ops_check
    ;;
  run)
    out=${OUT:-bench/out}
    mkdir -p "$out"
    D=${GPU_DIR:-.gpu-ops}
    if [ ! -x $D/ops_check ]; then
      echo "ops.sh: $D/ops_check is missing: run 'bench/gpu/ops.sh build' first and carry .gpu-ops" >&2
      exit 1
    fi
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader || true; } | tee "$out/ops.log"
    shift || true
    set -o pipefail
    $D/ops_check "$@" 2>&1 | tee -a "$out/ops.log"
    ;;
  *)
    echo "usage: bench/gpu/ops.sh {build|run}" >&2
    exit 2
    ;;
esac
