"""llmkern.transformers — llmkern inside Hugging Face transformers.

Importing it registers llmkern attention in transformers' AttentionInterface (and the
mask each name needs in AttentionMaskInterface):

    llmkern_flash_attention_2   flash_attention_2 (CPU and CUDA)     padding mask -> varlen
    llmkern_flash_attention_3   flash_attention_3 (Hopper)           as above
    llmkern_cudnn               cudnn (CUDA, built with cuDNN)       as above
    llmkern_flex_attention      flex_attention (CPU; CUDA in bf16)   the model's mask as a BlockMask

so `AutoModelForCausalLM.from_config(cfg, attn_implementation="llmkern_flash_attention_2")`
runs llmkern's kernel. A name this build or machine cannot run raises LlmkernError at
the first call, saying why and what can (the registry's message). Packed sequences
(cu_seq_lens_q/_k from DataCollatorWithFlattening, or position ids restarting at 0 in a
batch of one) run as varlen; sliding_window, softcap and sinks (s_aux) are passed on.

The flex name takes the model's mask: transformers builds its mask function (causal,
sliding, padding, packed documents) and llmkern evaluates it over every element once,
then classifies the blocks (lk_block_mask_dense): B x Q x KV bytes on the host per call.

    apply_llmkern_kernel_to_qwen3(model=None, **choices)
    apply_llmkern_kernel_to_qwen3_moe(model=None, **choices)

replace RMSNorm (every norm, q_norm and k_norm included), apply_rotary_pos_emb, the MLP,
the MoE experts and the LM head + loss, as Liger's apply functions do: on the model's
modules when `model` is given, else on the classes (every model made afterwards). Each
module's implementation is chosen by llmkern's registry (registry.py: the same fields,
YAML, per-module overrides and environment variables as the CLI). choices:
  rope, rms_norm, swiglu, experts, cross_entropy (alias fused_linear_cross_entropy):
      True (default): replace, the registry chooses; False: leave transformers' module;
      a name ("eager_fp32"): replace, with the op's field set to it
  <op>_implementation="name": the field by its config name (rms_norm_implementation, ...)
  config="run.yaml": model.ops_implementation / model.backend of a YAML file
  overrides={"layers.0.mlp": {"swiglu_mlp_implementation": "eager"}}: per module
`llmkern.explain(model)` prints what each module runs and why.

    AutoLlmkernKernelForCausalLM.from_pretrained(path, **choices_and_hf_kwargs)
    AutoLlmkernKernelForCausalLM.from_config(config, **choices_and_hf_kwargs)

load a model as AutoModelForCausalLM does and apply the function of its model_type
(Liger's AutoLigerKernelForCausalLM): the choices above are taken out of the keyword
arguments (the YAML file as ops_config=, since transformers' own `config` is its config
object), the rest go to transformers (dtype, attn_implementation, device_map, ...).
"""
import types

import torch

from . import _lib as L
from .attention import BlockMask, attention, attention_padded
from .ops import apply_rotary_pos_emb as _lk_rope, lm_head_cross_entropy, moe_experts, rms_norm, swiglu_mlp
from .registry import ROUTER_OPTIONS, Selection, explain_text

try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"llmkern.transformers needs transformers (pip install transformers): {e}") from e

ATTENTION_NAMES = {
    "llmkern_flash_attention_2": "flash_attention_2",
    "llmkern_flash_attention_3": "flash_attention_3",
    "llmkern_flex_attention": "flex_attention",
    "llmkern_cudnn": "cudnn",
}


# --- attention ---------------------------------------------------------------------

