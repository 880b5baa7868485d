#!/usr/bin/env python3
"""ggml's own quantizers and dequantizers over files, for smelt's live tests on fresh data.

    ggml_quant.py quantize TYPE N_PER_ROW IN OUT   IN: f32 rows; OUT: ggml's bytes
    ggml_quant.py dequantize TYPE IN OUT           IN: blocks of TYPE; OUT: f32

TYPE is any type `ggml_lib.TYPES` names (ggml_quantize_chunk, or the reference
quantizers for Q8_1 and Q8_K; to_float, or Q8_K's dequantizer and Q8_1's definition).
"""

import sys

import numpy as np

from ggml_lib import EXPECTED_TRAITS, Ggml, OracleError


def main(argv):
    if len(argv) < 2 or argv[1] not in ("quantize", "dequantize"):
        print(__doc__, file=sys.stderr)
        return 2
    g = Ggml()
    if argv[1] == "quantize":
        _, _, ty, n, src, dst = argv
        rows = np.fromfile(src, dtype="<f4").reshape(-1, int(n))
        out = b"".join(g.quantize(ty, row).tobytes() for row in rows)
    else:
        _, _, ty, src, dst = argv
        data = np.fromfile(src, dtype=np.uint8)
        block, size = EXPECTED_TRAITS[ty][1:]
        out = g.dequantize(ty, data, data.size // size * block).astype("<f4").tobytes()
    with open(dst, "wb") as f:
        f.write(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except OracleError as e:
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(4)
