/* hw_cpu.c — the one place the CPU is probed: cores, memory, vector extensions, model name.
 * Kernels read the lk_hw struct the registry fills; nothing else calls cpuid. Also the
 * memory a run can take now (lk_hw_mem_available): the host's from /proc/meminfo and the
 * cgroup, a GPU's from hw_cuda.c. */
#include <stdio.h>
#include <stdlib.h>
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

/* One number from a file such as memory.max ("max" or absent: none, 0). */
static uint64_t read_u64_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = "";
    char *ok = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!ok || buf[0] < '0' || buf[0] > '9') return 0;
    return strtoull(buf, NULL, 10);
}

/* The host: MemAvailable (what the kernel can hand out without swapping), capped by a
 * cgroup v2 limit (a container's memory.max less its memory.current). */
static uint64_t cpu_available(char *source, size_t n) {
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (uint64_t)kb * 1024; break; }
    }
    if (f) fclose(f);
    snprintf(source, n, "of host RAM available (MemAvailable)");
    if (avail == 0) {
        avail = (uint64_t)lk_hw_get()->cpu_mem_bytes;
        snprintf(source, n, "of host RAM (physical; MemAvailable unreadable)");
    }
    uint64_t max = read_u64_file("/sys/fs/cgroup/memory.max"), cur = read_u64_file("/sys/fs/cgroup/memory.current");
    if (max > 0 && max - (cur < max ? cur : max) < avail) {
        avail = max - (cur < max ? cur : max);
        snprintf(source, n, "of host RAM available to this cgroup (memory.max less memory.current)");
    }
    return avail;
}

uint64_t lk_hw_mem_available(lk_device_type device, char *source, size_t n) {
    char dummy[8];
    if (!source || n == 0) source = dummy, n = sizeof dummy;
    if (device == LK_DEVICE_CPU) return cpu_available(source, n);
#ifdef LLMKERN_HAVE_CUDA
    if (device == LK_DEVICE_CUDA) return lk_hw_cuda_mem_free(source, n);
#endif
    snprintf(source, n, "of %s memory (unknown in this build)", lk_device_name(device));
    return 0;
}
