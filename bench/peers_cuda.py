#!/usr/bin/env python3
"""peers_cuda.py — llmkern's CUDA kernels beside PyTorch eager, torch.compile and
Liger-Kernel, in one process on one GPU, on the shapes of ../shared/PEERS-H200.md.

Loads build/libllmkern.so and the C shim beside it (bench/peers_shim.c) through ctypes;
every call goes through the op's facade on torch's current stream. Timing: CUDA events
around each call, median of the repeats after warm-up; random bf16 inputs. GB/s counts
each tensor a pass must read or write once: fwd+bwd adds the forward's bytes to the
backward's (RMSNorm: x, y | x, dy, dx; silu(a)*b: a, b, c | dc, a, b, da, db). The
copy ceiling (2 GiB device-to-device, read + write) is measured in the same run.
MoE experts (moe_rows): TFLOP/s of the whole layer against torch._grouped_mm's pipeline,
Liger-Kernel's fused MoE (LigerFusedMoEFunction, autotuned before the timing, from the
results in bench/liger_autotune/ where they match: bench/triton_cache.py) and the HF
per-expert loop (LK_MOE_LIGER=0 leaves Liger's out), and of each grouped GEMM against torch._grouped_mm's
(llmkern's kernels timed by the profiler inside its calls). LK_BENCH_ONLY=moe_rows runs
that part alone.

Run:  python3 bench/peers_cuda.py --build build [--out DIR]   (writes DIR/peers_cuda.md)
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_problem  # noqa: E402
import shim  # noqa: E402
import triton_cache  # noqa: E402

triton_cache.seed()   # Liger's fused-MoE autotune results, carried (before Triton loads); sets TRITON_CACHE_DIR
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

P = argparse.ArgumentParser()
P.add_argument("--build", default="build")
P.add_argument("--out", default=os.environ.get("OUT", "."))
P.add_argument("--reps", type=int, default=50)
P.add_argument("--batch", type=int, default=1, help="back-to-back calls per timed sample (see ms)")
P.add_argument("--profile", action="store_true", help="also print where a call's time goes (see anatomy)")
ARGS = P.parse_args()

# The shim pulls libllmkern in through its own dependency, local to it: loaded with
# RTLD_GLOBAL, llmkern's CUDA runtime pieces (CUB's caches) met torch's copies and the
# process aborted in free().
LIB = shim.load(ARGS.build)   # with this build's libllmkern.so, whatever LD_LIBRARY_PATH says
BF16 = 1

try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    LIGER = True
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"liger-kernel not available: {e!r}")
    LIGER = False


def ok(status):
    if status != 0:
        raise RuntimeError(f"llmkern: status {status}: {LIB.lkp_last_error().decode()}")


def stream():
    return torch.cuda.current_stream().cuda_stream


def bound(f, *args):
    """A call into llmkern as a C caller makes it: the shim's f prepares it once (the
    pointers, shapes and stream in the op's args struct), and each timed call is
    lkp_run(handle), the facade with its checks and the launch. Gathering data_ptr() and
    current_stream() per call cost 8-12 us on the H200's host (bench/NOTES.md run 14), and
    converting a dozen ints through ctypes per call ~8 us more (run 28): the harness's
    time, not the library's."""
    h = f(*args)
    if not h:
        raise MemoryError("llmkern shim: out of memory preparing a call")
    return lambda: ok(LIB.lkp_run(h))


def ms(fn, reps=None):
    """Median milliseconds of fn() by CUDA events, after three warm-up calls. With --batch
    each sample times that many back-to-back calls (divided), so the host's work per call
    (Python, ctypes, argument checks, launches) overlaps the previous call's kernels and
    the number is the GPU's throughput; without it a short kernel also pays one call's
    host latency (at 0.2 ms a call, ~10%)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps or ARGS.reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(ARGS.batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / ARGS.batch)
    return statistics.median(times)


def anatomy(label, fn, n=20):
    """With --profile: one call's host time (wall clock of n calls queued without a sync,
    while the GPU is still busy with earlier ones) and its kernels' GPU time (CUPTI, per
    call), beside the event time ms() reports. The gap between the event time and the
    kernels' sum is what a call pays beyond its kernels: host latency and launch gaps."""
    if not ARGS.profile:
        return
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host_us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    kern = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kern.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in kern.values()) / n
    print(f"  anatomy {label}: event {ms(fn, 10) * 1e3:.1f} us, kernels {total:.1f} us, host {host_us:.1f} us",
          flush=True)
    for name, (cnt, us) in sorted(kern.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"    {us / n:9.1f} us  x{cnt / n:4.1f}  {name[:110]}", flush=True)


def gbps(nbytes, t_ms):
    return nbytes / (t_ms * 1e-3) / 1e9


ROWS = []
BAD = []   # outputs that disagreed with torch eager: the run fails


