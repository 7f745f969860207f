/* check.c — `llmkern check [--op N]`: every implementation available here, in every
 * dtype its op's harness runs, against the float64 reference on fresh random inputs.
 * Rows: {op, impl, dtype, shape, max_rel_err, tol, pass}. Exit status 1 if any fails. */
#include <string.h>
#include "cli/cli.h"

static int wanted_dtype(const cli_opts *o, lk_dtype dt) {
    lk_dtype want;
    return o->dtype == NULL || (lk_dtype_parse(o->dtype, &want) == LK_OK && want == dt);
}

int cli_check(const cli_opts *o) {
    int sel[LK_OP_COUNT], first = 1, failed = 0, ran = 0;
    lk_dtype dt_check;
    if (!cli_ops(o->op, sel)) return 2;
    if (o->dtype && lk_dtype_parse(o->dtype, &dt_check)) return cli_fail("check", LK_EINVAL);
    if (!o->json)
        printf("%-12s %-12s %-5s %-12s %-12s %-9s %s\n", "OP", "IMPL", "DTYPE", "SHAPE", "MAX_REL_ERR",
               "TOL", "RESULT");
    for (int i = 0; i < lk_impl_count(); i++) {
        const lk_impl *impl = lk_impl_at(i);
        const lk_harness *h = lk_harness_get(impl->op);
        char why[160];
        /* the harnesses hold CPU tensors; CUDA impls: tests/cuda and bench/peers_cuda.py */
        if (!sel[impl->op] || !h || impl->device != LK_DEVICE_CPU || (o->impl && strcmp(o->impl, impl->name) != 0) ||
            !lk_impl_available(impl, lk_hw_get(), why, sizeof why))
            continue;
        for (int dt = 0; dt < LK_DTYPE_COUNT; dt++) {
            if (!(h->dtypes & impl->needs.dtypes & LK_DTYPE_BIT(dt)) || !wanted_dtype(o, (lk_dtype)dt)) continue;
            for (int k = 0; k < h->n_check_shapes; k++) {
                lk_check_row r;
                lk_status s = h->check(impl, (lk_dtype)dt, &h->check_shapes[k], o->seed + (unsigned)k, &r);
                if (s) return cli_fail("check", s);
                ran++;
                failed += !r.pass;
                if (o->json) {
                    printf("%s\n  {\"op\": ", first ? "[" : ",");
                    json_str(stdout, r.op);
                    printf(", \"impl\": "); json_str(stdout, r.impl);
                    printf(", \"dtype\": "); json_str(stdout, r.dtype);
                    printf(", \"shape\": "); json_str(stdout, r.shape);
                    printf(", \"max_rel_err\": %.3e, \"tol\": %.1e, \"pass\": %s}", r.max_rel_err, r.tol,
                           r.pass ? "true" : "false");
                } else {
                    printf("%-12s %-12s %-5s %-12s %-12.3e %-9.1e %s\n", r.op, r.impl, r.dtype, r.shape,
                           r.max_rel_err, r.tol, r.pass ? "pass" : "FAIL");
                }
                first = 0;
            }
        }
    }
    if (o->json) printf("%s]\n", first ? "[" : "\n");
    else printf("\n%d checks, %d failed\n", ran, failed);
    if (ran == 0) {
        fprintf(stderr, "llmkern check: no implementation matched the options\n");
        return 2;
    }
    return failed ? 1 : 0;
}
