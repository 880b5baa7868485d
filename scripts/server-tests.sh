#!/usr/bin/env bash
# End-to-end tests of `smelt serve` (and of `smelt gateway` in front of real nodes) from the
# outside, as any client sees it: the official
# `openai` Python package (tests/server/*.py, pytest) and the chat page in headless Chromium
# (tests/server/browser, playwright-core). Installs what it needs through each project's own
# client, once and cached: a venv with pinned openai + pytest, another with schemathesis, one
# with lm-eval (scored against llama.cpp's Python bindings from scripts/oracles.sh),
# Debian's chromium (apt-get, as root, only when missing) and playwright-core (npm ci from the
# committed lock file).
# Builds smelt (or reuses the build), fetches both test models, starts one server on a
# free port, runs both suites, stops the server and exits non-zero on any failure. It ends with
# a cargo-style `test result:` line so scripts/test.sh counts these tests in its summary.
# Usage: scripts/server-tests.sh [extra pytest arguments, e.g. -k stream]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

OPENAI_VERSION=1.109.1
PYTEST_VERSION=8.4.2
# Validates structured outputs against their schemas (tests/server/test_structured.py).
JSONSCHEMA_VERSION=4.23.0
venv=${SMELT_SERVER_VENV:-$HOME/.cache/smelt/venv-server-openai$OPENAI_VERSION-pytest$PYTEST_VERSION}
chromium=${SMELT_CHROMIUM:-/usr/bin/chromium}

step() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'server-tests: %s\n' "$*" >&2; exit 1; }

step "python venv with openai $OPENAI_VERSION, pytest $PYTEST_VERSION, jsonschema $JSONSCHEMA_VERSION ($venv)"
if ! "$venv/bin/python" -c "import openai, pytest, jsonschema, importlib.metadata as m, sys; sys.exit(not (openai.__version__ == '$OPENAI_VERSION' and pytest.__version__ == '$PYTEST_VERSION' and m.version('jsonschema') == '$JSONSCHEMA_VERSION'))" 2>/dev/null; then
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "pytest==$PYTEST_VERSION" "jsonschema==$JSONSCHEMA_VERSION" ||
    die "pip install of openai/pytest/jsonschema failed"
fi

# Schemathesis (tests/server/test_schemathesis.py) in a venv of its own: its dependencies
# (hypothesis, jsonschema ranges) must not move the pins above.
SCHEMATHESIS_VERSION=4.32.5
st_venv=${SMELT_SCHEMATHESIS_VENV:-$HOME/.cache/smelt/venv-schemathesis-$SCHEMATHESIS_VERSION}
step "schemathesis $SCHEMATHESIS_VERSION ($st_venv)"
if ! "$st_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('schemathesis') != '$SCHEMATHESIS_VERSION')" 2>/dev/null; then
  python3 -m venv "$st_venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$st_venv/bin/python" -m pip install -q --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" ||
    die "pip install of schemathesis failed"
fi
export SMELT_SCHEMATHESIS=$st_venv/bin/st

# lm-eval (tests/server/test_lmeval.py) in a venv of its own, as a user installs it: its API
# extra needs no torch; its datasets/numpy pins must not move the ones above.
LMEVAL_VERSION=0.4.13
lm_venv=${SMELT_LMEVAL_VENV:-$HOME/.cache/smelt/venv-lmeval-$LMEVAL_VERSION}
step "lm-eval[api] $LMEVAL_VERSION ($lm_venv)"
if ! "$lm_venv/bin/python" -c "import importlib.metadata as m, sys, requests, datasets; sys.exit(m.version('lm_eval') != '$LMEVAL_VERSION')" 2>/dev/null; then
  python3 -m venv "$lm_venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$lm_venv/bin/python" -m pip install -q --disable-pip-version-check "lm-eval[api]==$LMEVAL_VERSION" ||
    die "pip install of lm-eval[api] failed"
fi
[ -x "$lm_venv/bin/lm_eval" ] || die "$lm_venv/bin/lm_eval is missing after installing lm-eval"
export SMELT_LMEVAL_BIN=$lm_venv/bin/lm_eval
# llama.cpp's Python bindings score the same samples (scripts/oracle/llamacpp_lmeval.py);
# scripts/test.sh has installed them already and exports SMELT_PYTHON.
if [ -z "${SMELT_PYTHON:-}" ]; then
  step "python oracles (llama-cpp-python, for the lm-eval comparison)"
  SMELT_PYTHON=$(scripts/oracles.sh | tail -n1)