def row(op, shape, pas, nbytes, timings, target, goal_ratio, copy_goal):
    """timings: name -> ms (None = not available). Prints and keeps one table row."""
    g = {k: (gbps(nbytes, v) if v else None) for k, v in timings.items()}
    mine = g["llmkern"]
    peer = g.get(target)
    ratio = mine / peer if (mine and peer) else None
    frac = mine / COPY
    met = (ratio is None or ratio >= goal_ratio) and frac >= copy_goal
    ROWS.append((op, shape, pas, g, timings["llmkern"], target, goal_ratio, ratio, frac, copy_goal, met))
    cells = "  ".join(f"{k} {v:7.0f}" if v else f"{k}     n/a" for k, v in g.items())
    rs = f"{ratio:.2f}x {target}" if ratio else "n/a"
    print(f"{op:8s} {shape:22s} {pas:8s} {cells}  | llmkern {timings['llmkern']:.3f} ms, {rs} "
          f"(goal {goal_ratio}x), {100 * frac:.0f}% of copy (goal {100 * copy_goal:.0f}%) {'MET' if met else 'MISSED'}",
          flush=True)


def check_close(name, got, ref, tol):
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    print(f"  check {name}: max rel err vs torch eager {err:.2e} (tol {tol})", flush=True)
    if not err <= tol:
        print(f"  WARNING {name}: llmkern disagrees with torch eager ({err:.2e} > {tol}); timing anyway", flush=True)
        BAD.append(name)


# ---- the copy ceiling --------------------------------------------------------------
assert LIB.lkp_init() > 0, "llmkern found no GPU"
dev = torch.device("cuda")
print(f"GPU {LIB.lkp_gpu_name().decode()}, torch {torch.__version__}, liger {LIGER}; cuDNN {torch.backends.cudnn.version()} "
      f"from {sorted({ln.split()[-1] for ln in open('/proc/self/maps') if 'libcudnn.so' in ln})}", flush=True)
src = torch.empty(1 << 30, dtype=torch.bfloat16, device=dev).random_()
dst = torch.empty_like(src)
COPY = gbps(2 * src.numel() * 2, ms(lambda: dst.copy_(src)))
print(f"copy: {COPY:.0f} GB/s (2 GiB, read + write)", flush=True)
anatomy("copy 2 GiB", lambda: dst.copy_(src), 5)
del src, dst

# ---- RMSNorm 65536 x 4096 ----------------------------------------------------------
EPS = 1e-6


def rms_eager(x, w):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * xf.to(x.dtype)


def rms_norm_rows():
    R, N = 65536, 4096
    x = torch.randn(R, N, dtype=torch.bfloat16, device=dev)
    w = torch.randn(N, dtype=torch.bfloat16, device=dev)
    dy = torch.randn_like(x)
    y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
    rstd = torch.empty(R, dtype=torch.float32, device=dev)
    comp = torch.compile(rms_eager)

    lk_fwd = bound(LIB.lkp_rms_norm, 0, b"fused", BF16, x.data_ptr(), w.data_ptr(), y.data_ptr(), None, None, None,
                   rstd.data_ptr(), R, N, EPS, stream())
    lk_bwd = bound(LIB.lkp_rms_norm, 1, b"fused", BF16, x.data_ptr(), w.data_ptr(), None, dy.data_ptr(),
                   dx.data_ptr(), dw.data_ptr(), rstd.data_ptr(), R, N, EPS, stream())

    lk_fwd()
    check_close("rms_norm y", y, rms_eager(x, w), 2e-2)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    lk_bwd()
    ref = torch.autograd.grad(rms_eager(xg, wg), (xg, wg), dy)
    check_close("rms_norm dx", dx, ref[0], 2e-2)
    check_close("rms_norm dw", dw, ref[1], 2e-2)
    del ref
    liger = (lambda a, b: LigerRMSNormFunction.apply(a, b, EPS)) if LIGER else None
    t = {"eager": ms(lambda: rms_eager(x, w)), "compile": ms(lambda: comp(x, w)),
         "liger": ms(lambda: liger(x, w)) if LIGER else None, "llmkern": ms(lk_fwd)}
    nb = 2 * x.numel() * 2
    row("RMSNorm", "65536x4096", "fwd", nb, t, "liger", 1.1, 0.85)
    anatomy("rms_norm fwd llmkern", lk_fwd)
    if LIGER:
        anatomy("rms_norm fwd liger", lambda: liger(x, w))

    def fb(f):
        return lambda: torch.autograd.grad(f(xg, wg), (xg, wg), dy)

    t = {"eager": ms(fb(rms_eager)), "compile": ms(fb(comp)), "liger": ms(fb(liger)) if LIGER else None,
         "llmkern": ms(lambda: (lk_fwd(), lk_bwd()))}
    row("RMSNorm", "65536x4096", "fwd+bwd", nb + 3 * x.numel() * 2, t, "compile", 1.2, 0.75)


# ---- SwiGLU silu(a) * b, 32768 x 14336 ---------------------------------------------
def silu_mul(a, b):
    return F.silu(a) * b


