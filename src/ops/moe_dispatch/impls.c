/* impls.c — the registry rows of moe_dispatch (include/llmkern/moe_dispatch.h). The
 * multi-process dispatchers take any communicator (the single-process one included),
 * so they need no LK_NEED_MPI: without MPI they run, on one process. The CUDA rows share
 * the CPU rows' vtables (the moves follow the tensors' device, rows.c) and run the CUDA
 * experts; across ranks they need an NCCL group, which the facade checks per call. */
#include "ops/moe_dispatch/internal.h"

#define DISPATCH_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_moe_dispatch_impls[] = {
    {
        .op = LK_OP_MOE_DISPATCH, .name = "local", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_local_vtable,
        .summary = "one process owns every expert: the experts op itself",
    },
    {
        .op = LK_OP_MOE_DISPATCH, .name = "alltoall", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_alltoall_vtable,
        .summary = "counts exchanged, routes sent to their experts' owners, results returned (any lk_comm)",
    },
    {
        .op = LK_OP_MOE_DISPATCH, .name = "allgather", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_allgather_vtable,
        .summary = "all tokens gathered, own experts run, reduce-scatter back (any lk_comm)",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_MOE_DISPATCH, .name = "local", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_local_vtable,
        .summary = "one GPU owns every expert: the CUDA experts op itself",
    },
    {
        .op = LK_OP_MOE_DISPATCH, .name = "alltoall", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_alltoall_vtable,
        .summary = "the CPU row's plan on the host, rows moved by kernels and NCCL, CUDA experts",
    },
    {
        .op = LK_OP_MOE_DISPATCH, .name = "allgather", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = DISPATCH_DTYPES}, .vtable = &lk_moe_dispatch_allgather_vtable,
        .summary = "all tokens gathered over NCCL, own CUDA experts run, reduce-scatter back",
    },
#endif
    {.name = NULL},
};
