"""attention_alone.py — one CUDA attention row timed in a process without torch, through the
peers shim's lkp_time_attention (random bf16 inputs, CUDA events). bench/peers_cuda.py runs it
for a row that refuses inside the torch process: the cudnn row does when torch's cuDNN is
another version than the one libllmkern was built against (bench/NOTES.md, issue 16's cudnn
row). Its correctness is cuda_test_attention's. Prints one JSON object: fwd_ms and
fwd+bwd_ms, or error.
  python3 bench/attention_alone.py --build build-h200 --impl cudnn --shape 2,32,32,8192,128 --causal 0"""
import argparse
import ctypes
import json
import os

import shim

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--impl", default="cudnn")
P.add_argument("--shape", default="2,32,32,8192,128", help="B,Hq,Hkv,S,D")
P.add_argument("--causal", type=int, default=0)
P.add_argument("--reps", type=int, default=10)
A = P.parse_args()
LIB = shim.load(A.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
B, Hq, Hkv, S, D = (int(x) for x in A.shape.split(","))
ms = (ctypes.c_double * 2)()
if LIB.lkp_init() < 1:
    print(json.dumps({"error": "no CUDA device"}))
elif LIB.lkp_time_attention(A.impl.encode(), B, Hq, Hkv, S, D, A.causal, A.reps, ms):
    print(json.dumps({"error": LIB.lkp_last_error().decode()}))
else:
    print(json.dumps({"impl": A.impl, "shape": A.shape, "causal": A.causal, "fwd_ms": ms[0], "fwd+bwd_ms": ms[1]}))
