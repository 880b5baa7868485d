#!/usr/bin/env python3
"""Reference data for smelt-quant's byte-exact parity tests, made by ggml itself.

    ggml_refs.py write DIR    generate inputs, run ggml on them, write DIR/*.bin
    ggml_refs.py check DIR    run ggml again on DIR's committed inputs and compare every
                              output byte with DIR's files (one line per type; exit 1 on
                              any difference)

Run it with the oracle venv's python (`scripts/oracles.sh` prints its path). ggml is
llama-cpp-python 0.3.36's libggml (llama.cpp 0c1e570), loaded by `ggml_lib`.

Inputs come in two sets: `b32` (every row length a multiple of 32; used by the 1- and
32-weight types) and `b256` (multiples of 256; the 256-weight types). Each set is a list
of named rows: random data from several distributions, zeros, constants, outliers, tiny,
subnormal and huge magnitudes, at every row length from 1 to 16 blocks (b32) or 1 to 8
super-blocks (b256), plus one 4096-long row.

File format (all little-endian; `str` = u16 length + UTF-8 bytes):

  inputs_<set>.bin   b"SMQIN\\0\\0\\1", u32 rows, then per row: str case, u32 n, f32[n]
  <type>.bin         b"SMQREF\\0\\1", u32 ggml type id, u32 block size, u32 type size,
                     str input set, u32 rows (0 for dequantize-only types), then per row:
                     u8[n / block * type size] ggml's quantization, f32[n] ggml's
                     dequantization of those bytes; then u32 blocks, u8[blocks * type
                     size] random valid blocks (finite scales), f32[blocks * block size]
                     ggml's dequantization of them.
"""

import hashlib
import os
import struct
import sys

import numpy as np

from ggml_lib import EXPECTED_TRAITS, TYPES, Ggml, OracleError

QUANTIZED = [
    "F32", "F16", "BF16",
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
]
DEQUANT_ONLY = ["IQ4_NL", "IQ4_XS"]

# Byte offsets of the f16 scale fields in each block (ggml-common.h), patched to finite
# values in the random blocks so they decode to finite floats.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}
RANDOM_BLOCKS = {1: 2048, 32: 256, 256: 32}

INPUTS_MAGIC = b"SMQIN\0\0\1"
REF_MAGIC = b"SMQREF\0\1"


def input_set(ty):
    return "b256" if EXPECTED_TRAITS[ty][1] == 256 else "b32"


