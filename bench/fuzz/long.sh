#!/usr/bin/env bash
# The long fuzz run of issue 17: every fuzz target for N executions (default 10 million),
# spread over all cores, then one table of executions, crashes and speed per target.
#
# It needs no toolchain and no network: prebuilt libFuzzer binaries, gzipped, and the inputs
# they read, all in one folder (default .gpu-fuzz/, git-ignored), made on a build machine by
#   bash bench/fuzz/build.sh            # -> .gpu-fuzz/{bin/*.gz,models/*.gguf}
# and the seeds committed under fuzz/seeds/. Run from the checkout (or a copy of it):
#   bash bench/fuzz/long.sh [--runs N] [--jobs J] [--max-time S] [--dir .gpu-fuzz] [TARGET ...]
# Each target runs J processes at once (default: every core), each with N/J executions, its
# own output corpus and a distinct seed; a crash stops only its own process, and every
# crashing input is kept under $OUT (default bench/out/fuzz-long/<target>/). The table counts
# crashes as the processes that failed (a crash, leak, timeout or out-of-memory). --max-time
# caps each target's wall time in seconds (the table then shows the executions reached):
# hf_folder converts whole folders and runs far slower than the others.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

runs=10000000
jobs=$(nproc)
max_time=0
dir=.gpu-fuzz
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --max-time) max_time=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf_read tokenize_chat hf_folder request_json)
out=${OUT:-$root/bench/out/fuzz-long}
case $dir in /*) ;; *) dir=$root/$dir ;; esac
die() { echo "fuzz-long: $*" >&2; exit 1; }
[ -d "$dir/bin" ] || die "$dir/bin is missing: build the binaries with bench/fuzz/build.sh and carry $dir"

# The binaries, unpacked once into a scratch folder.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  if [ -f "$dir/bin/$t.gz" ]; then gzip -dc "$dir/bin/$t.gz" >"$work/$t"
  elif [ -f "$dir/bin/$t" ]; then cp "$dir/bin/$t" "$work/$t"
  else die "no binary for $t in $dir/bin"; fi
  chmod +x "$work/$t"
done
# tokenize_chat reads the test models' tokenizers (metadata-only copies, see build.sh).
export SMELT_MODELS=${SMELT_MODELS:-$dir/models}

per=$(( (runs + jobs - 1) / jobs ))
rows=()
for t in "${targets[@]}"; do
  case $t in
    gguf_read) seeds=(fuzz/seeds/*.gguf); max_len=4096 ;;
    hf_folder) seeds=(fuzz/seeds/hf_folder/*); max_len=16384 ;;
    *) seeds=(fuzz/seeds/$t/*); max_len=4096 ;;
  esac
  mkdir -p "$out/$t" "$work/seeds-$t"
  cp "${seeds[@]}" "$work/seeds-$t/"
  echo "fuzz-long: $t: $jobs processes x $per executions (max_len $max_len)" >&2
  t0=$(date +%s%N)
  pids=()
  for i in $(seq 1 "$jobs"); do
    mkdir -p "$work/corpus-$t-$i"
    "$work/$t" "$work/corpus-$t-$i" "$work/seeds-$t" -runs="$per" -seed="$i" \
      -max_total_time="$max_time" \
      -max_len="$max_len" -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$out/$t/" >"$work/log-$t-$i" 2>&1 &
    pids+=($!)
  done
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
  secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  execs=$(cat "$work"/log-"$t"-* | awk '/stat::number_of_executed_units/ { s += $NF } END { print s + 0 }')
  found=$( (grep -l -E "^==[0-9]+== ERROR: libFuzzer|SUMMARY: libFuzzer|panicked at|deadly signal" "$work"/log-"$t"-* 2>/dev/null || true) | wc -l)
  crashes=$(( found > failed ? found : failed ))
  if [ "$crashes" -gt 0 ]; then
    for f in "$work"/log-"$t"-*; do cp "$f" "$out/$t/$(basename "$f").txt"; done
    echo "fuzz-long: $t: $crashes process(es) failed; logs and inputs in $out/$t/" >&2
  fi
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%d", (s > 0 ? e / s : 0) }')
  rows+=("$(printf '| %-13s | %12s | %7s | %8.0f | %10s |' "$t" "$execs" "$crashes" "$secs" "$rate")")
done

echo
echo "fuzz-long: $(nproc) cores, $jobs processes per target, $runs executions asked per target"
echo "| target        |   executions | crashes | seconds | execs/s    |"
echo "|---------------|-------------:|--------:|--------:|-----------:|"
printf '%s\n' "${rows[@]}"
