#!/usr/bin/env bash
# Structured output's decode cost on the CPU: starts `smelt serve` (SmolLM2, the test model)
# on a free port and runs bench/server/mask_cost.py against it (free vs JSON-schema-constrained
# greedy decode, alternating rounds; see that file). Uses the server tests' venv.
# Usage: bench/server/mask_cost.sh [ROUNDS (default 5)] [MAX_TOKENS (default 96)]
# SMELT_BIN: the binary (default target/release/smelt); SMELT_BENCH_THREADS: --threads.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${SMELT_BIN:-$root/target/release/smelt}
py=${SMELT_SERVER_VENV:-$HOME/.cache/smelt/venv-server-openai1.109.1-pytest8.4.2}/bin/python
[ -x "$bin" ] || { echo "mask_cost: $bin is missing: cargo build --release -p smelt" >&2; exit 1; }
[ -x "$py" ] || { echo "mask_cost: no server venv: run scripts/server-tests.sh once" >&2; exit 1; }
model=$(scripts/fetch-models.sh smollm2-135m | tail -n1)
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
threads=()
[ -n "${SMELT_BENCH_THREADS:-}" ] && threads=(--threads "$SMELT_BENCH_THREADS")
log=$(mktemp)
"$bin" serve --model "$model" --port "$port" "${threads[@]}" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 240); do
  "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.5
done
"$py" bench/server/mask_cost.py "http://127.0.0.1:$port" "$@"
