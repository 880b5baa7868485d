#!/usr/bin/env bash
# The gateway overhead benchmark (bench.py) on a quiet many-core machine that has no
# network (the GPU machine: 16 cores, nothing else running), from carried files: the
# gzipped smelt binary, httpx and its dependencies as wheels, and a GGUF holding only a
# tokenizer; the node serves a random two-layer llama3-tiny written there with that
# tokenizer (the gateway's cost does not depend on the model; a small one makes the
# node's per-token time short, so the gateway's share shows).
#
# Here:  mkdir -p .gpu-gw/wheels; pip download --only-binary=:all: --no-deps -d .gpu-gw/wheels
#        httpx httpcore h11 anyio sniffio idna certifi typing_extensions exceptiongroup;
#        gzip -9 -c SMELT > .gpu-gw/smelt.gz; cp TOKENIZER_ONLY.gguf .gpu-gw/tok.gguf
# There: bash bench/gateway/quiet-host.sh [bench.py options]    carry [".gpu-gw"]
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --target /tmp/gw-site .gpu-gw/wheels/*.whl
export PYTHONPATH=/tmp/gw-site
gunzip -c .gpu-gw/smelt.gz > /tmp/smelt && chmod +x /tmp/smelt
/tmp/smelt synth --shape llama3-tiny --quant q4_k --tokenizer-from .gpu-gw/tok.gguf -o /tmp/gw-model.gguf > /dev/null
nproc
exec python3 bench/gateway/bench.py /tmp/smelt /tmp/gw-model.gguf "$@"
