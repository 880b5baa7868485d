#!/usr/bin/env bash
# Every GPU op against its CPU twin in one call: the `gpu_ops` harness of smelt-kernels
# (crates/smelt-kernels/examples/gpu_ops, in the spirit of llama.cpp's test-backend-ops).
#
# Here (no CUDA toolkit needed):
#   bash bench/gpu/ops.sh pack     # release build, stripped and gzipped into .gpu-ops/ (~5 MB)
# There (device tool, carry [".gpu-ops"]):
#   bash bench/gpu/ops.sh          # check mode (or `run`): every op on ragged shapes, poisoned outputs
#   bash bench/gpu/ops.sh perf     # timings at real model shapes (time a launch, GB/s)
#   bash bench/gpu/ops.sh check -o gemv,rope -s 7x1000   # any gpu_ops arguments
#
# gpu_ops prints a line per case (op, shape, error, PASS/FAIL), a table with a row per kernel
# family (cases, failed, worst error, metric, tolerance), then a row per registered op (cases,
# failures, seconds); this script shows the failures and that last table (the rest is in the log). Exit status
# 1 when any case fails. Full log under $OUT (or bench/out) as gpu_ops.log (perf mode:
# gpu_ops-perf.log). GPU_DIR names
# another carry folder than .gpu-ops (both steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${GPU_DIR:-.gpu-ops}
case "${1:-check}" in
  pack | build)
    cargo build --release -p smelt-kernels --example gpu_ops
    T=${CARGO_TARGET_DIR:-target}/release/examples/gpu_ops
    mkdir -p "$D"
    strip -o /tmp/gpu_ops.stripped "$T"
    gzip -9 -c /tmp/gpu_ops.stripped > "$D/gpu_ops.gz"
    rm -f /tmp/gpu_ops.stripped
    ls -l "$D/gpu_ops.gz"
    "$T" list | tail -2
    ;;
  *)
    if [ ! -s "$D/gpu_ops.gz" ]; then
      echo "ops.sh: $D/gpu_ops.gz is missing: run 'bash bench/gpu/ops.sh pack' here first and carry $D" >&2
      exit 2
    fi
    [ "${1:-}" = run ] && shift
    B=/tmp/gpu_ops-bin
    gunzip -c "$D/gpu_ops.gz" > $B && chmod +x $B
    out=${OUT:-bench/out}
    mkdir -p "$out"
    log="$out/gpu_ops.log"
    [ "${1:-}" = perf ] && log="$out/gpu_ops-perf.log"
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
    status=0
    # The module cache of the engine's backend (the MoE cases open it) stays in /tmp.
    SMELT_CUDA_LOAD_LOG=1 SMELT_KERNEL_CACHE=/tmp/smelt-kernel-cache $B "$@" 2>&1 | tee -a "$log" > /tmp/gpu_ops.out || status=1
    # What failed (the first 60 lines of it), the perf tables in perf mode, then the summary
    # table, a row per registered op, last; every case's line and the table of every
    # kernel's row are in the log.
    head -3 /tmp/gpu_ops.out
    grep "kernels: PTX generated" /tmp/gpu_ops.out || true
    grep -E "FAIL|ERROR|first failure" /tmp/gpu_ops.out | grep -v "^| " | head -60 || true
    sed -n '/^== perf/,/^== seconds/p' /tmp/gpu_ops.out | grep -v "^== seconds" || true
    grep "^== summary" /tmp/gpu_ops.out || true
    sed -n '/^| registered op/,$p' /tmp/gpu_ops.out
    exit $status
    ;;
esac
