"""_lib.py — finds and loads libllmkern.so, and mirrors the C API's structs in ctypes.

Where the library is looked for, first found wins (README, "From Python"):
  1. $LLMKERN_LIB: the path of a libllmkern.so;
  2. libllmkern.so beside this file: a `pip install ./python` made after a build copies
     it in, and the build tree's package (<build>/python/llmkern, symlinks made by CMake)
     has one linking to <build>/libllmkern.so;
  3. <repo>/build/libllmkern.so, when this file is the checkout's python/llmkern.
No LD_LIBRARY_PATH is needed: the library's own dependencies are system libraries or
carry their RUNPATH. It is loaded RTLD_LOCAL (ctypes' default): with RTLD_GLOBAL its CUDA
runtime pieces met PyTorch's copies and the process aborted (bench/peers_cuda.py).

Every struct here is laid out as its header declares it (include/llmkern/*.h);
python/tests/test_abi.py compiles those headers and checks every size and offset. A
failing call raises LlmkernError with lk_last_error()'s text (`check`).
"""
import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint, c_void_p)

_HERE = os.path.dirname(os.path.abspath(__file__))
LK_MAX_DIMS = 6
LK_OP_COUNT = 9
LK_MAX_OVERRIDES = 64
LK_MAX_MODULE_BINDINGS = 64
LK_ENV_COUNT = 6

# enums (status.h, tensor.h, registry.h, cross_entropy.h)
STATUS_NAMES = ["LK_OK", "LK_EINVAL", "LK_ESHAPE", "LK_EDTYPE", "LK_EUNAVAILABLE", "LK_ENOMEM", "LK_EIO",
                "LK_EDEVICE", "LK_ECOMM", "LK_EINTERNAL"]
LK_F32, LK_BF16, LK_F16, LK_I32, LK_I64, LK_BOOL = range(6)
LK_DEVICE_CPU, LK_DEVICE_CUDA = 0, 1
OPS = ["attention", "cross_entropy", "rms_norm", "rope", "swiglu_mlp", "moe_experts", "moe_router",
       "moe_dispatch", "linear"]
OP = {name: i for i, name in enumerate(OPS)}
SOURCES = ["default", "env", "config", "override"]
STAGES = ["init", "model_register", "config_finalize", "model_build", "runtime"]
LK_SOURCE_CONFIG, LK_SOURCE_OVERRIDE = 2, 3
LK_STAGE_MODEL_BUILD, LK_STAGE_RUNTIME = 3, 4
LK_CE_MEAN, LK_CE_SUM, LK_CE_NONE = 0, 1, 2


class LlmkernError(RuntimeError):
    """A failing llmkern call: .status is the lk_status word ("LK_ESHAPE"), the message
    is lk_last_error()'s text (the op, the argument, expected vs got)."""

    def __init__(self, status, message):
        self.status = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
        super().__init__(f"{message} [{self.status}]")


# --- structs -------------------------------------------------------------------------

class Device(Structure):
    _fields_ = [("type", c_int), ("index", c_int)]


class Tensor(Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("device", Device), ("ndim", c_int),
                ("shape", c_int64 * LK_MAX_DIMS), ("stride", c_int64 * LK_MAX_DIMS)]


class Saved(Structure):
    _fields_ = [("data", c_void_p), ("bytes", c_size_t)]


ALLOC_FN = CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_int)
FREE_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_int)


class Allocator(Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("user", c_void_p)]


class Arena(Structure):
    _fields_ = [("base", c_void_p), ("cap", c_size_t), ("used", c_size_t), ("peak", c_size_t),
                ("device", c_int), ("allocator", POINTER(Allocator))]


class Ctx(Structure):
    _fields_ = [("device", Device), ("stream", c_void_p), ("arena", POINTER(Arena)), ("comm", c_void_p),
                ("rng", c_void_p)]


