"""test_ops.py — each llmkern op against the transformers / torch module it replaces:
outputs and gradients (every input that has one), per implementation, on the CPU and
(where torch sees one) the GPU, f32 and bf16, tolerances per dtype (conftest.TOL). Also
what the bridge promises: errors raised with the library's text, workspace from
torch's allocator and given back, non-contiguous inputs."""
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, TOL, assert_close, takes

import llmkern
from llmkern import LlmkernError, _torch
from transformers import Qwen3Config, Qwen3MoeConfig
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.models.qwen3 import modeling_qwen3 as mq
from transformers.models.qwen3_moe import modeling_qwen3_moe as mqm

HF_ROPE = mq.apply_rotary_pos_emb      # before any test patches the module
DTYPES = [torch.float32, torch.bfloat16]
# the implementations each op has per device in this build (llmkern list)
IMPLS = {(op, dev): [n for o, n, d, ok, _ in llmkern.implementations() if o == op and d == dev and ok]
         for op in ("rms_norm", "rope", "swiglu_mlp", "cross_entropy", "moe_experts", "attention") for dev in
         ("cpu", "cuda")}


def cases(op, only=None):
    out = []
    for dev in DEVICES:
        for name in IMPLS[(op, dev)]:
            if only is None or name in only:
                out += [(dev, name, dt) for dt in takes(op, name, dev)]
    return out


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def config(**kw):
    base = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)
    base.update(kw)
    return Qwen3Config(**base)


# --- RMSNorm ------------------------------------------------------------------------

@pytest.mark.parametrize("dev,impl,dt", cases("rms_norm"))
def test_rms_norm_matches_qwen3_rmsnorm(dev, impl, dt):
    ref = mq.Qwen3RMSNorm(64, eps=1e-6).to(dev, dt)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
    x = torch.randn(3, 5, 64, device=dev, dtype=dt) * 2
    dy = torch.randn_like(x)
    xr, xl = leaf(x), leaf(x)
    wl = leaf(ref.weight)
    y_ref = ref(xr)
    y_ref.backward(dy)
    y = llmkern.rms_norm(xl, wl, 1e-6, impl=impl)
    y.backward(dy)
    tol = TOL[dt] * (2 if impl == "eager" and dt == torch.bfloat16 else 1)   # eager rounds each step to bf16
    assert_close(y, y_ref, dt, f"{impl} y", tol)
    assert_close(xl.grad, xr.grad, dt, f"{impl} dx", tol)
    assert_close(wl.grad, ref.weight.grad, dt, f"{impl} dw", tol)


@pytest.mark.parametrize("dev,impl,dt", [c for c in cases("rms_norm") if c[2] == torch.bfloat16])
def test_rms_norm_bf16_with_an_f32_weight(dev, impl, dt):
    """bf16 activations with the f32 weight autocast keeps: y = round(x̂ · w) against float64,
    dweight f32 (the weight's dtype) and as close as f32 math gives."""
    w64 = torch.rand(64, dtype=torch.float64, device=dev) + 0.5
    x = (torch.randn(7, 64, device=dev) * 2).to(dt)
    dy = torch.randn(7, 64, device=dev).to(dt)
    xl, wl = leaf(x), leaf(w64.float())
    y = llmkern.rms_norm(xl, wl, 1e-6, impl=impl)
    y.backward(dy)
    x64, dy64 = x.double().requires_grad_(True), dy.double()
    w64 = w64.float().double().requires_grad_(True)
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    y64.backward(dy64)
    assert y.dtype == dt and wl.grad.dtype == torch.float32
    tol = TOL[dt] * (2 if impl == "eager" else 1)   # eager keeps x̂ in bf16
    assert_close(y, y64, dt, f"{impl} y", tol)
    assert_close(xl.grad, x64.grad, dt, f"{impl} dx", tol)
    # dweight summed in f32 from the stored bf16 values: 1e-4; eager's x̂ is bf16
    assert_close(wl.grad, w64.grad, torch.float32, f"{impl} dw f32", tol if impl == "eager" else 1e-4)


def test_rms_norm_on_a_non_contiguous_view():
    x = torch.randn(4, 6, 32).transpose(0, 1)          # [6, 4, 32], not contiguous
    w = torch.rand(32) + 0.5
    ref = mq.Qwen3RMSNorm(32)
    ref.weight.data.copy_(w)
    assert_close(llmkern.rms_norm(x, w), ref(x), torch.float32, "y")


