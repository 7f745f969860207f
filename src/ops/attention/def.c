/* def.c — attention's descriptor (lk_attention_def, src/ops/op_def.h): its catalog entry,
 * its harness, and its registry rows on the CPU and, built with CUDA, on the GPU (the
 * flash adapter's rows: fa2.cu, fa3.cu, sdpa_cudnn.cpp). Every row points at an
 * lk_attention_entry: which adapter of the facade (attention.c) it enters, whether
 * through the SP path, and on the GPU the backend it runs. With LLMKERN_BACKEND=llmkern the registry rewrites
 * flash_attention_2 and flex_attention to the llmkern_*_with_sp rows, which reach the
 * same adapters. flash_attention_3 is Hopper-only and has no CPU row. */
#include "ops/attention/internal.h"
#include "ops/op_def.h"

extern const lk_harness lk_attention_harness;

#define CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

static const lk_attention_entry eager = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_EAGER};
static const lk_attention_entry flash = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH};
static const lk_attention_entry flex = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLEX};
static const lk_attention_entry flash_sp = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH, .sp = 1};
static const lk_attention_entry flex_sp = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLEX, .sp = 1};
#ifdef LLMKERN_HAVE_CUDA
static const lk_attention_entry flash_fa2 = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH,
                                             .cuda = &lk_attention_fa2_cuda_backend};
static const lk_attention_entry flash_fa2_sp = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH,
                                                .sp = 1, .cuda = &lk_attention_fa2_cuda_backend};
static const lk_attention_entry flex_gpu = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLEX,
                                            .cuda = &lk_attention_fa3_flex_cuda_backend};
static const lk_attention_entry flex_gpu_sp = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLEX,
                                               .sp = 1, .cuda = &lk_attention_fa3_flex_cuda_backend};
static const lk_attention_entry fa3 = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH,
                                       .cuda = &lk_attention_fa3_cuda_backend};
static const lk_attention_entry fa3_sp = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH, .sp = 1,
                                          .cuda = &lk_attention_fa3_cuda_backend};
#endif
#ifdef LLMKERN_HAVE_CUDNN
static const lk_attention_entry cudnn_entry = {.version = LK_ATTENTION_ENTRY_VERSION, .adapter = LK_ATTN_FLASH,
                                               .cuda = &lk_attention_cudnn_backend};
#endif

static const lk_impl rows[] = {
    {
        .op = LK_OP_ATTENTION, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = CPU_DTYPES},
        .vtable = &eager,
        .summary = "materialized scores per head, any dense mask, softmax, GEMMs through BLAS",
    },
    {
        .op = LK_OP_ATTENTION, .name = "sdpa", .device = LK_DEVICE_CPU, .needs = {.dtypes = CPU_DTYPES},
        .vtable = &flash,
        .summary = "the flash adapter: tiled online softmax, O(S) memory, LSE saved",
    },
    {
        .op = LK_OP_ATTENTION, .name = "flash_attention_2", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CPU_DTYPES}, .vtable = &flash,
        .summary = "FA-2 loop order on the CPU: 64x64 tiles, backward recomputes P from the LSE",
    },
    {
        .op = LK_OP_ATTENTION, .name = "flex_attention", .device = LK_DEVICE_CPU, .needs = {.dtypes = CPU_DTYPES},
        .vtable = &flex,
        .summary = "block-sparse over a BlockMask: empty blocks skipped, full blocks unmasked",
    },
    {
        .op = LK_OP_ATTENTION, .name = "llmkern_flash_attention_2_with_sp", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CPU_DTYPES, .sp_aware = 1}, .vtable = &flash_sp,
        .summary = "SP-aware facade name for flash_attention_2 (one process: no exchange)",
    },
    {
        .op = LK_OP_ATTENTION, .name = "llmkern_flex_attention_with_sp", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CPU_DTYPES, .sp_aware = 1}, .vtable = &flex_sp,
        .summary = "SP-aware facade name for flex_attention (one process: no exchange)",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_ATTENTION, .name = "sdpa", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = CPU_DTYPES}, .vtable = &flash_fa2,
        .summary = "the flash adapter on flash_attention_2's kernel: bf16 on tensor cores (f32 on CUDA cores)",
    },
    {
        .op = LK_OP_ATTENTION, .name = "flash_attention_2", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = CPU_DTYPES}, .vtable = &flash_fa2,
        .summary = "FA-2 on tensor cores (mma.sync, bf16; f32 on CUDA cores); backward not deterministic "
                   "(dq, and unmasked the last wave's dk/dv, by atomics) unless asked",
    },
    {
        .op = LK_OP_ATTENTION, .name = "llmkern_flash_attention_2_with_sp", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = CPU_DTYPES, .sp_aware = 1}, .vtable = &flash_fa2_sp,
        .summary = "SP-aware flash_attention_2: Ulysses over an NCCL group around its tensor-core kernel",
    },
    {
        .op = LK_OP_ATTENTION, .name = "flex_attention", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = LK_DTYPE_BIT(LK_BF16)}, .vtable = &flex_gpu,
        .summary = "block-sparse over a BlockMask (bf16): empty tiles skipped, full ones unmasked, partial ones by "
                   "bits made on the device for the standard families; score_mod softcap or ALiBi; Hopper's "
                   "kernels (D <= 128), else flash_attention_2's",
    },
    {
        .op = LK_OP_ATTENTION, .name = "llmkern_flex_attention_with_sp", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = LK_DTYPE_BIT(LK_BF16), .sp_aware = 1}, .vtable = &flex_gpu_sp,
        .summary = "SP-aware flex_attention: Ulysses over an NCCL group around the BlockMask kernels",
    },
    {
        .op = LK_OP_ATTENTION, .name = "flash_attention_3", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 90, .dtypes = CPU_DTYPES}, .vtable = &fa3,
        .summary = "Hopper (bf16, D <= 128): TMA producer, two wgmma consumer warpgroups, forward and backward "
                   "(dq, and unmasked the last wave's dk/dv, by f32 reductions; deterministic, softcap and the "
                   "rest: flash_attention_2's); q/k/v and gradients as strided views",
    },
    {
        .op = LK_OP_ATTENTION, .name = "llmkern_flash_attention_3_with_sp", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 90, .dtypes = CPU_DTYPES, .sp_aware = 1}, .vtable = &fa3_sp,
        .summary = "SP-aware flash_attention_3: Ulysses over an NCCL group around the Hopper kernel",
    },