class RmsNormArgs(Structure):
    _fields_ = [("x", Tensor), ("weight", Tensor), ("y", Tensor), ("dy", Tensor), ("dx", Tensor),
                ("dweight", Tensor), ("saved", Saved), ("eps", c_double), ("weight_offset", c_float),
                ("inplace_dx", c_int), ("residual", Tensor), ("delta", Tensor), ("norm_of_x", c_int),
                ("rope", c_void_p)]   # const lk_rms_norm_rope *: NULL from Python


class RopeArgs(Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("q_out", Tensor), ("k_out", Tensor), ("dq_out", Tensor),
                ("dk_out", Tensor), ("dq", Tensor), ("dk", Tensor), ("cos", Tensor), ("sin", Tensor),
                ("position_ids", Tensor), ("saved", Saved), ("rotary_dim", c_int64)]


class SwigluMlpArgs(Structure):
    _fields_ = [("x", Tensor), ("gate_up_weight", Tensor), ("down_weight", Tensor), ("out", Tensor),
                ("dout", Tensor), ("dx", Tensor), ("d_gate_up_weight", Tensor), ("d_down_weight", Tensor),
                ("saved", Saved), ("swiglu_limit", c_float)]


class CrossEntropyArgs(Structure):
    _fields_ = [("hidden", Tensor), ("weight", Tensor), ("labels", Tensor), ("keep_indices", Tensor),
                ("loss", Tensor), ("z_loss", Tensor), ("n_valid", Tensor), ("d_loss", Tensor),
                ("d_hidden", Tensor), ("d_weight", Tensor), ("saved", Saved), ("reduction", c_int),
                ("ignore_index", c_int64), ("label_smoothing", c_double), ("z_loss_scale", c_double),
                ("softcap", c_double), ("logits_to_keep", c_int64), ("fp32_lm_head", c_int),
                ("chunk_bytes", c_size_t)]


class BlockMask(Structure):
    _fields_ = [("B", c_int64), ("H", c_int64), ("Q_LEN", c_int64), ("KV_LEN", c_int64),
                ("Q_BLOCK_SIZE", c_int64), ("KV_BLOCK_SIZE", c_int64), ("num_q_blocks", c_int64),
                ("num_kv_blocks", c_int64),
                ("kv_num_blocks", POINTER(c_int32)), ("kv_indices", POINTER(c_int32)),
                ("full_kv_num_blocks", POINTER(c_int32)), ("full_kv_indices", POINTER(c_int32)),
                ("q_num_blocks", POINTER(c_int32)), ("q_indices", POINTER(c_int32)),
                ("full_q_num_blocks", POINTER(c_int32)), ("full_q_indices", POINTER(c_int32)),
                ("mask_mod", c_void_p), ("mask_ctx", c_void_p), ("owned", c_void_p), ("mask_row", c_void_p),
                ("gpu", c_void_p)]


class ScoreMod(Structure):
    _fields_ = [("fn", c_void_p), ("ctx", c_void_p)]


class AttentionArgs(Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor), ("dout", Tensor), ("dq", Tensor),
                ("dk", Tensor), ("dv", Tensor), ("s_aux", Tensor), ("ds_aux", Tensor),
                ("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor), ("max_seqlen_q", c_int64),
                ("max_seqlen_k", c_int64), ("mask", Tensor), ("block_mask", POINTER(BlockMask)),
                ("score_mod", ScoreMod), ("saved", Saved), ("scale", c_float), ("causal", c_int),
                ("window_left", c_int64), ("window_right", c_int64), ("softcap", c_float),
                ("skip_ulysses", c_int), ("deterministic", c_int)]


class MoeExpertsArgs(Structure):
    _fields_ = [("hidden", Tensor), ("topk_ids", Tensor), ("topk_weights", Tensor), ("gate_up_weight", Tensor),
                ("down_weight", Tensor), ("out", Tensor), ("dout", Tensor), ("d_hidden", Tensor),
                ("d_topk_weights", Tensor), ("d_gate_up_weight", Tensor), ("d_down_weight", Tensor),
                ("saved", Saved), ("write_weight_grads", c_int)]


