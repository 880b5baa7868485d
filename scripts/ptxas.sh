#!/usr/bin/env bash
# Installs ptxas from the PyPI package nvidia-cuda-nvcc into a virtual environment outside the
# checkout and prints the path of the ptxas binary on the last line.
#
# CI has no GPU and no CUDA toolkit; assembling our generated PTX with the same ptxas
# generation that the GPU machine's driver (580, CUDA 13.0) carries is how CI catches a
# malformed kernel. The version is pinned to CUDA 13.0 so that a PTX feature newer than the
# driver's JIT cannot pass here and fail there. Idempotent: a second run only prints the path.
set -euo pipefail
cache=${SMELT_CACHE:-$HOME/.cache/smelt}
version=${SMELT_NVCC_VERSION:-13.0.88}
venv="$cache/venv-nvcc-$version"
py="$venv/bin/python"

find_ptxas() {
  "$py" - <<'PY'
import pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for candidate in sorted(site.glob("nvidia/cu*/bin/ptxas")) + sorted(site.glob("nvidia/cuda_nvcc/bin/ptxas")):
    if candidate.is_file():
        print(candidate)
        break
PY
}

if [ ! -x "$py" ]; then
  mkdir -p "$cache"
  python3 -m venv "$venv"
fi
ptxas=$(find_ptxas)
if [ -z "$ptxas" ]; then
  echo "ptxas: installing nvidia-cuda-nvcc==$version into $venv (once per machine)" >&2
  "$py" -m pip install -q --disable-pip-version-check "nvidia-cuda-nvcc==$version" >&2
  ptxas=$(find_ptxas)
fi
if [ -z "$ptxas" ]; then
  echo "ptxas: nvidia-cuda-nvcc==$version installed but no ptxas found under $venv" >&2
  exit 1
fi
chmod +x "$ptxas" 2>/dev/null || true
"$ptxas" --version >/dev/null
echo "$ptxas"