def swiglu_rows():
    R, C = 32768, 14336
    a = torch.randn(R, C, dtype=torch.bfloat16, device=dev)
    b = torch.randn_like(a)
    dc = torch.randn_like(a)
    c, da, db = torch.empty_like(a), torch.empty_like(a), torch.empty_like(a)
    comp = torch.compile(silu_mul)

    lk_fwd = bound(LIB.lkp_swiglu_act, 0, BF16, a.data_ptr(), b.data_ptr(), c.data_ptr(), None, None, None, R, C,
                   stream())
    lk_bwd = bound(LIB.lkp_swiglu_act, 1, BF16, a.data_ptr(), b.data_ptr(), None, dc.data_ptr(), da.data_ptr(),
                   db.data_ptr(), R, C, stream())

    lk_fwd()
    check_close("silu*b c", c, silu_mul(a, b), 2e-2)
    ag, bg = a.detach().requires_grad_(), b.detach().requires_grad_()
    lk_bwd()
    ref = torch.autograd.grad(silu_mul(ag, bg), (ag, bg), dc)
    check_close("silu*b da", da, ref[0], 2e-2)
    check_close("silu*b db", db, ref[1], 2e-2)
    del ref
    liger = (lambda x, y: LigerSiLUMulFunction.apply(x, y)) if LIGER else None
    n = a.numel() * 2
    t = {"eager": ms(lambda: silu_mul(a, b)), "compile": ms(lambda: comp(a, b)),
         "liger": ms(lambda: liger(a, b)) if LIGER else None, "llmkern": ms(lk_fwd)}
    row("SwiGLU", "32768x14336", "fwd", 3 * n, t, "compile", 1.0, 0.85)

    def fb(f):
        return lambda: torch.autograd.grad(f(ag, bg), (ag, bg), dc)

    t = {"eager": ms(fb(silu_mul)), "compile": ms(fb(comp)), "liger": ms(fb(liger)) if LIGER else None,
         "llmkern": ms(lambda: (lk_fwd(), lk_bwd()))}
    row("SwiGLU", "32768x14336", "fwd+bwd", 8 * n, t, "compile", 1.0, 0.75)
    anatomy("swiglu fwd+bwd llmkern", lambda: (lk_fwd(), lk_bwd()))
    anatomy("swiglu fwd+bwd compile", fb(comp))