@pytest.mark.parametrize("dev,impl,dt", cases("rms_norm"))
def test_fused_add_rms_norm_matches_add_then_qwen3_rmsnorm(dev, impl, dt):
    """(y, s) against transformers' decoder: s = residual + x in x's dtype (the same bits), y =
    Qwen3RMSNorm(s); the gradients of x, residual and the weight through both outputs."""
    ref = mq.Qwen3RMSNorm(64, eps=1e-6).to(dev, dt)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
    x, r = torch.randn(3, 5, 64, device=dev, dtype=dt), torch.randn(3, 5, 64, device=dev, dtype=dt) * 2
    dy, ds = torch.randn_like(x), torch.randn_like(x)
    xr, rr, xl, rl, wl = leaf(x), leaf(r), leaf(x), leaf(r), leaf(ref.weight)
    s_ref = rr + xr
    y_ref = ref(s_ref)
    torch.autograd.backward([y_ref, s_ref], [dy, ds])
    y, s = llmkern.ops.fused_add_rms_norm(xl, rl, wl, 1e-6, impl=impl)
    torch.autograd.backward([y, s], [dy, ds])
    assert s.dtype == dt and torch.equal(s, r + x)          # one rounding of the f32 sum, as torch's add
    tol = TOL[dt] * (2 if impl == "eager" and dt == torch.bfloat16 else 1)   # eager rounds each step to bf16
    assert_close(y, y_ref, dt, f"{impl} y", tol)
    assert_close(xl.grad, xr.grad, dt, f"{impl} dx", tol)
    assert_close(rl.grad, rr.grad, dt, f"{impl} d(residual)", tol)
    assert_close(wl.grad, ref.weight.grad, dt, f"{impl} dw", tol)
    assert rl.grad.data_ptr() != xl.grad.data_ptr()


@pytest.mark.parametrize("dev,impl,dt", [c for c in cases("rms_norm") if c[2] == torch.bfloat16])
def test_fused_add_rms_norm_f32_stream(dev, impl, dt):
    """An f32 residual beside bf16 x (autocast's stream): s = residual + x in f32, y the norm of
    that f32 sum, d(residual) f32, dx its rounding; against float64. Only s used: y's gradient
    absent; a bf16 residual beside f32 x refused with the library's text."""
    x = (torch.randn(7, 64, device=dev) * 0.5).to(dt)
    r = torch.randn(7, 64, device=dev) * 2
    w = torch.rand(64, device=dev) + 0.5
    dy, ds = torch.randn(7, 64, device=dev).to(dt), torch.randn(7, 64, device=dev)
    xl, rl, wl = leaf(x), leaf(r), leaf(w)
    y, s = llmkern.ops.fused_add_rms_norm(xl, rl, wl, 1e-6, impl=impl)
    torch.autograd.backward([y, s], [dy, ds])
    assert s.dtype == torch.float32 and torch.equal(s, r + x.float()) and rl.grad.dtype == torch.float32
    x64, r64, w64 = x.double().requires_grad_(True), r.double().requires_grad_(True), w.double().requires_grad_(True)
    s64 = r64 + x64
    y64 = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    torch.autograd.backward([y64, s64], [dy.double(), ds.double()])
    tol = TOL[dt] * (4 if impl == "eager" else 1)   # eager normalizes x, the sum's bf16 rounding
    assert_close(y, y64, dt, f"{impl} y", tol)
    assert_close(rl.grad, r64.grad, dt, f"{impl} d(residual)", tol)
    assert_close(xl.grad, x64.grad, dt, f"{impl} dx", tol)
    assert_close(wl.grad, w64.grad, dt, f"{impl} dw", tol)
    xl2, rl2 = leaf(x), leaf(r)
    _, s2 = llmkern.ops.fused_add_rms_norm(xl2, rl2, wl.detach(), 1e-6, impl=impl)
    s2.sum().backward()                                     # y unused: d(residual) = ds alone
    assert torch.equal(rl2.grad, torch.ones_like(r)) and torch.equal(xl2.grad, torch.ones_like(x))
    with pytest.raises(LlmkernError, match="residual"):
        llmkern.ops.fused_add_rms_norm(r, x, wl.detach(), impl=impl)   # f32 x, bf16 residual


# --- RoPE ---------------------------------------------------------------------------

