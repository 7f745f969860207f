"""ops.py — llmkern's training ops as torch.autograd.Functions, on CPU and CUDA tensors
(f32 and bf16; the library refuses other dtypes with an LlmkernError naming them).

Each function takes `impl`, an implementation name of the op ("fused", "eager", ...;
`llmkern list` shows them), resolved by llmkern's registry for the tensors' device: a
name that cannot run there raises LlmkernError saying why and what can. Every call goes
through the op's facade (all checks included), on torch's current CUDA stream, with its
workspace from torch's allocator; what the forward keeps for the backward (the op's
`saved` block) is a uint8 tensor saved on the autograd context.

    y = llmkern.ops.rms_norm(x, weight, eps=1e-6)
    y, s = llmkern.ops.fused_add_rms_norm(x, residual, weight)        # s = x + residual; y = rms_norm(s)
    q, k = llmkern.ops.apply_rotary_pos_emb(q, k, cos, sin)          # Hugging Face's signature
    out = llmkern.ops.swiglu_mlp(x, gate_up_weight, down_weight)
    loss = llmkern.ops.lm_head_cross_entropy(hidden, lm_head_weight, shifted_labels)
    out = llmkern.ops.moe_experts(hidden, topk_ids, topk_weights, gate_up, down)
Attention is in attention.py.

Weight gradients the C API accumulates (+=) are accumulated into zeros here, so each
backward returns this call's gradient, as autograd expects.
"""
import ctypes

import torch

from . import _lib as L
from ._torch import Call, impl as _impl, saved as _saved, shape_only, view

_sz = ctypes.c_size_t


def _bytes(t, n):
    return torch.empty(int(n), dtype=torch.uint8, device=t.device)


def _call(fn, t, args, what):
    with Call(t) as ctx:
        status = fn(args, ctx)
    L.check(status, what)


def _zeros_if(needed, like):
    return torch.zeros_like(like) if needed else None


# --- RMSNorm -------------------------------------------------------------------------

class RMSNormFunction(torch.autograd.Function):
    """y = x · rstd · (offset + w) over the last dim (rms_norm.h)."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, impl):
        x = x.contiguous()
        w = weight.contiguous() if weight is not None else None
        y = torch.empty_like(x)
        n = _sz()
        xv = view(x)
        L.check(L.lib.lk_rms_norm_saved_bytes(impl, ctypes.byref(xv), ctypes.byref(n)), "rms_norm")
        sv = _bytes(x, n.value)
        a = L.RmsNormArgs(x=xv, weight=view(w), y=view(y), saved=_saved(sv), eps=eps, weight_offset=offset)
        _call(lambda p, c: L.lib.lk_rms_norm_forward(impl, p, c), x, ctypes.byref(a), "rms_norm forward")
        ctx.save_for_backward(x, w, sv)
        ctx.eps, ctx.offset, ctx.impl = eps, offset, impl
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, sv = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dw = torch.empty_like(w) if w is not None and ctx.needs_input_grad[1] else None
        a = L.RmsNormArgs(x=view(x), weight=view(w), dy=view(dy), dx=view(dx), dweight=view(dw), saved=_saved(sv),
                          eps=ctx.eps, weight_offset=ctx.offset)
        _call(lambda p, c: L.lib.lk_rms_norm_backward(ctx.impl, p, c), x, ctypes.byref(a), "rms_norm backward")
        return dx, dw, None, None, None


def rms_norm(x, weight, eps=1e-6, impl="fused", offset=0.0):
    """RMSNorm of x over its last dim; weight [n] (None: no weight) in x's dtype, or f32 beside
    a bf16 x (autocast's f32 master weight: multiplied in f32, y rounded once; its gradient
    f32); any other weight dtype is converted to x's."""
    if weight is not None and weight.dtype != x.dtype and weight.dtype != torch.float32:
        weight = weight.to(x.dtype)
    return RMSNormFunction.apply(x, weight, float(eps), float(offset), _impl("rms_norm", impl, x))


