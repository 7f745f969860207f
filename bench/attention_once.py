"""attention_once.py — one forward and one backward of a CUDA attention row (default
flash_attention_2) at B 2, H 32, S 8192, D 128 bf16 (or the shape given) through the peers
shim, or with --sdpa one of torch SDPA's backends at the same shape: a short process for
`ncu --launch-count` to profile one launch of each kernel.
  python3 bench/attention_once.py --build build-h200 [--impl NAME] [--causal 1]
      [--batch 1 --hq 64 --hkv 8 --seq 4096] [--sdpa cudnn|flash]"""
import argparse
import os

import torch

import shim

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--impl", default="flash_attention_2")
P.add_argument("--causal", type=int, default=0)
P.add_argument("--batch", type=int, default=2)
P.add_argument("--hq", type=int, default=32)
P.add_argument("--hkv", type=int, default=0, help="K/V heads (default: --hq)")
P.add_argument("--seq", type=int, default=8192)
P.add_argument("--sdpa", choices=["cudnn", "flash"], help="time torch SDPA's backend instead")
A = P.parse_args()
B, Hq, Hkv, S, D = A.batch, A.hq, A.hkv or A.hq, A.seq, 128
if A.sdpa:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(B, Hq, S, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(B, Hkv, S, D, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    with sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[A.sdpa]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(A.causal), enable_gqa=Hq != Hkv)
        o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    raise SystemExit(print("sdpa once: done"))
LIB = shim.load(A.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
assert LIB.lkp_init() > 0
bufs = shim.attention_buffers(torch, "cuda", B, Hq, Hkv, S, D)
args = shim.attention_args(1, bufs, (B, Hq, Hkv, S, D), A.causal, torch.cuda.current_stream().cuda_stream)
for bwd in (0, 1):
    h = LIB.lkp_attention(A.impl.encode(), bwd, *args)
    assert h and LIB.lkp_run(h) == 0
torch.cuda.synchronize()
print("fa2_once: done")
