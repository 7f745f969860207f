"""llmkern from PyTorch: llmkern's kernels as torch.autograd.Functions, its registry,
and (llmkern.transformers) Hugging Face integration.

    import llmkern, llmkern.transformers
    model = llmkern.transformers.apply_llmkern_kernel_to_qwen3(model)   # RMSNorm, RoPE, MLP, loss
    print(llmkern.explain(model))

The package calls libllmkern.so through ctypes (no compiled extension); _lib.py says
where it looks for it ($LLMKERN_LIB, beside the package, the checkout's build/). Every
llmkern failure raises LlmkernError with the library's message (lk_last_error()).
"""
import torch  # noqa: F401  first: libllmkern.so's own CUDA libraries (NCCL, cuDNN) loaded before torch's
               # became the ones torch bound to ("libtorch_cuda.so: undefined symbol: ncclCommResume")

from ._lib import LlmkernError, path as library_path
from . import ops, attention, nn  # noqa: F401  nn: llmkern.nn, not in __all__ (a star import would hide torch.nn)
from .attention import BlockMask
from .ops import apply_rotary_pos_emb, fused_add_rms_norm, lm_head_cross_entropy, moe_experts, rms_norm, rope, swiglu_mlp
from .registry import Selection

__all__ = ["LlmkernError", "library_path", "ops", "attention", "BlockMask", "rms_norm", "fused_add_rms_norm", "rope",
           "apply_rotary_pos_emb", "swiglu_mlp", "lm_head_cross_entropy", "moe_experts", "Selection", "explain",
           "implementations"]


def explain(model, device=None):
    """Prints and returns what each llmkern module of a patched model runs and why
    (llmkern.transformers.explain)."""
    from .transformers import explain as _explain
    text = _explain(model, device)
    print(text)
    return text


def implementations(op=None):
    """[(op, name, device, available, why)] of every registered implementation (llmkern list)."""
    import ctypes
    from . import _lib as L
    out = []
    for i in range(L.lib.lk_impl_count()):
        im = L.lib.lk_impl_at(i).contents
        name = L.OPS[im.op]
        if op and name != op:
            continue
        why = ctypes.create_string_buffer(256)
        ok = L.lib.lk_impl_available(L.lib.lk_impl_at(i), L.lib.lk_hw_get(), why, 256)
        out.append((name, L.s(im.name), ("cpu", "cuda")[im.device], bool(ok), why.value.decode()))
    return out
