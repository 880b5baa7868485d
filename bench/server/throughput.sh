#!/usr/bin/env bash
# Aggregate generated tokens/s of `smelt serve` and of llama.cpp's own server
# (`python -m llama_cpp.server`, llama-cpp-python 0.3.36 from scripts/oracles.sh) at 1, 4 and 16
# concurrent clients: same model file, same prompts, greedy, max_tokens 64, both servers up
# in the same run and measured alternately at each concurrency so background load hits both.
# Rounds repeat the whole sweep (the machine is shared, so single runs are noisy); the table
# gives each cell's median over the rounds and the ratio smelt / llama.cpp.
#
# llama_cpp.server needs its `server` extras (uvicorn, fastapi ...). They go into their own
# cached venv that sees the oracle venv's packages through a .pth file, so the oracle venv
# stays as scripts/oracles.sh made it and llama.cpp is not rebuilt.
# Usage: bench/server/throughput.sh [REQUESTS_PER_CLIENT (default 2)] [ROUNDS (default 3)]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
per_client=${1:-2}
rounds=${2:-3}
max_tokens=64
threads=${SMELT_BENCH_THREADS:-2}

die() { printf 'throughput: %s\n' "$*" >&2; exit 1; }

oracle_py=$(scripts/oracles.sh | tail -n1)
oracle_site=$("$oracle_py" -c 'import site; print(site.getsitepackages()[0])')
venv=${SMELT_CACHE:-$HOME/.cache/smelt}/venv-llcpp-server-0.3.36
py=$venv/bin/python
if ! "$py" -c 'import llama_cpp.server.app, httpx' 2>/dev/null; then
  python3 -m venv "$venv"
  "$py" -c 'import site; print(site.getsitepackages()[0])' | {
    read -r own
    echo "$oracle_site" >"$own/llcpp-oracle.pth"
  }
  "$py" -m pip install -q --disable-pip-version-check 'uvicorn==0.54.0' 'fastapi==0.165.0' \
    'pydantic-settings==2.16.3' 'sse-starlette==3.7.0' 'starlette-context==0.3.6' \
    'PyYAML==6.0.3' 'httpx==0.28.1' >&2
  "$py" -c 'import llama_cpp.server.app, httpx' || die "llama_cpp.server does not import in $venv"
fi

cargo build --release -p smelt >&2
model=$(scripts/fetch-models.sh smollm2-135m | tail -n1)
[ -s "$model" ] || die "no model file"

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

wait_up() { # URL PID LOG
  for _ in $(seq 1 240); do
    kill -0 "$2" 2>/dev/null || { cat "$3" >&2; die "server for $1 exited"; }
    "$py" -c "import httpx; httpx.get('$1/v1/models', timeout=2).raise_for_status()" 2>/dev/null && return 0
    sleep 0.5
  done
  cat "$3" >&2
  die "$1 did not come up in 120 s"
}

smelt_port=$(free_port)
target/release/smelt serve --model "$model" --port "$smelt_port" --threads "$threads" \
  >"$work/smelt.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$smelt_port" "$!" "$work/smelt.log"

llama_port=$(free_port)
# llama_cpp.server runs one request at a time (one Llama object behind a lock): it has no
# parallel-slot setting, so its 4- and 16-client numbers show queued requests.
"$py" -m llama_cpp.server --model "$model" --port "$llama_port" --n_threads "$threads" \
  --n_threads_batch "$threads" --n_ctx 2048 >"$work/llama.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$llama_port" "$!" "$work/llama.log"

# Warm-up: first requests pay for page faults and thread start-up.
for port in "$smelt_port" "$llama_port"; do
  "$py" bench/server/load.py "http://127.0.0.1:$port" 1 1 8 >/dev/null
done

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-6s %-8s %-6s %9s %8s %8s %10s\n' round clients server requests tokens seconds tokens/s
declare -A tps
for r in $(seq 1 "$rounds"); do
  for c in 1 4 16; do
    for name in smelt llama; do
      port=$smelt_port
      [ "$name" = llama ] && port=$llama_port
      line=$("$py" bench/server/load.py "http://127.0.0.1:$port" "$c" "$per_client" "$max_tokens")
      read -r req tok sec rate < <("$py" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["requests"], d["tokens"], d["seconds"], d["tokens_per_s"])' "$line")
      [ "$tok" = $((req * max_tokens)) ] || die "$name at $c clients generated $tok tokens, not $((req * max_tokens))"
      tps[$name.$c]="${tps[$name.$c]:-} $rate"
      printf '%-6s %-8s %-6s %9s %8s %8s %10s\n' "$r" "$c" "$name" "$req" "$tok" "$sec" "$rate"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { "$py" -c 'import statistics,sys; print(f"{statistics.median(map(float, sys.argv[1:])):.1f}")' "$@"; }
echo
printf '| clients | smelt serve tok/s | llama_cpp.server tok/s | smelt / llama.cpp |\n'
printf '|---:|---:|---:|---:|\n'
for c in 1 4 16; do
  # shellcheck disable=SC2086 # the rates are space-separated on purpose
  s=$(median ${tps[smelt.$c]}) l=$(median ${tps[llama.$c]})
  printf '| %s | %s | %s | %s |\n' "$c" "$s" "$l" "$("$py" -c "print(f'{$s / $l:.2f}x')")"
done
