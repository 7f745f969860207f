"""test_nn.py — llmkern.nn's modules against the modules they stand in for (transformers'
Qwen3RMSNorm and Qwen3MLP; the add + norm; the LM head's cross-entropy in float64): the
same state-dict keys, outputs and every gradient, on the CPU and (where torch sees one) the
GPU, f32 and bf16 (conftest.TOL), the registry's default and a named implementation; and
the options they refuse, each named in the error."""
import pytest
import torch
from conftest import DEVICES, assert_close

import llmkern
import llmkern.nn as lnn
from llmkern import LlmkernError
from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3 as mq

DTYPES = [torch.float32, torch.bfloat16]
AVAILABLE = {(op, dev): [n for o, n, d, ok, _ in llmkern.implementations() if o == op and d == dev and ok]
             for op in ("rms_norm", "swiglu_mlp") for dev in ("cpu", "cuda")}


def cases(op):
    """Every device and dtype with the registry's default (None) and each other name the op has there."""
    return [(dev, dt, impl) for dev in DEVICES for dt in DTYPES for impl in [None] + AVAILABLE[(op, dev)]]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def config(**kw):
    return Qwen3Config(**dict(dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16), **kw))


def _pair(ref, ours, dev, dt):
    """ref's parameters random, ours loaded from its state dict (strict: the same keys), both on dev in dt."""
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    ours.load_state_dict(ref.state_dict())
    return ref.to(dev, dt), ours.to(dev, dt)


def _forward_backward(module, x, dy):
    """module(x) and x's gradient under dy (the parameters' gradients land in their .grad)."""
    xl = leaf(x)
    y = module(xl)
    y.backward(dy)
    return y, xl.grad


@pytest.mark.parametrize("dev,dt,impl", cases("rms_norm"))
@pytest.mark.parametrize("shape", [(3, 5, 64), (7, 40)])
def test_rms_norm_is_qwen3_rmsnorm(dev, dt, impl, shape):
    n = shape[-1]
    ref, ours = _pair(mq.Qwen3RMSNorm(n, eps=1e-5), lnn.RMSNorm(n, eps=1e-5, impl=impl), dev, dt)
    x = torch.randn(shape, device=dev, dtype=dt) * 2
    dy = torch.randn_like(x)
    y_ref, dx_ref = _forward_backward(ref, x, dy)
    y, dx = _forward_backward(ours, x, dy)
    assert_close(y, y_ref, dt, "y")
    assert_close(dx, dx_ref, dt, "dx")
    assert_close(ours.weight.grad, ref.weight.grad, dt, "dweight")


@pytest.mark.parametrize("dev", DEVICES)
def test_rms_norm_offset_and_zero_init(dev):
    """Gemma's form: offset 1 over a zero-initialized weight, against float64."""
    m = lnn.RMSNorm(48, eps=1e-6, offset=1.0, init_fn="zeros").to(dev)
    assert float(m.weight.detach().abs().max()) == 0.0
    with torch.no_grad():
        m.weight.normal_(0.0, 0.2)
    x = torch.randn(5, 48, device=dev)
    x64, w64 = x.double(), m.weight.detach().double()
    want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w64)
    assert_close(m(x), want, torch.float32, "y")


@pytest.mark.parametrize("dev,dt,impl", cases("rms_norm"))
@pytest.mark.parametrize("shape", [(2, 9, 64), (5, 33)])
def test_fused_add_rms_norm_is_the_add_then_the_norm(dev, dt, impl, shape):
    n = shape[-1]
    ref, ours = _pair(mq.Qwen3RMSNorm(n, eps=1e-6), lnn.FusedAddRMSNorm(n, impl=impl), dev, dt)
    x, r = torch.randn(shape, device=dev, dtype=dt), torch.randn(shape, device=dev, dtype=dt) * 3
    dy, ds = torch.randn_like(x), torch.randn_like(x)
    xr, rr, xl, rl = leaf(x), leaf(r), leaf(x), leaf(r)
    s_ref = rr + xr
    y_ref = ref(s_ref)
    torch.autograd.backward((y_ref, s_ref), (dy, ds))
    y, s = ours(xl, rl)
    torch.autograd.backward((y, s), (dy, ds))
    assert torch.equal(s, (r + x)), "s: not the sum rounded once"
    assert_close(y, y_ref, dt, "y")
    assert_close(xl.grad, xr.grad, dt, "dx")
    assert_close(rl.grad, rr.grad, dt, "dresidual")
    assert_close(ours.weight.grad, ref.weight.grad, dt, "dweight")