def _cu_from_positions(position_ids):
    """cu_seqlens of documents packed in one row whose positions restart at 0, or None
    when the row is one sequence (transformers' _is_packed_sequence)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    p = position_ids[0].to("cpu")
    if p.numel() == 0 or torch.equal(p, torch.arange(p.numel()) + p[0]):
        return None
    starts = (p == 0).nonzero().squeeze(1)
    if starts.numel() == 0 or starts[0] != 0:
        return None
    return torch.cat([starts, torch.tensor([p.numel()])]).to(torch.int32)


def _dense_mask(mask_mod, B, Q, KV, device, H=1):
    """A mask predicate (b, h, q, kv) evaluated over every element: [B, H, Q, KV] bool
    (H 1: the same for every head)."""
    from torch.nn.attention.flex_attention import create_mask
    return create_mask(mask_mod, B, H, Q, KV, device=device)


def _make_attention(name, impl):
    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                softcap=None, is_causal=None, s_aux=None, **kwargs):
        if dropout:
            raise ValueError(f"{name}: dropout: expected 0 (llmkern attention has no dropout; set the model's "
                             f"attention_dropout to 0), got {dropout}")
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        w = int(sliding_window) if sliding_window else 0
        kw = dict(causal=causal, scale=scaling, window=(w, w), softcap=softcap or 0.0, s_aux=s_aux)
        B, _, Sq, _ = query.shape
        if impl == "flex_attention":
            bm = attention_mask
            if not isinstance(bm, BlockMask):
                if bm is None or not hasattr(bm, "mask_mod"):
                    raise ValueError(f"{name}: attention_mask: expected a BlockMask (the model's mask, built by "
                                     f"transformers for {name}), got {type(bm).__name__}")
                Q, KV = bm.seq_lengths
                Bm, Hm = bm.shape[:2]          # a torch BlockMask: its own batch and head broadcast
                bm = BlockMask.from_dense(_dense_mask(bm.mask_mod, Bm, Q, KV, query.device, Hm))
            return attention(query, key, value, impl, block_mask=bm, **kw), None
        if kwargs.get("cu_seq_lens_q") is not None:
            out = attention(query, key, value, impl, cu_seqlens_q=kwargs["cu_seq_lens_q"],
                            cu_seqlens_k=kwargs.get("cu_seq_lens_k"), max_seqlen_q=kwargs.get("max_length_q") or 0,
                            max_seqlen_k=kwargs.get("max_length_k") or 0, **kw)
            return out, None
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError(f"{name}: attention_mask: expected None or a [B, S] padding mask (the mask "
                                 f"transformers builds for this name), got {tuple(attention_mask.shape)}")
            if key.shape[2] != Sq:
                raise ValueError(f"{name}: a padding mask with a KV cache (Sq {Sq} != Skv {key.shape[2]}) is not "
                                 f"supported")
            return attention_padded(query, key, value, attention_mask, impl, **kw), None
        cu = _cu_from_positions(kwargs.get("position_ids"))
        if cu is not None and key.shape[2] == Sq:
            return attention(query, key, value, impl, cu_seqlens_q=cu, cu_seqlens_k=cu, **kw), None
        return attention(query, key, value, impl, **kw), None

    forward.__name__ = name
    return forward


def _flex_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
               **kwargs):
    """transformers' mask function (causal, sliding, packed) and padding, as an llmkern BlockMask."""
    from transformers.masking_utils import (add_offsets_to_mask_function, and_masks, causal_mask_function,
                                            padding_mask_function, prepare_padding_mask)
    fn = mask_function or causal_mask_function
    if attention_mask is not None and not bool(attention_mask.all()):
        fn = and_masks(fn, padding_mask_function(prepare_padding_mask(attention_mask, kv_length, kv_offset)))
    fn = add_offsets_to_mask_function(fn, q_offset, kv_offset)
    device = attention_mask.device if attention_mask is not None else "cpu"
    return BlockMask.from_dense(_dense_mask(fn, batch_size, q_length, kv_length, device))


def _skip_flash_preload(original):
    """transformers takes every attn_implementation with "flash" in its name for the
    flash-attn package or a Hub kernel and loads one when the model is made (raising
    without either); llmkern's names are neither, so that pre-load is skipped for them."""
    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation in ATTENTION_NAMES:
            return None
        return original(implementation, *args, **kwargs)
    lazy_import_flash_attention._llmkern_original = original
    return lazy_import_flash_attention


def register():
    """Registers the four names (idempotent; importing the module does it)."""
    for name, impl in ATTENTION_NAMES.items():
        AttentionInterface.register(name, _make_attention(name, impl))
        AttentionMaskInterface.register(name, _flex_mask if impl == "flex_attention" else flash_attention_mask)
    import transformers.modeling_utils as mu
    f = getattr(mu, "lazy_import_flash_attention", None)
    if f is not None and not hasattr(f, "_llmkern_original"):
        mu.lazy_import_flash_attention = _skip_flash_preload(f)


register()


# --- the patch ---------------------------------------------------------------------

_OPS = {"rope": "rope", "rms_norm": "rms_norm", "swiglu": "swiglu_mlp", "experts": "moe_experts",
        "cross_entropy": "cross_entropy", "fused_linear_cross_entropy": "cross_entropy"}


def _is_field(key):
    """A choice the Selection sets by name: an op's <op>_implementation or a router option."""
    return key.endswith("_implementation") or key in ROUTER_OPTIONS


