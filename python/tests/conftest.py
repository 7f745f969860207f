"""conftest.py — the Python tests' shared set-up: which devices they run on (the CPU, and
CUDA where torch sees a GPU: tests/cuda/run_h200.sh runs them there), tolerances per
dtype, and llmkern imported from wherever the runner put it (python/tests/run.sh puts
<build>/python first on sys.path; otherwise the checkout's python/)."""
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import llmkern  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(_HERE, ".."))
    import llmkern  # noqa: F401

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# max |got - want| / max(|want|, tiny): f32 within a few ulps of accumulation, bf16 within its
# rounding of each intermediate (transformers rounds more often than llmkern's fused kernels)
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def rel_err(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def assert_close(got, want, dtype, what="", tol=None):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    e = rel_err(got, want)
    t = tol if tol is not None else TOL[dtype]
    assert e <= t, f"{what}: relative error {e:.3g} > {t:.3g} ({dtype})"


def takes(op, name, dev, dtypes=(torch.float32, torch.bfloat16)):
    """The dtypes the registry row (op, name, dev) takes (its dtypes mask: fused_sm90's experts bf16 alone)."""
    from llmkern import _torch
    L = _torch.L
    for i in range(L.lib.lk_impl_count()):
        im = L.lib.lk_impl_at(i).contents
        if L.OPS[im.op] == op and L.s(im.name) == name and ("cpu", "cuda")[im.device] == dev:
            mask = im.needs.dtypes
            return [dt for dt in dtypes if not mask or mask >> _torch._DTYPES[dt] & 1]
    return []


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
