#!/usr/bin/env bash
# Installs the Python oracles the tests compare against (ggml through llama-cpp-python,
# gguf-py's numpy code) into a virtual environment outside the checkout, so a fresh clone on
# the same machine reuses it. Prints the venv's python path on the last line.
#
# llama-cpp-python ships only as an sdist: building its libggml takes 15-20 minutes on two
# cores. AMX must be off: the native build enables it on these CPUs and crashes at decode.
set -euo pipefail
cache=${SMELT_CACHE:-$HOME/.cache/smelt}
venv="$cache/venv-llcpp-0.3.36"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  mkdir -p "$cache"
  python3 -m venv "$venv"
fi
if ! "$py" -c 'import numpy, gguf' 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check numpy 'gguf==0.19.0' >&2
fi
# Hugging Face folders for smelt-load's tests (scripts/oracle/hf_folder.py writes them).
if ! "$py" -c 'import safetensors, tokenizers' 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check 'safetensors==0.8.0' 'tokenizers==0.23.3' >&2
fi
# The CPU engine reproduces llama.cpp's AVX-512 build bit for bit, so that is the oracle's build;
# on a CPU without AVX-512 it dies with SIGILL. Say so once, loudly, instead of leaving dozens
# of tests to fail with a signal.
if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "oracles: WARNING: this CPU has no AVX-512 (no avx512f in /proc/cpuinfo): the llama.cpp" >&2
  echo "oracles: oracle is its AVX-512 build (the bits the CPU engine reproduces) and will stop" >&2
  echo "oracles: with SIGILL; every test that runs it fails on this machine" >&2
fi
if ! "$py" -c 'import llama_cpp' 2>/dev/null; then
  echo "oracles: building llama-cpp-python 0.3.36 (15-20 minutes on 2 cores, once per machine)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$py" -m pip install -q --disable-pip-version-check 'llama-cpp-python==0.3.36' >&2
fi
echo "$py"
