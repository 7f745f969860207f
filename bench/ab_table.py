#!/usr/bin/env python3
"""ab_table.py — bench/ab.sh's logs side by side: one row per table row of peers_cuda.py (its
label), one column per side, each cell the rounds' values in order (TFLOP/s, or ms with --ms),
so an A/B reads at a glance instead of from interleaved logs.
  python3 bench/ab_table.py OUT [--part moe_rows] [--ms] [--grep gemm]
OUT holds ab_<part>_<side><round>.log (bench/ab.sh's names; the round is the last digit, so a
side may end in digits: bn128 and round 1 make bn1281)."""
import argparse
import collections
import os
import re

P = argparse.ArgumentParser()
P.add_argument("out")
P.add_argument("--part", default="", help="only logs of this part (moe_rows, attention_rows, ...)")
P.add_argument("--ms", action="store_true", help="milliseconds instead of TFLOP/s")
P.add_argument("--grep", default="", help="only rows whose label contains this")
A = P.parse_args()

ROW = re.compile(r"^(?P<label>\S.*?)\s+(?P<ms>\d+\.\d+) ms\s+(?P<tf>\d+\.\d+) TFLOP/s")
NAME = re.compile(r"^ab_(?P<part>[a-z]+_rows)_(?P<side>.+)(?P<round>\d)\.log$")   # rounds 1-9
cells = collections.defaultdict(lambda: collections.defaultdict(dict))   # label -> side -> round -> value
sides, labels = [], []
for f in sorted(os.listdir(A.out)):
    m = NAME.match(f)
    if not m or (A.part and m["part"] != A.part):
        continue
    side, rnd = m["side"], int(m["round"])
    if side not in sides:
        sides.append(side)
    for line in open(os.path.join(A.out, f)):
        r = ROW.match(line)
        if not r:
            continue
        label = " ".join(r["label"].split())
        if A.grep not in label:
            continue
        if label not in labels:
            labels.append(label)
        cells[label][side][rnd] = float(r["ms"] if A.ms else r["tf"])
if not labels:
    raise SystemExit(f"ab_table: no table rows in {A.out}" + (f" for part {A.part}" if A.part else ""))
print("| row | " + " | ".join(sides) + " |")
print("|---|" + "---|" * len(sides))
for label in labels:
    vals = [" / ".join(f"{cells[label][s][r]:.{3 if A.ms else 1}f}" for r in sorted(cells[label][s])) or "-"
            for s in sides]
    print(f"| {label} | " + " | ".join(vals) + " |")
