"""attention_once.py — one forward and one backward of a CUDA attention row (default
flash_attention_2) at B 2, H 32, S 8192, D 128 bf16 (or the shape given) through the peers
shim, or with --sdpa one of torch SDPA's backends at the same shape: a short process for
`ncu --launch-count` to profile one launch of each kernel.
  python3 bench/attention_once.py --build build-h200 [--impl NAME] [--causal 1]
      [--batch 1 --hq 64 --hkv 8 --seq 4096] [--sdpa cudnn|flash]"""
import argparse
import ctypes
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
vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
LIB.lkp_init.restype = ci
LIB.lkp_attention.argtypes = [ctypes.c_char_p, ci, ci] + [vp] * 9 + [i64] * 5 + [ci, vp]
LIB.lkp_attention.restype = vp
LIB.lkp_run.argtypes = [vp]
LIB.lkp_run.restype = ci
assert LIB.lkp_init() > 0
q = torch.randn(B, Hq, S, D, dtype=torch.bfloat16, device="cuda")
k, v = (torch.randn(B, Hkv, S, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
dout = torch.randn(B, S, Hq, D, dtype=torch.bfloat16, device="cuda")
out = torch.empty_like(dout)
dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
lse = torch.empty(B, Hq, S, dtype=torch.float32, device="cuda")
st = torch.cuda.current_stream().cuda_stream
ptrs = [t.data_ptr() for t in (q, k, v, out, dout, dq, dk, dv, lse)]
for bwd in (0, 1):
    h = LIB.lkp_attention(A.impl.encode(), bwd, 1, *ptrs, B, Hq, Hkv, S, D, A.causal, st)
    assert h and LIB.lkp_run(h) == 0
torch.cuda.synchronize()
print("fa2_once: done")
