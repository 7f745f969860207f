/* list.c — `llmkern list`: every op and implementation, its device and requirements,
 * whether it runs here and why not; the names the design lists that this build does
 * not have; and other systems' names (NeMo AutoModel's), each with the llmkern
 * implementation it is or the nearest one. Rows: {op, impl, device, available, reason}. */
#include <string.h>
#include "cli/cli.h"

static void requirements(const lk_impl *impl, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < LK_DTYPE_COUNT; d++)
        if (impl->needs.dtypes & LK_DTYPE_BIT(d))
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? "|" : "", lk_dtype_name((lk_dtype)d));
    if (impl->needs.min_cc) k += (size_t)snprintf(buf + k, n - k, " sm_%d", impl->needs.min_cc);
    if (impl->needs.needs & LK_NEED_CUDNN) k += (size_t)snprintf(buf + k, n - k, " cudnn");
    if (impl->needs.needs & LK_NEED_MPI) k += (size_t)snprintf(buf + k, n - k, " mpi");
    if (impl->needs.needs & LK_NEED_NCCL) k += (size_t)snprintf(buf + k, n - k, " nccl");
    if (impl->needs.sp_aware) snprintf(buf + k, n - k, " sp");
}

static void row(const cli_opts *o, int *first, const char *op, const char *impl, const char *dev,
                int avail, const char *reason, const char *needs, const char *summary) {
    if (o->json) {
        printf("%s\n  {\"op\": ", *first ? "[" : ",");
        json_str(stdout, op);
        printf(", \"impl\": "); json_str(stdout, impl);
        printf(", \"device\": "); json_str(stdout, dev);
        printf(", \"available\": %s, \"reason\": ", avail ? "true" : "false");
        json_str(stdout, reason);
        printf("}");
    } else {
        printf("%-14s %-18s %-5s %-9s %-14s %s%s%s\n", op, impl, dev, avail ? "yes" : "no", needs,
               summary, reason[0] ? " -- " : "", reason);
    }
    *first = 0;
}

int cli_list(const cli_opts *o) {
    int sel[LK_OP_COUNT], first = 1;
    if (!cli_ops(o->op, sel)) return 2;
    const lk_hw *hw = lk_hw_get();
    if (!o->json && hw->cuda_devices > 0)
        printf("GPU: %s, compute capability %d.%d, %d SMs, L2 %zu MiB (%d device%s)\n", hw->cuda_name,
               hw->cuda_cc / 10, hw->cuda_cc % 10, hw->cuda_sms, hw->cuda_l2_bytes >> 20, hw->cuda_devices,
               hw->cuda_devices == 1 ? "" : "s");
    else if (!o->json)
        printf("GPU: none (%s)\n", hw->cuda_why);
    if (!o->json)
        printf("MPI: %s\n", hw->has_mpi ? "built in (lk_comm_mpi_world; run under mpirun)"
                                        : "not built (CMake found no MPI; the multi-process communicator is absent)");
    if (!o->json)
        printf("NCCL: %s\n", hw->has_nccl ? "built in (lk_comm_nccl_create; device buffers)"
                                          : "not built (needs CUDA and CMake finding nccl.h and libnccl)");
    if (!o->json)
        printf("%-14s %-18s %-5s %-9s %-14s %s\n", "OP", "IMPLEMENTATION", "DEV", "AVAILABLE",
               "NEEDS", "SUMMARY");
    for (int op = 0; op < LK_OP_COUNT; op++) {
        if (!sel[op]) continue;
        const lk_op_info *info = lk_op_info_get((lk_op)op);
        for (int i = 0; i < lk_impl_count(); i++) {
            const lk_impl *impl = lk_impl_at(i);
            if (impl->op != (lk_op)op) continue;
            char why[160], needs[96], summary[160];
            int avail = lk_impl_available(impl, lk_hw_get(), why, sizeof why);
            requirements(impl, needs, sizeof needs);
            snprintf(summary, sizeof summary, "%s%s", impl->summary,
                     lk_impl_is_reference(impl) ? " [reference]" : "");
            row(o, &first, info->name, impl->name, lk_device_name(impl->device), avail, why, needs, summary);
        }
        for (const char *const *k = info->known; *k; k++) {
            int built = 0;
            for (int d = 0; d < LK_DEVICE_COUNT; d++) built |= lk_impl_find((lk_op)op, *k, (lk_device_type)d) != NULL;
            if (!built) {
                const char *needs = lk_op_name_needs((lk_op)op, *k);
                row(o, &first, info->name, *k, "-", 0, "not available in this build", needs ? needs : "", "");
            }
        }
        for (const lk_op_alias *a = info->aliases; a && a->name; a++) {   /* other systems' names */
            char why[256];
            int avail = 0;
            size_t n = (size_t)snprintf(why, sizeof why, "%s's name", a->origin);
            if (!a->same_as[LK_DEVICE_CPU] && !a->same_as[LK_DEVICE_CUDA])
                snprintf(why + n, sizeof why - n, " (%s): not available in llmkern; nearest %s", a->what,
                         a->nearest[LK_DEVICE_CPU]);
            const char *cpu = a->same_as[LK_DEVICE_CPU], *cuda = a->same_as[LK_DEVICE_CUDA];
            if (cpu && cuda && strcmp(cpu, cuda) == 0) snprintf(why + n, sizeof why - n, " = %s", cpu);
            else if (cpu || cuda)
                snprintf(why + n, sizeof why - n, " = %s (cpu), %s (cuda)", cpu ? cpu : "none", cuda ? cuda : "none");
            for (int d = 0; d < LK_DEVICE_COUNT; d++) {
                const lk_impl *impl = a->same_as[d] ? lk_impl_find((lk_op)op, a->same_as[d], (lk_device_type)d) : NULL;
                char w[160];
                avail |= impl && lk_impl_available(impl, lk_hw_get(), w, sizeof w);
            }
            row(o, &first, info->name, a->name, "-", avail, why, "", "");
        }
    }
    if (o->json) printf("%s]\n", first ? "[" : "\n");
    return 0;
}
