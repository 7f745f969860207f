"""_torch.py — torch tensors as lk_tensor views, and the context of one call: the
tensor's device, torch's current CUDA stream, and a workspace arena whose block comes
from torch's allocator (lk_allocator, arena.h), so llmkern holds no memory of its own:
what a call needs is a torch tensor while the call runs, then goes back to torch's cache
(on CUDA stream-ordered: the caching allocator reuses it only after the queued kernels).

Also the implementation lookup every op takes (`impl`): a name through lk_select, as an
explicit request, so a name that cannot run here is an error saying why and what would.
"""
import ctypes

import torch

from . import _lib as L

_DTYPES = {torch.float32: L.LK_F32, torch.bfloat16: L.LK_BF16, torch.float16: L.LK_F16, torch.int32: L.LK_I32,
           torch.int64: L.LK_I64, torch.bool: L.LK_BOOL}


def view(t):
    """An lk_tensor over t's storage (t is kept alive by the caller); None = absent."""
    v = L.Tensor()
    if t is None:
        return v
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise TypeError(f"llmkern: dtype {t.dtype} is not one llmkern takes ({', '.join(map(str, _DTYPES))})")
    n = t.dim()
    if n > L.LK_MAX_DIMS:
        raise ValueError(f"llmkern: expected at most {L.LK_MAX_DIMS} dims, got {n} ({tuple(t.shape)})")
    # an empty tensor still needs a non-NULL pointer (NULL marks "absent")
    v.data = t.data_ptr() or _EMPTY_ADDR
    v.dtype = dt
    if t.is_cuda:
        v.device.type, v.device.index = L.LK_DEVICE_CUDA, t.device.index or 0
    v.ndim = n
    v.shape[:n] = t.shape
    v.stride[:n] = t.stride()
    return v


_EMPTY = ctypes.create_string_buffer(64)
_EMPTY_ADDR = ctypes.addressof(_EMPTY)


def shape_only(t):
    """A view with t's shape and dtype but no data (the backward's q, k of RoPE)."""
    v = view(t)
    v.data = None
    return v


def saved(t):
    return L.Saved(t.data_ptr() if t is not None and t.numel() else None, t.numel() if t is not None else 0)


def device_type(t):
    return L.LK_DEVICE_CUDA if t.is_cuda else L.LK_DEVICE_CPU


# --- workspace through torch's allocator ---------------------------------------------

class _TorchAllocator:
    """lk_allocator over torch.empty: blocks are uint8 tensors kept by address until
    the library frees them."""

    def __init__(self, device):
        self.device = device
        self.live = {}
        self.c = L.Allocator(L.ALLOC_FN(self._alloc), L.FREE_FN(self._free), None)
        self.ptr = ctypes.pointer(self.c)

    def _alloc(self, user, nbytes, dev):
        try:
            t = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
            p = t.data_ptr()
            self.live[p] = t
            return p
        except BaseException as e:  # noqa: BLE001 - a callback must not unwind through C
            L.keep_exception(e)
            return None

    def _free(self, user, p, dev):
        self.live.pop(p, None)


_allocators = {}


def _allocator(device):
    key = (device.type, (device.index or 0) if device.type == "cuda" else 0)
    a = _allocators.get(key)
    if a is None:
        a = _allocators[key] = _TorchAllocator(torch.device(device.type, key[1]))
    return a


class Call:
    """The lk_ctx of one call on tensor t's device: `with Call(t) as ctx: check(f(..., ctx))`.
    The arena's block (if the op asked for one) goes back to torch when the call ends."""

    def __init__(self, t):
        al = _allocator(t.device)
        self.arena = L.Arena(device=device_type(t), allocator=al.ptr)
        self.ctx = L.Ctx(arena=ctypes.pointer(self.arena))
        if t.is_cuda:
            self.ctx.device.type, self.ctx.device.index = L.LK_DEVICE_CUDA, t.device.index or 0
            self.ctx.stream = torch.cuda.current_stream(t.device).cuda_stream

    def __enter__(self):
        return ctypes.byref(self.ctx)

    def __exit__(self, *exc):
        L.lib.lk_arena_free(ctypes.byref(self.arena))
        return False


def run(fn, t, args, what):
    """fn(impl, &args, &ctx) on t's device; raises LlmkernError on failure."""
    with Call(t) as ctx:
        status = fn(args, ctx)
    L.check(status, what)


# --- implementations -----------------------------------------------------------------

_impl_cache = {}


def impl(op, name, t):
    """The lk_impl of op `name` for t's device, by lk_select (an explicit request: an
    error naming why it cannot run here and what can). Cached per (op, name, device).
    `name` may also be a registry.Binding (a module's), whose implementation must be of
    t's device."""
    dev = device_type(t)
    if hasattr(name, "impl"):
        if name.impl is None or name.impl.contents.device != dev:
            raise L.LlmkernError(7, f"{op}: {name.module or op}: bound to '{name.impl_name or '-'}' on "
                                    f"{name.device or 'no device'}, called with a tensor on {t.device}")
        return name.impl
    key = (op, name, dev)
    p = _impl_cache.get(key)
    if p is None:
        b = select(op, name, dev)
        p = _impl_cache[key] = b.impl
    return p


def select(op, name, dev, module=None, source=L.LK_SOURCE_CONFIG, detail="python"):
    req = L.Request(op=L.OP[op], module=module.encode() if module else None,
                    name=name.encode() if name else None, source=source, source_detail=detail.encode(),
                    device=dev)
    b = L.Binding()
    L.check(L.lib.lk_select(ctypes.byref(req), L.LK_STAGE_RUNTIME, ctypes.byref(b)), "select")
    if not b.impl:
        raise L.LlmkernError(4, f"{op}: no implementation of '{L.s(b.requested)}' on "
                                f"{'cuda' if dev else 'cpu'} in this build ({L.s(b.fallback)})")
    return b
