#!/usr/bin/env bash
# Quantization throughput to Q4_K, Q6_K and Q8_0 of one 4096x14336 f32 tensor: smelt (all
# cores) vs candle-core's QTensor::quantize vs ggml (llama-cpp-python), in one run, with
# byte comparisons. Prints a Markdown table last; see bench/RESULTS.md for recorded runs.
#
#   bench/quant.sh            # RUNS=3 by default; BENCH_OUT=folder for the data (bench/out)
#   bench/quant.sh --rows 64  # arguments go to bench/candle-quant (see its --help)
#
# Needs nothing installed by hand: cargo builds the bench crate (its own workspace and
# target dir, bench/candle-quant/target) and scripts/oracles.sh provides the Python venv.
# Exits non-zero when smelt's bytes differ from ggml's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${BENCH_OUT:-$root/bench/out}
runs=${RUNS:-3}

py=$(scripts/oracles.sh | tail -n1)
echo "==> building bench/candle-quant (release)" >&2
cargo build --release --quiet --manifest-path bench/candle-quant/Cargo.toml

# Other processes on the machine skew these numbers more than anything else (on two
# cores one busy neighbour halves the all-cores figures), so wait up to BENCH_QUIET_WAIT
# seconds (default 180) for the CPUs to be at least 90% idle, and print the load average
# before and after so a recorded run shows how quiet the machine was.
cpu_idle_pct() { # idle share of all CPUs over 2 s, from /proc/stat
  local a b
  read -r -a a < /proc/stat; sleep 2; read -r -a b < /proc/stat
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  echo $(( 100 * (b[4] + b[5] - a[4] - a[5]) / (total > 0 ? total : 1) ))
}
deadline=$((SECONDS + ${BENCH_QUIET_WAIT:-180}))
while idle=$(cpu_idle_pct); [ "$idle" -lt 90 ]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "==> machine still busy (${idle}% idle), measuring anyway" >&2
    break
  fi
done
echo "==> CPUs ${idle}% idle before the run" >&2
# CPU ticks busy on the whole machine (user nice system irq softirq steal), and those of
# this script's finished children (cutime + cstime): the difference over the run is what
# other processes (or the hypervisor) took while we measured.
busy_ticks() { local a; read -r -a a < /proc/stat; echo $((a[1] + a[2] + a[3] + a[6] + a[7] + a[8])); }
our_ticks() { awk '{print $16 + $17}' "/proc/$$/stat"; }
busy0=$(busy_ticks); ours0=$(our_ticks); t0=$SECONDS
echo "==> $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo '?'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "==> smelt and candle" >&2
cargo run --release --quiet --manifest-path bench/candle-quant/Cargo.toml -- --out "$out" --runs "$runs" "$@"

echo "==> ggml (llama-cpp-python's libggml-base)" >&2
status=0
"$py" bench/quant_ggml.py --dir "$out" --runs "$runs" || status=$?

others=$(( $(busy_ticks) - busy0 - ($(our_ticks) - ours0) ))
hz=$(getconf CLK_TCK)
wall=$((SECONDS - t0 > 0 ? SECONDS - t0 : 1))
share=$((100 * others / (hz * wall * $(nproc))))
echo "==> done $(date -u '+%H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg); other processes used $((others / hz)) CPU-s of the $((wall * $(nproc))) available during the ${wall} s run (${share}%)" >&2
if [ "$share" -ge 5 ]; then
  echo "==> WARNING: the machine was busy during the run; the all-cores figures are suspect" >&2
fi
echo >&2
"$py" bench/report.py "$out" || status=$?
exit "$status"
