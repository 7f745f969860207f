/* env.c — every environment variable llmkern reads, in one table: its name, the
 * described system's name for it (an alias, so scripts written for VeOmni keep
 * working), its default, its valid values and what it means. Nothing else calls getenv. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/config.h"

#define VALUES(...) (const char *const[]){__VA_ARGS__, NULL}

static const lk_env_var table[LK_ENV_COUNT] = {
    [LK_ENV_BACKEND] = {
        .name = "LLMKERN_BACKEND", .alias = "MODELING_BACKEND", .def = "llmkern",
        .values = VALUES("llmkern", "reference"),
        .value_aliases = VALUES("veomni", "llmkern", "hf", "reference"),
        .meaning = "llmkern: fused defaults and the SP-aware attention names; reference: every "
                   "op's reference implementation, no rewrite",
    },
    [LK_ENV_USE_FUSED] = {
        .name = "LLMKERN_USE_FUSED", .alias = "VEOMNI_USE_LIGER_KERNEL", .def = "1",
        .values = VALUES("1", "0"),
        .meaning = "1: fused RMSNorm, RoPE, SwiGLU and cross-entropy by default; 0: eager",
    },
    [LK_ENV_USE_GROUP_GEMM] = {
        .name = "LLMKERN_USE_GROUP_GEMM", .alias = "USE_GROUP_GEMM", .def = "1",
        .values = VALUES("1", "0"),
        .meaning = "1: grouped-GEMM MoE experts by default; 0: the per-expert loop",
    },
    [LK_ENV_ENABLE_CHUNK_LOSS] = {
        .name = "LLMKERN_ENABLE_CHUNK_LOSS", .alias = "VEOMNI_ENABLE_CHUNK_LOSS", .def = "0",
        .values = VALUES("0", "1"),
        .meaning = "1: chunk_loss cross-entropy when no config field names one",
    },
    [LK_ENV_GG_SM90] = {
        .name = "LLMKERN_GG_SM90", .def = "auto",
        .values = VALUES("auto", "coop", "pingpong", "pingpong_v4", "coop_cluster"),
        .meaning = "the Hopper MoE grouped GEMM's schedule (moe/grouped_sm90.cu): auto, each GEMM on "
                   "the one measured fastest for it; coop, two consumer warpgroups on one 128x256 "
                   "tile; pingpong, each on its own 128x128 tile, one's epilogue under the other's "
                   "mainloop; pingpong_v4, with 16-byte epilogue accesses; coop_cluster, coop on "
                   "two-CTA clusters sharing the weight tile's loads (TMA multicast)",
    },
    [LK_ENV_GEMM_TUNE] = {
        .name = "LLMKERN_GEMM_TUNE", .def = "0",
        .values = VALUES("0", "1"),
        .meaning = "1: the first call of each cuBLASLt GEMM shape times the heuristic's offers (up to 8), "
                   "each looped 0.2 s on the call's own operands, and keeps the fastest: a training step "
                   "runs at the board's power cap, where they rank otherwise than at the boost clock the "
                   "heuristic ranks by (core/cublaslt_cuda.c); up to 1.6 s a shape in a run's first "
                   "step, not under CUDA graph capture. The pick follows timings, so two runs may "
                   "differ in the last bits (a resumed run is not bit-identical to a straight one); "
                   "0: the heuristic's first, the same every run",
    },
};

const lk_env_var *lk_env_var_get(lk_env_id id) {
    return (unsigned)id < LK_ENV_COUNT ? &table[id] : NULL;
}

/* The canonical form of value, or NULL when it is not valid for v. */
static const char *canonical(const lk_env_var *v, const char *value) {
    for (const char *const *x = v->values; *x; x++)
        if (strcmp(*x, value) == 0) return *x;
    for (const char *const *a = v->value_aliases; a && a[0] && a[1]; a += 2)
        if (strcmp(a[0], value) == 0) return a[1];
    return NULL;
}

lk_status lk_env_read(lk_env_value out[LK_ENV_COUNT]) {
    lk_env_value read[LK_ENV_COUNT];
    for (int i = 0; i < LK_ENV_COUNT; i++) {
        const lk_env_var *v = &table[i];
        const char *name = v->name, *raw = getenv(name);
        if (raw == NULL && v->alias) raw = getenv(name = v->alias);
        const char *value = raw ? canonical(v, raw) : v->def;
        if (value == NULL) {
            char valid[128];
            size_t k = 0;
            for (const char *const *x = v->values; *x; x++)
                k += (size_t)snprintf(valid + k, sizeof valid - k, "%s%s", k ? ", " : "", *x);
            for (const char *const *a = v->value_aliases; a && a[0] && a[1]; a += 2)
                k += (size_t)snprintf(valid + k, sizeof valid - k, ", %s", a[0]);
            return lk_error(LK_EINVAL, "environment: %s: expected one of %s, got '%s'", name, valid, raw);
        }
        snprintf(read[i].value, sizeof read[i].value, "%s", value);
        snprintf(read[i].set_by, sizeof read[i].set_by, "%s", raw ? name : "");
        snprintf(read[i].raw, sizeof read[i].raw, "%s", raw ? raw : "");
    }
    memcpy(out, read, sizeof read);
    return LK_OK;
}

int lk_env_openmp_defaults(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return 0;
    return setenv("OMP_WAIT_POLICY", "passive", 0) == 0;
}
