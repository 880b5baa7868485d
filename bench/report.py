"""Prints the benchmark table from rust.json and ggml.json (written by bench/quant.sh's two
runs), as Markdown so it can go straight into bench/RESULTS.md.

Ratios above 1 mean smelt is faster. Exits non-zero when smelt's bytes differ from ggml's.
"""

import json
import sys
from pathlib import Path


def fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


def ratio(peer, smelt):
    return None if peer is None or not smelt else peer / smelt


def flag(v):
    return {True: "yes", False: "NO", None: "n/a"}[v]


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out")
    rust = json.loads((folder / "rust.json").read_text())
    ggml = {t["type"]: t for t in json.loads((folder / "ggml.json").read_text())["types"]}
    threads = rust["threads"]
    print(
        f"{rust['rows']}x{rust['cols']} f32 (seed {rust['seed']}), best of {rust['runs']} after a warm-up, "
        f"times in ms; smelt and ggml-all on {threads} threads, candle's QTensor::quantize is single-threaded"
    )
    print()
    print(
        "| type | smelt | smelt-1t | candle | ggml-1t | ggml-all | candle/smelt | ggml-all/smelt "
        "| ggml-1t/smelt-1t | smelt==ggml | smelt==candle |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|")
    ok = True
    for r in rust["types"]:
        g = ggml.get(r["type"], {})
        smelt, smelt_1t = r.get("smelt_ms"), r.get("smelt_1t_ms")
        eq_ggml = g.get("smelt_eq_ggml")
        ok &= eq_ggml is True
        print(
            f"| {r['type']} | {fmt(smelt)} | {fmt(smelt_1t)} | {fmt(r['candle_ms'])} | {fmt(g.get('ggml_1t_ms'))} "
            f"| {fmt(g.get('ggml_all_ms'))} | {fmt(ratio(r['candle_ms'], smelt), '.2f')} "
            f"| {fmt(ratio(g.get('ggml_all_ms'), smelt), '.2f')} | {fmt(ratio(g.get('ggml_1t_ms'), smelt_1t), '.2f')} "
            f"| {flag(eq_ggml)} | {flag(r.get('smelt_eq_candle'))} |"
        )
        if "smelt_error" in r:
            print(f"  {r['type']}: {r['smelt_error']}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
