"""moe_once.py — one forward and one backward of the CUDA moe_experts row ("fused") at
PEERS-H200.md's MoE shape (T 16384, top-8, H 2048, I 768, E 128, bf16, f32 weight gradients,
bench/peers_cuda.py's balanced routing) through the peers shim: a short process for
`ncu --kernel-name regex:gg_sm90 --launch-count N` to profile each grouped GEMM once.
  python3 bench/moe_once.py --build build-h200 [--reps 1]"""
import argparse
import ctypes
import os

import torch

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--reps", type=int, default=1)
A = P.parse_args()
LIB = ctypes.CDLL(os.path.join(A.build, "libllmkern_peers_shim.so"))
vp, i64, ci, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
LIB.lkp_init.restype = ci
LIB.lkp_last_error.restype = ctypes.c_char_p
LIB.lkp_moe_experts_saved_bytes.argtypes = [ci] + [i64] * 5
LIB.lkp_moe_experts_saved_bytes.restype = sz
LIB.lkp_moe_experts.argtypes = [ci, ci] + [vp] * 11 + [ci, vp, sz] + [i64] * 5 + [vp]
LIB.lkp_moe_experts.restype = vp
LIB.lkp_run.argtypes = [vp]
LIB.lkp_run.restype = ci
assert LIB.lkp_init() > 0
T, H, I, E, K = 16384, 2048, 768, 128, 8
BF16, F32 = 1, 0
bf, dev = torch.bfloat16, "cuda"
x = torch.randn(T, H, dtype=bf, device=dev)
wgu = (torch.randn(E, 2 * I, H, device=dev) / H ** 0.5).to(bf)
wd = (torch.randn(E, H, I, device=dev) / I ** 0.5).to(bf)
ids = ((torch.arange(T, device=dev)[:, None] * K + torch.arange(K, device=dev)[None, :]) % E).to(torch.int32)
w = torch.full((T, K), 1.0 / K, device=dev)
dout = torch.randn(T, H, dtype=bf, device=dev)
out, dx = torch.empty_like(x), torch.empty_like(x)
dw = torch.empty(T, K, device=dev)
dgu, ddn = torch.zeros(E, 2 * I, H, device=dev), torch.zeros(E, H, I, device=dev)
sb = LIB.lkp_moe_experts_saved_bytes(BF16, T, K, E, H, I)
saved = torch.empty(sb, dtype=torch.uint8, device=dev)
st = torch.cuda.current_stream().cuda_stream
ptrs = [t.data_ptr() for t in (x, ids, w, wgu, wd, out, dout, dx, dw, dgu, ddn)]
for _ in range(A.reps):
    for bwd in (0, 1):
        h = LIB.lkp_moe_experts(bwd, BF16, *ptrs, F32, saved.data_ptr(), sb, T, H, I, E, K, st)
        assert h and LIB.lkp_run(h) == 0, LIB.lkp_last_error()
torch.cuda.synchronize()
print("moe_once: done")
