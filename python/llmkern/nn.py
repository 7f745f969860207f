"""nn.py — llmkern's ops as torch.nn.Modules, named and called as Liger-Kernel's modules
(liger_kernel.transformers), so a model written against those changes its import alone:

    llmkern.nn.RMSNorm(hidden_size, eps=1e-6, offset=0.0, init_fn="ones")    LigerRMSNorm
    llmkern.nn.FusedAddRMSNorm(hidden_size, eps=1e-6, offset=0.0)           LigerFusedAddRMSNorm
        y, s = norm(x, residual)                                            s = residual + x, y = RMSNorm(s)
    llmkern.nn.SwiGLUMLP(config)  or  SwiGLUMLP(hidden_size=, intermediate_size=)   LigerSwiGLUMLP
    llmkern.nn.Experts(config)  or  Experts(num_experts=, hidden_size=, intermediate_size=)   LigerExperts
        out = experts(hidden_states, top_k_index, top_k_weights)         transformers 5's Qwen3-MoE experts
    llmkern.nn.FusedLinearCrossEntropyLoss(ignore_index=-100, lse_square_scale=0.0,
        label_smoothing=0.0, reduction="mean", softcap=None)                 LigerFusedLinearCrossEntropyLoss
        loss = ce(lm_head.weight, hidden, shifted_labels)

Parameters and state-dict keys are those of the modules they replace (weight; gate_proj,
up_proj, down_proj; the experts' stacked gate_up_proj, down_proj), so a checkpoint loads
into either. Each module takes `impl`: an implementation name of its op (`llmkern list`), or
None (default): the registry's default for the device of the call, as `llmkern explain`
shows it (the environment's choice, else the built-in one). A name that cannot run on the
input's device raises LlmkernError saying why and what can. Liger's options llmkern has no
equal for (casting_mode, in_place, return_z_loss, a bias) are not taken: a TypeError or a
ValueError names them rather than a silently different computation.
"""
import torch

from .ops import fused_add_rms_norm, lm_head_cross_entropy, moe_experts, rms_norm, swiglu_mlp

__all__ = ["RMSNorm", "FusedAddRMSNorm", "SwiGLUMLP", "Experts", "FusedLinearCrossEntropyLoss"]

_INIT = {"ones": torch.ones, "zeros": torch.zeros}


def _silu_act(config, where):
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"llmkern.nn.{where}: config.hidden_act: expected silu, got {act!r}")


class RMSNorm(torch.nn.Module):
    """y = x · rsqrt(mean(x²) + eps) · (offset + weight) over the last dim (offset 1 with
    init_fn "zeros" is Gemma's form)."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, init_fn="ones", impl=None):
        super().__init__()
        if init_fn not in _INIT:
            raise ValueError(f"llmkern.nn.{type(self).__name__}: init_fn: expected 'ones' or 'zeros', got {init_fn!r}")
        self.weight = torch.nn.Parameter(_INIT[init_fn](hidden_size))
        self.variance_epsilon, self.offset, self.impl = eps, offset, impl

    def forward(self, hidden_states):
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, impl=self.impl, offset=self.offset)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, offset={self.offset}, impl={self.impl}"


class FusedAddRMSNorm(RMSNorm):
    """(y, s) = norm(x, residual): s = residual + x, y = RMSNorm(s), one pass each way. A residual
    of x's dtype is the stream a bf16 model carries (s rounded once); an f32 residual beside
    bf16 x is autocast's f32 stream (s f32)."""

    def forward(self, hidden_states, residual):
        return fused_add_rms_norm(hidden_states, residual, self.weight, self.variance_epsilon, impl=self.impl,
                                  offset=self.offset)