# ---- RoPE q 4x32x8192x128, k 8 heads -----------------------------------------------
def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_eager(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_rows():
    B, HQ, HK, S, D = 4, 32, 8, 8192, 128
    q = torch.randn(B, HQ, S, D, dtype=torch.bfloat16, device=dev)
    k = torch.randn(B, HK, S, D, dtype=torch.bfloat16, device=dev)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D))
    ang = torch.arange(S, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
    cos_t, sin_t = ang.cos().float().contiguous(), ang.sin().float().contiguous()       # llmkern: [S, D/2] f32
    emb = torch.cat((ang, ang), dim=-1)
    cos = emb.cos().to(torch.bfloat16)[None].expand(B, S, D).contiguous()               # HF: [B, S, D] bf16
    sin = emb.sin().to(torch.bfloat16)[None].expand(B, S, D).contiguous()
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    comp = torch.compile(rope_eager)

    lk_fwd = bound(LIB.lkp_rope, 0, BF16, q.data_ptr(), k.data_ptr(), qo.data_ptr(), ko.data_ptr(), cos_t.data_ptr(),
                   sin_t.data_ptr(), B, HQ, HK, S, D, S, stream())

    lk_fwd()
    rq, rk = rope_eager(q, k, cos, sin)
    check_close("rope q", qo, rq, 2e-2)
    check_close("rope k", ko, rk, 2e-2)
    del rq, rk
    liger = (lambda a, b: LigerRopeFunction.apply(a, b, cos, sin)) if LIGER else None
    t = {"eager": ms(lambda: rope_eager(q, k, cos, sin)), "compile": ms(lambda: comp(q, k, cos, sin)),
         "liger": ms(lambda: liger(q, k)) if LIGER else None, "llmkern": ms(lk_fwd)}
    nb = 2 * (q.numel() + k.numel()) * 2
    row("RoPE", "q 4x32x8192x128 k 8h", "fwd", nb, t, "compile", 1.0, 0.85)
    anatomy("rope fwd llmkern", lk_fwd)
    anatomy("rope fwd compile", lambda: comp(q, k, cos, sin))


# ---- LM head + cross-entropy, 8192 tokens, hidden 4096, vocab 151936 -------------
CE_ROWS = []
PEERS_EAGER_MS, PEERS_LIGER_MIB = 58.1, 6139      # ../shared/PEERS-H200.md, the numbers to beat


def ce_rows():
    """fwd+bwd ms and extra memory: torch eager (bf16 logits, fp32 CE), Liger fused linear
    CE, llmkern fused (bf16 logits chunks), on both of its paths. The peers' extra is the
    peak allocated beyond what existed before the call, so it includes the .grad tensors
    they allocate (w.grad bf16 1187 MiB, h.grad 64 MiB); llmkern's is counted the same way:
    its saved and workspace bytes plus the d_hidden and d_weight its caller owns.
    The goal (issue 8, ../shared/PEERS-H200.md): no slower than torch eager, measured here
    and as recorded there (58.1 ms), with no more extra memory than PEERS-H200.md's Liger
    (6139 MiB). The Liger measured here (the PyPI wheel) is printed beside it: its default
    accumulates W's gradient in bf16 across chunks, which llmkern's contract (f32) does not
    (bench/NOTES.md runs 13-14)."""
    T, H, V = 8192, 4096, 151936
    h = (torch.randn(T, H, dtype=torch.bfloat16, device=dev)).requires_grad_()
    w = (torch.randn(V, H, dtype=torch.bfloat16, device=dev) * H ** -0.5).requires_grad_()
    y = torch.randint(0, V, (T,), device=dev)
    y[::7] = -100
    reps = 10

    def eager():
        h.grad = w.grad = None
        loss = F.cross_entropy((h @ w.t()).float(), y)
        loss.backward()
        return loss

    def peak(fn):
        """ms, and the most memory fn held beyond what existed before it (MiB)."""
        t = ms(fn, reps)
        torch.cuda.synchronize()
        h.grad = w.grad = None
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        return t, extra

    res = {}
    ref_loss = eager().item()
    ref_dh, ref_dw = h.grad.clone(), w.grad.clone()
    res["torch eager (full logits, fp32 CE)"] = peak(eager)
    if LIGER:
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            def liger_step(**kw):
                lce = LigerFusedLinearCrossEntropyLoss(**kw)

                def step():
                    h.grad = w.grad = None
                    loss = lce(w, h, y)
                    loss.backward()
                    return loss
                return step

            res["Liger fused linear CE"] = peak(liger_step())
            # The same op with W's gradient accumulated in f32, llmkern's contract.
            res["Liger fused linear CE, f32 dW (accum_dtype)"] = peak(liger_step(accum_dtype=torch.float32))
            anatomy("ce liger fwd+bwd", liger_step(), 3)
        except Exception as e:  # noqa: BLE001
            print(f"  liger fused linear CE failed: {e!r}", flush=True)
    h.grad = w.grad = None
    hd, wd = h.detach(), w.detach()
    loss = torch.empty(1, dtype=torch.float32, device=dev)
    dl = torch.ones(1, dtype=torch.float32, device=dev)
    dh, dw = torch.empty_like(hd), torch.zeros_like(wd)
    # chunk >= H: dW accumulated in f32 over token chunks (saved V·H·4); chunk < H: the lean
    # path (dh + lse saved, dW per vocab block in the backward), its budget under Liger's MiB
    for chunk in (4096, 8192, 2048, 1024):
        path = "lean" if chunk < H else "accumulating"
        sb, wb = ctypes.c_size_t(), ctypes.c_size_t()
        ok(LIB.lkp_cross_entropy_bytes(BF16, BF16, T, H, V, chunk, ctypes.byref(sb), ctypes.byref(wb)))
        saved = torch.empty(sb.value, dtype=torch.uint8, device=dev)

        passes = [bound(LIB.lkp_cross_entropy, backward, BF16, hd.data_ptr(), wd.data_ptr(), y.data_ptr(),
                        loss.data_ptr(), dl.data_ptr(), dh.data_ptr(), dw.data_ptr(), BF16, saved.data_ptr(), sb.value,
                        T, H, V, chunk, stream()) for backward in (0, 1)]

        def lk(backward):
            passes[backward]()

        dw.zero_()
        lk(0), lk(1)
        torch.cuda.synchronize()
        if chunk in (4096, 2048):
            err = abs(loss.item() - ref_loss) / abs(ref_loss)
            print(f"  check ce loss ({path}): llmkern {loss.item():.6f} torch {ref_loss:.6f} rel err {err:.2e}",
                  flush=True)
            if not err <= 1e-3:
                BAD.append(f"ce loss ({path})")
            check_close(f"ce d_hidden ({path})", dh, ref_dh, 2e-2)
            check_close(f"ce d_weight ({path})", dw, ref_dw, 2e-2)
        if chunk in (4096, 2048):
            anatomy(f"ce llmkern {path} chunk {chunk} fwd+bwd", lambda: (lk(0), lk(1)), 3)
        t_f = ms(lambda: lk(0), reps)
        t = ms(lambda: (lk(0), lk(1)), reps)
        own = (sb.value + wb.value) / 2 ** 20
        extra = own + (dh.numel() + dw.numel()) * 2 / 2 ** 20      # counted as the peers are
        print(f"  llmkern {path} chunk {chunk}: saved + workspace {own:.0f} MiB, with d_hidden and d_weight "
              f"{extra:.0f} MiB", flush=True)
        budget = chunk * V * 4 / 2 ** 20
        print(f"  llmkern {path} chunk {chunk} (budget {budget:.0f} MiB): fwd {t_f:.1f} ms, bwd {t - t_f:.1f} ms, "
              f"fwd+bwd {t:.1f} ms, saved {sb.value / 2 ** 20:.0f} MiB + workspace {wb.value / 2 ** 20:.0f} MiB",
              flush=True)
        res[f"llmkern fused {path} (chunk {chunk} tokens)"] = (t, extra)
        del saved
        torch.cuda.empty_cache()
    flops = 3 * 2 * T * H * V
    eager_ms = res["torch eager (full logits, fp32 CE)"][0]
    liger_mib = res.get("Liger fused linear CE", (None, None))[1]
    for name, (t, mib) in res.items():
        tf = flops / (t * 1e-3) / 1e12
        vs = f"  {eager_ms / t:.2f}x eager's speed" + (f", {mib / liger_mib:.2f}x Liger's MiB" if liger_mib else "")
        print(f"CE {name:48s} fwd+bwd {t:7.1f} ms  {tf:5.0f} TFLOP/s  extra {mib:6.0f} MiB{vs}", flush=True)
        CE_ROWS.append((name, t, tf, mib, eager_ms / t, mib / liger_mib if liger_mib else None))
    goal = {}
    for name in [n for n in res if n.startswith("llmkern")]:
        t, m = res[name]
        goal[name] = t <= min(eager_ms, PEERS_EAGER_MS) and m <= PEERS_LIGER_MIB
        here = "".join(f", {m / res[k][1]:.2f}x the MiB of {k} here" for k in res if k.startswith("Liger"))
        print(f"CE goal (<= eager's ms here and in PEERS-H200.md, <= PEERS-H200.md Liger's MiB) {name}: {t:.1f} "
              f"vs {eager_ms:.1f} / {PEERS_EAGER_MS} ms, {m:.0f} vs {PEERS_LIGER_MIB} MiB: "
              f"{'MET' if goal[name] else 'MISSED'}{here}", flush=True)
    CE_ROWS.append(("goal met", any(goal.values()), None, None, None, None))


# ---- attention: PEERS-H200.md's shape and cuDNN's GQA training shape ---------------
ATT_ROWS = []
ATT_SHAPES = [(2, 32, 32, 8192, 128), (1, 64, 8, 4096, 128)]     # B, Hq, Hkv, S, D
ATT_PASSES = os.environ.get("LK_ATT_PASSES", "fwd,fwd+bwd").split(",")   # fwd alone: a row's forward only
# The issue-16 goals: each row against a peer in every cell (TFLOP/s ratio).
ATT_GOALS = {"flash_attention_3": ("sdpa cudnn", 1.05), "cudnn": ("sdpa cudnn", 0.97),
             "flash_attention_2": ("sdpa flash", 1.00)}


def attention_alone(name, shape, causal):
    """{"fwd": ms, "fwd+bwd": ms} of a row timed by bench/attention_alone.py in a process
    without torch, or None (printed why)."""
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_alone.py"),
           "--build", ARGS.build, "--impl", name, "--shape", ",".join(map(str, shape)), "--causal", str(causal)]
    try:
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - a crash or a timeout of the child is reported, not fatal
        print(f"  {name} alone: {e!r}", flush=True)
        return None
    if "error" in r:
        print(f"  {name} alone: {r['error']}", flush=True)
        return None
    return {"fwd": r["fwd_ms"], "fwd+bwd": r["fwd+bwd_ms"]}


