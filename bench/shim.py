"""shim.py — bench/peers_shim.c's library from a build folder, bound to that folder's libllmkern.so.

The shim links libllmkern.so by name, so the dynamic linker takes the first one on LD_LIBRARY_PATH
(in an A/B, the other build's: the thirtieth session's A rows of .carry's flex script ran B's
library). Opened first, by path, the build's own copy is the one the shim's dependency finds (a
loaded library answers to its soname). RTLD_LOCAL, as the shim itself: llmkern's CUDA runtime
pieces loaded globally met torch's copies and the process aborted in free() (peers_cuda.py).

    import shim; LIB = shim.load(build)   # every shim function typed (SIGNATURES)
"""
import ctypes
import os

_vp, _i64, _int, _sz, _str, _dbl = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t,
                                    ctypes.c_char_p, ctypes.c_double)
_pdbl = ctypes.POINTER(_dbl)

# bench/peers_shim.c's functions: name -> (result, arguments), as its prototypes say. An lkp_call *
# is a prepared call for lkp_run; dt is an lk_dtype (0 f32, 1 bf16).
SIGNATURES = {
    "lkp_init": (_int, []),
    "lkp_last_error": (_str, []),
    "lkp_gpu_name": (_str, []),
    "lkp_run": (_int, [_vp]),
    "lkp_rms_norm": (_vp, [_int, _str, _int] + [_vp] * 7 + [_i64, _i64, _dbl, _vp]),
    "lkp_rope": (_vp, [_int, _int] + [_vp] * 6 + [_i64] * 6 + [_vp]),
    "lkp_swiglu_act": (_vp, [_int, _int] + [_vp] * 6 + [_i64, _i64, _vp]),
    "lkp_cross_entropy_bytes": (_int, [_int, _int] + [_i64] * 4 + [ctypes.POINTER(_sz)] * 2),
    "lkp_cross_entropy": (_vp, [_int, _int] + [_vp] * 7 + [_int, _vp, _sz] + [_i64] * 4 + [_vp]),
    "lkp_has_attention": (_int, [_str]),
    "lkp_attention": (_vp, [_str, _int, _int] + [_vp] * 9 + [_i64] * 5 + [_int, _vp]),
    "lkp_time_attention": (_int, [_str] + [_i64] * 5 + [_int, _int, _pdbl]),
    "lkp_time_flex": (_int, [_str] + [_i64] * 5 + [_int, _i64, _int, _pdbl, _pdbl]),
    "lkp_moe_experts_saved_bytes": (_sz, [_int] + [_i64] * 5),
    "lkp_moe_experts": (_vp, [_int, _int] + [_vp] * 11 + [_int, _vp, _sz] + [_i64] * 5 + [_vp]),
}


def load(build):
    """The shim of build (a build folder, or an installed shim's folder), every function in
    SIGNATURES typed."""
    own = os.path.join(build, "libllmkern.so")
    if os.path.exists(own):   # a build folder; an installed shim finds the installed library
        ctypes.CDLL(own, mode=os.RTLD_LOCAL)
    lib = ctypes.CDLL(os.path.join(build, "libllmkern_peers_shim.so"))
    for name, (res, args) in SIGNATURES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def attention_buffers(torch, dev, B, Hq, Hkv, S, D):
    """The bf16 tensors one lkp_attention call reads and writes, in its argument order:
    q (B, Hq, S, D), k and v (B, Hkv, S, D), out and dout (B, S, Hq, D), dq, dk, dv like
    q, k, v, and the f32 LSE (B, Hq, S). Random where read, empty where written."""
    q = torch.randn(B, Hq, S, D, dtype=torch.bfloat16, device=dev)
    k, v = (torch.randn(B, Hkv, S, D, dtype=torch.bfloat16, device=dev) for _ in range(2))
    dout = torch.randn(B, S, Hq, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, Hq, S, dtype=torch.float32, device=dev)
    return q, k, v, torch.empty_like(dout), dout, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), lse


def attention_args(dtype, bufs, shape, causal, stream):
    """lkp_attention's arguments after (name, backward): the dtype, bufs' pointers, B, Hq,
    Hkv, S, D, causal and the stream."""
    return (dtype, *(t.data_ptr() for t in bufs), *shape, causal, stream)