class SwiGLUMLP(torch.nn.Module):
    """down_proj(silu(gate_proj(x)) · up_proj(x)), bias-free, as Qwen3's and Llama's MLP. From a
    transformers config (hidden_size, intermediate_size, hidden_act silu) or the two sizes."""

    def __init__(self, config=None, hidden_size=None, intermediate_size=None, impl=None):
        super().__init__()
        if config is not None:
            _silu_act(config, "SwiGLUMLP")
            hidden_size, intermediate_size = config.hidden_size, config.intermediate_size
        if not hidden_size or not intermediate_size:
            raise TypeError("llmkern.nn.SwiGLUMLP: expected a config or hidden_size and intermediate_size, got "
                            f"hidden_size={hidden_size}, intermediate_size={intermediate_size}")
        self.hidden_size, self.intermediate_size, self.impl = hidden_size, intermediate_size, impl
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        gate_up = torch.cat((self.gate_proj.weight, self.up_proj.weight), 0)   # autograd splits its gradient
        return swiglu_mlp(x, gate_up, self.down_proj.weight, impl=self.impl)


class Experts(torch.nn.Module):
    """A MoE layer's routed experts, stacked: out[t] = Σ_k w[t, k] · down_e(silu(gate_e x) · up_e x)
    over e = top_k_index[t, k]. gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I],
    initialized N(0, 0.02) (transformers' initializer_range) until a state dict is loaded.
    From a config (num_experts or num_local_experts, moe_intermediate_size or
    intermediate_size, hidden_size) or the three sizes; hidden_states [..., H], top_k_index
    and top_k_weights [..., k] (the router's; the weights' gradient in their dtype)."""

    def __init__(self, config=None, num_experts=None, hidden_size=None, intermediate_size=None, impl=None):
        super().__init__()
        if config is not None:
            _silu_act(config, "Experts")
            num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
            intermediate_size = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
            hidden_size = config.hidden_size
        if not num_experts or not hidden_size or not intermediate_size:
            raise TypeError("llmkern.nn.Experts: expected a config or num_experts, hidden_size and intermediate_size, "
                            f"got {num_experts}, {hidden_size}, {intermediate_size}")
        self.num_experts, self.hidden_size, self.intermediate_size, self.impl = (num_experts, hidden_size,
                                                                               intermediate_size, impl)
        self.gate_up_proj = torch.nn.Parameter(torch.randn(num_experts, 2 * intermediate_size, hidden_size) * 0.02)
        self.down_proj = torch.nn.Parameter(torch.randn(num_experts, hidden_size, intermediate_size) * 0.02)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        k = top_k_index.shape[-1]
        out = moe_experts(hidden_states.reshape(-1, self.hidden_size), top_k_index.reshape(-1, k),
                          top_k_weights.reshape(-1, k), self.gate_up_proj, self.down_proj, impl=self.impl)
        return out.view(hidden_states.shape)


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """ce(weight, hidden, target): the cross-entropy of hidden · weightᵀ against target without
    the logits whole. hidden [T, H] (or [B, S, H]), weight [V, H], target [T] already shifted,
    ignore_index where not scored. lse_square_scale is the z-loss (lse² times it, added per
    token); softcap caps the logits as softcap · tanh(z / softcap)."""

    def __init__(self, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
                 impl=None):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"llmkern.nn.FusedLinearCrossEntropyLoss: reduction: expected 'mean' or 'sum', got "
                             f"{reduction!r}")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"llmkern.nn.FusedLinearCrossEntropyLoss: softcap: expected None or > 0, got {softcap!r}")
        self.ignore_index, self.lse_square_scale, self.label_smoothing = ignore_index, lse_square_scale, label_smoothing
        self.reduction, self.softcap, self.impl = reduction, softcap, impl

    def forward(self, lin_weight, _input, target, bias=None):
        if bias is not None:
            raise ValueError("llmkern.nn.FusedLinearCrossEntropyLoss: bias: expected None (the LM head has none), "
                             f"got a tensor of shape {tuple(bias.shape)}")
        return lm_head_cross_entropy(_input, lin_weight, target, impl=self.impl, reduction=self.reduction,
                                     ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
                                     z_loss_scale=self.lse_square_scale, softcap=self.softcap or 0.0)