def rng_for(*names):
    """A generator seeded from names, so adding a case never shifts another's data."""
    digest = hashlib.sha256("/".join(map(str, names)).encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def f16_finite(rng, n):
    """n random finite f16 values (every exponent, both signs, subnormals and zeros)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)
    return bits.view(np.float16)


def ties_between(values):
    """Exact midpoints between consecutive values of a narrower float format, as f32."""
    v = values.astype(np.float64)
    return ((v[:-1] + v[1:]) / 2).astype(np.float32)


# Each case maps (rng, n) to n float32 values.
def _normal(scale):
    return lambda r, n: r.standard_normal(n) * scale


def _const(c):
    return lambda r, n: np.full(n, c)


def _outlier(v):
    def gen(r, n):
        x = r.standard_normal(n)
        x[r.integers(0, n)] = v
        return x
    return gen


def _one_nonzero(r, n):
    x = np.zeros(n)
    x[r.integers(0, n)] = r.standard_normal()
    return x


def _subnormal(r, n):
    bits = r.integers(1, 1 << 23, size=n, dtype=np.uint32) | (r.integers(0, 2, size=n, dtype=np.uint32) << 31)
    return bits.astype(np.uint32).view(np.float32)


def _magnitudes(lo, hi):
    return lambda r, n: np.where(r.random(n) < 0.5, -1.0, 1.0) * 10.0 ** r.uniform(lo, hi, n)


def _chunk_scales(r, n):
    """Every 16 weights at its own magnitude: stresses K-quants' sub-block scales."""
    scales = np.repeat(10.0 ** r.uniform(-4, 4, n // 16), 16)
    return r.standard_normal(n) * scales


def _chunk_zero(r, n):
    x = r.standard_normal(n)
    c = r.integers(0, n // 32)
    x[c * 32:(c + 1) * 32] = 0
    return x


def _chunk_huge(r, n):
    x = r.standard_normal(n)
    c = r.integers(0, n // 32)
    x[c * 32:(c + 1) * 32] *= 1000
    return x


def _sparse(r, n):
    return np.where(r.random(n) < 0.9, 0.0, r.standard_normal(n))


def _f16_exact(r, n):
    return f16_finite(r, n).astype(np.float32)


def _f16_ties(r, n):
    v = np.sort(r.standard_normal(n + 1).astype(np.float16))
    v = np.unique(v.astype(np.float32))
    nxt = np.nextafter(v.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    mids = ((v.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)
    return r.permutation(np.resize(mids, n))


def _bf16_ties(r, n):
    bits = (r.standard_normal(n).astype(np.float32).view(np.uint32) & 0xFFFF0000) | 0x8000
    return bits.astype(np.uint32).view(np.float32)


def _alternating(r, n):
    return np.where(np.arange(n) % 2 == 0, 1.0, -1.0) * (1 + r.random(n) * 1e-3)


# (name, generator, lengths in blocks: "all" = every length of the set, else a list)
SPECIAL = {"b32": [1, 4], "b256": [1]}
DIST = {"b32": [3, 16], "b256": [1, 3]}
CASES = [
    ("normal", _normal(1.0), "all"),
    ("zeros", _const(0.0), SPECIAL),
    ("neg_zeros", _const(-0.0), SPECIAL),
    ("mixed_zeros", lambda r, n: np.where(r.random(n) < 0.5, -0.0, 0.0), SPECIAL),
    ("one_nonzero", _one_nonzero, SPECIAL),
    ("two_levels", lambda r, n: np.where(r.random(n) < 0.5, -0.75, 2.5), SPECIAL),
    ("const_pos", _const(1.0), SPECIAL),
    ("const_neg", _const(-1.0), SPECIAL),
    ("const_0.3", _const(0.3), SPECIAL),
    ("const_neg_tiny", _const(-1e-3), SPECIAL),
    ("const_huge", _const(3e38), SPECIAL),
    ("outlier_pos", _outlier(1e4), SPECIAL),
    ("outlier_neg", _outlier(-1e4), SPECIAL),
    ("outlier_1e30", _outlier(1e30), SPECIAL),
    ("tiny_1e-30", _normal(1e-30), SPECIAL),
    ("tiny_1e-38", _normal(1e-38), SPECIAL),
    ("subnormal", _subnormal, SPECIAL),
    ("tiny_mixed", _magnitudes(-45, -30), SPECIAL),
    ("huge_1e30", _normal(1e30), SPECIAL),
    ("huge_max", lambda r, n: r.uniform(-3.4e38, 3.4e38, n), SPECIAL),
    ("mixed_magnitudes", _magnitudes(-38, 38), SPECIAL),
    ("normal_0.01", _normal(0.01), DIST),
    ("normal_100", _normal(100.0), DIST),
    ("uniform", lambda r, n: r.uniform(-1, 1, n), DIST),
    ("laplace", lambda r, n: r.laplace(0, 1, n), DIST),
    ("positive", lambda r, n: np.abs(r.standard_normal(n)), DIST),
    ("negative", lambda r, n: -np.abs(r.standard_normal(n)), DIST),
    ("ints_-8_7", lambda r, n: r.integers(-8, 8, n).astype(np.float64), DIST),
    ("ints_-128_127", lambda r, n: r.integers(-128, 128, n).astype(np.float64), DIST),
    ("half_ints", lambda r, n: np.round(r.standard_normal(n) * 8) / 2, DIST),
    ("sparse", _sparse, DIST),
    ("f16_exact", _f16_exact, DIST),
    ("f16_ties", _f16_ties, DIST),
    ("bf16_ties", _bf16_ties, DIST),
    ("alternating", _alternating, DIST),
    ("chunk_scales", _chunk_scales, DIST),
    ("chunk_zero", _chunk_zero, DIST),
    ("chunk_huge", _chunk_huge, DIST),
]
MAX_BLOCKS = {"b32": 16, "b256": 8}
BLOCK = {"b32": 32, "b256": 256}
LONG_ROW = 4096


def make_inputs(set_name):
    """[(case, row)] for one input set."""
    block = BLOCK[set_name]
    rows = []
    for name, gen, lengths in CASES:
        ks = range(1, MAX_BLOCKS[set_name] + 1) if lengths == "all" else lengths[set_name]
        for k in ks:
            n = k * block
            with np.errstate(over="ignore"):
                row = np.asarray(gen(rng_for(set_name, name, n), n), dtype=np.float64).astype(np.float32)
            assert row.shape == (n,) and np.all(np.isfinite(row)), (set_name, name, n)
            rows.append((name, row))
    rows.append(("long_chunk_scales", _chunk_scales(rng_for(set_name, "long", LONG_ROW), LONG_ROW).astype(np.float32)))
    rows.append(("long_normal", rng_for(set_name, "long_normal").standard_normal(LONG_ROW).astype(np.float32)))
    return rows


def random_blocks(ty):
    """Random bytes with every scale field set to a finite value: any such block is valid."""
    block, tsize = EXPECTED_TRAITS[ty][1:]
    nb = RANDOM_BLOCKS[block]
    r = rng_for("random_blocks", ty)
    if ty == "F32":
        bits = r.integers(0, 1 << 32, size=nb, dtype=np.uint64).astype(np.uint32)
        bits = np.where((bits & 0x7F800000) == 0x7F800000, bits & 0xBFFFFFFF, bits).astype(np.uint32)
        return bits.view(np.uint8)
    if ty == "F16":
        return f16_finite(r, nb).view(np.uint8)
    if ty == "BF16":
        bits = r.integers(0, 1 << 16, size=nb, dtype=np.uint32).astype(np.uint16)
        bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0xBFFF, bits).astype(np.uint16)
        return bits.view(np.uint8)
    raw = r.integers(0, 256, size=(nb, tsize), dtype=np.uint16).astype(np.uint8)
    if ty == "Q8_K":
        raw[:, 0:4] = f16_finite(r, nb).astype(np.float32).view(np.uint8).reshape(nb, 4)
    else:
        for off in F16_FIELDS[ty]:
            raw[:, off:off + 2] = f16_finite(r, nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def put_str(s):
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def serialize_inputs(rows):
    out = [INPUTS_MAGIC, struct.pack("<I", len(rows))]
    for name, row in rows:
        out += [put_str(name), struct.pack("<I", row.size), row.astype("<f4").tobytes()]
    return b"".join(out)


def parse_inputs(data):
    if data[:8] != INPUTS_MAGIC:
        raise ValueError("not a smelt inputs file")
    (nrows,), pos = struct.unpack_from("<I", data, 8), 12
    rows = []
    for _ in range(nrows):
        (ln,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2:pos + 2 + ln].decode()
        pos += 2 + ln
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        rows.append((name, np.frombuffer(data, dtype="<f4", count=n, offset=pos).copy()))
        pos += 4 * n
    if pos != len(data):
        raise ValueError("trailing bytes in inputs file")
    return rows


def parse_random_blocks(data, ty, rows):
    """The committed random blocks of a type file (the section after the rows); `rows` are
    its input set's rows, which fix the size of the rows section."""
    block, tsize = EXPECTED_TRAITS[ty][1:]
    if data[:8] != REF_MAGIC:
        raise ValueError("not a smelt reference file")
    pos = 8 + 12
    (ln,) = struct.unpack_from("<H", data, pos)
    set_name = data[pos + 2:pos + 2 + ln].decode()
    pos += 2 + ln
    (nrows,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if nrows:
        if set_name != input_set(ty) or nrows != len(rows):
            raise ValueError(f"rows section is for {nrows} rows of {set_name}")
        for _, row in rows:
            n = row.size
            pos += n // block * tsize + 4 * n
    (nb,) = struct.unpack_from("<I", data, pos)
    pos += 4
    return np.frombuffer(data, dtype=np.uint8, count=nb * tsize, offset=pos).copy()


def serialize_type(ggml, ty, rows, blocks):
    block, tsize = EXPECTED_TRAITS[ty][1:]
    quantized = ty in QUANTIZED
    out = [REF_MAGIC, struct.pack("<III", TYPES[ty], block, tsize), put_str(input_set(ty))]
    out.append(struct.pack("<I", len(rows) if quantized else 0))
    if quantized:
        for _, row in rows:
            q = ggml.quantize(ty, row)
            out += [q.tobytes(), ggml.dequantize(ty, q, row.size).astype("<f4").tobytes()]
    nb = blocks.size // tsize
    deq = ggml.dequantize(ty, blocks, nb * block)
    if not np.all(np.isfinite(deq)):
        raise ValueError(f"{ty}: a random block decoded to a non-finite value")
    out += [struct.pack("<I", nb), blocks.tobytes(), deq.astype("<f4").tobytes()]
    return b"".join(out)


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def main(argv):
    if len(argv) != 3 or argv[1] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, out_dir = argv[1], argv[2]
    ggml = Ggml()
    failed = False
    inputs = {}
    for set_name in ("b32", "b256"):
        fresh = serialize_inputs(make_inputs(set_name))
        path = os.path.join(out_dir, f"inputs_{set_name}.bin")
        if mode == "write":
            os.makedirs(out_dir, exist_ok=True)
            with open(path, "wb") as f:
                f.write(fresh)
            inputs[set_name] = fresh
            print(f"inputs {set_name}: {len(fresh)} bytes")
        else:
            with open(path, "rb") as f:
                committed = f.read()
            inputs[set_name] = committed
            # The outputs are checked against the committed inputs whatever happens here;
            # this line only says whether today's numpy still draws the same inputs.
            same = "identical" if committed == fresh else "differ (numpy drew different inputs; outputs still checked on the committed ones)"
            print(f"inputs {set_name}: regenerated inputs {same}")
    rows = {k: parse_inputs(v) for k, v in inputs.items()}

    for ty in QUANTIZED + DEQUANT_ONLY:
        path = os.path.join(out_dir, f"{ty.lower()}.bin")
        if mode == "write":
            blocks = random_blocks(ty)
            data = serialize_type(ggml, ty, rows[input_set(ty)], blocks)
            with open(path, "wb") as f:
                f.write(data)
            print(f"{ty:7} wrote {len(data)} bytes")
            continue
        try:
            with open(path, "rb") as f:
                committed = f.read()
            blocks = parse_random_blocks(committed, ty, rows[input_set(ty)])
            fresh = serialize_type(ggml, ty, rows[input_set(ty)], blocks)
        except (OSError, ValueError, struct.error) as e:
            print(f"{ty:7} FAIL: cannot read {path}: {e}")
            failed = True
            continue
        if fresh == committed:
            print(f"{ty:7} ok: {len(committed)} bytes identical to ggml's output today")
        else:
            at = first_difference(fresh, committed)
            print(f"{ty:7} FAIL: ggml today differs from {path} at byte {at} (sizes {len(fresh)} vs {len(committed)})")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except OracleError as e:
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(4)