class FusedAddRMSNormFunction(torch.autograd.Function):
    """s = residual + x, y = rms_norm(s), one pass each way (rms_norm.h's residual mode). A
    residual of x's dtype is the stream in x's dtype: s rounded once to it; an f32 residual beside
    bf16 x is autocast's f32 stream: s f32, and the norm reads it (x's rounding kept for the
    backward). Backward: d(residual) = dS + the norm's dx, in the residual's dtype; dx its rounding."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, impl):
        x = x.contiguous()
        w = weight.contiguous() if weight is not None else None
        f32 = residual.dtype == torch.float32
        s = residual.contiguous().clone() if f32 else residual.contiguous()   # an f32 stream is written
        xs = torch.empty_like(x)                  # the stream's rounding to x's dtype: the norm's x
        y = torch.empty_like(x)
        n = _sz()
        xv = view(xs)
        L.check(L.lib.lk_rms_norm_saved_bytes(impl, ctypes.byref(xv), ctypes.byref(n)), "rms_norm")
        sv = _bytes(x, n.value)
        a = L.RmsNormArgs(x=xv, weight=view(w), y=view(y), saved=_saved(sv), eps=eps, weight_offset=offset,
                          residual=view(s), delta=view(x))
        _call(lambda p, c: L.lib.lk_rms_norm_forward(impl, p, c), x, ctypes.byref(a), "fused_add_rms_norm forward")
        ctx.save_for_backward(xs, w, sv)
        ctx.eps, ctx.offset, ctx.impl, ctx.f32 = eps, offset, impl, f32
        return y, (s if f32 else xs)

    @staticmethod
    def backward(ctx, dy, ds):
        xs, w, sv = ctx.saved_tensors   # dy, ds: zeros for an unused output (autograd materializes them)
        dy = dy.contiguous()
        g = ds.contiguous().clone() if ctx.f32 else ds.contiguous()   # the f32 gradient's stream is written
        dx = torch.empty_like(xs)
        dw = torch.empty_like(w) if w is not None and ctx.needs_input_grad[2] else None
        a = L.RmsNormArgs(x=view(xs), weight=view(w), dy=view(dy), dx=view(dx), dweight=view(dw), saved=_saved(sv),
                          eps=ctx.eps, weight_offset=ctx.offset, residual=view(g))
        _call(lambda p, c: L.lib.lk_rms_norm_backward(ctx.impl, p, c), xs, ctypes.byref(a),
              "fused_add_rms_norm backward")
        return dx, (g if ctx.f32 else dx.clone()), dw, None, None, None   # two leaves' .grad never share storage


def fused_add_rms_norm(x, residual, weight, eps=1e-6, impl="fused", offset=0.0):
    """(y, s): s = residual + x (Liger's LigerFusedAddRMSNorm, vLLM's fused_add_rms_norm, out of
    place), y = rms_norm(s, weight). residual of x's dtype (the stream as a bf16 model carries it:
    s rounded once), or f32 beside bf16 x (autocast's f32 stream: s f32, y the norm of the f32
    sum). weight as rms_norm takes it."""
    if residual.shape != x.shape:
        raise ValueError(f"llmkern: fused_add_rms_norm: residual: expected x's shape {tuple(x.shape)}, "
                         f"got {tuple(residual.shape)}")
    if weight is not None and weight.dtype != x.dtype and weight.dtype != torch.float32:
        weight = weight.to(x.dtype)
    return FusedAddRMSNormFunction.apply(x, residual, weight, float(eps), float(offset),
                                         _impl("rms_norm", impl, x))


# --- RoPE ----------------------------------------------------------------------------

class RopeFunction(torch.autograd.Function):
    """q, k [B, H, S, D] rotated by tables cos, sin f32 [P, R/2] at position_ids [B, S] (rope.h)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids, rotary_dim, impl):
        q, k = q.contiguous(), k.contiguous()
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        a = L.RopeArgs(q=view(q), k=view(k), q_out=view(qo), k_out=view(ko), cos=view(cos), sin=view(sin),
                       position_ids=view(position_ids), rotary_dim=rotary_dim)
        n = _sz()
        L.check(L.lib.lk_rope_saved_bytes(impl, ctypes.byref(a), ctypes.byref(n)), "rope")
        sv = _bytes(q, n.value)
        a.saved = _saved(sv)
        _call(lambda p, c: L.lib.lk_rope_forward(impl, p, c), q, ctypes.byref(a), "rope forward")
        ctx.save_for_backward(cos, sin, position_ids, sv)
        ctx.rotary_dim, ctx.impl = rotary_dim, impl
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        cos, sin, pos, sv = ctx.saved_tensors
        dqo, dko = dqo.contiguous(), dko.contiguous()
        dq, dk = torch.empty_like(dqo), torch.empty_like(dko)
        a = L.RopeArgs(q=shape_only(dqo), k=shape_only(dko), dq_out=view(dqo), dk_out=view(dko), dq=view(dq),
                       dk=view(dk), cos=view(cos), sin=view(sin), position_ids=view(pos), saved=_saved(sv),
                       rotary_dim=ctx.rotary_dim)
        _call(lambda p, c: L.lib.lk_rope_backward(ctx.impl, p, c), dqo, ctypes.byref(a), "rope backward")
        return dq, dk, None, None, None, None, None


