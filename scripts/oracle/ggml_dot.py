#!/usr/bin/env python3
"""ggml-cpu's own dot products over files, for smelt's live oracle tests.

    ggml_dot.py TYPE N X Y OUT

X holds rows of N weights of TYPE, Y as many rows of N activations in TYPE's vec_dot_type
(as smelt quantized them); OUT receives one f32 per row: ggml's `vec_dot(x_row, y_row)`.
Exit status 3 (with a message) when ggml-cpu has no vec_dot for TYPE. The vec_dot type
ggml pairs with TYPE is printed on stdout, so the caller can check it agrees with smelt's.
"""

import sys

import numpy as np

from ggml_lib import EXPECTED_TRAITS, TYPES, Ggml, OracleError


def main(argv):
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    _, ty, n, xs, ys, out = argv
    n = int(n)
    g = Ggml(with_cpu=True)
    act_id = g.vec_dot_type(ty)
    act = next(name for name, i in TYPES.items() if i == act_id)
    print(f"vec_dot_type {act}")
    x = np.fromfile(xs, dtype=np.uint8)
    y = np.fromfile(ys, dtype=np.uint8)
    xrow, yrow = g.row_size(ty, n), g.row_size(act, n)
    rows = x.size // xrow
    if x.size != rows * xrow or y.size != rows * yrow:
        print(f"sizes {x.size}, {y.size} are not whole rows of {xrow}, {yrow} bytes", file=sys.stderr)
        return 2
    res = []
    for r in range(rows):
        s = g.vec_dot(ty, n, x[r * xrow:(r + 1) * xrow], y[r * yrow:(r + 1) * yrow])
        if s is None:
            print(f"ggml-cpu has no vec_dot for {ty}", file=sys.stderr)
            return 3
        res.append(s)
    np.asarray(res, dtype="<f4").tofile(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except OracleError as e:
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(4)
