"""ctypes access to ggml's own quantizers, dequantizers and dot products.

ggml is reached through the shared libraries that llama-cpp-python 0.3.36 builds and ships
(vendoring llama.cpp 0c1e570): `libggml-base.so` holds the reference (scalar) quantizers
and dequantizers, `libggml-cpu.so` the SIMD dot products. Nothing here reimplements a
format: every byte that leaves this module came out of ggml, except Q8_1's dequantization,
for which ggml has no function (see `dequantize`).

Struct layouts are taken from the headers llama-cpp-python installs next to its libraries
(`site-packages/include/ggml.h` and `ggml-cpu.h`, which are llama.cpp 0c1e570's) and are
checked against ggml's own accessors when the library loads, so a layout mistake fails
loudly instead of reading garbage.
"""

import ctypes
import os

import numpy as np

# ggml_type ids (ggml.h `enum ggml_type`) for the types smelt handles.
TYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q8_1": 9,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "Q8_K": 15,
    "IQ4_NL": 20,
    "IQ4_XS": 23,
    "BF16": 30,
}

# (ggml type_name, blck_size, type_size) as ggml.c's type_traits table defines them; the
# loader checks that the struct read back through ctypes says exactly this.
EXPECTED_TRAITS = {
    "F32": (b"f32", 1, 4),
    "F16": (b"f16", 1, 2),
    "Q4_0": (b"q4_0", 32, 18),
    "Q4_1": (b"q4_1", 32, 20),
    "Q5_0": (b"q5_0", 32, 22),
    "Q5_1": (b"q5_1", 32, 24),
    "Q8_0": (b"q8_0", 32, 34),
    "Q8_1": (b"q8_1", 32, 36),
    "Q2_K": (b"q2_K", 256, 84),
    "Q3_K": (b"q3_K", 256, 110),
    "Q4_K": (b"q4_K", 256, 144),
    "Q5_K": (b"q5_K", 256, 176),
    "Q6_K": (b"q6_K", 256, 210),
    "Q8_K": (b"q8_K", 256, 292),
    "IQ4_NL": (b"iq4_nl", 32, 18),
    "IQ4_XS": (b"iq4_xs", 256, 136),
    "BF16": (b"bf16", 1, 2),
}

# typedef void (*ggml_to_float_t)  (const void * x, float * y, int64_t k);
TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# typedef void (*ggml_from_float_t)(const float * x, void * y, int64_t k);
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# typedef void (*ggml_vec_dot_t)(int n, float * s, size_t bs, const void * x, size_t bx,
#                                const void * y, size_t by, int nrc);
VEC_DOT = ctypes.CFUNCTYPE(
    None,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
)


