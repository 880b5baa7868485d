#!/usr/bin/env bash
# The long fuzz run of issue 17: every fuzz target at once for N executions each (default
# 10 million), the machine's cores shared out by what each target costs, every process stopped
# at a wall-time cap, then one table of executions, crashes and speed per target (last).
#
# It needs no toolchain and no network: prebuilt libFuzzer binaries, gzipped, and the inputs
# they read, all in one folder (default .gpu-fuzz/, git-ignored), made on a build machine by
#   bash bench/fuzz/build.sh            # -> .gpu-fuzz/{bin/*.gz,models/*.gguf}
# and the seeds committed under fuzz/seeds/. Run from the checkout (or a copy of it):
#   bash bench/fuzz/long.sh [--runs N] [--time S] [--cores C] [--jobs TARGET=J ...]
#                           [--dir .gpu-fuzz] [--plan] [TARGET ...]
# --time caps every process's wall time (default 500 s; a process still running 20 s after
# it is stopped with SIGINT, which makes libFuzzer print its totals): with unpacking, the
# whole run ends within S + 40 s. --cores (default: all) are shared out as below; --jobs sets
# one target's process count by hand; --plan prints the shares and stops.
#
# Sharing: a target gets one core when one core reaches N executions within S at the speed
# in COST below with a fifth to spare; the other cores go to the rest in proportion to the core-seconds
# they need, so that each reaches the same share of N. Each process runs N/J executions with
# its own corpus and seed; a crash stops only its own process, and every crashing input is
# kept under $OUT (default bench/out/fuzz-long/<target>/) with that process's log. The table
# counts as crashes the processes that failed (a crash, panic, timeout or out-of-memory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

# Microseconds per execution on one core, averaged over the 500 s run of bench/RESULTS.md
# (16-core H100 host, binaries of build.sh: no sanitizer, debug assertions on); only their
# ratios matter. tokenize_chat runs two tokenizers and eight chat-template renders per
# input; hf_folder converts whole folders (370 at first; 670-910 on the 64-core host of
# 2026-11-27, its corpus grown: 6.4M of 10M in 330 s on 13 cores).
declare -A COST=([gguf_read]=11 [request_json]=50 [tokenize_chat]=1450 [hf_folder]=800)