@pytest.mark.parametrize("dev,impl,dt", cases("rope"))
@pytest.mark.parametrize("batch_positions", [False, True])
def test_rope_matches_apply_rotary_pos_emb(dev, impl, dt, batch_positions):
    cfg = config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    rot = mq.Qwen3RotaryEmbedding(cfg).to(dev)
    B, S = 2, 7
    pos = torch.arange(S, device=dev).expand(B, S)
    if batch_positions:                                # a row of its own positions, as packed or shifted ones
        pos = torch.stack([torch.arange(S, device=dev) + 3, torch.arange(S, device=dev).flip(0)])
    x = torch.randn(B, S, 8, device=dev, dtype=dt)
    cos, sin = rot(x, pos)
    # q, k as the attention makes them: [B, S, H, D] transposed (not contiguous), GQA
    q = torch.randn(B, S, 4, 16, device=dev, dtype=dt).transpose(1, 2)
    k = torch.randn(B, S, 2, 16, device=dev, dtype=dt).transpose(1, 2)
    qr, kr, ql, kl = leaf(q), leaf(k), leaf(q), leaf(k)
    q_ref, k_ref = HF_ROPE(qr, kr, cos, sin)
    q_out, k_out = llmkern.apply_rotary_pos_emb(ql, kl, cos, sin, impl=impl)
    dq, dk = torch.randn_like(q_ref), torch.randn_like(k_ref)
    ((q_ref * dq).sum() + (k_ref * dk).sum()).backward()
    ((q_out * dq).sum() + (k_out * dk).sum()).backward()
    for got, want, what in ((q_out, q_ref, "q"), (k_out, k_ref, "k"), (ql.grad, qr.grad, "dq"),
                            (kl.grad, kr.grad, "dk")):
        assert_close(got, want, dt, f"{impl} {what}")


# --- SwiGLU MLP ---------------------------------------------------------------------

@pytest.mark.parametrize("dev,impl,dt", cases("swiglu_mlp"))
def test_swiglu_mlp_matches_qwen3_mlp(dev, impl, dt):
    ref = mq.Qwen3MLP(config()).to(dev, dt)
    x = torch.randn(2, 9, 64, device=dev, dtype=dt)
    xr, xl = leaf(x), leaf(x)
    g, u, d = leaf(ref.gate_proj.weight), leaf(ref.up_proj.weight), leaf(ref.down_proj.weight)
    y_ref = ref(xr)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y = llmkern.swiglu_mlp(xl, torch.cat((g, u)), d, impl=impl)
    y.backward(dy)
    assert_close(y, y_ref, dt, f"{impl} out")
    assert_close(xl.grad, xr.grad, dt, f"{impl} dx")
    assert_close(g.grad, ref.gate_proj.weight.grad, dt, f"{impl} d_gate")
    assert_close(u.grad, ref.up_proj.weight.grad, dt, f"{impl} d_up")
    assert_close(d.grad, ref.down_proj.weight.grad, dt, f"{impl} d_down")


# --- LM head + cross-entropy --------------------------------------------------------

@pytest.mark.parametrize("dev,impl,dt", cases("cross_entropy"))
@pytest.mark.parametrize("num_items", [None, 13])
def test_lm_head_cross_entropy_matches_for_causal_lm_loss(dev, impl, dt, num_items):
    B, S, H, V = 2, 11, 64, 96
    head = torch.nn.Linear(H, V, bias=False).to(dev, dt)
    h = torch.randn(B, S, H, device=dev, dtype=dt)
    labels = torch.randint(0, V, (B, S), device=dev)
    labels[0, :3] = -100                                 # ignored positions
    hr, hl, wl = leaf(h), leaf(h), leaf(head.weight)
    loss_ref = ForCausalLMLoss(head(hr), labels, V, num_items_in_batch=num_items)
    loss_ref.backward()
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    if num_items is None:
        loss = llmkern.lm_head_cross_entropy(hl.reshape(-1, H), wl, shifted, impl=impl)
    else:
        loss = llmkern.lm_head_cross_entropy(hl.reshape(-1, H), wl, shifted, impl=impl, reduction="sum") / num_items
    loss.backward()
    assert_close(loss, loss_ref, dt, f"{impl} loss", TOL[dt] / 3 if dt == torch.bfloat16 else None)
    assert_close(hl.grad, hr.grad, dt, f"{impl} d_hidden")
    assert_close(wl.grad, head.weight.grad, dt, f"{impl} d_weight")


