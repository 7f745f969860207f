/* timing.c — the bench loop shared by the GEMM-based ops (see timing.h). */
#include <string.h>
#include "ops/linear/timing.h"

static void both(void *p) {
    const lk_dense_bench_spec *b = p;
    b->fwd(b->job);
    b->bwd(b->job);
}

void lk_dense_bench(const lk_dense_bench_spec *b, const lk_ceilings *ceil, lk_bench_row rows[3]) {
    static const char *const pass[3] = {"fwd", "bwd", "fwd+bwd"};
    double ms[3] = {lk_time_ms(b->fwd, b->job, 0.5), lk_time_ms(b->bwd, b->job, 0.5),
                    lk_time_ms(both, (void *)b, 0.5)};
    double flops[3] = {b->flops_fwd, b->flops_bwd, b->flops_fwd + b->flops_bwd};
    for (int k = 0; k < 3; k++) {
        lk_bench_row *r = &rows[k];
        memset(r, 0, sizeof *r);
        snprintf(r->op, sizeof r->op, "%s", b->op);
        snprintf(r->impl, sizeof r->impl, "%s", b->impl->name);
        snprintf(r->device, sizeof r->device, "cpu");
        snprintf(r->dtype, sizeof r->dtype, "%s", lk_dtype_name(b->dt));
        lk_shape_format(b->shape, r->shape, sizeof r->shape);
        snprintf(r->pass, sizeof r->pass, "%s", pass[k]);
        r->ms = ms[k];
        r->gflops = flops[k] / (ms[k] * 1e6);
        r->ceiling_fraction = ceil && ceil->gemm_gflops > 0 ? r->gflops / ceil->gemm_gflops : 0.0;
        r->peak_bytes = b->extra_bytes + b->arena->peak;
    }
}
