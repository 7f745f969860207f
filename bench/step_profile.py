#!/usr/bin/env python3
"""step_profile.py — where one llmkern training step's GPU time goes (issue 17: the per-op
breakdown). Runs `llmkern train` of --steps steps under Nsight Compute with
train.profile_step set, so ncu records that one step's kernels alone (cudaProfilerStart/
Stop around it; `--profile-from-start off`), each kernel's gpu__time_duration, and sums
them by op: attention, GEMMs (cuBLASLt), the loss (LM head's CE kernels; its GEMMs count as
GEMMs), RMSNorm, RoPE, SwiGLU, MoE, the embedding, the model's own moves (head transposes,
residual adds, the bf16 weight copy), the optimizer (norm, clip, AdamW). ncu runs the
kernels one at a time: the sum has no overlap and no launch gaps, so it is printed beside
the step's wall time from an unprofiled run of the same config (the difference is the time
the GPU waited on the host).

Run (the H200, B the build directory, after `source tests/cuda/h200_env.sh`):
  python3 bench/step_profile.py --llmkern $B/llmkern --model dense --out $OUT   # writes OUT/step_profile.md
Uses e2e_peers.py's configs (dense: 4096 x 8, moe: 4096 x 4; --batch / --seq to change; --set
KEY=VALUE for any other train: key, e.g. --set exp_avg_dtype=bf16; --only REGEX profiles those kernels alone).
"""
import argparse
import collections
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_peers import DENSE, MOE, write_tokens, yaml_of  # noqa: E402

# kernel function name -> op, first match wins (the names of src/**/*.cu and cuBLAS's)
CATEGORIES = [
    ("attention", r"^(fa3_|fa2_|dq_tiles|dkv_tiles|fwd_tiles|sink_sum|flash)"),
    ("MoE grouped GEMMs", r"^(gg_sm90|gg_mma)"),
    ("GEMMs (cuBLASLt)", r"(gemm|nvjet|xmma|cutlass|sm90_|sm80_|splitK|Kernel2|cublas)"),
    ("loss (cross-entropy kernels)", r"^(ce_block|ce_rows|ce_rows_smem|ce_rows_ring|d_logits|count_valid|gather|scatter_rows|axpy)$"),
    ("rms_norm", r"^(fwd_reg|bwd_reg|fwd_warp|fwd_short|bwd_short|fwd_loop|bwd_loop|lk_rms_dw_reduce|row_reduce|"
                 r"scale_rows|upcast|downcast|mul_weight|dx_of)"),
    ("rope", r"^rope_kernel"),
    ("swiglu", r"^act_(fwd|bwd)$"),
    ("moe (routing, permutation, combine)", r"^(softmax_topk|sigmoid|fake_|aux_|count_routes|act_forward|act_backward|"
     r"gather_rows|unpermute_sum|convert|check_ids|clear_padding|combine_rows|dw_reduce|expert_bias|nan_if|"
     r"own_routes|owners_of|pack_|pick_by_pos|round_robin|route_|slot_plan|split_meta|unpack_slots|tile_scan|topk)"),
    ("embedding", r"^(make_keys|segment_sum|token_of|.*Radix|.*radix|.*DeviceScan|.*Histogram)"),
    ("model's moves (transposes, adds, bf16 copy)", r"^(heads_k|add_k|acc_k|round_k)$"),
    ("optimizer (norm, clip, AdamW)", r"^(adamw_kernel|adamw_plan_kernel|log_kernel|sumsq_kernel|final_kernel|scale_kernel|finish|lk_mt)"),
    ("linear bias", r"^colsum"),
]


def category(name):
    for cat, rx in CATEGORIES:
        if re.search(rx, name):
            return cat
    return "other"


def config(A, work, profile_step):
    model = DENSE if A.model == "dense" else MOE
    B = A.batch or (8 if A.model == "dense" else 4)
    tokens = os.path.join(work, "tokens.lktok")
    if not os.path.exists(tokens):
        write_tokens(tokens, model["vocab_size"], B * A.seq * 4 + 1, 7)
    train = dict(steps=A.steps, lr=3e-4, min_lr=3e-5, warmup_steps=1, batch_size=B, seq_len=A.seq, log_every=1,
                 out=os.path.join(work, "out"), dtype=A.dtype, profile_step=profile_step)
    for kv in A.set:   # --set exp_avg_dtype=bf16: any other train: key
        k, _, v = kv.partition("=")
        train[k] = {"true": True, "false": False}.get(v, v)
    path = os.path.join(work, f"step_profile_{profile_step}.yaml")
    with open(path, "w") as f:
        m = dict(model, torch_dtype="bfloat16")
        if A.attn:
            m["ops_implementation"] = dict(attn_implementation=A.attn)
        f.write(yaml_of(dict(model=m, train=train, data=dict(tokens=tokens, eos_id=-1))))
    return path, B