def rope(q, k, cos_table, sin_table, position_ids=None, rotary_dim=0, impl="fused"):
    """RoPE from tables (lk_rope_tables' layout: f32 [max_pos, R/2] on q's device) at
    position_ids ([B, S] i64; None: 0..S-1 in every row)."""
    if position_ids is not None:
        position_ids = position_ids.to(device=q.device, dtype=torch.int64).contiguous()
    cos_table = cos_table.to(device=q.device, dtype=torch.float32).contiguous()
    sin_table = sin_table.to(device=q.device, dtype=torch.float32).contiguous()
    return RopeFunction.apply(q, k, cos_table, sin_table, position_ids, int(rotary_dim), _impl("rope", impl, q))


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, impl="fused"):
    """Hugging Face's apply_rotary_pos_emb(q, k, cos, sin) on llmkern: q, k [B, H, S, D],
    cos, sin [B or 1, S, R] as the model's rotary embedding gives them (rotate-half
    halves repeated). The first halves become the call's tables, one row per (b, s),
    so the angles are the model's own; R < D rotates the first R dims only."""
    if unsqueeze_dim != 1:
        raise ValueError(f"llmkern apply_rotary_pos_emb: unsqueeze_dim: expected 1 (q, k as [B, H, S, D]), "
                         f"got {unsqueeze_dim}")
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    B, S, R = q.shape[0], q.shape[2], cos.shape[-1]
    if cos.shape[-2] != S or cos.shape[0] not in (1, B):
        raise ValueError(f"llmkern apply_rotary_pos_emb: cos: expected [{B} or 1, {S}, R], got {tuple(cos.shape)}")
    half = R // 2
    ct = cos[..., :half].reshape(-1, half)
    st = sin[..., :half].reshape(-1, half)
    pos = None
    if cos.shape[0] == B and B > 1:
        pos = torch.arange(B * S, device=q.device, dtype=torch.int64).view(B, S)
    return rope(q, k, ct, st, pos, rotary_dim=0 if R == q.shape[-1] else R, impl=impl)


# --- SwiGLU MLP ----------------------------------------------------------------------