# --- attention ----------------------------------------------------------------------

def reference_attention(q, k, v, causal=True, window=0, softcap=0.0, s_aux=None, cu=None, scale=None):
    """Attention in float64 the plain way: [B, H, S, D] in, [B, S, H, D] out."""
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Sq, D = q.shape
    Skv, g = k.shape[2], Hq // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * (scale or D ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq, device=q.device)[:, None] + (Skv - Sq)
    j = torch.arange(Skv, device=q.device)[None, :]
    seen = torch.ones(Sq, Skv, dtype=torch.bool, device=q.device)
    if causal:
        seen &= j <= i
    if window:
        seen &= (i - j < window) & (j - i < window)
    if cu is not None:
        doc = torch.zeros(Skv, dtype=torch.long, device=q.device)
        for b in cu[1:-1].tolist():
            doc[b:] += 1
        seen &= doc[:, None] == doc[None, :]
    s = s.masked_fill(~seen, float("-inf"))
    if s_aux is not None:
        sink = s_aux.double().view(1, Hq, 1, 1).expand(B, Hq, Sq, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return (p.nan_to_num(0.0) @ v).transpose(1, 2)


ATTN_CASES = [
    dict(),                                            # causal, GQA 4/2
    dict(causal=False),
    dict(window=5),
    dict(softcap=8.0),
    dict(sinks=True),
    dict(varlen=True),
]


def attn_cases():
    out = []
    for dev in DEVICES:
        for name in IMPLS[("attention", dev)]:
            if "_with_sp" in name or name == "flex_attention":
                continue                              # SP rows are these under a group of one; flex below
            for dt in DTYPES:
                if dev == "cuda" and name in ("flash_attention_3", "cudnn") and dt != torch.bfloat16:
                    continue                          # bf16-only rows (llmkern list)
                for c in ATTN_CASES:
                    out.append((dev, name, dt, c))
    return out


def _attn_id(c):
    return ",".join(k for k in c) or "causal"


@pytest.mark.parametrize("dev,impl,dt,case", attn_cases(),
                         ids=lambda v: _attn_id(v) if isinstance(v, dict) else str(v))
def test_attention_matches_plain_attention(dev, impl, dt, case):
    B, S, D = (1, 24, 16) if case.get("varlen") else (2, 20, 16)
    q = torch.randn(B, 4, S, D, device=dev, dtype=dt)
    k, v = torch.randn(B, 2, S, D, device=dev, dtype=dt), torch.randn(B, 2, S, D, device=dev, dtype=dt)
    sinks = torch.randn(4, device=dev) if case.get("sinks") else None
    cu = torch.tensor([0, 5, 13, 24], dtype=torch.int32) if case.get("varlen") else None
    w = case.get("window", 0)
    kw = dict(causal=case.get("causal", True), window=(w, w), softcap=case.get("softcap", 0.0))
    ql, kl, vl = leaf(q), leaf(k), leaf(v)
    sl = leaf(sinks) if sinks is not None else None
    try:
        out = llmkern.attention.attention(ql, kl, vl, impl, s_aux=sl, cu_seqlens_q=cu, **kw)
    except LlmkernError as e:                            # a backend that refuses the option says so
        assert e.status == "LK_EUNAVAILABLE", str(e)
        pytest.skip(f"{impl} refuses this case: {e}")
    q64, k64, v64 = leaf(q.double()), leaf(k.double()), leaf(v.double())
    s64 = leaf(sinks.double()) if sinks is not None else None
    ref = reference_attention(q64, k64, v64, kw["causal"], w, kw["softcap"], s64, cu)
    dout = torch.randn_like(ref)
    (ref * dout).sum().backward()
    (out * dout.to(dt)).sum().backward()
    assert_close(out, ref, dt, f"{impl} out")
    for got, want, what in ((ql.grad, q64.grad, "dq"), (kl.grad, k64.grad, "dk"), (vl.grad, v64.grad, "dv")):
        assert_close(got, want, dt, f"{impl} {what}")
    if sinks is not None:
        assert_close(sl.grad, s64.grad, dt, f"{impl} ds_aux")


@pytest.mark.parametrize("dev,impl,dt", sorted({(d, n, t) for d, n, t, _ in attn_cases()}, key=str))
def test_attention_takes_transposed_projection_views(dev, impl, dt):
    # q, k, v as transformers hands them over: [B, S, H, D] projection rows seen as [B, H, S, D]
    # (strided views; flash_attention_3 reads them in place, the other rows from copies)
    B, S, D = 2, 40, 16
    rows = [leaf(torch.randn(B, S, h, D, device=dev, dtype=dt)) for h in (4, 2, 2)]
    q, k, v = (r.transpose(1, 2) for r in rows)
    assert not q.is_contiguous()
    out = llmkern.attention.attention(q, k, v, impl, causal=True)
    r64 = [leaf(r.detach().double()) for r in rows]
    ref = reference_attention(*(r.transpose(1, 2) for r in r64), True)
    dout = torch.randn_like(ref)
    (ref * dout).sum().backward()
    (out * dout.to(dt)).sum().backward()
    assert_close(out, ref, dt, f"{impl} out")
    for got, want, what in zip((r.grad for r in rows), (r.grad for r in r64), ("dq", "dk", "dv")):
        assert_close(got, want, dt, f"{impl} {what} through the views")


def test_attention_padding_mask_matches_each_row_alone():
    q, k, v = torch.randn(3, 4, 10, 16), torch.randn(3, 2, 10, 16), torch.randn(3, 2, 10, 16)
    lens = [10, 6, 3]
    mask = torch.zeros(3, 10, dtype=torch.bool)
    for b, n in enumerate(lens):
        mask[b, :n] = True
    out = llmkern.attention.attention_padded(q, k, v, mask)
    for b, n in enumerate(lens):
        alone = reference_attention(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n])
        assert_close(out[b:b + 1, :n], alone, torch.float32, f"row {b}")
        assert out[b, n:].abs().max() == 0 if n < 10 else True


