/* def.c — moe_dispatch's descriptor (lk_moe_dispatch_def, src/ops/op_def.h): its catalog
 * entry, its registry rows and the members its vtables must have; it has no harness (the
 * dispatchers are checked by tests/test_moe.c and tests/dist). The multi-process
 * dispatchers take any communicator (the single-process one included), so they need no
 * LK_NEED_MPI: without MPI they run, on one process. The CUDA local shares the CPU row's
 * vtable (the experts op of the tensors' device); the CUDA alltoall and allgather are their
 * own (alltoall_cuda.c, allgather_cuda.c: the plan on the device). All run the CUDA
 * experts; across ranks they need an NCCL group, which the facade checks per call. */
#include "ops/moe_dispatch/internal.h"
#include "ops/op_def.h"

static const lk_impl rows[] = {
    {.op = LK_OP_MOE_DISPATCH, .name = "local", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_dispatch_local_vtable, .summary = "one process owns every expert: the experts op itself"},
    {.op = LK_OP_MOE_DISPATCH, .name = "alltoall", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_dispatch_alltoall_vtable,
     .summary = "counts exchanged, routes sent to their experts' owners, results returned (any lk_comm)"},
    {.op = LK_OP_MOE_DISPATCH, .name = "allgather", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_dispatch_allgather_vtable,
     .summary = "all tokens gathered, own experts run, reduce-scatter back (any lk_comm)"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_MOE_DISPATCH, .name = "local", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_moe_dispatch_local_vtable, .summary = "one GPU owns every expert: the CUDA experts op itself"},
    {.op = LK_OP_MOE_DISPATCH, .name = "alltoall", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_moe_dispatch_alltoall_cuda_vtable,
     .summary = "counts exchanged on the device, rows in bound-sized slots over NCCL, no host read"},
    {.op = LK_OP_MOE_DISPATCH, .name = "allgather", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_moe_dispatch_allgather_cuda_vtable,
     .summary = "all tokens gathered over NCCL in bound-sized slots, own routes run, reduce-scatter back"},
#endif
    {.name = NULL},
};

static const char *lacks(const void *vtable) {
    const lk_moe_dispatch_vtable *vt = vtable;
    return !vt->forward ? "forward" : !vt->backward ? "backward" : NULL;
}

const lk_op_def lk_moe_dispatch_def = {
    .info = {
        .op = LK_OP_MOE_DISPATCH, .name = "moe_dispatch", .field = "moe.dispatcher",
        .known = LK_NAMES("local", "alltoall", "allgather"),
        .reference = "local", .default_fused = "local", .default_plain = "local",
        .aliases = LK_ALIASES(
            LK_NEMO_SAME("torch", "allgather"),
            LK_NEMO_NOT_HERE("deepep", "DeepEP's dispatch and combine", LK_EVERYWHERE("alltoall")),
            LK_NEMO_NOT_HERE("hybridep", "HybridEP's dispatch and combine", LK_EVERYWHERE("alltoall")),
            LK_NEMO_NOT_HERE("uccl_ep", "UCCL-EP's dispatch and combine", LK_EVERYWHERE("alltoall")),
            LK_NEMO_NOT_HERE("mok", "Mixture-of-Kittens' fused communication and SwiGLU megakernel",
                             LK_EVERYWHERE("alltoall"))),
    },
    .impls = rows,
    .vtable_lacks = lacks,
};
