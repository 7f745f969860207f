"""attention_load.py — where a sustained fwd+bwd loop's time goes, kernel by kernel, with the
SM clock and the board power beside it: llmkern's CUDA attention rows and torch SDPA's cuDNN
backend, each looped for a few seconds in one process, as bench/peers_cuda.py's rows time them.

Why: Nsight Compute times one launch on a cold GPU at its top clock; the rows loop for seconds,
where a 700 W board lowers its clock by how much power each kernel draws. A kernel that takes
fewer cycles can still lose the row if it burns more energy per cycle (bench/NOTES.md,
forty-ninth session). Prints, per side and cell: the loop's ms a call, each kernel's mean
µs a call (CUDA profiler), and the mean SM clock (MHz) and power (W) sampled by NVML while
the loop ran.
  python3 bench/attention_load.py --build build-h200 [--impls flash_attention_3] [--seconds 4]"""
import argparse
import statistics
import threading
import time

import shim
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--impls", default="flash_attention_3")
P.add_argument("--shapes", default="2,32,32,8192,128;1,64,8,4096,128", help="B,Hq,Hkv,S,D;...")
P.add_argument("--causal", default="0,1")
P.add_argument("--seconds", type=float, default=4.0, help="each loop's length before it is sampled")
A = P.parse_args()

LIB = shim.load(A.build)
assert LIB.lkp_init() >= 1, "no CUDA device"

try:
    import pynvml
    pynvml.nvmlInit()
    NVML = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
except Exception as e:  # noqa: BLE001 - without NVML the clocks are left out, the times stay
    print(f"no NVML ({e!r}): clocks and power not sampled")
    NVML = None


class Sampler:
    """SM clock (MHz) and power (W) every 20 ms on a thread, while `with` holds."""
    def __enter__(self):
        self.mhz, self.w, self.stop = [], [], False

        def run():
            while not self.stop:
                self.mhz.append(pynvml.nvmlDeviceGetClockInfo(NVML, pynvml.NVML_CLOCK_SM))
                self.w.append(pynvml.nvmlDeviceGetPowerUsage(NVML) / 1e3)
                time.sleep(0.02)
        self.t = threading.Thread(target=run) if NVML else None
        if self.t:
            self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        if self.t:
            self.t.join()

    def __str__(self):
        if not self.mhz:
            return ""
        return f"{statistics.mean(self.mhz):5.0f} MHz {statistics.mean(self.w):4.0f} W"


def measure(label, fn):
    """Loop fn for --seconds (warm), then 10 timed calls under the sampler, then 5 profiled."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < A.seconds:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()
    with Sampler() as smp:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            fn()
        b.record()
        b.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    kern = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kern[e.name] = kern.get(e.name, 0.0) + e.device_time_total
    total = sum(kern.values()) / 5
    print(f"{label:44s} {a.elapsed_time(b) / 10:8.3f} ms  kernels {total / 1e3:8.3f} ms  {smp}", flush=True)
    for name, us in sorted(kern.items(), key=lambda kv: -kv[1])[:5]:
        print(f"      {us / 5:10.1f} us  {name[:100]}", flush=True)


dev = torch.device("cuda")
for shp in A.shapes.split(";"):
    B, Hq, Hkv, S, D = (int(x) for x in shp.split(","))
    q, k, v, out, dout, dq, dk, dv, lse = bufs = shim.attention_buffers(torch, dev, B, Hq, Hkv, S, D)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    for causal in (int(c) for c in A.causal.split(",")):
        cell = f"B{B} Hq{Hq} Hkv{Hkv} S{S} {'causal' if causal else 'full'}"

        def sdpa_fb():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=bool(causal), enable_gqa=Hq != Hkv)
                torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2))
        measure(f"{cell} sdpa cudnn fwd+bwd", sdpa_fb)
        for impl in A.impls.split(","):
            args = shim.attention_args(1, bufs, (B, Hq, Hkv, S, D), causal, torch.cuda.current_stream().cuda_stream)
            hf, hb = (LIB.lkp_attention(impl.encode(), bw, *args) for bw in (0, 1))
            if not hf or not hb:
                print(f"{cell} {impl}: {LIB.lkp_last_error().decode()}")
                continue

            def lk_fb(hf=hf, hb=hb):
                if LIB.lkp_run(hf) or LIB.lkp_run(hb):
                    raise RuntimeError(LIB.lkp_last_error().decode())
            measure(f"{cell} {impl} fwd+bwd", lk_fb)
        measure(f"{cell} sdpa cudnn fwd+bwd (again)", sdpa_fb)
    del q, k, v, dout, out, dq, dk, dv, lse, bufs, qg, kg, vg
    torch.cuda.empty_cache()
