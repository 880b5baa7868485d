#!/usr/bin/env python3
"""gguf-py's numpy quantizers and dequantizers over files, for smelt's live oracle tests.

    gguf_py.py quantize TYPE N_PER_ROW IN OUT   IN: f32 rows (little-endian); OUT: bytes
    gguf_py.py dequantize TYPE IN OUT           IN: blocks of TYPE; OUT: f32

Exit status 3 (with a message) when gguf-py has no such function for TYPE.
"""

import sys
import warnings

import numpy as np
from gguf import GGMLQuantizationType, quants


def main(argv):
    if len(argv) < 2 or argv[1] not in ("quantize", "dequantize"):
        print(__doc__, file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # overflow warnings are part of the adversarial inputs
    if argv[1] == "quantize":
        _, _, ty, n_per_row, src, dst = argv
        qtype = getattr(GGMLQuantizationType, ty)
        data = np.fromfile(src, dtype="<f4").reshape(-1, int(n_per_row))
        try:
            with np.errstate(all="ignore"):
                out = quants.quantize(data, qtype)
        except NotImplementedError as e:
            print(f"gguf-py cannot quantize {ty}: {e}", file=sys.stderr)
            return 3
        np.ascontiguousarray(out).view(np.uint8).tofile(dst)
    else:
        _, _, ty, src, dst = argv
        qtype = getattr(GGMLQuantizationType, ty)
        data = np.fromfile(src, dtype=np.uint8)
        try:
            with np.errstate(all="ignore"):
                out = quants.dequantize(data, qtype)
        except NotImplementedError as e:
            print(f"gguf-py cannot dequantize {ty}: {e}", file=sys.stderr)
            return 3
        np.ascontiguousarray(out, dtype="<f4").tofile(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
