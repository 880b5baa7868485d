#!/usr/bin/env bash
# GEMV parity and bandwidth on the GPU machine, in one device call.
#
# Here (builds; no CUDA toolkit needed):
#   bench/gpu/gemv.sh build     # cargo build the check, copy it into .gpu/
# There (through the device tool, carry [".gpu"]):
#   bash bench/gpu/gemv.sh run  # parity vs the CPU twins, then timings, table last
#
# The check generates every kernel's PTX, loads it through the driver (cudarc, dynamic
# loading), checks each kernel against its CPU twin on fresh random inputs with poisoned
# outputs, then times each GEMV at real shapes against a device-to-device copy measured in
# the same run. Full log under $OUT (or bench/out) as gemv.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-run}" in
  build)
    cargo build --release --example gpu_check -p smelt-kernels
    mkdir -p .gpu
    cp target/release/examples/gpu_check .gpu/gpu_check
    ls -l .gpu/gpu_check
    ;;
  run)
    out=${OUT:-bench/out}
    mkdir -p "$out"
    if [ ! -x .gpu/gpu_check ]; then
      echo "gemv.sh: .gpu/gpu_check is missing: run 'bench/gpu/gemv.sh build' first and carry .gpu" >&2
      exit 1
    fi
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader || true; } | tee "$out/gemv.log"
    shift || true
    set -o pipefail
    .gpu/gpu_check "$@" 2>&1 | tee -a "$out/gemv.log"
    ;;
  *)
    echo "usage: bench/gpu/gemv.sh {build|run} [--quick]" >&2
    exit 2
    ;;
esac
