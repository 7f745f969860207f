/* registry.h — the one registry: ops, their implementations and requirements, the
 * hardware they are checked against, selection with its precedence, and the five
 * lifecycle stages that bind implementations to a model.
 *
 * Precedence, written once (lk_select): a per-module override, then the per-op config
 * field, then the environment default, then the built-in default. An explicit request
 * (override or field) that cannot be met is an error; only a default may fall back,
 * and the fallback is recorded in the binding. */
#ifndef LLMKERN_REGISTRY_H
#define LLMKERN_REGISTRY_H

#include <stddef.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every op, once, in lk_op's order (the numbers are ABI: append only). X(NAME, name)
 * makes LK_OP_NAME below and, in the registry (src/registry/ops.c), the slot of
 * lk_<name>_def, the descriptor its folder src/ops/ exports (src/ops/op_def.h): adding an
 * op is that folder and one line here. */
#define LK_OPS(X)                       \
    X(ATTENTION, attention)             \
    X(CROSS_ENTROPY, cross_entropy)     \
    X(RMS_NORM, rms_norm)               \
    X(ROPE, rope)                       \
    X(SWIGLU_MLP, swiglu_mlp)           \
    X(MOE_EXPERTS, moe_experts)         \
    X(MOE_ROUTER, moe_router)           \
    X(MOE_DISPATCH, moe_dispatch)       \
    X(LINEAR, linear)                   \
    /* a new op: its line above this one */

typedef enum {
#define LK_OP_ENUM_(NAME, name) LK_OP_##NAME,
    LK_OPS(LK_OP_ENUM_)
#undef LK_OP_ENUM_
    LK_OP_COUNT
} lk_op;

/* A built-in default on a GPU: asked for where the probed device has compute capability
 * >= min_cc. */
typedef struct {
    int min_cc;
    const char *name;
} lk_gpu_default;

/* A name another training system writes for one of an op's implementations (NeMo
 * AutoModel's `torch_fp32` for rms_norm). Selection resolves it per op and device: to the
 * llmkern implementation it is (same_as), or, where llmkern has none (same_as NULL), to
 * an error naming the nearest llmkern one. Never a silent substitute. */
typedef struct {
    const char *name;                       /* "torch_fp32" */
    const char *origin;                     /* "NeMo AutoModel" */
    const char *same_as[LK_DEVICE_COUNT];   /* the llmkern name per device, or NULL: not in llmkern */
    const char *nearest[LK_DEVICE_COUNT];   /* same_as NULL: the nearest llmkern implementation */
    const char *what;                       /* same_as NULL: what it is ("Transformer Engine's fused RMSNorm") */
} lk_op_alias;

/* What the project knows of an op, whether or not this build implements it. */
typedef struct {
    lk_op op;
    const char *name;               /* "rms_norm" */
    const char *field;              /* config field: "rms_norm_implementation" */
    const char *const *known;       /* every name the design gives it, NULL-terminated */
    const char *reference;          /* the plain implementation every other is held against */
    const char *default_fused;      /* built-in default with LLMKERN_USE_FUSED=1 */
    const char *default_plain;      /* ... with LLMKERN_USE_FUSED=0 or LLMKERN_BACKEND=reference */
    /* The built-in default on a GPU, most capable first, {0, NULL} last (NULL: default_fused):
     * the first the GPU meets is asked for, the later ones it meets are its fallbacks. */
    const lk_gpu_default *gpu_defaults;
    const lk_op_alias *aliases;     /* other systems' names, terminated by a NULL name; or NULL */
} lk_op_info;

LK_API const lk_op_info *lk_op_info_get(lk_op op);
/* The other system's name `name` of op (lk_op_info.aliases), or NULL when it is none. */
LK_API const lk_op_alias *lk_op_alias_find(lk_op op, const char *name);
/* "eager, eager_fp32, fused (NeMo AutoModel: torch, torch_fp32, te, quack)": every name
 * op takes, for error messages. */
LK_API void lk_op_names_text(lk_op op, char *buf, size_t n);
/* The name of op (llmkern's or an alias) closest to word, or NULL if none is close. */
LK_API const char *lk_op_suggest(lk_op op, const char *word);
/* What a name of op needs that a build or machine may lack ("a Hopper GPU (sm_90) and
 * CUDA"), or NULL when it needs nothing special. */
