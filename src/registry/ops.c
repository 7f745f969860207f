/* ops.c — the catalog: every op the design names, its config field, every
 * implementation name users of the described system write (built here or not), its
 * reference implementation and its built-in defaults. A name in `known` that no
 * registered implementation carries is "not available in this build", never "unknown".
 * Other systems' names for the same implementations (NeMo AutoModel's) are the ops'
 * `aliases`: each is one llmkern implementation per device, or a name llmkern does not
 * implement, which an explicit request is refused for with the nearest one named. */
#include <stdio.h>
#include <string.h>
#include "llmkern/config.h"

#define NAMES(...) (const char *const[]){__VA_ARGS__, NULL}
#define ALIASES(...) (const lk_op_alias[]){__VA_ARGS__, {.name = NULL}}
#define EVERYWHERE(n) {[LK_DEVICE_CPU] = n, [LK_DEVICE_CUDA] = n}
#define BY_DEVICE(cpu, cuda) {[LK_DEVICE_CPU] = cpu, [LK_DEVICE_CUDA] = cuda}

/* NeMo AutoModel's BackendConfig names (model.backend.attn, .rms_norm, .rope, .experts,
 * .dispatcher, .linear; src/config/backend_yaml.c), resolved per op: `torch` is eager for
 * rms_norm, the all-gather dispatcher for moe_dispatch, BLAS or cuBLASLt for linear. */
#define NEMO "NeMo AutoModel"
#define SAME(n, llmkern) {.name = n, .origin = NEMO, .same_as = EVERYWHERE(llmkern)}
#define NOT_HERE(n, what_, near) {.name = n, .origin = NEMO, .nearest = near, .what = what_}