class Requirements(Structure):
    _fields_ = [("min_cc", c_int), ("needs", c_uint), ("dtypes", c_uint), ("sp_aware", c_int)]


class Impl(Structure):
    _fields_ = [("op", c_int), ("name", c_char_p), ("aliases", POINTER(c_char_p)), ("device", c_int),
                ("needs", Requirements), ("supported", c_void_p), ("vtable", c_void_p), ("summary", c_char_p)]


class Binding(Structure):
    _fields_ = [("op", c_int), ("module", c_char * 96), ("requested", c_char * 64), ("source", c_int),
                ("source_detail", c_char * 128), ("resolved", c_char * 96), ("impl", POINTER(Impl)),
                ("stage", c_int), ("fallback", c_char * 192)]


class Request(Structure):
    _fields_ = [("op", c_int), ("module", c_char_p), ("name", c_char_p), ("source", c_int),
                ("source_detail", c_char_p), ("device", c_int)]


class ConfigValue(Structure):
    _fields_ = [("value", c_char * 64), ("where", c_char * 192)]


class Override(Structure):
    _fields_ = [("module", c_char * 96), ("op", c_int), ("v", ConfigValue)]


class RouterOptions(Structure):
    _fields_ = [("noise", c_float), ("gate_f32", c_int)]


class EnvValue(Structure):
    _fields_ = [("value", c_char * 32), ("set_by", c_char * 48), ("raw", c_char * 32)]


class OpsConfig(Structure):
    _fields_ = [("field", ConfigValue * LK_OP_COUNT), ("overrides", Override * LK_MAX_OVERRIDES),
                ("n_overrides", c_int), ("device", c_int), ("fake_gate_noise", ConfigValue),
                ("gate_precision", ConfigValue), ("env", EnvValue * LK_ENV_COUNT), ("finalized", c_int),
                ("bound_mask", c_uint),
                ("bound", Binding * LK_OP_COUNT), ("module_bound", Binding * LK_MAX_OVERRIDES),
                ("router", RouterOptions)]


class OpTable(Structure):
    _fields_ = [("family", c_void_p), ("device", c_int), ("op", Binding * LK_OP_COUNT),
                ("module", Binding * LK_MAX_MODULE_BINDINGS), ("n_module", c_int), ("router", RouterOptions)]


class OpInfo(Structure):
    _fields_ = [("op", c_int), ("name", c_char_p), ("field", c_char_p), ("known", POINTER(c_char_p)),
                ("reference", c_char_p), ("default_fused", c_char_p), ("default_plain", c_char_p),
                ("gpu_defaults", c_void_p), ("aliases", c_void_p)]


class Hw(Structure):
    _fields_ = [("cpu_cores", c_int), ("cpu_avx2", c_int), ("cpu_avx512f", c_int), ("cpu_model", c_char * 64),
                ("cuda_devices", c_int), ("cuda_cc", c_int), ("has_cudnn", c_int), ("has_mpi", c_int),
                ("has_nccl", c_int), ("cuda_sms", c_int), ("cuda_smem_per_block", c_size_t),
                ("cuda_l2_bytes", c_size_t), ("cuda_name", c_char * 96), ("cuda_why", c_char * 128),
                ("cpu_mem_bytes", c_size_t)]