class _Patch:
    """The choices of one apply call and the registry's Selection per device."""

    def __init__(self, family, where, choices, config, overrides):
        self.family, self.where, self.config, self.overrides = family, where, config, overrides
        self.enabled, self.fields = {}, {}
        for key, value in choices.items():
            if key in _OPS:
                op = _OPS[key]
                self.enabled[op] = value is not False
                if isinstance(value, str):
                    self.fields[op] = value
            elif _is_field(key):
                self.fields[key] = value
            else:
                raise TypeError(f"{where}: unknown choice {key!r}; expected one of {', '.join(_OPS)}, "
                                f"an <op>_implementation field, config= or overrides=")
        self.selections, self.bindings = {}, {}
        self.selection("cpu")          # every name is checked now, not at the first step

    def on(self, op):
        return self.enabled.get(op, True)

    def selection(self, device):
        kind = "cuda" if str(device).startswith("cuda") else "cpu"
        s = self.selections.get(kind)
        if s is None:
            s = self.selections[kind] = Selection(self.family, kind, self.fields, self.config, self.overrides,
                                                  where=self.where)
        return s

    def binding(self, op, module, t):
        key = (op, module, t.device.type)
        b = self.bindings.get(key)
        if b is None:
            b = self.bindings[key] = self.selection(t.device).binding(op, module)
        return b


def _module_name(name):
    """Hugging Face's module name as the family's ("model.layers.0.mlp" -> "layers.0.mlp")."""
    return name[len("model."):] if name.startswith("model.") else name


def _rms_forward(self, x):
    p, module = self._llmkern
    return rms_norm(x, self.weight, getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6)),
                    impl=p.binding("rms_norm", module, x))


def _mlp_forward(self, x):
    p, module = self._llmkern
    act = getattr(getattr(self, "config", None), "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"llmkern swiglu_mlp: {module}: hidden_act: expected silu, got {act}")
    gate_up = torch.cat((self.gate_proj.weight, self.up_proj.weight), 0)
    return swiglu_mlp(x, gate_up, self.down_proj.weight, impl=p.binding("swiglu_mlp", module, x))


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    p, module = self._llmkern
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                       impl=p.binding("moe_experts", module, hidden_states))


def _sparse_moe_forward_v4(self, hidden_states):
    """transformers 4's Qwen3MoeSparseMoeBlock (experts an nn.ModuleList): its router,
    then the experts through llmkern over the stacked weights (autograd splits the
    gradients back to each expert's Linear)."""
    p, module = self._llmkern
    B, S, H = hidden_states.shape
    x = hidden_states.view(-1, H)
    router_logits = self.gate(x)
    w = torch.softmax(router_logits, dim=1, dtype=torch.float)
    w, ids = torch.topk(w, self.top_k, dim=-1)
    if self.norm_topk_prob:
        w = w / w.sum(dim=-1, keepdim=True)
    w = w.to(x.dtype)
    gate_up = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight), 0) for e in self.experts])
    down = torch.stack([e.down_proj.weight for e in self.experts])
    out = moe_experts(x, ids, w, gate_up, down, impl=p.binding("moe_experts", module + ".experts", x))
    return out.view(B, S, H), router_logits


# apply_rotary_pos_emb is a module-level function of each modeling file: the replacement
# finds the calling attention module's binding through a forward pre-hook on it.
_current_attention = [None]


def _note_attention(module, args, kwargs=None):
    _current_attention[0] = module


def _make_rope(patch):
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        m = _current_attention[0]
        if m is not None and getattr(m, "_llmkern_rope", None) is not None:
            p, module = m._llmkern_rope
        else:
            p, module = patch, None
        return _lk_rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, impl=p.binding("rope", module, q))
    apply_rotary_pos_emb._llmkern = (patch, None)
    return apply_rotary_pos_emb


def _shifted(labels, ignore_index=-100):
    return torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()


def _loss(self, hidden, labels, shift_labels=None, num_items_in_batch=None, ignore_index=-100):
    p, module = self._llmkern
    if shift_labels is None:
        shift_labels = _shifted(labels, ignore_index)
    h = hidden.reshape(-1, hidden.shape[-1])
    y = shift_labels.reshape(-1).to(h.device)
    b = p.binding("cross_entropy", module, h)
    if num_items_in_batch is None:
        return lm_head_cross_entropy(h, self.lm_head.weight, y, impl=b, ignore_index=ignore_index)
    loss = lm_head_cross_entropy(h, self.lm_head.weight, y, impl=b, reduction="sum", ignore_index=ignore_index)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _slice(hidden, logits_to_keep):
    if isinstance(logits_to_keep, int):
        return hidden[:, -logits_to_keep:, :] if logits_to_keep else hidden
    return hidden[:, logits_to_keep, :]