def attention_rows():
    """TFLOP/s of llmkern's CUDA attention rows (LK_ATT_IMPLS, default every one this build
    has) beside torch SDPA's cuDNN and flash backends, in one process, at each shape of
    ATT_SHAPES, causal and not, fwd and fwd+bwd. FLOPs: 4·B·Hq·S²·D forward (half of it
    causal), 3.5x that for fwd+bwd. Each row's out and gradients are checked against SDPA's
    (its default backend) before timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = [n for n in os.environ.get("LK_ATT_IMPLS", ",".join(ATT_GOALS)).split(",") if n]
    have = [n for n in names if LIB.lkp_has_attention(n.encode())]
    for n in names:
        if n not in have:
            print(f"attention: this build has no CUDA row {n}", flush=True)
    peers = {"sdpa cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa flash": SDPBackend.FLASH_ATTENTION}
    for B, Hq, Hkv, S, D in ATT_SHAPES:
        shape = f"B{B} Hq{Hq} Hkv{Hkv} S{S} D{D}"
        q, k, v, out, dout, dq, dk, dv, lse = bufs = shim.attention_buffers(torch, dev, B, Hq, Hkv, S, D)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        gqa = Hq != Hkv
        for causal in (0, 1):
            fl = 4 * B * Hq * S * S * D / (2 if causal else 1)
            cells = {}

            def sdpa(qq, kk, vv):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal), enable_gqa=gqa)

            o = sdpa(qg, kg, vg)
            ref_o = o.detach().transpose(1, 2)
            ref_g = torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2))
            del o
            for pname, be in peers.items():
                def f(be=be):
                    with sdpa_kernel(be):
                        return sdpa(q, k, v)

                def fb(be=be):
                    with sdpa_kernel(be):
                        torch.autograd.grad(sdpa(qg, kg, vg), (qg, kg, vg), dout.transpose(1, 2))
                try:
                    cells[(pname, "fwd")], cells[(pname, "fwd+bwd")] = ms(f, 10), ms(fb, 10)
                except Exception as e:  # noqa: BLE001 - a backend torch cannot run here is reported, not fatal
                    print(f"attention {shape} causal {causal}: {pname} failed: {str(e)[:160]}", flush=True)
                    if gqa:     # some backends take no enable_gqa: time them on K/V repeated to Hq heads
                        kr, vr = (t.repeat_interleave(Hq // Hkv, 1) for t in (k, v))
                        krg, vrg = (t.detach().requires_grad_() for t in (kr, vr))

                        def fr(be=be):
                            with sdpa_kernel(be):
                                return F.scaled_dot_product_attention(q, kr, vr, is_causal=bool(causal))

                        def fbr(be=be):
                            with sdpa_kernel(be):
                                o = F.scaled_dot_product_attention(qg, krg, vrg, is_causal=bool(causal))
                                torch.autograd.grad(o, (qg, krg, vrg), dout.transpose(1, 2))
                        try:
                            cells[(pname, "fwd")], cells[(pname, "fwd+bwd")] = ms(fr, 10), ms(fbr, 10)
                            print(f"  {pname}: timed on K/V repeated to {Hq} heads", flush=True)
                        except Exception as e2:  # noqa: BLE001
                            print(f"  {pname} failed again: {str(e2)[:160]}", flush=True)
                        del kr, vr, krg, vrg
            for name in have:
                args = shim.attention_args(BF16, bufs, (B, Hq, Hkv, S, D), causal, stream())
                both = "fwd+bwd" in ATT_PASSES
                try:
                    lk_f = bound(LIB.lkp_attention, name.encode(), 0, *args)
                    lk_b = bound(LIB.lkp_attention, name.encode(), 1, *args)
                    lk_f()
                    if both:
                        lk_b()
                except Exception as e:  # noqa: BLE001 - one row's refusal must not lose the others
                    alone = attention_alone(name, (B, Hq, Hkv, S, D), causal) if name == "cudnn" else None
                    if alone:   # refused beside torch's own cuDNN: timed in a process of its own
                        print(f"attention {shape} causal {causal}: {name} refused in this process ({e}); timed "
                              f"alone (bench/attention_alone.py; checked by cuda_test_attention)", flush=True)
                        cells.update({(name, p): alone[p] for p in ("fwd", "fwd+bwd") if p in ATT_PASSES})
                        continue
                    print(f"attention {shape} causal {causal}: {name} FAILED: {e}", flush=True)
                    BAD.append(f"attention {name}")
                    continue
                tag = f"attention {name} {shape} causal {causal}"
                check_close(f"{tag} out", out, ref_o, 2e-2)
                for gn, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_g if both else ()):
                    check_close(f"{tag} {gn}", got, want, 3e-2)
                cells[(name, "fwd")] = ms(lk_f, 10)
                if both:
                    cells[(name, "fwd+bwd")] = ms(lambda: (lk_f(), lk_b()), 10)
            for (name, pas), tm in cells.items():
                tf = (fl if pas == "fwd" else 3.5 * fl) / (tm * 1e-3) / 1e12
                peer, goal = ATT_GOALS.get(name, (None, None))
                ratio = None
                if peer and (peer, pas) in cells:
                    ptm = cells[(peer, pas)]
                    ratio = ptm / tm
                met = None if ratio is None else ratio >= goal
                gs = f"  {ratio:.3f}x {peer} (goal {goal}x) {'met' if met else 'MISSED'}" if ratio else ""
                print(f"attention {shape} {'causal' if causal else 'full  '} {name:18s} {pas:7s} {tm:8.2f} ms "
                      f"{tf:6.1f} TFLOP/s{gs}", flush=True)
                ATT_ROWS.append((shape, causal, name, pas, tm, tf, peer, goal, ratio, met))
        del q, k, v, dout, out, dq, dk, dv, lse, bufs, qg, kg, vg, ref_o, ref_g


# ---- MoE experts: 128 experts, top-8, hidden 2048, expert FFN 768, 16384 tokens --------
MOE_ROWS = []


def moe_rows():
    """The experts layer (permute, gate/up, SwiGLU, down, weighted un-permute) with the fake
    gate's balanced routing (token t takes experts (t·k + j) mod E: 1024 rows an expert,
    the shape of PEERS-H200.md's torch._grouped_mm rows; LK_MOE_SHAPE / LK_MOE_SKEW for another
    shape and an uneven router: bench/moe_problem.py), bf16, weight gradients in f32.
    Peers: torch._grouped_mm in the same pipeline (argsort, gather, two grouped GEMMs,
    SiLU·up weighted, index_add in f32) under autograd, and the HF per-expert loop. The
    grouped GEMMs alone: torch._grouped_mm's gate/up and down beside llmkern's gate/up
    (SwiGLU epilogue) and down kernels, timed by the profiler inside one llmkern call."""
    pb = moe_problem.make(dev)   # the tensors bench/moe_once.py profiles too
    T, H, I, E, K = pb.T, pb.H, pb.I, pb.E, pb.K
    R = T * K
    bf = torch.bfloat16
    x, wgu, wd, ids, w, dout, out, dx, dw = pb.x, pb.wgu, pb.wd, pb.ids, pb.w, pb.dout, pb.out, pb.dx, pb.dw
    sb = LIB.lkp_moe_experts_saved_bytes(BF16, T, K, E, H, I)
    saved = torch.empty(sb, dtype=torch.uint8, device=dev)
    args = moe_problem.call_args(pb, saved, sb, stream())
    lk_f = bound(LIB.lkp_moe_experts, 0, BF16, *args)
    lk_b = bound(LIB.lkp_moe_experts, 1, BF16, *args)

    def hf_loop(x, w, wgu, wd):
        acc = torch.zeros(T, H, dtype=torch.float32, device=dev)
        for e in range(E):
            tok, j = torch.where(ids == e)
            if tok.numel() == 0:
                continue
            gu = x[tok] @ wgu[e].t()
            y = (F.silu(gu[:, :I]) * gu[:, I:]) @ wd[e].t()
            acc.index_add_(0, tok, y.float() * w[tok, j, None])
        return acc.to(bf)

    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    tok_of = order // K

    def gmm_layer(x, w, wgu, wd):
        xs = x[tok_of]
        gu = torch._grouped_mm(xs, wgu.transpose(-2, -1), offs=offs)
        h = (F.silu(gu[:, :I].float()) * gu[:, I:].float() * w.reshape(-1)[order, None]).to(bf)
        y = torch._grouped_mm(h, wd.transpose(-2, -1), offs=offs)
        return torch.zeros(T, H, dtype=torch.float32, device=dev).index_add_(0, tok_of, y.float()).to(bf)

    lk_f()
    ref = hf_loop(x, w, wgu, wd)
    check_close("moe out", out, ref, 3e-2)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    gug, wdg = wgu.detach().requires_grad_(), wd.detach().requires_grad_()
    lk_b()
    g = torch.autograd.grad(hf_loop(xg, wg, gug, wdg), (xg, wg), dout)
    check_close("moe d_hidden", dx, g[0], 3e-2)
    check_close("moe d_topk_weights", dw, g[1], 3e-2)
    del g, ref
    fl = 2.0 * R * H * 3 * I   # gate/up + down; the backward is twice this

    def fb(f):
        return lambda: torch.autograd.grad(f(xg, wg, gug, wdg), (xg, wg, gug, wdg), dout)

    peers = [("llmkern fused", lk_f, lambda: (lk_f(), lk_b())),
             ("torch _grouped_mm", lambda: gmm_layer(x, w, wgu, wd), fb(gmm_layer)),
             ("HF per-expert loop", lambda: hf_loop(x, w, wgu, wd), fb(hf_loop))]
    try:   # Liger's fused MoE (Triton grouped GEMMs, autotuned at the first call of a shape: minutes)
        if os.environ.get("LK_MOE_LIGER", "1") == "0":
            raise RuntimeError("LK_MOE_LIGER=0")
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

        def liger_moe(x, w, wgu, wd):
            return LigerFusedMoEFunction.apply(x, wgu, wd, ids, w)
        t0 = time.time()
        lo = liger_moe(x, w, wgu, wd)   # the autotune, outside the timing
        check_close("moe liger fused out", lo, out, 3e-2)
        fb(liger_moe)()
        torch.cuda.synchronize()
        print(f"  moe liger fused: first fwd+bwd (autotune) {time.time() - t0:.0f} s", flush=True)
        peers.append(("Liger fused MoE", lambda: liger_moe(x, w, wgu, wd), fb(liger_moe)))
    except Exception as e:  # noqa: BLE001 - no Liger, or a Liger without fused MoE: n/a
        print(f"  moe liger fused: n/a ({e!r})", flush=True)
    t = {}
    for name, fwd, both in peers:
        for pas, fn, f in (("fwd", fwd, fl), ("fwd+bwd", both, 3 * fl)):
            try:
                t[(name, pas)] = ms(fn, 10)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run here is n/a
                print(f"  moe {name} {pas}: {e!r}", flush=True)
                continue
            tm = t[(name, pas)]
            MOE_ROWS.append(("layer", name, pas, tm, f / (tm * 1e-3) / 1e12))
    # the grouped GEMMs alone
    xs = x[tok_of].contiguous()
    hs = torch.randn(R, I, dtype=bf, device=dev)
    gems = {"gate/up": (lambda: torch._grouped_mm(xs, wgu.transpose(-2, -1), offs=offs), 2.0 * R * H * 2 * I),
            "down": (lambda: torch._grouped_mm(hs, wd.transpose(-2, -1), offs=offs), 2.0 * R * I * H)}
    for gname, (fn, f) in gems.items():
        tm = ms(fn, 20)
        MOE_ROWS.append(("gemm " + gname, "torch _grouped_mm", "fwd", tm, f / (tm * 1e-3) / 1e12))
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            lk_f(), lk_b()
        torch.cuda.synchronize()
    # grouped.cu's instantiations, gg_mma<mode, epilogue, A k-major, B k-major>, and on sm_90
    # grouped_sm90.cu's, gg_sm90<epilogue, A gathered, B k-major, V4> (gg_sm90_pp<...> under
    # LLMKERN_GG_SM90=pingpong), and grouped_wgrad_sm90.cu's gg_sm90_wgrad<A gathered, B
    # gathered, TMA epilogue> (gg_sm90_wgrad_pp<...>; both weight gradients): a row sums whichever ran
    kinds = {("gg_mma<0, 2, true, true>", "gg_sm90<2, true, true,", "gg_sm90_pp<2, true, true,"):
                 ("gemm gate/up", "fwd", 2.0 * R * H * 2 * I),
             ("gg_mma<0, 0, true, true>", "gg_sm90<0, false, true,", "gg_sm90_pp<0, false, true,"):
                 ("gemm down", "fwd", 2.0 * R * I * H),
             ("gg_mma<0, 3, true, false>", "gg_sm90<3, true, false,", "gg_sm90_pp<3, true, false,"):
                 ("gemm down", "bwd dh'", 2.0 * R * I * H),
             ("gg_mma<0, 0, true, false>", "gg_sm90<0, false, false,", "gg_sm90_pp<0, false, false,"):
                 ("gemm gate/up", "bwd d_rows", 2.0 * R * H * 2 * I),
             ("gg_mma<1, 1, false, false>", "gg_sm90_wgrad<", "gg_sm90_wgrad_pp<"):
                 ("gemm wgrad", "bwd d_down + d_gate_up", 2.0 * R * H * 3 * I)}
    us, ran = {}, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.replace("(int)", "")
            for keys in kinds:
                for key in keys:
                    if key in name:
                        us[keys] = us.get(keys, 0.0) + (e.device_time_total if hasattr(e, "device_time_total")
                                                        else e.cuda_time_total)
                        ran.setdefault(keys, set()).add(key.split("<")[0])
    for keys, (gname, pas, f) in kinds.items():
        if keys in us:
            tm = us[keys] / 5 / 1e3
            MOE_ROWS.append((gname, "llmkern fused", f"{pas} ({'+'.join(sorted(ran[keys]))})", tm,
                             f / (tm * 1e-3) / 1e12))
        else:
            print(f"  moe: no kernel named {' or '.join(keys)} in the profile", flush=True)
    for r in MOE_ROWS:
        print(f"moe {r[0]:14s} {r[1]:20s} {r[2]:24s} {r[3]:8.3f} ms {r[4]:6.1f} TFLOP/s", flush=True)
    anatomy("moe fwd+bwd llmkern", lambda: (lk_f(), lk_b()), 5)
    del pb, x, wgu, wd, out, dx, saved, xs, hs, xg, wg, gug, wdg


def write_table():
    os.makedirs(ARGS.out, exist_ok=True)
    path = os.path.join(ARGS.out, "peers_cuda.md")
    with open(path, "w") as f:
        f.write(f"GPU {LIB.lkp_gpu_name().decode()}, torch {torch.__version__}; copy {COPY:.0f} GB/s. "
                "GB/s per implementation; goal: llmkern / peer and fraction of copy.\n\n")
        f.write("| op | shape | pass | torch eager | torch.compile | Liger | llmkern | llmkern ms | vs peer (goal) "
                "| of copy (goal) | met |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for op, shape, pas, g, t_ms, target, goal, ratio, frac, cgoal, met in ROWS:
            cell = lambda v: f"{v:.0f}" if v else "n/a"  # noqa: E731
            rs = f"{ratio:.2f}x {target} ({goal}x)" if ratio else f"n/a ({goal}x {target})"
            f.write(f"| {op} | {shape} | {pas} | {cell(g['eager'])} | {cell(g['compile'])} | {cell(g['liger'])} | "
                    f"**{cell(g['llmkern'])}** | {t_ms:.3f} | {rs} | {100 * frac:.0f}% ({100 * cgoal:.0f}%) | "
                    f"{'yes' if met else 'no'} |\n")
        if ATT_ROWS:
            f.write("\n## Attention (bf16; TFLOP/s; goal: TFLOP/s / the peer's)\n\n| shape | mask | impl | pass | "
                    "ms | TFLOP/s | vs peer (goal) | met |\n|---|---|---|---|---|---|---|---|\n")
            for shape, causal, name, pas, tm, tf, peer, goal, ratio, met in ATT_ROWS:
                vs = f"{ratio:.3f}x {peer} ({goal}x)" if ratio else ""
                f.write(f"| {shape} | {'causal' if causal else 'none'} | {name} | {pas} | {tm:.2f} | {tf:.1f} | {vs} | "
                        f"{'' if met is None else 'yes' if met else 'no'} |\n")
        if CE_ROWS:
            f.write("\n## LM head + cross-entropy (T 8192, H 4096, V 151936, bf16, mean)\n\n"
                    "| impl | fwd+bwd ms | TFLOP/s (3 GEMMs) | extra peak MiB | eager ms / ms | MiB / Liger's |\n"
                    "|---|---|---|---|---|---|\n")
            for name, t, tf, mib, sp, mr in CE_ROWS:
                if tf is None:
                    f.write(f"\ngoal (no slower than eager here and in PEERS-H200.md, no more memory than "
                            f"PEERS-H200.md's Liger, {PEERS_LIGER_MIB} MiB): {'met' if t else 'MISSED'}\n")
                else:
                    mrs = f"{mr:.2f}" if mr is not None else "n/a"
                    f.write(f"| {name} | {t:.1f} | {tf:.0f} | {mib:.0f} | {sp:.2f} | {mrs} |\n")
        if MOE_ROWS:
            f.write("\n## MoE experts (T 16384, H 2048, I 768, E 128, top-8, balanced, bf16; TFLOP/s)\n\n"
                    "| what | impl | pass | ms | TFLOP/s |\n|---|---|---|---|---|\n")
            for what, name, pas, tm, tf in MOE_ROWS:
                f.write(f"| {what} | {name} | {pas} | {tm:.3f} | {tf:.0f} |\n")
    print(f"wrote {path}")


t0 = time.time()
PARTS = [ce_rows, rms_norm_rows, swiglu_rows, rope_rows, attention_rows, moe_rows]
if os.environ.get("LK_BENCH_ONLY"):
    PARTS = [p for p in PARTS if p.__name__ in os.environ["LK_BENCH_ONLY"].split(",")]
for part in PARTS:
    try:
        part()
    except Exception as e:  # noqa: BLE001 - one op's failure must not lose the others' rows
        print(f"{part.__name__} FAILED: {e!r}", flush=True)
    torch.cuda.empty_cache()
    write_table()
print(f"bench took {time.time() - t0:.0f} s")
if triton_cache.harvest(os.environ["TRITON_CACHE_DIR"], ARGS.out):   # new Liger autotune results, to keep
    print(f"new Triton autotune results in {ARGS.out}/liger_autotune_new.tgz (bench/triton_cache.py)")
if BAD:
    print(f"outputs that disagreed with torch eager: {', '.join(BAD)}")
ce_ok = all(r[1] for r in CE_ROWS if r[0] == "goal met")
sys.exit(0 if ROWS and all(r[-1] for r in ROWS) and ce_ok and not BAD else 1)
