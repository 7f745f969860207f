"""moe_problem.py — the MoE experts problem that bench/peers_cuda.py's moe_rows times and
bench/moe_once.py profiles, built in one place so both see the same routing: PEERS-H200.md's
shape (T 16384, top-8, H 2048, I 768, E 128), bf16 activations and weights, the fake gate's
balanced routing (token t takes experts (t·k + j) mod E: 1024 rows an expert), routing
weights 1/k, f32 weight gradients (zeros: the layer adds into them).
LK_MOE_SHAPE=T,H,I,E,K another shape (e2e_peers.py's MoE config: 16384,1024,512,64,8);
LK_MOE_SKEW=s routing a trained router's kind of uneven: each token's k distinct experts drawn
with weights (e + 1)^-s (seeded), so expert 0 takes the most rows (s 0.5 at e2e's shape: 1,133-7,466 rows
an expert, mean 2,048)."""
import os
from types import SimpleNamespace

import torch

SHAPE = tuple(int(v) for v in os.environ.get("LK_MOE_SHAPE", "16384,2048,768,128,8").split(","))   # T, H, I, E, K
SKEW = float(os.environ.get("LK_MOE_SKEW", "0"))


def make(dev, shape=SHAPE):
    T, H, I, E, K = shape
    bf = torch.bfloat16
    p = SimpleNamespace(T=T, H=H, I=I, E=E, K=K)
    p.x = torch.randn(T, H, dtype=bf, device=dev)
    p.wgu = (torch.randn(E, 2 * I, H, device=dev) / H ** 0.5).to(bf)
    p.wd = (torch.randn(E, H, I, device=dev) / I ** 0.5).to(bf)
    if SKEW:
        wts = (torch.arange(E, dtype=torch.float64) + 1) ** -SKEW
        gen = torch.Generator().manual_seed(11)
        p.ids = torch.multinomial(wts.expand(T, E), K, replacement=False, generator=gen).to(torch.int32).to(dev)
    else:
        p.ids = ((torch.arange(T, device=dev)[:, None] * K + torch.arange(K, device=dev)[None, :]) % E).to(torch.int32)
    counts = torch.bincount(p.ids.reshape(-1).long(), minlength=E).float()
    print(f"  moe problem: T {T} H {H} I {I} E {E} top-{K}, skew {SKEW}: rows an expert max {counts.max():.0f} "
          f"min {counts.min():.0f} mean {counts.mean():.0f}", flush=True)
    p.w = torch.full((T, K), 1.0 / K, device=dev)
    p.dout = torch.randn(T, H, dtype=bf, device=dev)
    p.out, p.dx = torch.empty_like(p.x), torch.empty_like(p.x)
    p.dw = torch.empty(T, K, device=dev)
    p.dgu, p.ddn = torch.zeros(E, 2 * I, H, device=dev), torch.zeros(E, H, I, device=dev)
    return p


def call_args(p, saved, saved_bytes, stream):
    """The peers shim's lkp_moe_experts arguments after (backward, dtype), f32 weight gradients."""
    return [p.x.data_ptr(), p.ids.data_ptr(), p.w.data_ptr(), p.wgu.data_ptr(), p.wd.data_ptr(), p.out.data_ptr(),
            p.dout.data_ptr(), p.dx.data_ptr(), p.dw.data_ptr(), p.dgu.data_ptr(), p.ddn.data_ptr(), 0,
            saved.data_ptr(), saved_bytes, p.T, p.H, p.I, p.E, p.K, stream]