LK_API const char *lk_op_name_needs(lk_op op, const char *name);
LK_API lk_status lk_op_parse(const char *name, lk_op *out);      /* op name or config field */

/* The machine, probed once per device kind (hw_cpu.c, hw_cuda.c). */
typedef struct {
    int cpu_cores;
    int cpu_avx2, cpu_avx512f;
    char cpu_model[64];
    int cuda_devices;               /* 0 when built without CUDA or no GPU is present */
    int cuda_cc;                    /* compute capability of device 0, e.g. 90 */
    int has_cudnn, has_mpi, has_nccl;
    /* Device 0, filled by hw_cuda.c (cudaGetDeviceProperties) when cuda_devices > 0. */
    int cuda_sms;                   /* multiprocessors */
    size_t cuda_smem_per_block;     /* shared memory a block may opt in to, bytes */
    size_t cuda_l2_bytes;
    char cuda_name[96];             /* "NVIDIA H200" */
    char cuda_why[128];             /* why cuda_devices is 0: "built without CUDA", the runtime's error */
    size_t cpu_mem_bytes;           /* physical memory (0: unknown); what cannot fit is refused before it is allocated */
} lk_hw;

LK_API const lk_hw *lk_hw_get(void);
/* The memory a run can take on device now, in bytes (0: unknown), and in source what
 * the number is, worded to follow it ("23.5 GiB" + " of host RAM available
 * (MemAvailable)", " free on GPU 0 (cudaMemGetInfo, of 139.8 GiB)"): on the CPU the
 * host's MemAvailable (/proc/meminfo) capped by a cgroup v2 memory.max less
 * memory.current; on CUDA the current GPU's free memory (cudaMemGetInfo; 0 in a build
 * without CUDA). Read afresh at every call. */
LK_API uint64_t lk_hw_mem_available(lk_device_type device, char *source, size_t n);
#ifdef LLMKERN_HAVE_CUDA
LK_API uint64_t lk_hw_cuda_mem_free(char *source, size_t n);   /* hw_cuda.c */
#endif

enum {                               /* lk_requirements.needs */
    LK_NEED_CUDNN = 1u << 0,
    LK_NEED_MPI   = 1u << 1,
    LK_NEED_NCCL  = 1u << 2,
};
#define LK_DTYPE_BIT(dt) (1u << (dt))

typedef struct {
    int min_cc;                     /* CUDA compute capability, 0 = any */
    unsigned needs;                 /* LK_NEED_* */
    unsigned dtypes;                /* LK_DTYPE_BIT mask of storage dtypes taken */
    int sp_aware;                   /* runs under Ulysses sequence parallelism */
} lk_requirements;

typedef struct lk_impl {
    lk_op op;
    const char *name;
    const char *const *aliases;     /* NULL-terminated, or NULL */
    lk_device_type device;
    lk_requirements needs;
    /* Optional extra hardware condition; fills why (size n) when it says no. */
    int (*supported)(const lk_hw *hw, char *why, size_t n);
    const void *vtable;             /* the op's own struct of forward/backward pointers */
    const char *summary;            /* one line for `llmkern list` */
} lk_impl;

/* Adds an implementation (a static, const entry the caller keeps alive). lk_init()
 * registers the built-in ones. A second entry with the same op, name and device is
 * an error. */
LK_API lk_status lk_impl_register(const lk_impl *impl);
LK_API int lk_impl_count(void);
LK_API const lk_impl *lk_impl_at(int i);
/* By name or alias for an op and device; NULL when there is none. */
LK_API const lk_impl *lk_impl_find(lk_op op, const char *name, lk_device_type dev);
/* 1 when impl can run here; otherwise 0 with the unmet requirement in why. */
LK_API int lk_impl_available(const lk_impl *impl, const lk_hw *hw, char *why, size_t n);
LK_API int lk_impl_is_reference(const lk_impl *impl);
/* 1 when name is a name of op that the design lists or some registered entry carries. */
LK_API int lk_impl_name_known(lk_op op, const char *name);

/* --- bindings ------------------------------------------------------------------ */

typedef enum {
    LK_SOURCE_DEFAULT,      /* built-in default */
    LK_SOURCE_ENV,          /* an environment variable */
    LK_SOURCE_CONFIG,       /* the per-op config field */
    LK_SOURCE_OVERRIDE      /* a per-module override */
} lk_source;