def _cache_field(cls, out):
    """The model's cache under the output's name for it: `cache` (transformers 5) or
    `past_key_values` (4)."""
    import dataclasses
    names = {f.name for f in dataclasses.fields(cls)}
    for n in ("cache", "past_key_values"):
        if n in names:
            return {n: getattr(out, n, None)}
    return {}


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, logits_to_keep=0,
                       **kwargs):
    """Qwen3ForCausalLM.forward with the loss fused into the LM head: with labels, the
    logits are not materialized while training (returned as None, as Liger does)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    loss_kw = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    hidden = out.last_hidden_state
    loss, logits = None, None
    if labels is not None or loss_kw.get("shift_labels") is not None:
        loss = _loss(self, hidden, labels, **loss_kw)
    if labels is None or not self.training:
        logits = self.lm_head(_slice(hidden, logits_to_keep))
    return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions,
                                  **_cache_field(CausalLMOutputWithPast, out))


def _moe_causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                           output_router_logits=None, logits_to_keep=0, **kwargs):
    """Qwen3MoeForCausalLM.forward with the fused loss; the router's aux loss as transformers adds it."""
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    if output_router_logits is None:
        output_router_logits = self.config.output_router_logits
    loss_kw = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     output_router_logits=output_router_logits, **kwargs)
    hidden = out.last_hidden_state
    loss, logits, aux = None, None, None
    if labels is not None or loss_kw.get("shift_labels") is not None:
        loss = _loss(self, hidden, labels, **loss_kw)
    if labels is None or not self.training:
        logits = self.lm_head(_slice(hidden, logits_to_keep))
    if output_router_logits:
        aux = load_balancing_loss_func(out.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask)
        if loss is not None:
            loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
    return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux, logits=logits, hidden_states=out.hidden_states,
                                     attentions=out.attentions, router_logits=out.router_logits,
                                     **_cache_field(MoeCausalLMOutputWithPast, out))


def _bind(obj, name, fn, patch, module, attr="_llmkern"):
    setattr(obj, attr, (patch, module))
    if fn is not None:
        setattr(obj, name, types.MethodType(fn, obj) if not isinstance(obj, type) else fn)


def _apply(family, modeling, prefix, model, choices):
    where = f"apply_llmkern_kernel_to_{family}"
    config = choices.pop("config", None)
    overrides = choices.pop("overrides", None)
    if model is None and overrides:
        raise ValueError(f"{where}: overrides: per-module choices need the model (model=...), got model=None")
    p = _Patch(family, where, choices, config, overrides)
    if p.on("rope"):
        modeling.apply_rotary_pos_emb = _make_rope(p)
    if model is None:                      # the classes: every model made afterwards
        cls = lambda n: getattr(modeling, prefix + n, None)  # noqa: E731
        for op, n, fn in (("rms_norm", "RMSNorm", _rms_forward), ("swiglu_mlp", "MLP", _mlp_forward),
                          ("moe_experts", "Experts", _experts_forward),
                          ("moe_experts", "SparseMoeBlock", _sparse_moe_forward_v4),
                          ("cross_entropy", "ForCausalLM",
                           _moe_causal_lm_forward if family == "qwen3_moe" else _causal_lm_forward)):
            c = cls(n)
            if c is None or not p.on(op):
                continue
            if n == "Experts" and not hasattr(c, "forward"):
                continue
            if n == "SparseMoeBlock" and cls("Experts") is not None:
                continue                   # transformers 5: the experts module is patched instead
            _bind(c, "forward", fn, p, None)
        return None
    for name, m in model.named_modules():
        module, kind = _module_name(name), type(m).__name__
        if kind.endswith("RMSNorm") and p.on("rms_norm"):
            _bind(m, "forward", _rms_forward, p, module)
        elif kind == prefix + "MLP" and p.on("swiglu_mlp"):
            _bind(m, "forward", _mlp_forward, p, module)
        elif kind == prefix + "Experts" and p.on("moe_experts"):
            _bind(m, "forward", _experts_forward, p, module)
        elif kind == prefix + "SparseMoeBlock" and isinstance(getattr(m, "experts", None), torch.nn.ModuleList) \
                and p.on("moe_experts"):
            _bind(m, "forward", _sparse_moe_forward_v4, p, module)
        elif kind == prefix + "Attention" and p.on("rope"):
            _bind(m, None, None, p, module + ".rotary_emb", attr="_llmkern_rope")
            if not getattr(m, "_llmkern_hooked", False):
                m.register_forward_pre_hook(_note_attention)
                m._llmkern_hooked = True
        elif kind.endswith("ForCausalLM") and p.on("cross_entropy"):
            _bind(m, "forward", _moe_causal_lm_forward if family == "qwen3_moe" else _causal_lm_forward, p,
                  "lm_head")
    model._llmkern_patch = p
    return model


