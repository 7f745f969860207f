"""attention_once.py — one forward and one backward of a CUDA attention row (default
flash_attention_2) at B 2, H 32, S 8192, D 128 bf16 through the peers shim: a short
process for `ncu --launch-count` to profile one launch of each kernel.
  python3 bench/attention_once.py --build build-h200 [--impl NAME] [--causal 1]"""
import argparse
import ctypes
import os

import torch

import shim

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--impl", default="flash_attention_2")
P.add_argument("--causal", type=int, default=0)
A = P.parse_args()
LIB = shim.load(A.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
LIB.lkp_init.restype = ci
LIB.lkp_attention.argtypes = [ctypes.c_char_p, ci, ci] + [vp] * 9 + [i64] * 5 + [ci, vp]
LIB.lkp_attention.restype = vp
LIB.lkp_run.argtypes = [vp]
LIB.lkp_run.restype = ci
assert LIB.lkp_init() > 0
B, H, S, D = 2, 32, 8192, 128
q, k, v = (torch.randn(B, H, S, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
dout = torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda")
out = torch.empty_like(dout)
dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
lse = torch.empty(B, H, S, dtype=torch.float32, device="cuda")
st = torch.cuda.current_stream().cuda_stream
ptrs = [t.data_ptr() for t in (q, k, v, out, dout, dq, dk, dv, lse)]
for bwd in (0, 1):
    h = LIB.lkp_attention(A.impl.encode(), bwd, 1, *ptrs, B, H, H, S, D, A.causal, st)
    assert h and LIB.lkp_run(h) == 0
torch.cuda.synchronize()
print("fa2_once: done")
