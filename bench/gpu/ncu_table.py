"""One markdown table row per kernel launch of an Nsight Compute report (`ncu --section
SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats ...` text
output): grid, registers, duration, DRAM / memory / SM throughput, occupancy and the two
top stall reasons. Usage: python3 ncu_table.py REPORT.txt LABEL"""
import re, sys
text = open(sys.argv[1]).read()
path = sys.argv[2]
blocks = re.split(r"\n  (?=\S+.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)
for b in blocks[1:]:
    head = b.splitlines()[0]
    name = head.split()[0]
    grid = re.search(r"\((\d+, \d+, \d+)\)x", head)
    def metric(label):
        m = re.search(r"^\s*" + re.escape(label) + r"\s+\S+\s+([\d.,]+)", b, re.M)
        return m.group(1) if m else "-"
    flat = " ".join(b.split())
    stalls = re.findall(r"stalled ([a-z ]+?)(?: on| \(|\.|,).{0,300}?represents about ([\d.]+)% of the total", flat)
    top = "; ".join(f"{n.strip()[:28]} {p}%" for n, p in stalls[:2]) or "-"
    print(f"| {path} | {name} | {grid.group(1) if grid else '-'} | {metric('Registers Per Thread')} | "
          f"{metric('Duration')} | {metric('DRAM Throughput')} | {metric('Memory Throughput')} | "
          f"{metric('Compute (SM) Throughput')} | {metric('Achieved Occupancy')} | {top} |")