def main():
    P = argparse.ArgumentParser()
    P.add_argument("--llmkern", default=os.path.join(os.environ.get("B", "build"), "llmkern"))
    P.add_argument("--model", choices=["dense", "moe"], default="dense")
    P.add_argument("--batch", type=int, default=0)
    P.add_argument("--seq", type=int, default=4096)
    P.add_argument("--steps", type=int, default=3, help="the last one is profiled")
    P.add_argument("--dtype", default="bf16")
    P.add_argument("--ncu", default="ncu")
    P.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train: key (repeatable)")
    P.add_argument("--attn", help="model.ops_implementation.attn_implementation (default: the selection's)")
    P.add_argument("--top", type=int, default=40, help="kernels listed by time")
    P.add_argument("--launches", metavar="REGEX", help="also list each launch of the kernels it matches, in order")
    P.add_argument("--only", metavar="REGEX", help="profile only the kernels it matches (ncu --kernel-name): one "
                   "kernel's time in a fraction of the full run's")
    P.add_argument("--out", default=os.environ.get("OUT", "."))
    A = P.parse_args()
    work = tempfile.mkdtemp(prefix="lk_step_profile_")
    # the wall time of a step, unprofiled (the loss.csv of a plain run)
    cfg, B = config(A, work, 0)
    p = subprocess.run([A.llmkern, "train", "--config", cfg, "--device", "cuda"], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"step_profile: the plain run failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    rows = [ln.split(",") for ln in open(os.path.join(work, "out", "loss.csv")).read().splitlines()[1:] if ln]
    wall_ms = B * A.seq / float(rows[-1][4]) * 1e3
    # each run ends with a checkpoint (weights and AdamW state: ~24 GB at the MoE config; two of them
    # filled the H200 machine's disk in the eighteenth session)
    shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
    # the profiled one
    cfg, _ = config(A, work, A.steps)
    cmd = [A.ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum",
           "--csv", "--print-units", "base", "--print-kernel-base", "function"] + \
          (["--kernel-name", f"regex:{A.only}"] if A.only else []) + [A.llmkern, "train", "--config", cfg, "--device", "cuda"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    if p.returncode:
        sys.exit(f"step_profile: ncu failed ({p.returncode}): {p.stdout[-3000:]}{p.stderr[-3000:]}")
    text = p.stdout[p.stdout.find('"ID"'):]
    by_cat, by_kernel, calls, n = collections.Counter(), collections.Counter(), collections.Counter(), 0
    launches = []   # (name, us) of each launch --launches matches, in the step's order
    for r in csv.DictReader(io.StringIO(text)):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        name = r["Kernel Name"]
        by_cat[category(name)] += ns
        by_kernel[name] += ns
        calls[name] += 1
        n += 1
        if A.launches and re.search(A.launches, name):
            launches.append((name, ns / 1e3))
    total = sum(by_cat.values())
    what = ", ".join([A.dtype] + A.set + ([A.attn] if A.attn else []) +
                     ([f"only the kernels matching {A.only}"] if A.only else []))
    lines = [f"# One training step's GPU time by op ({A.model}, {B} x {A.seq} tokens, {what})", "",
             f"{n} kernels, {total / 1e6:.1f} ms of kernel time (ncu, one at a time); the step's wall time "
             f"unprofiled: {wall_ms:.1f} ms ({B * A.seq / wall_ms * 1e3:,.0f} tokens/s); ncu took "
             f"{time.time() - t0:.0f} s", "", "| op | ms | share |", "|---|---|---|"]
    for cat, ns in by_cat.most_common():
        lines.append(f"| {cat} | {ns / 1e6:.2f} | {ns / total:.1%} |")
    lines += ["", "Top kernels:", "", "| kernel | calls | ms | us a call | op |", "|---|---|---|---|---|"]
    for name, ns in by_kernel.most_common(A.top):
        lines.append(f"| `{name[:60]}` | {calls[name]} | {ns / 1e6:.2f} | {ns / 1e3 / calls[name]:.1f} | {category(name)} |")
    if A.launches:
        lines += ["", f"Launches of `{A.launches}`, in order (us):", ""]
        lines += [f"{i}. `{name[:60]}` {us:.1f}" for i, (name, us) in enumerate(launches)]
    md = "\n".join(lines) + "\n"
    print(md)
    os.makedirs(A.out, exist_ok=True)
    tag = "".join("_" + re.sub(r"[^A-Za-z0-9]+", "-", kv) for kv in A.set)
    with open(os.path.join(A.out, f"step_profile_{A.model}{tag}.md"), "w") as f:
        f.write(md)


if __name__ == "__main__":
    main()