@pytest.mark.parametrize("dt", DTYPES)
def test_flex_attention_follows_its_block_mask(dt):
    S = 40
    q, k, v = (torch.randn(1, 4, S, 16, dtype=dt), torch.randn(1, 2, S, 16, dtype=dt),
               torch.randn(1, 2, S, 16, dtype=dt))
    cu = torch.tensor([0, 17, 40])
    for bm, ref_kw in ((llmkern.BlockMask.causal(S, block=16), {}),
                       (llmkern.BlockMask.sliding_window(6, S, block=16), dict(window=6)),
                       (llmkern.BlockMask.documents(cu, block=16), dict(cu=cu))):
        ql, kl, vl = leaf(q), leaf(k), leaf(v)
        out = llmkern.attention.attention(ql, kl, vl, "flex_attention", block_mask=bm)
        q64, k64, v64 = leaf(q.double()), leaf(k.double()), leaf(v.double())
        ref = reference_attention(q64, k64, v64, **ref_kw)
        dout = torch.randn_like(ref)
        (ref * dout).sum().backward()
        (out * dout.to(dt)).sum().backward()
        assert_close(out, ref, dt, "flex out")
        assert_close(ql.grad, q64.grad, dt, "flex dq")
        assert_close(kl.grad, k64.grad, dt, "flex dk")
    # a dense predicate (what a torch BlockMask's mask_mod evaluates to) gives the same
    dense = torch.ones(S, S, dtype=torch.bool).tril().view(1, 1, S, S)
    out = llmkern.attention.attention(q, k, v, "flex_attention", block_mask=llmkern.BlockMask.from_dense(dense))
    assert_close(out, reference_attention(q, k, v), dt, "flex dense out")
    with pytest.raises(LlmkernError, match="BlockMask|block_mask"):
        llmkern.attention.attention(q, k, v, "flex_attention")


# --- MoE experts --------------------------------------------------------------------