static const lk_op_info ops[LK_OP_COUNT] = {
    [LK_OP_ATTENTION] = {
        .op = LK_OP_ATTENTION, .name = "attention", .field = "attn_implementation",
        .known = NAMES("eager", "sdpa", "flash_attention_2", "flash_attention_3",
                       "flash_attention_4", "flex_attention", "cudnn", "native-sparse",
                       "llmkern_flash_attention_2_with_sp", "llmkern_flash_attention_3_with_sp",
                       "llmkern_flash_attention_4_with_sp", "llmkern_flex_attention_with_sp"),
        .reference = "eager", .default_fused = "flash_attention_2", .default_plain = "flash_attention_2",
        .gpu_defaults = (const lk_gpu_default[]){{90, "flash_attention_3"}, {80, "flash_attention_2"}, {0, NULL}},
        /* NeMo's eager, sdpa and cudnn are llmkern's names already. Its `torch` is its own
         * PyTorch attention path, whose numerics llmkern has not been held against: refused
         * with sdpa named, not taken for sdpa. */
        .aliases = ALIASES(
            SAME("flex", "flex_attention"),
            NOT_HERE("torch", "its own PyTorch attention path", EVERYWHERE("sdpa")),
            NOT_HERE("te", "Transformer Engine's DotProductAttention", BY_DEVICE("sdpa", "cudnn")),
            NOT_HERE("tilelang", "TileLang's sparse attention kernels", EVERYWHERE("flex_attention")),
            NOT_HERE("fa4", "FlashAttention-4 (CuTe DSL, Blackwell)", BY_DEVICE("flash_attention_2", "flash_attention_3")),
            NOT_HERE("magi", "MagiAttention", EVERYWHERE("flex_attention"))),
    },
    [LK_OP_CROSS_ENTROPY] = {
        .op = LK_OP_CROSS_ENTROPY, .name = "cross_entropy",
        .field = "cross_entropy_loss_implementation",
        .known = NAMES("eager", "fused", "chunk_loss"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_RMS_NORM] = {
        .op = LK_OP_RMS_NORM, .name = "rms_norm", .field = "rms_norm_implementation",
        .known = NAMES("eager", "eager_fp32", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        .aliases = ALIASES(
            SAME("torch", "eager"), SAME("torch_fp32", "eager_fp32"),
            NOT_HERE("te", "Transformer Engine's fused RMSNorm", EVERYWHERE("fused")),
            NOT_HERE("quack", "QuACK's CuTe DSL RMSNorm", EVERYWHERE("fused"))),
    },
    [LK_OP_ROPE] = {
        .op = LK_OP_ROPE, .name = "rope", .field = "rotary_pos_emb_implementation",
        .known = NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        /* NeMo's rope_fusion: true (TE's fused RoPE) is read as `fused` by the loader */
        .aliases = ALIASES(
            SAME("torch", "eager"),
            NOT_HERE("quack", "QuACK's rotary embedding", EVERYWHERE("fused")),
            NOT_HERE("triton", "the fused Triton rotation of DeepSeek V4", EVERYWHERE("fused"))),
    },
    [LK_OP_SWIGLU_MLP] = {
        .op = LK_OP_SWIGLU_MLP, .name = "swiglu_mlp", .field = "swiglu_mlp_implementation",
        .known = NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_MOE_EXPERTS] = {
        .op = LK_OP_MOE_EXPERTS, .name = "moe_experts", .field = "moe_implementation",
        .known = NAMES("eager", "fused", "fused_triton", "fused_sm90", "fused_quack", "fused_cublas"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        .aliases = ALIASES(
            SAME("torch", "eager"), SAME("torch_mm", "fused"), SAME("gmm", "fused"),
            NOT_HERE("te", "Transformer Engine's GroupedLinear", EVERYWHERE("fused")),
            NOT_HERE("torch_mm_mxfp8", "torchao's MXFP8 grouped GEMM", EVERYWHERE("fused"))),
    },
    [LK_OP_MOE_ROUTER] = {
        .op = LK_OP_MOE_ROUTER, .name = "moe_router", .field = "moe.router",
        .known = NAMES("softmax_topk", "sigmoid_bias", "fake_balanced"),
        .reference = "softmax_topk", .default_fused = "softmax_topk", .default_plain = "softmax_topk",
    },
    [LK_OP_MOE_DISPATCH] = {
        .op = LK_OP_MOE_DISPATCH, .name = "moe_dispatch", .field = "moe.dispatcher",
        .known = NAMES("local", "alltoall", "allgather"),
        .reference = "local", .default_fused = "local", .default_plain = "local",
        .aliases = ALIASES(
            SAME("torch", "allgather"),
            NOT_HERE("deepep", "DeepEP's dispatch and combine", EVERYWHERE("alltoall")),
            NOT_HERE("hybridep", "HybridEP's dispatch and combine", EVERYWHERE("alltoall")),
            NOT_HERE("uccl_ep", "UCCL-EP's dispatch and combine", EVERYWHERE("alltoall")),
            NOT_HERE("mok", "Mixture-of-Kittens' fused communication and SwiGLU megakernel", EVERYWHERE("alltoall"))),
    },
    [LK_OP_LINEAR] = {
        .op = LK_OP_LINEAR, .name = "linear", .field = "linear_implementation",
        .known = NAMES("blas", "cublaslt"),
        .reference = "blas", .default_fused = "blas", .default_plain = "blas",
        .aliases = ALIASES(
            {.name = "torch", .origin = NEMO, .same_as = BY_DEVICE("blas", "cublaslt")},
            NOT_HERE("te", "Transformer Engine's Linear", BY_DEVICE("blas", "cublaslt")),
            NOT_HERE("quack", "QuACK's CuTe DSL GEMM", BY_DEVICE("blas", "cublaslt"))),
    },
};

/* What the names this build may lack need, so a request for one can say so. */
static const struct { lk_op op; const char *name, *needs; } requirements[] = {
    {LK_OP_ATTENTION, "flash_attention_3", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_ATTENTION, "llmkern_flash_attention_3_with_sp", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_ATTENTION, "flash_attention_4", "a Blackwell GPU (sm_100) and CUDA"},
    {LK_OP_ATTENTION, "llmkern_flash_attention_4_with_sp", "a Blackwell GPU (sm_100) and CUDA"},
    {LK_OP_ATTENTION, "cudnn", "a CUDA GPU, cuDNN 9 and the cudnn-frontend headers at build time"},
    {LK_OP_MOE_EXPERTS, "fused_sm90", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_MOE_EXPERTS, "fused_quack", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_MOE_EXPERTS, "fused_cublas", "a CUDA GPU and cuBLAS"},
    {LK_OP_LINEAR, "cublaslt", "a CUDA GPU and cuBLASLt"},
};

const char *lk_op_name_needs(lk_op op, const char *name) {
    for (size_t i = 0; name && i < sizeof requirements / sizeof *requirements; i++)
        if (requirements[i].op == op && strcmp(requirements[i].name, name) == 0) return requirements[i].needs;
    return NULL;
}

const lk_op_info *lk_op_info_get(lk_op op) {
    return (unsigned)op < LK_OP_COUNT ? &ops[op] : NULL;
}

const lk_op_alias *lk_op_alias_find(lk_op op, const char *name) {
    const lk_op_info *info = lk_op_info_get(op);
    for (const lk_op_alias *a = info && name ? info->aliases : NULL; a && a->name; a++)
        if (strcmp(a->name, name) == 0) return a;
    return NULL;
}

void lk_op_names_text(lk_op op, char *buf, size_t n) {
    const lk_op_info *info = lk_op_info_get(op);
    size_t k = 0;
    buf[0] = '\0';
    for (const char *const *kn = info ? info->known : NULL; kn && *kn && k < n; kn++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", *kn);
    const char *origin = NULL;
    for (const lk_op_alias *a = info ? info->aliases : NULL; a && a->name && k < n; a++) {
        int first = origin == NULL || strcmp(origin, a->origin) != 0;
        k += (size_t)snprintf(buf + k, n - k, "%s%s%s%s", first && origin ? ")" : "", first ? " (" : ", ",
                              first ? a->origin : "", first ? ": " : "");
        k += k < n ? (size_t)snprintf(buf + k, n - k, "%s", a->name) : 0;
        origin = a->origin;
    }
    if (origin && k < n) snprintf(buf + k, n - k, ")");
}

const char *lk_op_suggest(lk_op op, const char *word) {
    const lk_op_info *info = lk_op_info_get(op);
    const char *names[64];
    size_t k = 0;
    for (const char *const *kn = info ? info->known : NULL; kn && *kn && k + 1 < 64; kn++) names[k++] = *kn;
    for (const lk_op_alias *a = info ? info->aliases : NULL; a && a->name && k + 1 < 64; a++) names[k++] = a->name;
    names[k] = NULL;
    return word ? lk_suggest(word, names) : NULL;
}

lk_status lk_op_parse(const char *name, lk_op *out) {
    for (int i = 0; name && i < LK_OP_COUNT; i++)
        if (strcmp(name, ops[i].name) == 0 || strcmp(name, ops[i].field) == 0) {
            *out = (lk_op)i;
            return LK_OK;
        }
    return lk_error(LK_EINVAL, "op: expected one of attention, cross_entropy, rms_norm, rope, "
                    "swiglu_mlp, moe_experts, moe_router, moe_dispatch, linear (or their config "
                    "fields), got '%s'", name ? name : "(null)");
}

const char *lk_source_name(lk_source s) {
    static const char *const n[] = {"default", "env", "config", "override"};
    return (unsigned)s < 4 ? n[s] : "?";
}

const char *lk_stage_name(lk_stage s) {
    static const char *const n[] = {"init", "model_register", "config_finalize", "model_build",
                                    "runtime"};
    return (unsigned)s < 5 ? n[s] : "?";
}
