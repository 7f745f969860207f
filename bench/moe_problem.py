"""moe_problem.py — the MoE experts problem that bench/peers_cuda.py's moe_rows times and
bench/moe_once.py profiles, built in one place so both see the same routing: PEERS-H200.md's
shape (T 16384, top-8, H 2048, I 768, E 128), bf16 activations and weights, the fake gate's
balanced routing (token t takes experts (t·k + j) mod E: 1024 rows an expert), routing
weights 1/k, f32 weight gradients (zeros: the layer adds into them)."""
from types import SimpleNamespace

import torch

SHAPE = (16384, 2048, 768, 128, 8)   # T, H, I, E, K


def make(dev, shape=SHAPE):
    T, H, I, E, K = shape
    bf = torch.bfloat16
    p = SimpleNamespace(T=T, H=H, I=I, E=E, K=K)
    p.x = torch.randn(T, H, dtype=bf, device=dev)
    p.wgu = (torch.randn(E, 2 * I, H, device=dev) / H ** 0.5).to(bf)
    p.wd = (torch.randn(E, H, I, device=dev) / I ** 0.5).to(bf)
    p.ids = ((torch.arange(T, device=dev)[:, None] * K + torch.arange(K, device=dev)[None, :]) % E).to(torch.int32)
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