class TypeTraits(ctypes.Structure):
    """`struct ggml_type_traits` (ggml.h, llama.cpp 0c1e570)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class TypeTraitsCpu(ctypes.Structure):
    """`struct ggml_type_traits_cpu` (ggml-cpu.h, llama.cpp 0c1e570)."""

    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


class OracleError(Exception):
    pass


def lib_dir():
    """Where llama-cpp-python keeps its ggml libraries."""
    try:
        import llama_cpp
    except ImportError as e:
        raise OracleError(f"llama_cpp is not importable ({e}): run scripts/oracles.sh") from e
    return os.path.join(os.path.dirname(llama_cpp.__file__), "lib")


class Ggml:
    """The ggml functions the oracles need, with argument types declared."""

    def __init__(self, with_cpu=False):
        d = lib_dir()
        self.base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        b = self.base
        b.ggml_get_type_traits.argtypes = [ctypes.c_int]
        b.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        b.ggml_type_size.argtypes = [ctypes.c_int]
        b.ggml_type_size.restype = ctypes.c_size_t
        b.ggml_blck_size.argtypes = [ctypes.c_int]
        b.ggml_blck_size.restype = ctypes.c_int64
        b.ggml_type_name.argtypes = [ctypes.c_int]
        b.ggml_type_name.restype = ctypes.c_char_p
        b.ggml_quantize_chunk.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        ]
        b.ggml_quantize_chunk.restype = ctypes.c_size_t
        # Q8_K has neither from_float_ref nor to_float in 0c1e570's type_traits table, but
        # ggml-base exports its reference quantizer and dequantizer by name.
        for name in ("quantize_row_q8_K_ref", "dequantize_row_q8_K"):
            f = getattr(b, name)
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            f.restype = None
        self._check_layout()
        self.cpu = None
        if with_cpu:
            self.cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
            self.cpu.ggml_cpu_init.argtypes = []
            self.cpu.ggml_cpu_init.restype = None
            self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
            self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
            self.cpu.ggml_cpu_init()
            self._check_cpu_layout()

    def traits(self, name):
        return self.base.ggml_get_type_traits(TYPES[name]).contents

    def _check_layout(self):
        """Reads every type's traits through the ctypes struct and compares with ggml's own
        accessors and the table above: a wrong field offset cannot pass this."""
        for name, (tname, blck, tsize) in EXPECTED_TRAITS.items():
            t = TYPES[name]
            tr = self.traits(name)
            got = (tr.type_name, tr.blck_size, tr.type_size)
            acc = (self.base.ggml_type_name(t), self.base.ggml_blck_size(t), self.base.ggml_type_size(t))
            if got != (tname, blck, tsize) or acc != (tname, blck, tsize):
                raise OracleError(
                    f"ggml_type_traits layout mismatch for {name}: struct says {got}, "
                    f"accessors say {acc}, expected {(tname, blck, tsize)}"
                )
            if tr.blck_size_interleave != 0 or tr.is_quantized != (blck > 1):
                raise OracleError(
                    f"ggml_type_traits layout mismatch for {name}: interleave "
                    f"{tr.blck_size_interleave}, is_quantized {tr.is_quantized}"
                )
        # The function pointers must be the exported functions they name.
        q8 = self.traits("Q8_0")
        for field, symbol in (("to_float", "dequantize_row_q8_0"), ("from_float_ref", "quantize_row_q8_0_ref")):
            want = ctypes.cast(getattr(self.base, symbol), ctypes.c_void_p).value
            if getattr(q8, field) != want:
                raise OracleError(f"ggml_type_traits layout mismatch: Q8_0's {field} is not {symbol}")

    def _check_cpu_layout(self):
        """`struct ggml_type_traits_cpu` read through ctypes must name the exported Q4_0
        functions and ggml's known activation pairings."""
        tr = self.cpu.ggml_get_type_traits_cpu(TYPES["Q4_0"]).contents
        for field, symbol in (("from_float", "quantize_row_q4_0"), ("vec_dot", "ggml_vec_dot_q4_0_q8_0")):
            want = ctypes.cast(getattr(self.cpu, symbol), ctypes.c_void_p).value
            if getattr(tr, field) != want:
                raise OracleError(f"ggml_type_traits_cpu layout mismatch: Q4_0's {field} is not {symbol}")
        for name, act in (("Q4_0", "Q8_0"), ("Q4_1", "Q8_1"), ("Q4_K", "Q8_K"), ("F16", "F16")):
            tr = self.cpu.ggml_get_type_traits_cpu(TYPES[name]).contents
            if tr.vec_dot_type != TYPES[act] or tr.nrows != 1:
                raise OracleError(
                    f"ggml_type_traits_cpu layout mismatch: {name} pairs with type "
                    f"{tr.vec_dot_type} ({tr.nrows} rows), expected {act}"
                )

    def row_size(self, name, n):
        blck, tsize = EXPECTED_TRAITS[name][1:]
        if n % blck:
            raise OracleError(f"{n} is not a multiple of {name}'s block {blck}")
        return n // blck * tsize

    def quantize(self, name, row):
        """One row of f32 to `name` with ggml's reference quantizer (no imatrix)."""
        src = np.ascontiguousarray(row, dtype=np.float32)
        n = src.size
        out = np.zeros(self.row_size(name, n), dtype=np.uint8)
        if name == "Q8_K":
            self.base.quantize_row_q8_K_ref(src.ctypes.data, out.ctypes.data, n)
        elif name == "Q8_1":
            # ggml_quantize_chunk does not take Q8_1: it is an activation-only format.
            ptr = self.traits(name).from_float_ref
            if not ptr:
                raise OracleError("ggml has no from_float_ref for Q8_1")
            FROM_FLOAT(ptr)(src.ctypes.data, out.ctypes.data, n)
        else:
            got = self.base.ggml_quantize_chunk(TYPES[name], src.ctypes.data, out.ctypes.data, 0, 1, n, None)
            if got != out.size:
                raise OracleError(f"ggml_quantize_chunk({name}) wrote {got} bytes, expected {out.size}")
        return out

    def dequantize(self, name, data, n):
        """`n` weights of `name` (raw bytes) to f32 with ggml's `to_float`."""
        src = np.ascontiguousarray(np.frombuffer(bytes(data), dtype=np.uint8))
        if src.size != self.row_size(name, n):
            raise OracleError(f"{src.size} bytes is not {n} weights of {name}")
        out = np.zeros(n, dtype=np.float32)
        if name == "F32":
            # ggml has no to_float for F32: its rows are already floats.
            out[:] = src.view(np.float32)
        elif name == "Q8_K":
            self.base.dequantize_row_q8_K(src.ctypes.data, out.ctypes.data, n)
        elif name == "Q8_1":
            # ggml never dequantizes Q8_1 (it only exists as dot-product activations), so
            # this is the format's definition, x = d * q, with d (f16) widened to f32 and
            # one f32 multiply, as every ggml dequantizer of an 8-bit block does.
            blocks = src.reshape(-1, 36)
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 4:36].copy().view(np.int8).astype(np.float32)
            with np.errstate(invalid="ignore"):  # an inf scale times q = 0 is NaN, as in C
                out[:] = (d * q).reshape(-1)
        else:
            ptr = self.traits(name).to_float
            if not ptr:
                raise OracleError(f"ggml has no to_float for {name}")
            TO_FLOAT(ptr)(src.ctypes.data, out.ctypes.data, n)
        return out

    def vec_dot(self, name, n, x, y):
        """ggml-cpu's `vec_dot` for weight type `name` on `n` weights: `x` in `name`, `y`
        in its vec_dot_type. Returns None where ggml-cpu has no vec_dot for the type."""
        if self.cpu is None:
            raise OracleError("Ggml(with_cpu=True) is needed for vec_dot")
        tr = self.cpu.ggml_get_type_traits_cpu(TYPES[name]).contents
        if not tr.vec_dot:
            return None
        xs = np.ascontiguousarray(np.frombuffer(bytes(x), dtype=np.uint8))
        ys = np.ascontiguousarray(np.frombuffer(bytes(y), dtype=np.uint8))
        s = np.zeros(1, dtype=np.float32)
        VEC_DOT(tr.vec_dot)(n, s.ctypes.data, 0, xs.ctypes.data, 0, ys.ctypes.data, 0, 1)
        return float(s[0])

    def vec_dot_type(self, name):
        if self.cpu is None:
            raise OracleError("Ggml(with_cpu=True) is needed for vec_dot_type")
        return self.cpu.ggml_get_type_traits_cpu(TYPES[name]).contents.vec_dot_type
