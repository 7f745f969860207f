#!/usr/bin/env python3
r"""flex_peers.py — issue 19's bench: llmkern's CUDA flex_attention under PEERS-H200.md's four
BlockMasks (causal, sliding window 1024, causal documents of 256-2048 tokens, prefix-LM 2048)
beside torch's compiled flex_attention on the same masks, and llmkern's own flash_attention_3
and flash_attention_2 causal (issue 19: flex causal >= 0.9x flash_attention_3 causal), in one
process. TFLOP/s on the visible elements: 4·B·H·S²·D·density forward, 3.5x that forward +
backward. llmkern's rows are timed by the peers shim (lkp_time_flex / lkp_time_attention:
random bf16 inputs, CUDA events, the mean of --reps after one untimed pass); torch's by CUDA
events around the compiled call (the median of --reps after two warm-ups). The document ids
are drawn by the same xorshift as the shim's, so both sides see the same documents. torch's
compiles take time: --torch-s bounds the whole torch part (a mask not reached says so).
--no-torch times llmkern's rows alone (an A/B of two builds, no torch in the process); --masks
keeps some masks (their first words), e.g. one mask's kernels under ncu (3: LK_MASK_FLEX, visible.cuh):

  python3 bench/flex_peers.py --build $B [--shape 2,32,8192,128] [--out DIR]
  for s in $B $A $B $A; do python3 bench/flex_peers.py --build $s --no-torch --out /tmp/x | grep ^llmkern; done
  ncu --kernel-name-base demangled --kernel-name 'regex:fa3_bwd<\(int\)128, \(int\)3' ... \
      python3 bench/flex_peers.py --build $B --no-torch --masks prefix-LM
"""
import argparse
import ctypes
import json
import os
import statistics
import time

import shim

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--shape", default="2,32,8192,128", help="B,H,S,D")
P.add_argument("--reps", type=int, default=10)
P.add_argument("--torch-s", type=float, default=240.0)
P.add_argument("--no-torch", action="store_true", help="llmkern's rows alone")
P.add_argument("--out", default=os.environ.get("OUT", "."))
P.add_argument("--masks", default="causal,sliding,document,prefix-LM", help="the masks kept, by their first words")
A = P.parse_args()
B, H, S, D = (int(x) for x in A.shape.split(","))
MASKS = [("causal", 1, 0), ("sliding window 1024", 2, 1024), ("document 256-2048 + causal", 3, 2048),
         ("prefix-LM 2048", 4, 2048)]
KEEP = A.masks.split(",")
unknown = [k for k in KEEP if k not in [m[0].split()[0] for m in MASKS]]
if unknown:
    P.error(f"--masks: {', '.join(unknown)} is not one of causal, sliding, document, prefix-LM")
MASKS = [m for m in MASKS if m[0].split()[0] in KEEP]

LIB = shim.load(A.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
assert LIB.lkp_init() >= 1, "no CUDA device"
FLOPS = 4.0 * B * H * S * S * D
rows = []


def tflops(ms, density, fb):
    return FLOPS * density * (3.5 if fb else 1.0) / (ms * 1e-3) / 1e12


def add(who, mask, density, ms):
    rows.append(dict(who=who, mask=mask, density=density, fwd_ms=ms[0], fb_ms=ms[1],
                     fwd=tflops(ms[0], density, 0), fb=tflops(ms[1], density, 1)))
    r = rows[-1]
    print(f"{who:28s} {mask:28s} density {density:.3f}: fwd {r['fwd_ms']:.3f} ms {r['fwd']:.1f} TFLOP/s, "
          f"fwd+bwd {r['fb_ms']:.3f} ms {r['fb']:.1f} TFLOP/s", flush=True)


ms, dens = (ctypes.c_double * 2)(), ctypes.c_double()
for name, kind, param in MASKS:
    if LIB.lkp_time_flex(b"flex_attention", B, H, H, S, D, kind, param, A.reps, ms, ctypes.byref(dens)):
        print(f"llmkern flex_attention {name}: {LIB.lkp_last_error().decode()}", flush=True)
    else:
        add("llmkern flex_attention", name, dens.value, list(ms))
for impl in ("flash_attention_3", "flash_attention_2"):
    if LIB.lkp_time_attention(impl.encode(), B, H, H, S, D, 1, A.reps, ms):
        print(f"llmkern {impl}: {LIB.lkp_last_error().decode()}", flush=True)
    else:
        add(f"llmkern {impl}", "causal", 0.5 * (S + 1) / S, list(ms))


def doc_ids():
    """The shim's documents (lkp_time_flex kind 3): the same xorshift, the same lengths."""
    x, ids = 88172645, []
    for _ in range(B):
        row, doc = [], 0
        while len(row) < S:
            x ^= (x << 13) & 0xFFFFFFFF
            x ^= x >> 17
            x ^= (x << 5) & 0xFFFFFFFF
            row += [doc] * min(256 + x % (2048 - 255), S - len(row))
            doc += 1
        ids.append(row)
    return ids


def time_torch():
    """torch's compiled flex_attention on the same masks, rows added beside llmkern's."""
    t0 = time.time()
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        dev = torch.device("cuda")
        flex = torch.compile(flex_attention)
        q, k, v, dout = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        docs = torch.tensor(doc_ids(), device=dev, dtype=torch.int32)
        mods = {
            1: lambda b, h, i, j: i >= j,
            2: lambda b, h, i, j: (i >= j) & (i - j < 1024),
            3: lambda b, h, i, j: (i >= j) & (docs[b, i] == docs[b, j]),
            4: lambda b, h, i, j: (j < 2048) | (i >= j),
        }

        def timed(fn):
            for _ in range(2):
                fn()
            ts = []
            for _ in range(A.reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1))
            return statistics.median(ts)

        for name, kind, _ in MASKS:
            if time.time() - t0 > A.torch_s:
                print(f"torch flex_attention {name}: not reached within --torch-s {A.torch_s:.0f} s", flush=True)
                continue
            bm = create_block_mask(mods[kind], B if kind == 3 else None, None, S, S, device=dev)
            density = [r["density"] for r in rows if r["mask"] == name][0] if any(r["mask"] == name for r in rows) else 0.5

            def f():
                return flex(q, k, v, block_mask=bm)

            def fb():
                o = flex(qg, kg, vg, block_mask=bm)
                torch.autograd.grad(o, (qg, kg, vg), dout)

            add("torch flex_attention (compiled)", name, density, [timed(f), timed(fb)])
    except Exception as e:  # noqa: BLE001 - the torch side is reported, not fatal
        print(f"torch flex_attention: {type(e).__name__}: {str(e)[:300]}", flush=True)


if not A.no_torch:
    time_torch()

lines = ["| who | mask | density | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |", "|---|---|---|---|---|---|---|"]
lines += [f"| {r['who']} | {r['mask']} | {r['density']:.3f} | {r['fwd_ms']:.3f} | {r['fwd']:.1f} | {r['fb_ms']:.3f} | "
          f"{r['fb']:.1f} |" for r in rows]
os.makedirs(A.out, exist_ok=True)
open(os.path.join(A.out, "flex_peers.md"), "w").write("\n".join(lines) + "\n")
json.dump(rows, open(os.path.join(A.out, "flex_peers.json"), "w"), indent=1)
print("\n".join(lines))
