#!/usr/bin/env bash
# Installs the Python oracles the tests compare against (ggml through llama-cpp-python,
# gguf-py's numpy code) into a virtual environment outside the checkout, so a fresh clone on
# the same machine reuses it. Prints the venv's python path on the last line.
#
# llama-cpp-python ships only as an sdist: building its libggml takes 15-20 minutes on two
# cores. AMX must be off: the native build enables it on these CPUs and crashes at decode.
set -euo pipefail
cache=${SMELT_CACHE:-$HOME/.cache/smelt}
# The CPU engine reproduces llama.cpp's AVX-512 build bit for bit, so that is the oracle's
# build where the CPU can run it; elsewhere (it would die with SIGILL) an AVX2 build, whose
# quantizers and tokenizer agree byte for byte, and the tests whose answers depend on the build
# replay the AVX-512 build's answers committed in crates/smelt-oracle/records/
# (smelt_oracle::Flavour and run_recorded make the same choice).
flavour=avx2
if [ "$(grep -m1 -ow -E 'avx512f|avx512bw|avx512vl|avx512dq|avx512cd' /proc/cpuinfo 2>/dev/null | sort -u | wc -l)" -eq 5 ]; then
  flavour=avx512
fi
venv="$cache/venv-llcpp-0.3.36-$flavour"
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
if ! "$py" -c 'import llama_cpp' 2>/dev/null; then
  echo "oracles: building llama-cpp-python 0.3.36, $flavour (15-20 minutes on 2 cores, once per machine)" >&2
  avx512=OFF; [ "$flavour" = avx512 ] && avx512=ON
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$avx512 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$py" -m pip install -q --disable-pip-version-check 'llama-cpp-python==0.3.36' >&2
fi
echo "$py"
