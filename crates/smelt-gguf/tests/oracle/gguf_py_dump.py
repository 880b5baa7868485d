"""Prints what gguf-py's GGUFReader sees in a GGUF file, in the line format the Rust tests
build from smelt-gguf's reading of the same file (tests/common/mod.rs, `dump`).

header  version alignment data_offset
kv      key(hex) types(gguf-py's field.types ids) items(flattened, comma-separated)
tensor  name(hex) type_id dims(ne order) offset(relative) n_bytes byte_sum
Floats are printed as their bit patterns, strings as hex of their UTF-8 bytes.
"""
import struct
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

# gguf-py 0.19 still sizes Q8_1 blocks with the old f32 d and s (40 bytes); ggml's
# block_q8_1 has two f16s and 32 int8s (36 bytes, static_assert in ggml-common.h). The
# reader uses this shared table, so patch it to ggml's truth.
GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1] = (32, 2 + 2 + 32)


def item(x, ty):
    if ty == GGUFValueType.STRING:
        return x.encode("utf-8").hex()
    if ty == GGUFValueType.FLOAT32:
        return struct.pack(">f", x).hex()
    if ty == GGUFValueType.FLOAT64:
        return struct.pack(">d", x).hex()
    if ty == GGUFValueType.BOOL:
        return "1" if x else "0"
    return str(int(x))


def main(path):
    r = GGUFReader(path)
    fields = list(r.fields.values())
    version = int(fields[0].parts[0][0])
    out = [f"header\t{version}\t{r.alignment}\t{r.data_offset}"]
    for f in fields[3:]:
        types = ",".join(str(int(t)) for t in f.types)
        v = f.contents()
        leaf = f.types[-1]
        vals = v if isinstance(v, list) else [v]
        items = ",".join(item(x, leaf) for x in vals)
        out.append(f"kv\t{f.name.encode('utf-8').hex()}\t{types}\t{items}")
    for t in r.tensors:
        dims = ",".join(str(int(d)) for d in t.field.parts[3])
        rel = t.data_offset - r.data_offset
        raw = r.data[t.data_offset : t.data_offset + t.n_bytes]
        total = int(np.asarray(raw, dtype=np.uint8).sum(dtype=np.uint64))
        out.append(
            f"tensor\t{t.name.encode('utf-8').hex()}\t{int(t.tensor_type)}\t{dims}\t{rel}\t{t.n_bytes}\t{total}"
        )
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
