"""attention.py — llmkern attention as a torch.autograd.Function: every backend the
build has (eager, sdpa, flash_attention_2, flex_attention on the CPU; flash_attention_2,
flash_attention_3, sdpa, cudnn on CUDA: `llmkern list`), GQA/MQA, causal, sliding
windows, softcap, attention sinks, packed documents (varlen) and BlockMasks.

    out = llmkern.attention.attention(q, k, v, impl="flash_attention_2", causal=True)

q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D] (Hkv divides Hq), out [B, Sq, Hq, D] — the
layouts of Hugging Face's attention functions. Varlen: cu_seqlens_q/_k (B = 1; any
integer tensor, brought to the host as i32: the facade reads them). A padding mask
[B, S] is turned into varlen (`attention_padded`) the way the library's
lk_attention_varlen_from_padding does: the kept rows packed, the result scattered back
with zeros at padding. flex_attention takes a BlockMask (`BlockMask.causal`, ...,
`BlockMask.from_dense`).
"""
import ctypes

import torch

from . import _lib as L
from ._torch import Call, impl as _impl, saved as _saved, view

_sz = ctypes.c_size_t


class BlockMask:
    """An llmkern BlockMask (block_mask.h), freed with the object. The builders are the
    library's; from_dense evaluates a predicate given as a dense [B, H, Q, KV] bool
    tensor (a torch BlockMask's mask_mod materialized, see transformers.py)."""

    def __init__(self):
        self.c = L.BlockMask()
        self._keep = []

    def __del__(self):
        if getattr(self, "c", None) is not None:
            L.lib.lk_block_mask_free(ctypes.byref(self.c))

    @classmethod
    def _build(cls, fn, *args):
        m = cls()
        L.check(fn(*args, ctypes.byref(m.c)), "block_mask")
        return m

    @classmethod
    def causal(cls, q_len, kv_len=None, B=1, H=1, block=128):
        return cls._build(L.lib.lk_block_mask_causal, B, H, q_len, kv_len or q_len, block, block)

    @classmethod
    def sliding_window(cls, window, q_len, kv_len=None, B=1, H=1, block=128):
        return cls._build(L.lib.lk_block_mask_sliding_window, window, B, H, q_len, kv_len or q_len, block, block)

    @classmethod
    def documents(cls, cu_seqlens, causal=True, H=1, block=128):
        cu = torch.as_tensor(cu_seqlens).to(torch.int32).cpu().contiguous()
        p = ctypes.cast(cu.data_ptr(), ctypes.POINTER(ctypes.c_int32))
        n = cu.numel() - 1
        return cls._build(L.lib.lk_block_mask_document_cu, p, n, int(causal), H, int(cu[-1]), block, block)

    @classmethod
    def from_dense(cls, mask, block=128):
        """mask [B, H, Q, KV] bool (B, H may be 1: broadcast); nonzero = visible."""
        if mask.dim() != 4:
            raise ValueError(f"llmkern BlockMask.from_dense: mask: expected [B, H, Q, KV], got {tuple(mask.shape)}")
        m = mask.to(torch.uint8).cpu().contiguous()
        B, H, Q, KV = m.shape
        dims = (ctypes.c_int64 * 4)(B, H, Q, KV)
        b = cls()
        L.check(L.lib.lk_block_mask_dense(ctypes.cast(m.data_ptr(), ctypes.c_void_p), dims, block, block,
                                          ctypes.byref(b.c)), "block_mask")
        b._keep.append(m)
        return b


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, s_aux, opts, impl):
        # transformers' q, k, v are transposed views of the projections' [B, S, H, D] rows: read in
        # place where the row takes views (flash_attention_3 on a Hopper), else made contiguous
        a = _args(q, k, v, s_aux, opts)
        if not all(t.is_contiguous() for t in (q, k, v)) and not L.lib.lk_attention_takes_views(impl, ctypes.byref(a)):
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            a = _args(q, k, v, s_aux, opts)
        B, Hq, Sq, D = q.shape
        out = q.new_empty(B, Sq, Hq, D)
        a.out = view(out)
        n = _sz()
        L.check(L.lib.lk_attention_saved_bytes(impl, ctypes.byref(a), ctypes.byref(n)), "attention")
        sv = torch.empty(int(n.value), dtype=torch.uint8, device=q.device)
        a.saved = _saved(sv)
        with Call(q) as c:
            st = L.lib.lk_attention_forward(impl, ctypes.byref(a), c)
        L.check(st, "attention forward")
        ctx.save_for_backward(q, k, v, s_aux, out, sv)
        ctx.opts, ctx.impl = opts, impl
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, s_aux, out, sv = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)   # q's layout: a view where q is
        ds = torch.zeros_like(s_aux) if s_aux is not None and ctx.needs_input_grad[3] else None
        a = _args(q, k, v, s_aux, ctx.opts)
        a.out, a.dout, a.dq, a.dk, a.dv, a.ds_aux, a.saved = view(out), view(dout), view(dq), view(dk), view(dv), \
            view(ds), _saved(sv)
        with Call(q) as c:
            st = L.lib.lk_attention_backward(ctx.impl, ctypes.byref(a), c)
        L.check(st, "attention backward")
        return dq, dk, dv, ds, None, None


