"""ggml's own CPU matmul kernels, called through ctypes, for smelt's exact-order tests.

usage: ggml_dot.py TYPE_ID N ROWS DIR

Reads DIR/w.bin (ROWS rows of N weights of ggml type TYPE_ID, ggml's bytes) and DIR/x.bin
(T rows of N little-endian f32 activations), quantizes each activation row with the CPU
backend's `from_float` of the type's `vec_dot_type` (the x86 AVX2 quantizers llama.cpp
uses) into DIR/xq.bin, and writes DIR/out.bin: T x ROWS f32, out[t][r] = ggml's `vec_dot`
of weight row r with activation row t (the decode path of ggml_compute_forward_mul_mat).
"""
import ctypes
import os
import sys

import numpy as np
import llama_cpp


class Traits(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)


def libs():
    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(d, "libggml-base.so"))
    cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"))
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def main():
    ty, n, rows, d = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    base, cpu = libs()
    tr = cpu.ggml_get_type_traits_cpu(ty).contents
    act = tr.vec_dot_type
    act_tr = cpu.ggml_get_type_traits_cpu(act).contents
    wrow = base.ggml_row_size(ty, n)
    arow = base.ggml_row_size(act, n)
    w = np.fromfile(os.path.join(d, "w.bin"), dtype=np.uint8)
    assert w.size == rows * wrow, (w.size, rows, wrow)
    x = np.fromfile(os.path.join(d, "x.bin"), dtype=np.float32)
    t = x.size // n
    xq = np.zeros(t * arow, dtype=np.uint8)
    from_float = FROM_FLOAT(act_tr.from_float) if act != 0 else None
    for i in range(t):
        src = x[i * n:(i + 1) * n]
        if from_float is None:
            xq[i * arow:(i + 1) * arow] = np.frombuffer(src.tobytes(), dtype=np.uint8)
        else:
            from_float(src.ctypes.data, xq[i * arow:].ctypes.data, n)
    vec_dot = VEC_DOT(tr.vec_dot)
    out = np.zeros(t * rows, dtype=np.float32)
    for i in range(t):
        for r in range(rows):
            vec_dot(n, out[i * rows + r:].ctypes.data, 0, w[r * wrow:].ctypes.data, 0,
                    xq[i * arow:].ctypes.data, 0, 1)
    xq.tofile(os.path.join(d, "xq.bin"))
    out.tofile(os.path.join(d, "out.bin"))


if __name__ == "__main__":
    main()
