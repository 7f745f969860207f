"""ncu_stalls.py — where a kernel's warps wait, instruction by instruction, from Nsight Compute's
per-instruction stall samples: the source page of a report collected with the SourceCounters
section, exported as CSV. For each kernel it prints the stall reasons summed over the kernel,
the samples of each warp-role region (the code between setmaxnreg / EXIT instructions: a
producer's and a consumer's loops are separate regions) and the instructions that hold the most
samples, with the two largest reasons of each and the instructions just before them (the one a
scoreboard stall waits on is usually a few lines up).
  on the GPU machine:
    ncu --clock-control none --kernel-name regex:gg_sm90_wgrad --launch-count 2 \\
        --section SourceCounters --section WarpStateStats -o rep python3 bench/moe_once.py --build B
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep_sass.csv
  anywhere:  python3 bench/ncu_stalls.py rep_sass.csv [--top 20] [--kernel SUBSTRING] [--context 3] [--blocks]"""
import argparse
import csv

P = argparse.ArgumentParser()
P.add_argument("csv")
P.add_argument("--top", type=int, default=20)
P.add_argument("--kernel", default="", help="only kernels whose name contains this")
P.add_argument("--context", type=int, default=0, help="instructions shown before each top one")
P.add_argument("--blocks", action="store_true",
               help="also the samples of each run of instructions executed equally often (a loop's phases, "
                    "split at barriers), with their reasons and opcodes")
A = P.parse_args()

kernels = {}   # name -> (header, rows); a name met twice (two launches) keeps its first table
name = None
for row in csv.reader(open(A.csv)):
    if not row:
        continue
    if row[0] == "Kernel Name":
        name = row[1] if row[1] not in kernels else None
        if name:
            kernels[name] = [None, []]
        continue
    if name is None:
        continue
    if row[0] == "Address":
        kernels[name][0] = row
    else:
        kernels[name][1].append(row)


def num(x):
    try:
        return int(float(x))
    except ValueError:
        return 0


for name, (hdr, rows) in kernels.items():
    if A.kernel not in name or not hdr:
        continue
    sa = hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r[sa]) for r in rows) or 1
    print(f"== {name}\n   {total} samples, {len(rows)} instructions")
    by = sorted(((sum(num(r[i]) for r in rows), hdr[i]) for i in reasons), reverse=True)
    print("   reasons: " + ", ".join(f"{h[6:]} {100 * n / total:.1f}%" for n, h in by[:8] if n))
    cuts = [i for i, r in enumerate(rows) if "USETMAXREG" in r[1] or "EXIT" in r[1]]
    for lo, hi in zip([0] + cuts, cuts + [len(rows)]):
        n = sum(num(rows[i][sa]) for i in range(lo, hi))
        if n > total / 100:
            print(f"   region {lo}-{hi} ({rows[lo][1].strip()[:40]}): {100 * n / total:.1f}%")
    if A.blocks:   # the phases of a step: runs of equal execution count, a new one at each barrier
        ex = hdr.index("Instructions Executed")
        runs = []
        for i, r in enumerate(rows):
            op = r[1].split()[1 if r[1].lstrip().startswith("@") else 0] if r[1].split() else ""
            if not runs or num(r[ex]) != runs[-1][1] or op.startswith("BAR"):
                runs.append([i, num(r[ex]), 0, {}, {}])
            run = runs[-1]
            run[2] += num(r[sa])
            for k in reasons:
                run[3][hdr[k][6:]] = run[3].get(hdr[k][6:], 0) + num(r[k])
            run[4][op.split(".")[0]] = run[4].get(op.split(".")[0], 0) + 1
        for i, (lo, n_ex, n, why, ops) in enumerate(runs):
            if n > total / 200:
                hi = runs[i + 1][0] if i + 1 < len(runs) else len(rows)
                w = sorted(why.items(), key=lambda t: -t[1])[:3]
                o = sorted(ops.items(), key=lambda t: -t[1])[:4]
                print(f"   block {lo}-{hi} x{n_ex}: {100 * n / total:5.1f}% ("
                      + ", ".join(f"{k} {100 * v / total:.1f}" for k, v in w) + "; "
                      + " ".join(f"{k}:{v}" for k, v in o) + ")")
    top = sorted(range(len(rows)), key=lambda i: -num(rows[i][sa]))[:A.top]
    for i in sorted(top):
        for j in range(max(0, i - A.context), i):
            print(f"   {j:5d}        {rows[j][1].strip()[:72]}")
        r = rows[i]
        why = sorted(((num(r[k]), hdr[k][6:]) for k in reasons), reverse=True)[:2]
        print(f"   {i:5d} {100 * num(r[sa]) / total:5.1f}% {r[1].strip()[:72]:72s} "
              + ", ".join(f"{w} {n}" for n, w in why if n))
