#!/usr/bin/env python3
"""dist_e2e.py — issue 24's numbers: `mpirun -np N llmkern train` over DP, SP and EP meshes, one GPU
a rank, on e2e_peers.py's configs (PEERS-H200.md's):

  moe       the 2B-A0.4B MoE at 4096 x 4 tokens a DP replica: dp N (every expert on every rank)
            against ep 2 and ep 4 (each rank its share of the experts, the routes through
            moe.dispatcher alltoall, the default under EP), the same tokens a rank
  dense32k  the 0.6B dense model at seq 32768 x 1 a replica: dp N against sp 2 and sp 4 (Ulysses:
            each rank a 1/sp slice of every sequence, dp N/sp replicas)

Per mesh: the world's tokens/s (the trainer's rate, all ranks' tokens: the median step after
--warmup, from loss.csv), tokens/s a GPU, MFU a GPU (FLOPs a token as PEERS-H200.md counts them,
against 989 TFLOP/s), and rank 0's peak GPU memory (its own print). Writes OUT/dist_e2e.md and
OUT/dist_e2e.json. The all-to-all's bus bandwidth from 1 MiB to 1 GiB is tests/cuda/dist_nccl's
(`mpirun -np N build/cuda_dist_nccl`). Needs an MPI build (tests/cuda/dist_h200.sh builds one on
the GPU machine; the prebuilt binaries have no MPI).

Run (a machine with N GPUs, B the build directory):
  python3 bench/dist_e2e.py --llmkern $B/llmkern --np 4 --out $OUT
Check it on the CPU, tiny (f32, a minute):
  python3 bench/dist_e2e.py --tiny --device cpu --np 2 --llmkern build/llmkern --out /tmp/dist_e2e
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_peers import (BETAS, CLIP, DENSE, EPS, LR, MIN_LR, MOE, PEAK_RE, PEAK_TF, TINY, TINY_MOE, WD,  # noqa: E402
                       flops_per_token, write_tokens, yaml_of)


def meshes(config, n):
    """(dp, sp, ep) of each run of config on n ranks: data parallelism alone first."""
    if config == "moe":
        return [(n, 1, 1)] + [(n, 1, e) for e in (2, 4) if n % e == 0]
    return [(n, 1, 1)] + [(n // s, s, 1) for s in (2, 4) if n % s == 0]


def run(A, config, model, B, S, mesh, tokens, work):
    dp, sp, ep = mesh
    label = f"{config} dp {dp} sp {sp} ep {ep}"
    out = os.path.join(work, label.replace(" ", "_"))
    train = dict(steps=A.steps, lr=LR, min_lr=MIN_LR, warmup_steps=1, weight_decay=WD, betas=BETAS, eps=EPS,
                 grad_clip=CLIP, batch_size=B, seq_len=S, log_every=1, save_every=0, out=out,
                 dtype=A.dtype)
    sections = dict(model=dict(model, torch_dtype="bfloat16"), train=train, data=dict(tokens=tokens, eos_id=-1),
                    parallel=dict(dp=dp, sp=sp, ep=ep))
    cfg = os.path.join(work, label.replace(" ", "_") + ".yaml")
    with open(cfg, "w") as f:
        f.write(yaml_of(sections))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), NCCL_NVLS_ENABLE="0")
    cmd = [A.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(A.np), "-x", "OMP_NUM_THREADS", "-x",
           "NCCL_NVLS_ENABLE", A.llmkern, "train", "--config", cfg, "--device", A.device, "--no-save"]
    print(f"  {label}: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=A.run_timeout)
    r = dict(label=label, dp=dp, sp=sp, ep=ep, rc=p.returncode, cmd=" ".join(cmd))
    csv = os.path.join(out, "loss.csv")
    rows = [ln.split(",") for ln in open(csv).read().splitlines()[1:] if ln] if os.path.exists(csv) else []
    if p.returncode or len(rows) <= A.warmup:
        r["error"] = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        print(f"  {label}: failed: {r['error']}", flush=True)
        return r
    r["tokens_per_s"] = statistics.median(float(x[4]) for x in rows[A.warmup:])
    r["losses"] = [float(x[1]) for x in rows]
    peaks = [float(v) * {"k": 2**-20, "m": 2**-10, "g": 1}[u[0].lower()] for v, u in PEAK_RE.findall(p.stdout)]
    if peaks:
        r["peak_gib"] = max(peaks)
    return r


def main():
    P = argparse.ArgumentParser()
    P.add_argument("--llmkern", default="build/llmkern")
    P.add_argument("--mpirun", default="mpirun")
    P.add_argument("--np", type=int, default=2)
    P.add_argument("--configs", default="moe,dense32k")
    P.add_argument("--steps", type=int, default=10)
    P.add_argument("--warmup", type=int, default=3)
    P.add_argument("--device", default="cuda")
    P.add_argument("--dtype", default=None, help="train.dtype (default bf16 on cuda, f32 on cpu)")
    P.add_argument("--tiny", action="store_true", help="the tiny shapes (a CPU check of the script)")
    P.add_argument("--run-timeout", type=int, default=900)
    P.add_argument("--out", default=os.environ.get("OUT", "."))
    A = P.parse_args()
    A.dtype = A.dtype or ("bf16" if A.device == "cuda" else "f32")
    os.makedirs(A.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="lk_dist_e2e_")
    results = []
    for config in A.configs.split(","):
        model = dict(TINY_MOE if A.tiny else MOE) if config == "moe" else dict(TINY if A.tiny else DENSE)
        B, S = (4, 4096) if config == "moe" else (1, 32768)
        if A.tiny:
            B, S = (4, 128) if config == "moe" else (1, 512)
        if config == "dense32k":
            model["max_position_embeddings"] = max(model.get("max_position_embeddings", 0), S)
        tokens = os.path.join(work, f"{config}.lktok")
        write_tokens(tokens, model["vocab_size"], (A.steps + 1) * A.np * B * S + 1, seed=7)
        fpt, _, _ = flops_per_token(model, S)
        for mesh in meshes(config, A.np):
            r = run(A, config, model, B, S, mesh, tokens, work)
            if "tokens_per_s" in r:
                r["per_gpu"] = r["tokens_per_s"] / A.np
                r["mfu"] = fpt * r["per_gpu"] / PEAK_TF
            r["config"] = config
            results.append(r)
    lines = [f"`dist_e2e.py`: {A.np} ranks, {A.device}, {A.dtype}, {A.steps} steps (median after {A.warmup})", "",
             "| config | mesh | tokens/s (world) | tokens/s a GPU | MFU a GPU | peak GiB (rank 0) | vs dp alone |",
             "|---|---|---|---|---|---|---|"]
    base = {}
    for r in results:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['config']} | dp {r['dp']} sp {r['sp']} ep {r['ep']} | failed: {r['error'][:80]} |"
                         " | | | |")
            continue
        if r["sp"] == 1 and r["ep"] == 1:
            base[r["config"]] = r["tokens_per_s"]
        rel = f"{r['tokens_per_s'] / base[r['config']]:.2f}x" if r["config"] in base else ""
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else ""
        lines.append(f"| {r['config']} | dp {r['dp']} sp {r['sp']} ep {r['ep']} | {r['tokens_per_s']:,.0f} | "
                     f"{r['per_gpu']:,.0f} | {100 * r['mfu']:.1f}% | {peak} | {rel} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(A.out, "dist_e2e.md"), "w") as f:
        f.write(text)
    with open(os.path.join(A.out, "dist_e2e.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all("tokens_per_s" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