class SwigluMlpFunction(torch.autograd.Function):
    """(silu(x W_gateᵀ) · x W_upᵀ) W_downᵀ, gate_up_weight = cat(W_gate, W_up) (swiglu_mlp.h)."""

    @staticmethod
    def forward(ctx, x, gate_up, down, limit, impl):
        x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
        out = torch.empty_like(x)
        xv, gv, n = view(x), view(gate_up), _sz()
        L.check(L.lib.lk_swiglu_mlp_saved_bytes(impl, ctypes.byref(xv), ctypes.byref(gv), ctypes.byref(n)), "swiglu_mlp")
        sv = _bytes(x, n.value)
        a = L.SwigluMlpArgs(x=xv, gate_up_weight=gv, down_weight=view(down), out=view(out), saved=_saved(sv),
                            swiglu_limit=limit)
        _call(lambda p, c: L.lib.lk_swiglu_mlp_forward(impl, p, c), x, ctypes.byref(a), "swiglu_mlp forward")
        ctx.save_for_backward(x, gate_up, down, sv)
        ctx.limit, ctx.impl = limit, impl
        return out

    @staticmethod
    def backward(ctx, dout):
        x, gate_up, down, sv = ctx.saved_tensors
        dout = dout.contiguous()
        dx = torch.empty_like(x)
        dgu, dd = _zeros_if(ctx.needs_input_grad[1], gate_up), _zeros_if(ctx.needs_input_grad[2], down)
        a = L.SwigluMlpArgs(x=view(x), gate_up_weight=view(gate_up), down_weight=view(down), dout=view(dout),
                            dx=view(dx), d_gate_up_weight=view(dgu), d_down_weight=view(dd), saved=_saved(sv),
                            swiglu_limit=ctx.limit)
        _call(lambda p, c: L.lib.lk_swiglu_mlp_backward(ctx.impl, p, c), x, ctypes.byref(a), "swiglu_mlp backward")
        return dx, dgu, dd, None, None


def swiglu_mlp(x, gate_up_weight, down_weight, impl="fused", swiglu_limit=0.0):
    """The SwiGLU MLP; gate_up_weight [2I, H] (gate rows first), down_weight [H, I]. A model
    with separate gate_proj / up_proj passes torch.cat((gate, up)): autograd splits the
    gradient back."""
    return SwigluMlpFunction.apply(x, gate_up_weight, down_weight, float(swiglu_limit),
                                   _impl("swiglu_mlp", impl, x))


# --- LM head + cross-entropy ---------------------------------------------------------

_REDUCTIONS = {"mean": L.LK_CE_MEAN, "sum": L.LK_CE_SUM}


class LmHeadCrossEntropyFunction(torch.autograd.Function):
    """loss of (hidden Wᵀ, labels) without the [T, V] logits whole (cross_entropy.h)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, opts, impl):
        hidden, weight, labels = hidden.contiguous(), weight.contiguous(), labels.contiguous()
        loss = torch.empty(1, dtype=torch.float32, device=hidden.device)
        a = _ce_args(hidden, weight, labels, opts)
        a.loss = view(loss)
        n = _sz()
        L.check(L.lib.lk_cross_entropy_saved_bytes(impl, ctypes.byref(a), ctypes.byref(n)), "cross_entropy")
        sv = _bytes(hidden, n.value)
        a.saved = _saved(sv)
        _call(lambda p, c: L.lib.lk_cross_entropy_forward(impl, p, c), hidden, ctypes.byref(a),
              "cross_entropy forward")
        ctx.save_for_backward(hidden, weight, labels, sv)
        ctx.opts, ctx.impl = opts, impl
        return loss[0]

    @staticmethod
    def backward(ctx, dloss):
        hidden, weight, labels, sv = ctx.saved_tensors
        dl = dloss.reshape(1).to(torch.float32).contiguous()
        dh = torch.empty_like(hidden)
        dw = _zeros_if(ctx.needs_input_grad[1], weight)
        a = _ce_args(hidden, weight, labels, ctx.opts)
        a.d_loss, a.d_hidden, a.d_weight, a.saved = view(dl), view(dh), view(dw), _saved(sv)
        _call(lambda p, c: L.lib.lk_cross_entropy_backward(ctx.impl, p, c), hidden, ctypes.byref(a),
              "cross_entropy backward")
        return dh, dw, None, None, None


def _ce_args(hidden, weight, labels, opts):
    a = L.lib.lk_cross_entropy_args_init()
    a.hidden, a.weight, a.labels = view(hidden), view(weight), view(labels)
    a.reduction, a.ignore_index, a.label_smoothing, a.z_loss_scale, a.softcap, a.fp32_lm_head = opts
    return a


def lm_head_cross_entropy(hidden, weight, labels, impl="fused", reduction="mean", ignore_index=-100,
                          label_smoothing=0.0, z_loss_scale=0.0, softcap=0.0, fp32_lm_head=False):
    """Cross-entropy of the LM head's logits, fused (`fused`: chunk by chunk, logits never
    whole). hidden [T, H] or [B, S, H]; weight [V, H]; labels already shifted, i64 or i32,
    ignore_index where not scored. reduction "mean" (over the scored tokens) or "sum". The
    bf16 logits are rounded to bf16 as the unfused model's are, unless fp32_lm_head."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"llmkern lm_head_cross_entropy: reduction: expected mean or sum, got {reduction!r}")
    opts = (_REDUCTIONS[reduction], int(ignore_index), float(label_smoothing), float(z_loss_scale), float(softcap),
            int(bool(fp32_lm_head)))
    if weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    return LmHeadCrossEntropyFunction.apply(hidden, weight, labels, opts, _impl("cross_entropy", impl, hidden))


