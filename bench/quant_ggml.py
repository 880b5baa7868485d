"""Times ggml's own quantizer on the benchmark tensor and checks smelt's bytes against it.

Run by bench/quant.sh after the Rust side (bench/candle-quant), which wrote the input
tensor, smelt's output per type and rust.json into the output folder. ggml is reached
through llama-cpp-python's libggml-base (`ggml_quantize_chunk`, no importance matrix), the
same entry point llama.cpp's quantize tool uses. "All cores" splits the rows into one
contiguous slice per thread: ctypes releases the GIL for the length of each call, so the
threads run ggml in parallel with no Python in the hot loop.

Writes ggml.json beside rust.json; exits non-zero when ggml's bytes and smelt's differ.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np


def plain_pages() -> None:
    """Stops numpy from asking for transparent huge pages on big arrays.

    numpy madvises large allocations with MADV_HUGEPAGE; ggml's callers (and smelt's and
    candle's Vec) get ordinary malloc memory. With THP in `madvise` mode, numpy's buffers
    would fault in 2 MiB at a time and spare ggml ~10 ms of page faults per output that
    the others pay, so the harness gives ggml the same plain pages.
    """
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)


def load_ggml_base() -> ctypes.CDLL:
    """libggml-base from llama-cpp-python's package folder, found without importing it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        sys.exit("llama_cpp is not installed in this python: run scripts/oracles.sh")
    path = Path(spec.origin).parent / "lib" / "libggml-base.so"
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,  # enum ggml_type
        ctypes.c_void_p,  # const float * src
        ctypes.c_void_p,  # void * dst
        ctypes.c_int64,  # start (element index, a whole number of rows)
        ctypes.c_int64,  # nrows
        ctypes.c_int64,  # n_per_row
        ctypes.c_void_p,  # const float * imatrix
    ]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    return lib


def quantize(lib, pool, ty: int, src: np.ndarray, threads: int) -> np.ndarray:
    """Quantizes all rows of `src` into a fresh buffer (allocated inside the timed region,
    as smelt's and candle's are), splitting rows over `threads` pool threads."""
    rows, cols = src.shape
    row_bytes = lib.ggml_row_size(ty, cols)
    dst = np.empty(rows * row_bytes, dtype=np.uint8)
    src_ptr, dst_ptr = src.ctypes.data, dst.ctypes.data

    def chunk(lo: int, hi: int) -> int:
        return lib.ggml_quantize_chunk(ty, src_ptr, dst_ptr, lo * cols, hi - lo, cols, None)

    bounds = [rows * i // threads for i in range(threads + 1)]
    if threads == 1:
        written = chunk(0, rows)
    else:
        written = sum(pool.map(lambda i: chunk(bounds[i], bounds[i + 1]), range(threads)))
    if written != dst.size:
        raise RuntimeError(f"ggml wrote {written} bytes, expected {dst.size}")
    return dst


def best_of(runs: int, f):
    """(fastest of `runs` timed calls in ms, result of the untimed warm-up call)."""
    first = f()
    best = float("inf")
    for _ in range(max(runs, 1)):
        start = time.perf_counter()
        out = f()
        best = min(best, (time.perf_counter() - start) * 1e3)
        del out
    return best, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="bench/out", help="folder holding rust.json and the input")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    plain_pages()
    folder = Path(args.dir)
    rust = json.loads((folder / "rust.json").read_text())
    rows, cols = rust["rows"], rust["cols"]
    src = np.fromfile(folder / rust["input"], dtype="<f4")
    if src.size != rows * cols:
        sys.exit(f"{rust['input']}: {src.size} floats, expected {rows}x{cols}")
    src = np.ascontiguousarray(src.reshape(rows, cols))

    lib = load_ggml_base()
    results, mismatch = [], False
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for entry in rust["types"]:
            name = entry["type"]
            ty = gguf.GGMLQuantizationType[name].value
            print(f"{name}: ggml, 1 thread ...", file=sys.stderr)
            ms_1t, out_1t = best_of(args.runs, lambda: quantize(lib, pool, ty, src, 1))
            print(f"{name}: ggml, {args.threads} threads ...", file=sys.stderr)
            ms_all, out_all = best_of(args.runs, lambda: quantize(lib, pool, ty, src, args.threads))
            res = {
                "type": name,
                "ggml_1t_ms": round(ms_1t, 3),
                "ggml_all_ms": round(ms_all, 3),
                "ggml_threads": args.threads,
                "ggml_threaded_eq_1t": bool(np.array_equal(out_1t, out_all)),
            }
            if "smelt_file" in entry:
                smelt = np.fromfile(folder / entry["smelt_file"], dtype=np.uint8)
                block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1]
                eq = smelt.size == out_1t.size and bool(np.array_equal(smelt, out_1t))
                res["smelt_eq_ggml"] = eq
                if not eq and smelt.size == out_1t.size:
                    bad = np.flatnonzero(
                        (smelt.reshape(-1, block_bytes) != out_1t.reshape(-1, block_bytes)).any(axis=1)
                    )
                    res["blocks_differing_from_ggml"] = int(bad.size)
                    res["first_block_differing_from_ggml"] = int(bad[0])
                mismatch |= not eq
            mismatch |= not res["ggml_threaded_eq_1t"]
            print(json.dumps(res), file=sys.stderr)
            results.append(res)

    (folder / "ggml.json").write_text(json.dumps({"threads": args.threads, "types": results}, indent=1) + "\n")
    if mismatch:
        print("ggml's bytes differ from smelt's (or from its own threaded run): see ggml.json", file=sys.stderr)
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
