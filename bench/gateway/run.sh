#!/usr/bin/env bash
# The gateway's overhead benchmark (issue 22): builds smelt in release, fetches SmolLM2,
# reuses scripts/server-tests.sh's venv (httpx) and runs bench/gateway/bench.py, which starts
# one node and a gateway in front of it and prints a table last.
# Usage: bench/gateway/run.sh [bench.py options: --streams 64 --tokens 32 --rounds 3 ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OPENAI_VERSION=1.109.1
PYTEST_VERSION=8.4.2
venv=${SMELT_SERVER_VENV:-$HOME/.cache/smelt/venv-server-openai$OPENAI_VERSION-pytest$PYTEST_VERSION}
if ! "$venv/bin/python" -c "import httpx" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "pytest==$PYTEST_VERSION"
fi
cargo build --release -p smelt >&2
target=${CARGO_TARGET_DIR:-$root/target}
model=$(scripts/fetch-models.sh smollm2-135m | tail -n1)
exec "$venv/bin/python" bench/gateway/bench.py "$target/release/smelt" "$model" "$@"