# --- MoE experts ---------------------------------------------------------------------

class MoeExpertsFunction(torch.autograd.Function):
    """out[t] = Σ_j w[t, j] · SwiGLU_{ids[t, j]}(hidden[t]) (moe.h)."""

    @staticmethod
    def forward(ctx, hidden, ids, weights, gate_up, down, impl):
        hidden, gate_up, down = hidden.contiguous(), gate_up.contiguous(), down.contiguous()
        ids = ids.to(torch.int32).contiguous()
        weights = weights.to(torch.float32).contiguous()
        T, H = hidden.shape
        E, I2, _ = gate_up.shape
        n = _sz()
        L.check(L.lib.lk_moe_experts_saved_bytes(impl, T, ids.shape[1], E, H, I2 // 2, view(hidden).dtype,
                                                 ctypes.byref(n)), "moe_experts")
        sv = _bytes(hidden, n.value)
        out = torch.empty_like(hidden)
        a = L.MoeExpertsArgs(hidden=view(hidden), topk_ids=view(ids), topk_weights=view(weights),
                             gate_up_weight=view(gate_up), down_weight=view(down), out=view(out), saved=_saved(sv))
        _call(lambda p, c: L.lib.lk_moe_experts_forward(impl, p, c), hidden, ctypes.byref(a), "moe_experts forward")
        ctx.save_for_backward(hidden, ids, weights, gate_up, down, sv)
        ctx.impl = impl
        return out

    @staticmethod
    def backward(ctx, dout):
        hidden, ids, weights, gate_up, down, sv = ctx.saved_tensors
        dout = dout.contiguous()
        dh = torch.empty_like(hidden)
        dw = torch.empty_like(weights) if ctx.needs_input_grad[2] else None
        # written by the op (write_weight_grads), not added onto zeros made here first
        dgu = torch.empty_like(gate_up) if ctx.needs_input_grad[3] else None
        dd = torch.empty_like(down) if ctx.needs_input_grad[4] else None
        a = L.MoeExpertsArgs(hidden=view(hidden), topk_ids=view(ids), topk_weights=view(weights),
                             gate_up_weight=view(gate_up), down_weight=view(down), dout=view(dout), d_hidden=view(dh),
                             d_topk_weights=view(dw), d_gate_up_weight=view(dgu), d_down_weight=view(dd),
                             saved=_saved(sv), write_weight_grads=1)
        _call(lambda p, c: L.lib.lk_moe_experts_backward(ctx.impl, p, c), hidden, ctypes.byref(a),
              "moe_experts backward")
        return dh, None, dw, dgu, dd, None


def moe_experts(hidden, topk_ids, topk_weights, gate_up_weight, down_weight, impl="fused"):
    """The routed experts: hidden [T, H], topk_ids [T, k] (ints in [0, E)), topk_weights
    [T, k] (f32; the gradient comes back in the weights' dtype), gate_up_weight [E, 2I, H]
    (gate rows first), down_weight [E, H, I], all but ids and weights in hidden's dtype."""
    wdt = topk_weights.dtype
    out = MoeExpertsFunction.apply(hidden, topk_ids, topk_weights.float() if wdt != torch.float32 else topk_weights,
                                   gate_up_weight, down_weight, _impl("moe_experts", impl, hidden))
    return out
