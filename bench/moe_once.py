"""moe_once.py — one forward and one backward of the CUDA moe_experts row ("fused") at
PEERS-H200.md's MoE shape (bench/moe_problem.py: the problem bench/peers_cuda.py's moe_rows
times) through the peers shim: a short process for
`ncu --kernel-name regex:gg_sm90 --launch-count N` to profile each grouped GEMM once; with
--kernels, every kernel of a warm forward + backward and its time (torch.profiler), to see
where the layer's time goes beside the GEMMs.
  python3 bench/moe_once.py --build build-h200 [--reps 1] [--kernels]"""
import argparse
import os

import torch

import moe_problem
import shim

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--reps", type=int, default=1)
P.add_argument("--kernels", action="store_true")
A = P.parse_args()
LIB = shim.load(A.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
assert LIB.lkp_init() > 0
BF16 = 1
pb = moe_problem.make("cuda")   # bench/peers_cuda.py's moe_rows problem
sb = LIB.lkp_moe_experts_saved_bytes(BF16, pb.T, pb.K, pb.E, pb.H, pb.I)
saved = torch.empty(sb, dtype=torch.uint8, device="cuda")
args = moe_problem.call_args(pb, saved, sb, torch.cuda.current_stream().cuda_stream)


def layer():
    for bwd in (0, 1):
        h = LIB.lkp_moe_experts(bwd, BF16, *args)
        assert h and LIB.lkp_run(h) == 0, LIB.lkp_last_error()


for _ in range(A.reps):
    layer()
torch.cuda.synchronize()
if A.kernels:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        layer()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.device_time
            print(f"  {e.device_time / 1e3:8.3f} ms  {e.name[:110]}")
    print(f"  {total / 1e3:8.3f} ms  all kernels")
print("moe_once: done")