runs=10000000
time_cap=500
cores=$(nproc)
dir=.gpu-fuzz
plan=0
declare -A jobs_set=()
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --time) time_cap=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --jobs) jobs_set[${2%%=*}]=${2#*=}; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --plan) plan=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "fuzz-long: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf_read tokenize_chat hf_folder request_json)

case $dir in /*) ;; *) dir=$root/$dir ;; esac
die() { echo "fuzz-long: $*" >&2; exit 1; }
[ "$plan" -eq 1 ] || [ -d "$dir/bin" ] || die "$dir/bin is missing: build the binaries with bench/fuzz/build.sh and carry $dir"
for t in "${targets[@]}"; do [ -n "${COST[$t]:-}" ] || die "unknown target $t"; done

# The shares: one core for a target that needs at most one, the rest by need.
declare -A jobs=()
left=$cores
declare -A need=()
rest=()
for t in "${targets[@]}"; do
  need[$t]=$(awk -v n="$runs" -v c="${COST[$t]}" 'BEGIN { printf "%.0f", n * c / 1e6 }')
  if [ -n "${jobs_set[$t]:-}" ]; then jobs[$t]=${jobs_set[$t]}; left=$((left - jobs[$t]))
  elif [ $((need[$t] * 6 / 5)) -le "$time_cap" ]; then jobs[$t]=1; left=$((left - 1))
  else rest+=("$t"); fi
done
if [ ${#rest[@]} -gt 0 ]; then
  [ "$left" -ge ${#rest[@]} ] || die "$cores cores are too few for ${#targets[@]} targets"
  total=0
  for t in "${rest[@]}"; do total=$((total + need[$t])); done
  given=0
  for t in "${rest[@]}"; do
    j=$(awk -v l="$left" -v n="${need[$t]}" -v s="$total" 'BEGIN { j = int(l * n / s); print (j < 1 ? 1 : j) }')
    jobs[$t]=$j; given=$((given + j))
  done
  # Cores lost to rounding go to the targets that need the most, one each.
  while [ "$given" -lt "$left" ]; do
    for t in $(for x in "${rest[@]}"; do echo "$((need[$x] / jobs[$x])) $x"; done | sort -rn | awk '{ print $2 }'); do
      [ "$given" -lt "$left" ] || break
      jobs[$t]=$((jobs[$t] + 1)); given=$((given + 1))
    done
  done
fi

if [ "$plan" -eq 1 ]; then
  for t in "${targets[@]}"; do echo "$t: ${jobs[$t]} processes (needs ${need[$t]} core-seconds at ${COST[$t]} us each)"; done
  exit 0
fi

# Scratch space in memory where there is some: hf_folder writes its three files per input.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then work=$(mktemp -d -p /dev/shm); else work=$(mktemp -d); fi
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  if [ -f "$dir/bin/$t.gz" ]; then gzip -dc "$dir/bin/$t.gz" >"$work/$t"
  elif [ -f "$dir/bin/$t" ]; then cp "$dir/bin/$t" "$work/$t"
  else die "no binary for $t in $dir/bin"; fi
  chmod +x "$work/$t"
done
# tokenize_chat reads the test models' tokenizers (metadata-only copies, see build.sh).
export SMELT_MODELS=${SMELT_MODELS:-$dir/models}
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp

out=${OUT:-$root/bench/out/fuzz-long}
declare -A t0=() pids=()
for t in "${targets[@]}"; do
  case $t in
    gguf_read) seeds=(fuzz/seeds/*.gguf); max_len=4096 ;;
    hf_folder) seeds=(fuzz/seeds/hf_folder/*); max_len=16384 ;;
    *) seeds=(fuzz/seeds/$t/*); max_len=4096 ;;
  esac
  mkdir -p "$out/$t" "$work/seeds-$t"
  cp "${seeds[@]}" "$work/seeds-$t/"
  per=$(( (runs + jobs[$t] - 1) / jobs[$t] ))
  echo "fuzz-long: $t: ${jobs[$t]} processes x $per executions, at most ${time_cap}s (max_len $max_len)" >&2
  t0[$t]=$(date +%s%N)
  list=""
  for i in $(seq 1 "${jobs[$t]}"); do
    mkdir -p "$work/corpus-$t-$i"
    timeout -s INT -k 10 $((time_cap + 20)) \
      "$work/$t" "$work/corpus-$t-$i" "$work/seeds-$t" -runs="$per" -seed="$i" \
      -max_total_time="$time_cap" -max_len="$max_len" -malloc_limit_mb=256 -rss_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 -artifact_prefix="$out/$t/" >"$work/log-$t-$i" 2>&1 &
    list+=" $!"
  done
  pids[$t]=$list
done

rows=()
all_ok=1
for t in "${targets[@]}"; do
  failed=0
  stopped=0
  for p in ${pids[$t]}; do
    rc=0
    wait "$p" || rc=$?
    if [ "$rc" -eq 124 ]; then stopped=$((stopped + 1))
    elif [ "$rc" -ne 0 ]; then failed=$((failed + 1)); fi
  done
  secs=$(awk -v a="${t0[$t]}" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  # Executions: libFuzzer's final count, or its last status line where a process had none.
  execs=0
  for f in "$work"/log-"$t"-*; do
    n=$(awk '/stat::number_of_executed_units/ { n = $NF } END { print n + 0 }' "$f")
    [ "$n" -gt 0 ] || n=$(grep -a -o -E '^#[0-9]+' "$f" | tail -n1 | tr -d '#' || true)
    execs=$((execs + ${n:-0}))
  done
  found=$( (grep -a -l -E "^==[0-9]+== ERROR: libFuzzer|SUMMARY: libFuzzer|panicked at|deadly signal|memory allocation of" "$work"/log-"$t"-* 2>/dev/null || true) | wc -l)
  crashes=$(( found > failed ? found : failed ))
  if [ "$crashes" -gt 0 ]; then
    all_ok=0
    for f in "$work"/log-"$t"-*; do
      if grep -a -q -E "ERROR: libFuzzer|SUMMARY: libFuzzer|panicked at|deadly signal|memory allocation of" "$f"; then
        cp "$f" "$out/$t/$(basename "$f").txt"
      fi
    done
    echo "fuzz-long: $t: $crashes process(es) failed; logs and inputs in $out/$t/" >&2
    grep -a -h -m3 -E "panicked at|ERROR: libFuzzer|memory allocation of" "$out/$t"/*.txt >&2 || true
  fi
  [ "$stopped" -eq 0 ] || echo "fuzz-long: $t: $stopped process(es) stopped at ${time_cap}s + 20s" >&2
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%d", (s > 0 ? e / s : 0) }')
  core=$(awk -v e="$execs" -v s="$secs" -v j="${jobs[$t]}" 'BEGIN { printf "%d", (s > 0 ? e / s / j : 0) }')
  reached=no; [ "$execs" -lt "$runs" ] || reached=yes
  rows+=("$(printf '| %-13s | %5s | %12s | %7s | %7.0f | %9s | %8s | %-7s |' \
    "$t" "${jobs[$t]}" "$execs" "$crashes" "$secs" "$rate" "$core" "$reached")")
done

echo
echo "fuzz-long: $(nproc) cores ($cores shared out), cap ${time_cap}s, $runs executions asked per target, $(date -u +%FT%TZ)"
echo "| target        | procs |   executions | crashes | seconds |   execs/s | per core | reached |"
echo "|---------------|------:|-------------:|--------:|--------:|----------:|---------:|---------|"
printf '%s\n' "${rows[@]}"
[ "$all_ok" -eq 1 ]
