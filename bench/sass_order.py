"""sass_order.py — the order of a kernel's wgmma issues, waits and the work between them, from its SASS:
runs of HGMMA, WARPGROUP.DEPBAR (each wait with its group count), MUFU, FMNMX, FMUL, F2FP, barriers,
mbarrier waits and arrivals, shared and global accesses, in program order, a line a run. ptxas places a
wgmma wait at the top of the basic block that holds it, whatever register-only work the source put
before it (fa3_fwd's softmax ran after its P·V until the forty-eighth session: bench/NOTES.md), so a
pipelined wgmma loop is read here before it is measured. --between counts the MUFU.EX2 between each
`DEPBAR.LE gsb0, 0x1` and the next `gsb0, 0x0` (the work a warpgroup overlaps with its second GEMM).
  cuobjdump -sass fa3.cubin > fa3.sass     (cuobjdump: the CUDA toolkit's, or the triton wheel's
                                            triton/backends/nvidia/bin)
  python3 bench/sass_order.py fa3.sass fa3_fwdILi128ELi128ELb0E [--between]"""
import argparse
import re

P = argparse.ArgumentParser()
P.add_argument("sass")
P.add_argument("kernel", help="a substring of the kernel's mangled name")
P.add_argument("--between", action="store_true")
A = P.parse_args()

KEYS = ("HGMMA", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "MUFU.EX2", "FMNMX", "FMUL", "F2FP", "BAR.SYNC", "BAR.ARV",
        "SYNCS.ARRIVE", "SYNCS.PHASECHK", "STS", "STSM", "LDS", "LDSM", "REDG", "STG", "LDG", "SHFL", "EXIT")
funcs = open(A.sass).read().split("Function : ")
body = next((f for f in funcs[1:] if A.kernel in f.split("\n", 1)[0]), None)
if body is None:
    raise SystemExit(f"sass_order: no kernel named like {A.kernel} in {A.sass}")
runs = []   # [address, key, count]
for line in body.split("\n"):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", line)
    if not m:
        continue
    op = m.group(2)
    key = next((k for k in KEYS if op == k or op.startswith(k + ".")), None)
    if key is None:
        continue
    if key == "WARPGROUP.DEPBAR":
        key = op + m.group(3).rstrip()   # which group count it waits for
    if runs and runs[-1][1] == key:
        runs[-1][2] += 1
    else:
        runs.append([m.group(1), key, 1])
if A.between:
    n, inside = 0, False
    for _, key, c in runs:
        if key.endswith("gsb0, 0x1"):
            inside, n = True, 0
        elif key.endswith("gsb0, 0x0") and inside:
            print(f"MUFU.EX2 between a wait for 1 and the next wait for 0: {n}")
            inside = False
        elif key == "MUFU.EX2" and inside:
            n += c
else:
    for addr, key, c in runs:
        print(f"{addr:>6} {key} x{c}")