class _StackedExperts(torch.nn.Module):
    """transformers 5's Qwen3MoeExperts for a transformers 4 without it: the same loop
    over experts on the stacked weights."""

    def __init__(self, cfg):
        super().__init__()
        E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = torch.nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = torch.nn.Parameter(torch.empty(E, H, I))

    def forward(self, x, ids, w):
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            tok, pos = torch.where(ids == e)
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * w[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


@pytest.mark.parametrize("idle", [False, True])   # idle: expert 4 takes no token (its written gradients: zeros)
@pytest.mark.parametrize("dev,impl,dt", cases("moe_experts"))
def test_moe_experts_match_qwen3_moe_experts(dev, impl, dt, idle):
    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=5, num_experts_per_tok=2)
    ref = (mqm.Qwen3MoeExperts(cfg) if hasattr(mqm, "Qwen3MoeExperts") else _StackedExperts(cfg)).to(dev, dt)
    with torch.no_grad():
        ref.gate_up_proj.normal_(0, 0.2)
        ref.down_proj.normal_(0, 0.2)
    T = 13
    x = torch.randn(T, 32, device=dev, dtype=dt)
    ids = torch.stack([torch.randperm(4 if idle else 5, device=dev)[:2] for _ in range(T)])
    ids[:, 0] = torch.where(ids[:, 0] == 4, 0, ids[:, 0])  # expert 4 may get few tokens; 0 takes more
    w = torch.rand(T, 2, device=dev, dtype=dt)
    xr, xl, wr, wl = leaf(x), leaf(x), leaf(w), leaf(w)
    gu, dn = leaf(ref.gate_up_proj), leaf(ref.down_proj)
    y_ref = ref(xr, ids, wr)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y = llmkern.moe_experts(xl, ids, wl, gu, dn, impl=impl)
    y.backward(dy)
    assert_close(y, y_ref, dt, f"{impl} out")
    assert_close(xl.grad, xr.grad, dt, f"{impl} d_hidden")
    assert_close(wl.grad, wr.grad, dt, f"{impl} d_topk_weights")
    assert_close(gu.grad, ref.gate_up_proj.grad, dt, f"{impl} d_gate_up")
    assert_close(dn.grad, ref.down_proj.grad, dt, f"{impl} d_down")


# --- the bridge ---------------------------------------------------------------------

def test_errors_carry_the_library_text():
    x = torch.randn(4, 8)
    with pytest.raises(LlmkernError, match="weight") as e:
        llmkern.rms_norm(x, torch.ones(7))
    assert e.value.status == "LK_ESHAPE"
    with pytest.raises(LlmkernError, match="fussed|fused"):     # an unknown name: the registry's did-you-mean
        llmkern.rms_norm(x, torch.ones(8), impl="fussed")
    with pytest.raises(LlmkernError, match="flash_attention_3"):  # not on the CPU: why, and what can
        q = torch.randn(1, 2, 4, 8)
        llmkern.attention.attention(q, q, q, "flash_attention_3")
    with pytest.raises(LlmkernError, match="dtype|f16|f64"):
        llmkern.rms_norm(x.half(), torch.ones(8).half())


@pytest.mark.parametrize("dev", DEVICES)
def test_workspace_comes_from_torch_and_goes_back(dev):
    # cross-entropy keeps a chunk of [T, V] f32 logits in its workspace (eager on the CPU:
    # all of them; fused on CUDA: one chunk)
    impl = "eager" if dev == "cpu" else "fused"
    al = _torch._allocator(torch.device(dev, 0) if dev == "cuda" else torch.device(dev))
    calls = []
    orig = al._alloc

    def counting(user, n, dev):
        calls.append(n)
        return orig(user, n, dev)
    al.c.alloc = type(al.c.alloc)(counting)
    try:
        h, w = torch.randn(16, 32, device=dev), torch.randn(50, 32, device=dev)
        llmkern.lm_head_cross_entropy(h, w, torch.randint(0, 50, (16,), device=dev), impl=impl)
    finally:
        al.c.alloc = type(al.c.alloc)(orig)
    assert calls, "the workspace came from torch"
    if dev == "cpu":
        assert max(calls) >= 16 * 50 * 4, calls          # eager's [T, V] f32 logits
    assert al.live == {}, "every block went back to torch"


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU (torch.cuda.is_available())")
def test_cuda_calls_take_the_current_stream(monkeypatch):
    seen = []
    init = _torch.Call.__init__

    def spy(self, t):
        init(self, t)
        seen.append(self.ctx.stream)
    monkeypatch.setattr(_torch.Call, "__init__", spy)
    s = torch.cuda.Stream()
    x = torch.randn(64, 256, device="cuda")
    with torch.cuda.stream(s):
        y = llmkern.rms_norm(x, torch.ones(256, device="cuda"))
    s.synchronize()
    assert seen and all(p == s.cuda_stream for p in seen), (seen, s.cuda_stream)
    ref = mq.Qwen3RMSNorm(256).cuda()
    assert_close(y, ref(x), torch.float32, "y")
