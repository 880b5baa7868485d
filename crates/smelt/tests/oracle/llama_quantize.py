"""Quantize a GGUF with llama.cpp's own llama_model_quantize (llama-cpp-python).

usage: llama_quantize.py IN OUT FTYPE [--pure]
(FTYPE: llama.cpp's LLAMA_FTYPE number, e.g. 15 = Q4_K_M; --pure: one type, no mixture rules)
"""
import ctypes
import sys

import llama_cpp


def main():
    inp, out, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    params.pure = "--pure" in sys.argv[4:]
    rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llama_model_quantize failed with {rc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
