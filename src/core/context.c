/* context.c — the CPU context, OpenMP thread count, and the monotonic clock. */
#include <omp.h>
#include <time.h>
#include "llmkern/context.h"

lk_ctx lk_ctx_cpu(lk_arena *arena) {
    return (lk_ctx){.device = {LK_DEVICE_CPU, 0}, .arena = arena};
}

void lk_set_num_threads(int n) { if (n > 0) omp_set_num_threads(n); }

int lk_get_num_threads(void) { return omp_get_max_threads(); }

double lk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