# The structs test_abi.py holds against the headers: Python name -> C type name.
ABI_STRUCTS = {
    "Device": "lk_device", "Tensor": "lk_tensor", "Saved": "lk_saved", "Allocator": "lk_allocator",
    "Arena": "lk_arena", "Ctx": "lk_ctx", "RmsNormArgs": "lk_rms_norm_args", "RopeArgs": "lk_rope_args",
    "SwigluMlpArgs": "lk_swiglu_mlp_args", "CrossEntropyArgs": "lk_cross_entropy_args",
    "BlockMask": "lk_block_mask", "ScoreMod": "lk_score_mod", "AttentionArgs": "lk_attention_args",
    "MoeExpertsArgs": "lk_moe_experts_args", "Requirements": "lk_requirements", "Impl": "lk_impl",
    "Binding": "lk_binding", "Request": "lk_request", "ConfigValue": "lk_config_value",
    "Override": "lk_override", "RouterOptions": "lk_router_options", "EnvValue": "lk_env_value",
    "OpsConfig": "lk_ops_config",
    "OpTable": "lk_op_table", "OpInfo": "lk_op_info", "Hw": "lk_hw",
}


# --- loading -------------------------------------------------------------------------

def candidates():
    """The paths tried, in order (the module docstring says why each)."""
    out = []
    if os.environ.get("LLMKERN_LIB"):
        out.append(("$LLMKERN_LIB", os.environ["LLMKERN_LIB"]))
    out.append(("the package", os.path.join(_HERE, "libllmkern.so")))
    out.append(("the checkout's build", os.path.join(_HERE, "..", "..", "build", "libllmkern.so")))
    return out


def _load():
    tried = []
    for where, path in candidates():
        if os.path.isfile(path):
            return ctypes.CDLL(os.path.realpath(path)), os.path.realpath(path)
        tried.append(f"{path} ({where}: no such file)")
        if where == "$LLMKERN_LIB":   # an explicit choice that cannot be met is an error, not a fallback
            break
    raise ImportError("llmkern: libllmkern.so not found; tried " + "; ".join(tried) +
                      ". Build it (make build, or cmake --build <dir>) and set LLMKERN_LIB=<dir>/libllmkern.so, "
                      "or import the package from <dir>/python")


lib, path = _load()