class _Opts:
    """What a call takes besides its tensors; the host tensors stay alive with it."""

    def __init__(self, scale, causal, window, softcap, cu_q, cu_k, max_q, max_k, block_mask, deterministic):
        self.scale, self.causal, self.window, self.softcap = scale, causal, window, softcap
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.block_mask, self.deterministic = block_mask, deterministic


def _args(q, k, v, s_aux, o):
    a = L.AttentionArgs(q=view(q), k=view(k), v=view(v), s_aux=view(s_aux), cu_seqlens_q=view(o.cu_q),
                        cu_seqlens_k=view(o.cu_k), max_seqlen_q=o.max_q, max_seqlen_k=o.max_k, scale=o.scale,
                        causal=int(o.causal), window_left=o.window[0], window_right=o.window[1],
                        softcap=o.softcap, deterministic=int(o.deterministic))
    if o.block_mask is not None:
        a.block_mask = ctypes.pointer(o.block_mask.c)
    return a


def _host_i32(t):
    if t is None:
        return None
    return torch.as_tensor(t).to(device="cpu", dtype=torch.int32).contiguous()


def attention(q, k, v, impl="flash_attention_2", *, causal=True, scale=None, window=(0, 0), softcap=0.0,
              s_aux=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, block_mask=None,
              deterministic=False):
    """Attention through llmkern's facade; returns [B, Sq, Hq, D].
    window: (left, right), Hugging Face's convention, 0 = unbounded: key j is seen from
    query position p when p - j < left and j - p < right (sliding_window=W is (W, 0)
    under causal). s_aux: one sink logit per q head (gpt-oss). scale None: 1/sqrt(D)."""
    cu_q, cu_k = _host_i32(cu_seqlens_q), _host_i32(cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q)
    if cu_q is not None:
        if not max_seqlen_q and cu_q.numel() > 1:
            max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max())
        if not max_seqlen_k and cu_k.numel() > 1:
            max_seqlen_k = int((cu_k[1:] - cu_k[:-1]).max())
    if s_aux is not None:
        s_aux = s_aux.to(device=q.device, dtype=torch.float32).contiguous()
    opts = _Opts(0.0 if scale is None else float(scale), bool(causal), (int(window[0]), int(window[1])),
                 float(softcap or 0.0), cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), block_mask,
                 bool(deterministic))
    return AttentionFunction.apply(q, k, v, s_aux, opts, _impl("attention", impl, q))


def attention_padded(q, k, v, padding_mask, impl="flash_attention_2", **kw):
    """Attention over rows padded to one length: padding_mask [B, S] (nonzero = a token)
    for self-attention (Sq = Skv = S). The kept rows are packed as one varlen call (B = 1,
    a document per row) and the output scattered back, zeros at padding."""
    B, Hq, S, D = q.shape
    keep = padding_mask.reshape(B, S).to(device=q.device).bool()
    lens = keep.sum(1).to("cpu", torch.int32)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    idx = keep.reshape(-1).nonzero().squeeze(1)

    def pack(x):  # [B, H, S, D] -> [1, H, total, D]
        return x.transpose(1, 2).reshape(B * S, x.shape[1], D).index_select(0, idx).transpose(0, 1).unsqueeze(0)

    o = attention(pack(q), pack(k), pack(v), impl, cu_seqlens_q=cu, cu_seqlens_k=cu,
                  max_seqlen_q=int(lens.max()), max_seqlen_k=int(lens.max()), **kw)   # [1, total, Hq, D]
    full = o.new_zeros(B * S, Hq, D).index_copy(0, idx, o[0])
    return full.view(B, S, Hq, D)
