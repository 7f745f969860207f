#!/usr/bin/env python3
"""cpu_targets.py — the CPU benchmark targets of the issues, measured in one run.

Runs `llmkern bench --json` for each target shape and prints every row plus the ratio
each target is judged by (speed-up over eager, fraction of the copy ceiling, memory
ratio). Run on a quiet machine:  python3 bench/cpu_targets.py [build/llmkern]
"""
import json
import subprocess
import sys

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/llmkern"


def bench(op, size, dtype="f32"):
    out = subprocess.run([BIN, "bench", "--op", op, "--size", size, "--dtype", dtype, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def row(rows, impl, pas):
    return next(r for r in rows if r["impl"] == impl and r["pass"] == pas)


def show(rows):
    for r in rows:
        print(f"  {r['op']:<14}{r['impl']:<12}{r['dtype']:<5}{r['shape']:<18}{r['pass']:<8}"
              f"{r['ms']:>10.2f} ms {r['gbps']:>8.2f} GB/s {r['gflops']:>8.1f} GF/s "
              f"{100 * r['ceiling_fraction']:>6.1f}% {r['peak_bytes'] / 2**20:>9.1f} MiB")


def main():
    verdicts = []

    rows = bench("rms_norm", "8192x4096")
    show(rows)
    e, f = row(rows, "eager", "fwd+bwd"), row(rows, "fused", "fwd+bwd")
    verdicts.append(("rms_norm fused fwd+bwd >= 2x eager (f32 8192x4096)", e["ms"] / f["ms"], 2.0))
    verdicts.append(("rms_norm fused fwd+bwd >= 60% of copy bandwidth (5 passes)", f["ceiling_fraction"], 0.6))

    rows = bench("cross_entropy", "4096x1024x32000")
    show(rows)
    e, f = row(rows, "eager", "fwd+bwd"), row(rows, "fused", "fwd+bwd")
    verdicts.append(("cross_entropy fused memory <= 1/8 eager: eager/fused", e["peak_bytes"] / f["peak_bytes"], 8.0))
    verdicts.append(("cross_entropy fused no slower: eager ms / fused ms", e["ms"] / f["ms"], 1.0))

    rows = bench("swiglu_mlp", "4096x1024x2816")
    show(rows)
    e, f = row(rows, "eager", "fwd+bwd"), row(rows, "fused", "fwd+bwd")
    verdicts.append(("swiglu fused less memory: eager/fused", e["peak_bytes"] / f["peak_bytes"], 1.0 + 1e-9))
    verdicts.append(("swiglu fused no slower: eager ms / fused ms", e["ms"] / f["ms"], 1.0))

    rows = bench("rope", "1x32x2048x128")
    show(rows)
    for p in ("fwd", "bwd"):
        e, f = row(rows, "eager", p), row(rows, "fused", p)
        verdicts.append((f"rope fused {p} >= 2x eager", e["ms"] / f["ms"], 2.0))

    print()
    for name, value, target in verdicts:
        print(f"{'MET ' if value >= target else 'MISS'} {name}: {value:.2f} (target {target:g})")


if __name__ == "__main__":
    main()
