"""test_nn.py — llmkern.nn's modules against the modules they stand in for (transformers'
Qwen3RMSNorm and Qwen3MLP; the add + norm; the LM head's cross-entropy in float64): the
same state-dict keys, outputs and every gradient, on the CPU and (where torch sees one) the
GPU, f32 and bf16 (conftest.TOL), the registry's default and a named implementation; and
the options they refuse, each named in the error."""
import pytest
import torch
from conftest import DEVICES, assert_close, takes

import llmkern
import llmkern.nn as lnn
from llmkern import LlmkernError
from transformers import Qwen3Config, Qwen3MoeConfig
from transformers.models.qwen3 import modeling_qwen3 as mq
from transformers.models.qwen3_moe import modeling_qwen3_moe as mqm

DTYPES = [torch.float32, torch.bfloat16]
AVAILABLE = {(op, dev): [n for o, n, d, ok, _ in llmkern.implementations() if o == op and d == dev and ok]
             for op in ("rms_norm", "swiglu_mlp", "moe_experts") for dev in ("cpu", "cuda")}


def cases(op):
    """Every device and dtype with the registry's default (None), and each name the op has there in the
    dtypes its row takes."""
    return [(dev, dt, impl) for dev in DEVICES for dt in DTYPES for impl in [None] + AVAILABLE[(op, dev)]
            if impl is None or dt in takes(op, impl, dev)]


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


def _experts64(x, ids, w, gate_up, down):
    """The experts in float64: each token's k experts, silu(gate) · up, down, weighted."""
    x, w, gate_up, down = x.double(), w.double(), gate_up.double(), down.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += w[t, j] * (down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("dev,dt,impl", cases("moe_experts"))
def test_experts_match_float64(dev, dt, impl):
    """[B, S, H] tokens, top-2 of 5 experts (one expert idle), every gradient against float64 autograd;
    the state dict is transformers 5's Qwen3MoeExperts' where it has one."""
    cfg = Qwen3MoeConfig(hidden_size=24, moe_intermediate_size=40, num_experts=5, num_experts_per_tok=2)
    m = lnn.Experts(cfg, impl=impl)
    src = mqm.Qwen3MoeExperts(cfg) if hasattr(mqm, "Qwen3MoeExperts") else m
    with torch.no_grad():
        src.gate_up_proj.normal_(0, 0.2)
        src.down_proj.normal_(0, 0.2)
    m.load_state_dict(src.state_dict())      # strict: transformers' keys and shapes
    m = m.to(dev, dt)
    x = torch.randn(2, 7, 24, device=dev, dtype=dt)
    ids = torch.stack([torch.randperm(4, device=dev)[:2] for _ in range(14)]).view(2, 7, 2)
    w = torch.rand(2, 7, 2, device=dev, dtype=dt)
    dy = torch.randn_like(x)
    xl, wl = leaf(x), leaf(w)
    y = m(xl, ids, wl)
    y.backward(dy)
    p64 = [t.detach().double().requires_grad_(True) for t in (x.view(14, 24), w.view(14, 2), m.gate_up_proj,
                                                               m.down_proj)]
    want = _experts64(p64[0], ids.view(14, 2), p64[1], p64[2], p64[3])
    want.backward(dy.view(14, 24).double())
    assert y.shape == x.shape
    assert_close(y.view(14, 24), want, dt, "out")
    grads = ((xl.grad.view(14, 24), "d_hidden"), (wl.grad.view(14, 2), "d_topk_weights"),
             (m.gate_up_proj.grad, "d_gate_up"), (m.down_proj.grad, "d_down"))
    for (got, what), ref in zip(grads, p64):
        assert_close(got, ref.grad, dt, what)
    assert float(m.gate_up_proj.grad[4].abs().max()) == 0.0   # the idle expert's gradients: zeros


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
    with pytest.raises(ValueError, match="hidden_act"):
        lnn.Experts(Qwen3MoeConfig(hidden_act="gelu"))
    with pytest.raises(TypeError, match="num_experts"):
        lnn.Experts(hidden_size=8, intermediate_size=4)
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
    assert set(lnn.__all__) == {"RMSNorm", "FusedAddRMSNorm", "SwiGLUMLP", "Experts", "FusedLinearCrossEntropyLoss"}
