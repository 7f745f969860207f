/* bench.c — `llmkern bench [--op N] [--size AxB]`: first the machine's copy bandwidth
 * and GEMM rate, then every available implementation's forward, backward and
 * forward+backward: time, GB/s, GFLOP/s, fraction of the measured ceiling, and peak
 * extra memory. Rows: {op, impl, device, dtype, shape, pass, ms, gbps, gflops,
 * ceiling_fraction, peak_bytes}. */
#include <string.h>
#include "cli/cli.h"

static void print_row(const cli_opts *o, const lk_bench_row *r, int first) {
    if (o->json) {
        printf("%s\n  {\"op\": ", first ? "[" : ",");
        json_str(stdout, r->op);
        printf(", \"impl\": "); json_str(stdout, r->impl);
        printf(", \"device\": "); json_str(stdout, r->device);
        printf(", \"dtype\": "); json_str(stdout, r->dtype);
        printf(", \"shape\": "); json_str(stdout, r->shape);
        printf(", \"pass\": "); json_str(stdout, r->pass);
        printf(", \"ms\": %.4f, \"gbps\": %.2f, \"gflops\": %.2f, \"ceiling_fraction\": %.3f, "
               "\"peak_bytes\": %zu}", r->ms, r->gbps, r->gflops, r->ceiling_fraction, r->peak_bytes);
    } else {
        printf("%-12s %-12s %-4s %-5s %-16s %-8s %10.3f %9.2f %9.2f %8.1f%% %12.1f\n", r->op, r->impl,
               r->device, r->dtype, r->shape, r->pass, r->ms, r->gbps, r->gflops,
               100.0 * r->ceiling_fraction, (double)r->peak_bytes / (1 << 20));
    }
}

int cli_bench(const cli_opts *o) {
    int sel[LK_OP_COUNT], first = 1;
    lk_shape size;
    lk_dtype want = LK_F32;
    lk_status s;
    if (!cli_ops(o->op, sel)) return 2;
    if (o->size && (s = lk_shape_parse(o->size, &size))) return cli_fail("bench", s);
    if (o->dtype && (s = lk_dtype_parse(o->dtype, &want))) return cli_fail("bench", s);

    lk_ceilings ceil;
    lk_bench_row rows[3];
    if ((s = lk_measure_ceilings(&ceil, rows))) return cli_fail("bench", s);
    if (!o->json)
        printf("%-12s %-12s %-4s %-5s %-16s %-8s %10s %9s %9s %9s %12s\n", "OP", "IMPL", "DEV", "DTYPE",
               "SHAPE", "PASS", "MS", "GB/S", "GFLOP/S", "CEILING", "PEAK_MIB");
    print_row(o, &rows[0], 1);
    print_row(o, &rows[1], 0);
    first = 0;
    for (int i = 0; i < lk_impl_count(); i++) {
        const lk_impl *impl = lk_impl_at(i);
        const lk_harness *h = lk_harness_get(impl->op);
        char why[160];
        /* the harnesses hold CPU tensors; CUDA impls: tests/cuda and bench/peers_cuda.py */
        if (!sel[impl->op] || !h || impl->device != LK_DEVICE_CPU || (o->impl && strcmp(o->impl, impl->name) != 0) ||
            !lk_impl_available(impl, lk_hw_get(), why, sizeof why))
            continue;
        for (int dt = 0; dt < LK_DTYPE_COUNT; dt++) {
            if (!(h->dtypes & impl->needs.dtypes & LK_DTYPE_BIT(dt))) continue;
            if ((o->dtype && dt != (int)want)) continue;
            if ((s = h->bench(impl, (lk_dtype)dt, o->size ? &size : &h->bench_shape, &ceil, rows)))
                return cli_fail("bench", s);
            for (int k = 0; k < 3; k++) print_row(o, &rows[k], first);
        }
    }
    if (o->json) printf("\n]\n");
    return 0;
}
