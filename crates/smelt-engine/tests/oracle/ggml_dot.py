"""ggml's own CPU matmul kernels, called through ctypes, for smelt's exact-order tests.

usage: ggml_dot.py TYPE_ID N ROWS DIR [repack]

Reads DIR/w.bin (ROWS rows of N weights of ggml type TYPE_ID, ggml's bytes) and DIR/x.bin
(T rows of N little-endian f32 activations), quantizes each activation row with the CPU
backend's `from_float` of the type's `vec_dot_type` (the x86 AVX2 quantizers llama.cpp
uses) into DIR/xq.bin, and writes DIR/out.bin: T x ROWS f32, out[t][r] = ggml's `vec_dot`
of weight row r with activation row t (the decode path of ggml_compute_forward_mul_mat).
With `repack`, DIR/out.bin comes from a real ggml_mul_mat graph whose weight sits in the
CPU_REPACK buffer, as llama.cpp places Q4_K weights on x86 (gemm for groups of four
tokens, gemv for the rest); xq.bin is not written then.
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
    if len(sys.argv) > 5:
        mul_mat_graph(ty, n, rows, d, sys.argv[5] == "repack")
        return
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




def mul_mat_graph(ty, n, rows, d, repack):
    """ggml_mul_mat(W, X) through a real graph: the weight in the CPU_REPACK buffer (as
    llama.cpp places it) when `repack`, else in plain memory; writes DIR/out.bin."""
    base, cpu = libs()
    vp = ctypes.c_void_p

    class P(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]

    for name, res, args in [
        ("ggml_init", vp, [P]),
        ("ggml_new_tensor_2d", vp, [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
        ("ggml_mul_mat", vp, [vp, vp, vp]),
        ("ggml_new_graph", vp, [vp]),
        ("ggml_build_forward_expand", None, [vp, vp]),
        ("ggml_get_data", vp, [vp]),
        ("ggml_backend_buft_alloc_buffer", vp, [vp, ctypes.c_size_t]),
        ("ggml_backend_buft_get_alloc_size", ctypes.c_size_t, [vp, vp]),
        ("ggml_backend_buffer_get_base", vp, [vp]),
        ("ggml_backend_tensor_alloc", ctypes.c_int, [vp, vp, vp]),
        ("ggml_backend_tensor_set", None, [vp, vp, ctypes.c_size_t, ctypes.c_size_t]),
    ]:
        getattr(base, name).restype = res
        getattr(base, name).argtypes = args
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    cpu._Z35ggml_backend_cpu_repack_buffer_typev.restype = vp
    w = np.fromfile(os.path.join(d, "w.bin"), dtype=np.uint8)
    x = np.fromfile(os.path.join(d, "x.bin"), dtype=np.float32)
    t = x.size // n
    wctx = base.ggml_init(P(w.size + (1 << 20), None, repack))
    wt = base.ggml_new_tensor_2d(wctx, ty, n, rows)
    if repack:
        buft = cpu._Z35ggml_backend_cpu_repack_buffer_typev()
        size = base.ggml_backend_buft_get_alloc_size(buft, wt)
        buf = base.ggml_backend_buft_alloc_buffer(buft, size + 4096)
        assert base.ggml_backend_tensor_alloc(buf, wt, base.ggml_backend_buffer_get_base(buf)) == 0
        base.ggml_backend_tensor_set(wt, w.ctypes.data, 0, w.size)
    else:
        ctypes.memmove(base.ggml_get_data(wt), w.ctypes.data, w.size)
    ctx = base.ggml_init(P(256 << 20, None, False))
    xt = base.ggml_new_tensor_2d(ctx, 0, n, t)
    ctypes.memmove(base.ggml_get_data(xt), x.ctypes.data, x.nbytes)
    y = base.ggml_mul_mat(ctx, wt, xt)
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, y)
    cpu.ggml_graph_compute_with_ctx(ctx, gf, 1)
    out = np.ctypeslib.as_array((ctypes.c_float * (t * rows)).from_address(base.ggml_get_data(y))).copy()
    out.tofile(os.path.join(d, "out.bin"))


if __name__ == "__main__":
    main()