typedef enum {
    LK_STAGE_INIT,              /* lk_init */
    LK_STAGE_MODEL_REGISTER,    /* lk_model_register */
    LK_STAGE_CONFIG_FINALIZE,   /* lk_ops_config_finalize */
    LK_STAGE_MODEL_BUILD,       /* lk_model_build */
    LK_STAGE_RUNTIME
} lk_stage;

LK_API const char *lk_source_name(lk_source s);
LK_API const char *lk_stage_name(lk_stage s);

/* One op (or one module's op) bound to an implementation, with the story of why. */
typedef struct {
    lk_op op;
    char module[96];            /* "" for the op-wide binding */
    char requested[64];         /* the value as written */
    lk_source source;
    char source_detail[128];    /* "LLMKERN_USE_FUSED=0", "cfg.yaml:4:28", ... */
    char resolved[96];          /* after aliases and the SP rewrite */
    const lk_impl *impl;        /* NULL when the op has no implementation in this build */
    lk_stage stage;
    char fallback[192];         /* "" unless a default fell back, and why */
} lk_binding;

/* A request for selection: name NULL means "use the defaults". */
typedef struct {
    lk_op op;
    const char *module;
    const char *name;
    lk_source source;
    const char *source_detail;
    lk_device_type device;
} lk_request;

/* Selects an implementation. LK_EUNAVAILABLE or LK_EINVAL for an explicit request
 * that is unknown or cannot run here (the message names the unmet requirement and
 * the implementations that would work); a default falls back instead. */
LK_API lk_status lk_select(const lk_request *req, lk_stage stage, lk_binding *out);

/* --- lifecycle ----------------------------------------------------------------- */

struct lk_ops_config;

/* A model family: its modules (patterns such as "layers.*.input_layernorm") and which
 * fused replacements apply to it. */
typedef struct {
    const char *pattern;
    lk_op op;
} lk_module_decl;

typedef struct {
    const char *name;                   /* "qwen3" */
    const lk_module_decl *modules;      /* terminated by a NULL pattern */
    unsigned fused_ops;                 /* bit (1u << lk_op) per op with a fused replacement */
} lk_model_family;

#define LK_MAX_MODULE_BINDINGS 64

/* What every MoE layer's router call takes besides its tensors (moe.h's noise and
 * gate_f32), from the config (lk_ops_config_set_option). */
typedef struct {
    float noise;                /* fake_gate_noise: the fake_balanced router's noise, in [0, 1] */
    int gate_f32;               /* gate_precision float32: the router's GEMM and softmax in f32 */
} lk_router_options;

/* The bound op table a model runs with: no name lookups after lk_model_build. */
typedef struct {
    const lk_model_family *family;
    lk_device_type device;
    lk_binding op[LK_OP_COUNT];
    lk_binding module[LK_MAX_MODULE_BINDINGS];
    int n_module;
    lk_router_options router;   /* for every MoE layer's router */
} lk_op_table;

/* 1. Import time: registers the built-in implementations, reads the environment
 *    table, registers the attention facade under its SP names, binds the loss slot.
 *    Idempotent; every other stage calls it. */
LK_API lk_status lk_init(void);
/* 2. Model registration: declares a family's modules and binds its fused replacements. */
LK_API lk_status lk_model_register(const lk_model_family *family);
LK_API const lk_model_family *lk_model_family_find(const char *name);
/* 3. Config post-init: validates every name, binds the explicit fields and overrides,
 *    and (with the llmkern backend) rewrites flash_attention_{2,3,4} / flex_attention
 *    to llmkern_<name>_with_sp. Changes nothing on error. */
LK_API lk_status lk_ops_config_finalize(struct lk_ops_config *cfg);
/* 4. Build time: binds the deferred ops (MoE experts) and assembles the op table. */
LK_API lk_status lk_model_build(const struct lk_ops_config *cfg, const char *family, lk_op_table *out);
/* 5. Runtime: the binding a module runs with (its override, else the op's). */
LK_API const lk_binding *lk_op_table_get(const lk_op_table *t, lk_op op, const char *module);

/* The binding lk_init made for the loss slot. */
LK_API const lk_binding *lk_loss_slot(void);

#ifdef __cplusplus
}
#endif
#endif