fi
"$SMELT_PYTHON" -c 'import llama_cpp' || die "SMELT_PYTHON=$SMELT_PYTHON has no llama_cpp: run scripts/oracles.sh"
export SMELT_PYTHON

step "chromium ($chromium)"
if [ ! -x "$chromium" ]; then
  [ "$(id -u)" = 0 ] || die "$chromium is missing and installing it needs root: apt-get install chromium"
  command -v apt-get >/dev/null || die "$chromium is missing and there is no apt-get to install it"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  [ -x "$chromium" ] || die "apt-get install chromium did not give $chromium"
fi

step "playwright-core (npm ci in tests/server/browser)"
command -v node >/dev/null || die "node is missing (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || die "npm is missing (Debian: apt-get install npm)"
browser_dir=tests/server/browser
if [ ! -f "$browser_dir/node_modules/playwright-core/package.json" ] ||
  [ "$browser_dir/package-lock.json" -nt "$browser_dir/node_modules/.package-lock.json" ]; then
  (cd "$browser_dir" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed"
fi

step "cargo build --release -p smelt"
cargo build --release -p smelt
smelt_bin=${CARGO_TARGET_DIR:-$root/target}/release/smelt
[ -x "$smelt_bin" ] || die "$smelt_bin was not built"

step "test models"
model=$(scripts/fetch-models.sh smollm2-135m | tail -n1)
[ -s "$model" ] || die "scripts/fetch-models.sh gave no model file ($model)"
# The gateway tests' nodes load gemma3-270m by its alias from the same folder.
gemma=$(scripts/fetch-models.sh gemma3-270m | tail -n1)
[ "$(dirname "$gemma")" = "$(dirname "$model")" ] || die "the two test models are in different folders"

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$(free_port)
step "smelt serve on port $port"
"$smelt_bin" serve --model "$model" --port "$port" >"$work/server.log" 2>&1 &
server_pid=$!
base=http://127.0.0.1:$port
for _ in $(seq 1 240); do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$work/server.log" >&2
    die "smelt serve exited before /health answered"
  fi
  if "$venv/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('$base/health', timeout=2)" 2>/dev/null; then
    break
  fi
  sleep 0.5
done
"$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('$base/health', timeout=2)" ||
  { cat "$work/server.log" >&2; die "smelt serve did not answer /health within 120 s"; }

export SMELT_BASE_URL=$base SMELT_BIN=$smelt_bin SMELT_MODEL_PATH=$model
mkdir -p bench/out

step "pytest tests/server (openai $OPENAI_VERSION)"
py_rc=0
"$venv/bin/python" -m pytest tests/server -q -p no:cacheprovider --junitxml="$work/junit.xml" "$@" || py_rc=$?

step "browser test (chromium, playwright-core)"
br_rc=0
SMELT_CHROMIUM=$chromium node "$browser_dir/chat-page.mjs" || br_rc=$?

if [ "$py_rc" != 0 ] || [ "$br_rc" != 0 ]; then
  echo "--- last lines of the server log ---" >&2
  tail -n 40 "$work/server.log" >&2
fi

# Counts in cargo's words, for scripts/test.sh's closing summary line.
"$venv/bin/python" - "$work/junit.xml" "$br_rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
try:
    for suite in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
        total = int(suite.get("tests", 0))
        f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        s = int(suite.get("skipped", 0))
        passed += total - f - s
        failed += f
        skipped += s
except (OSError, ET.ParseError):
    failed += 1  # pytest wrote no report: count the run itself as a failure
if sys.argv[2] == "0":
    passed += 1
else:
    failed += 1
state = "ok" if failed == 0 and skipped == 0 else "FAILED"
print(f"test result: {state}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; 0 filtered out (server e2e)")
EOF

[ "$py_rc" = 0 ] || die "pytest failed (exit $py_rc)"
[ "$br_rc" = 0 ] || die "browser test failed (exit $br_rc)"
echo "server-tests: all passed" >&2
