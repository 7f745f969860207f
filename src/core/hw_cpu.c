/* hw_cpu.c — the one place the CPU is probed: cores, memory, vector extensions, model name.
 * Kernels read the lk_hw struct the registry fills; nothing else calls cpuid. */
#include <stdio.h>
#include <string.h>
#include <omp.h>
#include <unistd.h>
#include "llmkern/registry.h"

void lk_hw_probe_cpu(lk_hw *hw) {
    hw->cpu_cores = omp_get_num_procs();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    hw->cpu_mem_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
#ifdef LLMKERN_HAVE_MPI
    hw->has_mpi = 1;    /* the MPI communicator is built in (src/dist/comm_mpi.c) */
#endif
#ifdef LLMKERN_HAVE_NCCL
    hw->has_nccl = 1;   /* the NCCL communicator is built in (src/dist/comm_nccl.c) */
#endif
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    hw->cpu_avx2 = __builtin_cpu_supports("avx2") != 0;
    hw->cpu_avx512f = __builtin_cpu_supports("avx512f") != 0;
#endif
    snprintf(hw->cpu_model, sizeof hw->cpu_model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *v = strchr(line, ':');
        if (v) {
            v += v[1] == ' ' ? 2 : 1;
            v[strcspn(v, "\n")] = '\0';
            snprintf(hw->cpu_model, sizeof hw->cpu_model, "%s", v);
        }
        break;
    }
    fclose(f);
}
