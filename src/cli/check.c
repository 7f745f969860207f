/* check.c — `llmkern check [--op N] [--device cpu|cuda]`: every implementation available
 * here, CPU and CUDA rows alike (a CUDA row's harness moves its tensors to the GPU: the
 * lk_place_* of ops/harness.h), in every dtype its op's harness runs, against the float64
 * reference on fresh random inputs, with the tolerances of each op's check.h. --device
 * keeps one device's rows. Rows (a table, or --json): {op, impl, dtype, shape,
 * max_rel_err, tol, pass, device}; a table is printed once every check has run. A check a
 * row refuses as LK_EUNAVAILABLE (valid, but not runnable here: the cudnn row beside
 * another process-wide cuDNN) is named on stderr and counted apart, not failed; any other
 * error stops the run (exit 2), naming the row. Exit status 1 if any fails, 2 when none
 * ran. */
#include <string.h>
#include "cli/cli.h"

static int wanted_dtype(const cli_opts *o, lk_dtype dt) {
    lk_dtype want;
    return o->dtype == NULL || (lk_dtype_parse(o->dtype, &want) == LK_OK && want == dt);
}

int cli_check(const cli_opts *o) {
    static const char *const head[] = {"OP", "IMPL", "DEV", "DTYPE", "SHAPE", "MAX_REL_ERR", "TOL", "RESULT"};
    int sel[LK_OP_COUNT], failed = 0, ran = 0, not_run = 0;
    lk_dtype dt_check;
    unsigned devices = CLI_DEVICE(LK_DEVICE_CPU) | CLI_DEVICE(LK_DEVICE_CUDA);
    if (!cli_ops(o->op, sel)) return 2;
    if (o->dtype && lk_dtype_parse(o->dtype, &dt_check)) return cli_fail("check", LK_EINVAL);
    if (o->device) {
        if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0) {
            fprintf(stderr, "llmkern check: --device: expected cpu or cuda, got '%s'\n", o->device);
            return 2;
        }
        devices = CLI_DEVICE(strcmp(o->device, "cuda") == 0 ? LK_DEVICE_CUDA : LK_DEVICE_CPU);
    }
    cli_json j;
    cli_table t;
    if (o->json) cli_json_begin(&j, stdout);
    else cli_table_init(&t, 8, head, 0);
    for (int i = 0; i < lk_impl_count(); i++) {
        const lk_impl *impl = lk_impl_at(i);
        const lk_harness *h = cli_harness_for(impl, sel, o->impl, devices);
        const char *dev = lk_device_name(impl->device);
        if (!h) continue;
        for (int dt = 0; dt < LK_DTYPE_COUNT; dt++) {
            if (!lk_harness_runs(h, impl, (lk_dtype)dt) || !wanted_dtype(o, (lk_dtype)dt)) continue;
            for (int k = 0; k < h->n_check_shapes; k++) {
                lk_check_row r;
                char now[200];
                snprintf(now, sizeof now, "llmkern check: %d run, %s (%s) %s %s ...", ran, impl->name, dev,
                         lk_dtype_name((lk_dtype)dt), lk_op_info_get(impl->op)->name);
                cli_progress(now);
                lk_status s = h->check(impl, (lk_dtype)dt, &h->check_shapes[k], o->seed + (unsigned)k, &r);
                if (s == LK_EUNAVAILABLE) {     /* valid, but the row cannot run it here: said, not failed */
                    char shape[64];
                    cli_progress(NULL);
                    fprintf(stderr, "llmkern check: not run: %s %s (%s) %s %s: %s\n", lk_op_info_get(impl->op)->name,
                            impl->name, dev, lk_dtype_name((lk_dtype)dt),
                            lk_shape_format(&h->check_shapes[k], shape, sizeof shape), lk_last_error());
                    not_run++;
                    continue;
                }
                if (s) {                /* the row that could not run, then why */
                    char shape[64];
                    cli_progress(NULL);
                    if (!o->json) cli_table_free(&t);
                    fprintf(stderr, "llmkern check: %s %s (%s) %s %s: %s (%s)\n", lk_op_info_get(impl->op)->name,
                            impl->name, dev, lk_dtype_name((lk_dtype)dt),
                            lk_shape_format(&h->check_shapes[k], shape, sizeof shape), lk_last_error(),
                            lk_status_name(s));
                    return 2;
                }
                ran++;
                failed += !r.pass;
                if (o->json) {
                    cli_json_object(&j, NULL);
                    cli_json_str(&j, "op", r.op);
                    cli_json_str(&j, "impl", r.impl);
                    cli_json_str(&j, "dtype", r.dtype);
                    cli_json_str(&j, "shape", r.shape);
                    cli_json_num(&j, "max_rel_err", "%.3e", r.max_rel_err);
                    cli_json_num(&j, "tol", "%.1e", r.tol);
                    cli_json_bool(&j, "pass", r.pass);
                    cli_json_str(&j, "device", dev);
                    cli_json_close(&j);
                } else {
                    char err[32], tol[32];
                    snprintf(err, sizeof err, "%.3e", r.max_rel_err);
                    snprintf(tol, sizeof tol, "%.1e", r.tol);
                    cli_table_add(&t,
                                  (const char *[]){r.op, r.impl, dev, r.dtype, r.shape, err, tol, r.pass ? "pass" : "FAIL"});
                }
            }
        }
    }
    cli_progress(NULL);
    if (o->json) cli_json_end(&j);
    else {
        lk_status s = cli_table_print(&t, stdout, 0);
        if (s) return cli_fail("check", s);
        if (not_run) printf("\n%d checks, %d failed, %d not run here (LK_EUNAVAILABLE: stderr says why)\n", ran,
                            failed, not_run);
        else printf("\n%d checks, %d failed\n", ran, failed);
    }
    if (ran == 0) {
        const lk_hw *hw = lk_hw_get();
        if (devices == CLI_DEVICE(LK_DEVICE_CUDA) && hw->cuda_devices == 0)
            fprintf(stderr, "llmkern check: no implementation matched the options: --device cuda, and no GPU here (%s)\n",
                    hw->cuda_why);
        else
            fprintf(stderr, "llmkern check: no implementation matched the options\n");
        return 2;
    }
    return failed ? 1 : 0;
}
