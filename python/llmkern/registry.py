"""registry.py — llmkern's registry from Python: the same selection the CLI and the C
model make (include/llmkern/registry.h, config.h), for a Hugging Face model's modules.

    sel = Selection("qwen3", "cpu", {"rms_norm_implementation": "eager_fp32"},
                    config="run.yaml", overrides={"layers.0.mlp": {"swiglu_mlp": "eager"}})
    b = sel.binding("rms_norm", "layers.3.input_layernorm")   # a Binding: .impl, .requested, ...

Precedence is the library's (lk_select): a module's override, then the op's field (the
choices given here, then a YAML file's model.ops_implementation / model.backend), then
the environment (LLMKERN_USE_FUSED, ...: read again at each Selection), then the
built-in default. An explicit choice that cannot run here raises LlmkernError; only a
default falls back, and the binding says so. Module names are the family's
(`llmkern explain`): Hugging Face's names without the leading "model.".
"""
import ctypes

from . import _lib as L

_lib = L.lib
_lib.lk_env_reload.argtypes, _lib.lk_env_reload.restype = [], ctypes.c_int


ROUTER_OPTIONS = ("fake_gate_noise", "gate_precision")   # set by lk_ops_config_set_option, not as fields


class Binding:
    """One module's (or op's) bound implementation and why (lk_binding)."""

    def __init__(self, c, module=""):
        self.op = L.OPS[c.op]
        self.module = module or L.s(c.module)
        self.requested = L.s(c.requested)
        self.source = L.SOURCES[c.source]
        self.source_detail = L.s(c.source_detail)
        self.resolved = L.s(c.resolved)
        self.impl = ctypes.cast(c.impl, ctypes.POINTER(L.Impl)) if c.impl else None
        self.impl_name = L.s(c.impl.contents.name) if c.impl else ""
        self.device = ("cpu", "cuda")[c.impl.contents.device] if c.impl else ""
        self.stage = L.STAGES[c.stage]
        self.fallback = L.s(c.fallback)

    def source_text(self):
        return f"{self.source} {self.source_detail}".strip()

    def __repr__(self):
        return (f"Binding({self.op} {self.module or '*'}: {self.requested} from {self.source_text()} -> "
                f"{self.impl_name or '-'}/{self.device}{', fallback: ' + self.fallback if self.fallback else ''})")


def _field(op_or_field):
    """An op name ("rms_norm") or its config field ("rms_norm_implementation") as the field."""
    for i, name in enumerate(L.OPS):
        info = _lib.lk_op_info_get(i).contents
        if op_or_field in (name, L.s(info.field)):
            return L.s(info.field)
    return op_or_field     # the library names the valid fields in its error


class Selection:
    """Every op of a model family bound for a device, from choices, a YAML file,
    per-module overrides and the environment (lk_ops_config_finalize, lk_model_build)."""

    def __init__(self, family, device, choices=None, config=None, overrides=None, where="python"):
        L.check(_lib.lk_env_reload(), "environment")
        self.family = family
        self.cfg = L.OpsConfig()
        _lib.lk_ops_config_init(ctypes.byref(self.cfg))
        self.cfg.device = L.LK_DEVICE_CUDA if str(device).startswith("cuda") else L.LK_DEVICE_CPU
        if config:
            L.check(_lib.lk_config_load_yaml(str(config).encode(), ctypes.byref(self.cfg)), "config")
        for key, value in (choices or {}).items():
            if key in ROUTER_OPTIONS:
                L.check(_lib.lk_ops_config_set_option(ctypes.byref(self.cfg), key.encode(), str(value).encode(),
                                                      f"{where}({key}=...)".encode()), key)
            else:
                L.check(_lib.lk_ops_config_set(ctypes.byref(self.cfg), _field(key).encode(), str(value).encode(),
                                               f"{where}({key}={value!r})".encode()), key)
        for module, fields in (overrides or {}).items():
            for key, value in fields.items():
                L.check(_lib.lk_ops_config_set_override(ctypes.byref(self.cfg), module.encode(), _field(key).encode(),
                                                        str(value).encode(),
                                                        f"{where}(overrides[{module!r}])".encode()), module)
        L.check(_lib.lk_ops_config_finalize(ctypes.byref(self.cfg)), "config")
        L.check(_lib.lk_model_register(L.family(family)), "model_register")
        self.table = L.OpTable()
        L.check(_lib.lk_model_build(ctypes.byref(self.cfg), family.encode(), ctypes.byref(self.table)), "model_build")

    def binding(self, op, module=None):
        """The binding `module` runs with: its override, else the op's."""
        b = _lib.lk_op_table_get(ctypes.byref(self.table), L.OP[op], module.encode() if module else None)
        if not b:
            raise L.LlmkernError(1, f"{op}: no binding")
        return Binding(b.contents, module or "")


def explain_text(bindings, title=""):
    """The table `llmkern explain` prints, for a list of (module, Binding)."""
    rows = [("MODULE", "OP", "REQUESTED", "SOURCE", "IMPL", "STAGE", "FALLBACK")]
    for module, b in bindings:
        rows.append((module, b.op, b.requested, b.source_text(),
                     f"{b.impl_name}/{b.device}" if b.impl_name else "-", b.stage, b.fallback))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [title] if title else []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return "\n".join(line.rstrip() for line in lines)