def apply_llmkern_kernel_to_qwen3(model=None, **choices):
    """Replaces Qwen3's RMSNorm, RoPE, MLP and LM head + loss with llmkern's (see the module doc)."""
    from transformers.models.qwen3 import modeling_qwen3
    return _apply("qwen3", modeling_qwen3, "Qwen3", model, dict(choices))


def apply_llmkern_kernel_to_qwen3_moe(model=None, **choices):
    """Replaces Qwen3-MoE's RMSNorm, RoPE, experts and LM head + loss with llmkern's."""
    from transformers.models.qwen3_moe import modeling_qwen3_moe
    return _apply("qwen3_moe", modeling_qwen3_moe, "Qwen3Moe", model, dict(choices))


_APPLY_BY_TYPE = {"qwen3": apply_llmkern_kernel_to_qwen3, "qwen3_moe": apply_llmkern_kernel_to_qwen3_moe}


def _choices_of(kwargs):
    """llmkern's choices, taken out of a from_pretrained / from_config call's keyword arguments
    (attn_implementation stays: it is transformers', and the llmkern_* names are in its registry)."""
    ours = {k: kwargs.pop(k) for k in list(kwargs)
            if k in _OPS or k in ("overrides", "ops_config") or (_is_field(k) and k != "attn_implementation")}
    if "ops_config" in ours:
        ours["config"] = ours.pop("ops_config")
    return ours


def _apply_fn(model_type, where):
    fn = _APPLY_BY_TYPE.get(model_type)
    if fn is None:
        raise ValueError(f"llmkern: AutoLlmkernKernelForCausalLM.{where}: model_type: expected one of "
                         f"{', '.join(_APPLY_BY_TYPE)}, got {model_type!r}")
    return fn


class AutoLlmkernKernelForCausalLM:
    """AutoModelForCausalLM with llmkern's kernels applied by model_type (see the module doc).
    The model type is checked before any weight is read."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM
        choices = _choices_of(kwargs)
        cfg = kwargs.get("config")
        if cfg is None:
            hub = {k: kwargs[k] for k in ("cache_dir", "revision", "token", "local_files_only", "trust_remote_code",
                                          "subfolder") if k in kwargs}
            cfg = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        fn = _apply_fn(getattr(cfg, "model_type", None), "from_pretrained")
        model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return fn(model, **choices)

    @classmethod
    def from_config(cls, config, **kwargs):
        from transformers import AutoModelForCausalLM
        choices = _choices_of(kwargs)
        fn = _apply_fn(getattr(config, "model_type", None), "from_config")
        return fn(AutoModelForCausalLM.from_config(config, **kwargs), **choices)


def explain(model, device=None):
    """What each llmkern module of `model` runs and why, as `llmkern explain` prints it:
    the requested name, its source (choice, YAML place, override, environment, default),
    the implementation, the stage that bound it and any fallback. Returns the text."""
    if device is None:
        p0 = next(model.parameters(), None)
        device = p0.device if p0 is not None else "cpu"
    t = torch.empty(0, device=device)
    rows = []
    for name, m in model.named_modules():
        for attr, op in (("_llmkern", None), ("_llmkern_rope", "rope")):
            v = getattr(m, attr, None)
            if v is None:
                continue
            p, module = v               # module None: patched through its class, the op-wide binding
            kind = type(m).__name__
            op = op or ("rms_norm" if kind.endswith("RMSNorm") else "swiglu_mlp" if kind.endswith("MLP") else
                        "cross_entropy" if kind.endswith("ForCausalLM") else "moe_experts")
            if kind.endswith("SparseMoeBlock") and module is not None:
                module += ".experts"
            shown = module or ("lm_head" if op == "cross_entropy" else _module_name(name))
            rows.append((shown, p.binding(op, module, t)))
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl in ATTENTION_NAMES:
        from ._torch import select
        b = select("attention", ATTENTION_NAMES[impl], 1 if t.is_cuda else 0, detail=f"attn_implementation={impl}")
        from .registry import Binding
        rows.append(("layers.*.self_attn", Binding(b, "layers.*.self_attn")))
    fam = getattr(getattr(model, "_llmkern_patch", None), "family", "?")
    return explain_text(rows, f"model family {fam}, device {t.device.type}")