@pytest.mark.parametrize("dev,dt,impl", cases("swiglu_mlp"))
@pytest.mark.parametrize("sizes", [(64, 96), (40, 72)])
def test_swiglu_mlp_is_qwen3_mlp(dev, dt, impl, sizes):
    cfg = config(hidden_size=sizes[0], intermediate_size=sizes[1])
    ref, ours = _pair(mq.Qwen3MLP(cfg), lnn.SwiGLUMLP(cfg, impl=impl), dev, dt)
    by_sizes = lnn.SwiGLUMLP(hidden_size=sizes[0], intermediate_size=sizes[1])
    assert by_sizes.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 7, sizes[0], device=dev, dtype=dt)
    dy = torch.randn_like(x)
    y_ref, dx_ref = _forward_backward(ref, x, dy)
    y, dx = _forward_backward(ours, x, dy)
    assert_close(y, y_ref, dt, "y")
    assert_close(dx, dx_ref, dt, "dx")
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert_close(getattr(ours, name).weight.grad, getattr(ref, name).weight.grad, dt, f"d{name}")


def _ce64(h, w, y, ignore, eps, s, cap, reduction):
    """The loss in float64, as cross_entropy.h states it."""
    z = h.double() @ w.double().T
    if cap:
        z = cap * torch.tanh(z / cap)
    lse = torch.logsumexp(z, -1)
    keep = y != ignore
    zy = z.gather(-1, y.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    per = (1 - eps) * (lse - zy) + eps * (lse - z.mean(-1)) + s * lse * lse
    per = torch.where(keep, per, torch.zeros_like(per))
    return per.sum() / keep.sum() if reduction == "mean" else per.sum()


@pytest.mark.parametrize("dev,dt", [(dev, dt) for dev in DEVICES for dt in DTYPES])
@pytest.mark.parametrize("opts", [dict(), dict(reduction="sum", ignore_index=7),
                                  dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=20.0)])
def test_fused_linear_cross_entropy_matches_float64(dev, dt, opts):
    T, H, V = 37, 48, 131
    ignore = opts.get("ignore_index", -100)
    h = torch.randn(T, H, device=dev, dtype=dt)
    w = (torch.randn(V, H, device=dev) * 0.2).to(dt)
    y = torch.randint(0, V, (T,), device=dev)
    y[::5] = ignore
    hl, wl = leaf(h), leaf(w)
    loss = lnn.FusedLinearCrossEntropyLoss(**opts)(wl, hl, y)
    loss.backward()
    h64, w64 = h.double().requires_grad_(True), w.double().requires_grad_(True)
    want = _ce64(h64, w64, y, ignore, opts.get("label_smoothing", 0.0), opts.get("lse_square_scale", 0.0),
                 opts.get("softcap"), opts.get("reduction", "mean"))
    want.backward()
    assert_close(loss.reshape(1), want.reshape(1), dt, "loss")
    assert_close(hl.grad, h64.grad, dt, "dhidden")
    assert_close(wl.grad, w64.grad, dt, "dweight")


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="init_fn"):
        lnn.RMSNorm(8, init_fn="normal")
    with pytest.raises(ValueError, match="hidden_act"):
        lnn.SwiGLUMLP(config(hidden_act="gelu"))
    with pytest.raises(TypeError, match="hidden_size"):
        lnn.SwiGLUMLP(hidden_size=8)
    with pytest.raises(ValueError, match="reduction"):
        lnn.FusedLinearCrossEntropyLoss(reduction="none")
    with pytest.raises(ValueError, match="softcap"):
        lnn.FusedLinearCrossEntropyLoss(softcap=-1.0)
    ce = lnn.FusedLinearCrossEntropyLoss()
    with pytest.raises(ValueError, match="bias"):
        ce(torch.randn(11, 8), torch.randn(3, 8), torch.zeros(3, dtype=torch.long), bias=torch.zeros(11))
    with pytest.raises(TypeError):
        lnn.FusedLinearCrossEntropyLoss(return_z_loss=True)   # no equal here: refused, not ignored
    with pytest.raises(LlmkernError, match="no_such_norm"):
        lnn.RMSNorm(8, impl="no_such_norm")(torch.randn(2, 8))
    with pytest.raises(ValueError, match="residual"):
        lnn.FusedAddRMSNorm(8)(torch.randn(2, 8), torch.randn(3, 8))


def test_package_exports_nn():
    assert llmkern.nn is lnn
    assert set(lnn.__all__) == {"RMSNorm", "FusedAddRMSNorm", "SwiGLUMLP", "FusedLinearCrossEntropyLoss"}