#ifdef LLMKERN_HAVE_CUDNN
    {
        .op = LK_OP_ATTENTION, .name = "cudnn", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .needs = LK_NEED_CUDNN, .dtypes = LK_DTYPE_BIT(LK_BF16)}, .vtable = &cudnn_entry,
        .summary = "cuDNN 9's fused flash SDPA (cudnn-frontend graph per shape): causal, window, GQA, varlen",
    },
#endif
#endif
    {.name = NULL},
};

#define HOPPER "a Hopper GPU (sm_90) and CUDA"

const lk_op_def lk_attention_def = {
    .info = {
        .op = LK_OP_ATTENTION, .name = "attention", .field = "attn_implementation",
        .known = LK_NAMES("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                          "flex_attention", "cudnn", "native-sparse", "llmkern_flash_attention_2_with_sp",
                          "llmkern_flash_attention_3_with_sp", "llmkern_flash_attention_4_with_sp",
                          "llmkern_flex_attention_with_sp"),
        .reference = "eager", .default_fused = "flash_attention_2", .default_plain = "flash_attention_2",
        .gpu_defaults = (const lk_gpu_default[]){{90, "flash_attention_3"}, {80, "flash_attention_2"}, {0, NULL}},
        /* NeMo's eager, sdpa and cudnn are llmkern's names already. Its `torch` is its own
         * PyTorch attention path, whose numerics llmkern has not been held against: refused
         * with sdpa named, not taken for sdpa. */
        .aliases = LK_ALIASES(
            LK_NEMO_SAME("flex", "flex_attention"),
            LK_NEMO_NOT_HERE("torch", "its own PyTorch attention path", LK_EVERYWHERE("sdpa")),
            LK_NEMO_NOT_HERE("te", "Transformer Engine's DotProductAttention", LK_BY_DEVICE("sdpa", "cudnn")),
            LK_NEMO_NOT_HERE("tilelang", "TileLang's sparse attention kernels", LK_EVERYWHERE("flex_attention")),
            LK_NEMO_NOT_HERE("fa4", "FlashAttention-4 (CuTe DSL, Blackwell)",
                             LK_BY_DEVICE("flash_attention_2", "flash_attention_3")),
            LK_NEMO_NOT_HERE("magi", "MagiAttention", LK_EVERYWHERE("flex_attention"))),
    },
    .impls = rows, .harness = &lk_attention_harness,
    .name_needs = LK_NEEDS({"flash_attention_3", HOPPER}, {"llmkern_flash_attention_3_with_sp", HOPPER},
                           {"flash_attention_4", "a Blackwell GPU (sm_100) and CUDA"},
                           {"llmkern_flash_attention_4_with_sp", "a Blackwell GPU (sm_100) and CUDA"},
                           {"cudnn", "a CUDA GPU, cuDNN 9 and the cudnn-frontend headers at build time"}),
    /* the entries have no members beyond the version: the facade resolves each adapter */
};
