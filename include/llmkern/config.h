/* config.h — the two sources of selection besides the built-in defaults: the
 * environment table (src/config/env.c, every variable read in one place) and the
 * ops configuration (model.ops_implementation.* in YAML, with per-module overrides, or
 * NeMo AutoModel's model.backend section, src/config/backend_yaml.c). */
#ifndef LLMKERN_CONFIG_H
#define LLMKERN_CONFIG_H

#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- environment --------------------------------------------------------------- */

typedef enum {
    LK_ENV_BACKEND,             /* llmkern | reference          (alias MODELING_BACKEND: veomni | hf) */
    LK_ENV_USE_FUSED,           /* 1 | 0                        (alias VEOMNI_USE_LIGER_KERNEL) */
    LK_ENV_USE_GROUP_GEMM,      /* 1 | 0                        (alias USE_GROUP_GEMM) */
    LK_ENV_ENABLE_CHUNK_LOSS,   /* 0 | 1                        (alias VEOMNI_ENABLE_CHUNK_LOSS) */
    LK_ENV_GG_SM90,             /* auto | coop | pingpong | pingpong_v4 | coop_cluster (the Hopper MoE grouped GEMM's schedule) */
    LK_ENV_GEMM_TUNE,           /* 0 | 1 (cuBLASLt's offers timed at the power cap on each shape's first call) */
    LK_ENV_COUNT
} lk_env_id;

typedef struct {
    const char *name;                 /* LLMKERN_USE_FUSED */
    const char *alias;                /* the described system's name, or NULL */
    const char *def;                  /* default value */
    const char *const *values;        /* valid values, NULL-terminated */
    const char *const *value_aliases; /* "veomni", "llmkern", ... pairs, NULL-terminated, or NULL */
    const char *meaning;
} lk_env_var;

typedef struct {
    char value[32];                   /* canonical value in force */
    char set_by[48];                  /* the variable that set it; "" when it is the default */
    char raw[32];                     /* its value as written ("veomni" for llmkern, say) */
} lk_env_value;

LK_API const lk_env_var *lk_env_var_get(lk_env_id id);
/* Reads every variable of the table (the llmkern name first, then its alias).
 * Strict: a value outside the valid ones is LK_EINVAL naming the variable and the
 * valid values, and out is left as it was. */
LK_API lk_status lk_env_read(lk_env_value out[LK_ENV_COUNT]);
/* OpenMP's own variables (libgomp reads them once, as it loads): when neither
 * OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets OMP_WAIT_POLICY=passive and returns 1,
 * so a program that wants it (the llmkern command) starts itself again; 0 when the user
 * chose. Spinning barriers on a 2-core machine with another process busy ran training
 * 70-90x slower than sleeping ones (bench/NOTES.md, "OpenMP under load"). */
LK_API int lk_env_openmp_defaults(void);
/* The values in force: read by lk_init; lk_env_reload reads them again (tests, tools). */
LK_API const lk_env_value *lk_env(lk_env_id id);
LK_API lk_status lk_env_reload(void);

/* --- ops configuration --------------------------------------------------------- */

#define LK_MAX_OVERRIDES 64

typedef struct {
    char value[64];                   /* "" = not set */
    char where[192];                  /* "configs/x.yaml:4:28", or "" when set from code */
} lk_config_value;

typedef struct {
    char module[96];                  /* "layers.0.input_layernorm" */
    lk_op op;
    lk_config_value v;
} lk_override;

typedef struct lk_ops_config {
    lk_config_value field[LK_OP_COUNT];
    lk_override overrides[LK_MAX_OVERRIDES];
    int n_overrides;
    lk_device_type device;            /* where the model runs: selection filters by it */
    /* The MoE router's options (lk_ops_config_set_option), as written; "" = not set. */
    lk_config_value fake_gate_noise;  /* "0.3": a number in [0, 1] */
    lk_config_value gate_precision;   /* "float32" (canonical) */
    /* The environment defaults the config resolves with, below its fields and overrides:
     * lk_ops_config_init copies the values in force (lk_env); set them to resolve the
     * config as under another environment (an entry whose value is "" takes the value in
     * force). lk_ops_config_finalize and lk_model_build resolve with these. */
    lk_env_value env[LK_ENV_COUNT];
    /* Written by lk_ops_config_finalize: */
    int finalized;
    unsigned bound_mask;              /* bit (1u << op) for each op bound from a field */
    lk_binding bound[LK_OP_COUNT];
    lk_binding module_bound[LK_MAX_OVERRIDES];
    lk_router_options router;         /* the options above, parsed; lk_model_build copies them */
} lk_ops_config;

/* An empty config on the CPU, with the environment defaults in force (lk_env). */
LK_API void lk_ops_config_init(lk_ops_config *cfg);
/* Sets a field ("rms_norm_implementation" or the op name) by code. The value must be a
 * known name of the op (LK_EINVAL with a did-you-mean otherwise). */
LK_API lk_status lk_ops_config_set(lk_ops_config *cfg, const char *field, const char *value,
                            const char *where);
LK_API lk_status lk_ops_config_set_override(lk_ops_config *cfg, const char *module, const char *field,
                                     const char *value, const char *where);
/* Sets a MoE router option by code: "fake_gate_noise" (a number in [0, 1]; NeMo
 * AutoModel's name, used by the fake_balanced router) or "gate_precision" ("float32",
 * also written "torch.float32" or "fp32": the router's GEMM and softmax in f32). A value
 * out of range or of another kind is LK_EINVAL naming the option, the expected values and
 * the value; cfg is then unchanged. lk_ops_config_finalize refuses a noise above 0 when
 * no router binding is fake_balanced. */
LK_API lk_status lk_ops_config_set_option(lk_ops_config *cfg, const char *option, const char *value,
                                   const char *where);

/* Loads a YAML file into cfg. Every error (unreadable file, malformed YAML, an unknown
 * key, an unknown implementation, a wrong type) is LK_EIO or LK_EINVAL with
 * file:line:column, the field, and the valid names; cfg is then unchanged. */
LK_API lk_status lk_config_load_yaml(const char *path, lk_ops_config *cfg);

/* The candidate closest to word (edit distance), or NULL if none is close. */
LK_API const char *lk_suggest(const char *word, const char *const *candidates);

#ifdef __cplusplus
}
#endif
#endif
