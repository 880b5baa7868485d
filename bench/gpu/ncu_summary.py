"""Sums Nsight Compute's per-kernel durations (CSV of `ncu --csv --metrics
gpu__time_duration.sum`) by kernel name: where a decode step's GPU time goes."""
import csv
import sys
from collections import defaultdict

tot = defaultdict(float)
cnt = defaultdict(int)
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hdr is None:
    print("ncu_summary: no CSV header found")
    sys.exit(0)
h = rows[hdr]
kn, mn, mv, mu = (h.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
for r in rows[hdr + 1:]:
    if len(r) <= mv or r[mn] != "gpu__time_duration.sum":
        continue
    v = float(r[mv].replace(",", ""))
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r[mu], 1e-3)
    name = r[kn].split("(")[0]
    tot[name] += v * scale
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{'kernel':40} {'launches':>8} {'total us':>10} {'share':>6} {'us/launch':>9}")
for name, us in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{name[:40]:40} {cnt[name]:8} {us:10.1f} {100 * us / all_us:5.1f}% {us / cnt[name]:9.2f}")
print(f"{'all':40} {sum(cnt.values()):8} {all_us:10.1f}")