_P = POINTER
_sigs = {
    "lk_init": ([], c_int),
    "lk_last_error": ([], c_char_p),
    "lk_status_name": ([c_int], c_char_p),
    "lk_hw_get": ([], _P(Hw)),
    "lk_arena_free": ([_P(Arena)], None),
    "lk_impl_find": ([c_int, c_char_p, c_int], _P(Impl)),
    "lk_impl_count": ([], c_int),
    "lk_impl_at": ([c_int], _P(Impl)),
    "lk_impl_available": ([_P(Impl), _P(Hw), c_char_p, c_size_t], c_int),
    "lk_op_info_get": ([c_int], _P(OpInfo)),
    "lk_select": ([_P(Request), c_int, _P(Binding)], c_int),
    "lk_ops_config_init": ([_P(OpsConfig)], None),
    "lk_ops_config_set": ([_P(OpsConfig), c_char_p, c_char_p, c_char_p], c_int),
    "lk_ops_config_set_override": ([_P(OpsConfig), c_char_p, c_char_p, c_char_p, c_char_p], c_int),
    "lk_ops_config_set_option": ([_P(OpsConfig), c_char_p, c_char_p, c_char_p], c_int),
    "lk_config_load_yaml": ([c_char_p, _P(OpsConfig)], c_int),
    "lk_ops_config_finalize": ([_P(OpsConfig)], c_int),
    "lk_model_register": ([c_void_p], c_int),
    "lk_model_build": ([_P(OpsConfig), c_char_p, _P(OpTable)], c_int),
    "lk_op_table_get": ([_P(OpTable), c_int, c_char_p], _P(Binding)),
    "lk_rms_norm_saved_bytes": ([_P(Impl), _P(Tensor), _P(c_size_t)], c_int),
    "lk_rms_norm_forward": ([_P(Impl), _P(RmsNormArgs), _P(Ctx)], c_int),
    "lk_rms_norm_backward": ([_P(Impl), _P(RmsNormArgs), _P(Ctx)], c_int),
    "lk_rope_saved_bytes": ([_P(Impl), _P(RopeArgs), _P(c_size_t)], c_int),
    "lk_rope_forward": ([_P(Impl), _P(RopeArgs), _P(Ctx)], c_int),
    "lk_rope_backward": ([_P(Impl), _P(RopeArgs), _P(Ctx)], c_int),
    "lk_swiglu_mlp_saved_bytes": ([_P(Impl), _P(Tensor), _P(Tensor), _P(c_size_t)], c_int),
    "lk_swiglu_mlp_forward": ([_P(Impl), _P(SwigluMlpArgs), _P(Ctx)], c_int),
    "lk_swiglu_mlp_backward": ([_P(Impl), _P(SwigluMlpArgs), _P(Ctx)], c_int),
    "lk_cross_entropy_args_init": ([], CrossEntropyArgs),
    "lk_cross_entropy_saved_bytes": ([_P(Impl), _P(CrossEntropyArgs), _P(c_size_t)], c_int),
    "lk_cross_entropy_forward": ([_P(Impl), _P(CrossEntropyArgs), _P(Ctx)], c_int),
    "lk_cross_entropy_backward": ([_P(Impl), _P(CrossEntropyArgs), _P(Ctx)], c_int),
    "lk_attention_saved_bytes": ([_P(Impl), _P(AttentionArgs), _P(c_size_t)], c_int),
    "lk_attention_takes_views": ([_P(Impl), _P(AttentionArgs)], c_int),
    "lk_attention_forward": ([_P(Impl), _P(AttentionArgs), _P(Ctx)], c_int),
    "lk_attention_backward": ([_P(Impl), _P(AttentionArgs), _P(Ctx)], c_int),
    "lk_block_mask_free": ([_P(BlockMask)], None),
    "lk_block_mask_causal": ([c_int64] * 6 + [_P(BlockMask)], c_int),
    "lk_block_mask_sliding_window": ([c_int64] * 7 + [_P(BlockMask)], c_int),
    "lk_block_mask_document_cu": ([_P(c_int32), c_int64, c_int, c_int64, c_int64, c_int64, c_int64,
                                   _P(BlockMask)], c_int),
    "lk_block_mask_document_ids": ([_P(c_int32), c_int, c_int64, c_int64, c_int64, c_int64, c_int64,
                                    _P(BlockMask)], c_int),
    "lk_block_mask_dense": ([c_void_p, _P(c_int64), c_int64, c_int64, _P(BlockMask)], c_int),
    "lk_moe_experts_saved_bytes": ([_P(Impl), c_int64, c_int64, c_int64, c_int64, c_int64, c_int,
                                    _P(c_size_t)], c_int),
    "lk_moe_experts_forward": ([_P(Impl), _P(MoeExpertsArgs), _P(Ctx)], c_int),
    "lk_moe_experts_backward": ([_P(Impl), _P(MoeExpertsArgs), _P(Ctx)], c_int),
}
for _name, (_args, _res) in _sigs.items():
    _f = getattr(lib, _name)
    _f.argtypes, _f.restype = _args, _res


def last_error():
    return (lib.lk_last_error() or b"").decode(errors="replace")


# A Python exception inside a callback the library made (the torch allocator) is kept
# here, per thread, and raised instead of the library's own message about it.
_pending = threading.local()


def keep_exception(e):
    _pending.exc = e


def check(status, what=""):
    """Raises LlmkernError for a status other than LK_OK (0)."""
    exc = getattr(_pending, "exc", None)
    _pending.exc = None
    if status == 0:
        return
    msg = last_error() or (what + ": failed")
    if exc is not None:
        raise LlmkernError(status, msg) from exc
    raise LlmkernError(status, msg)


check(lib.lk_init(), "lk_init")


def family(name):
    """The address of a model family (lk_family_qwen3, lk_family_qwen3_moe)."""
    return ctypes.cast(getattr(lib, "lk_family_" + name), c_void_p)


def hw():
    return lib.lk_hw_get().contents


def s(b):
    """A C string field or char * as str."""
    return b.decode() if isinstance(b, bytes) else (b or "")
