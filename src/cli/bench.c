/* bench.c — `llmkern bench [--op N] [--impl N] [--dtype D] [--size AxB] [--mask M]
 * [--kv-heads H] [--block N]`: first the machine's copy bandwidth and GEMM rate, then
 * every available implementation's forward, backward and forward+backward: time, GB/s,
 * GFLOP/s, fraction of the measured ceiling, and peak extra memory.
 *
 * Every option is checked before anything is timed: the size and the named options by
 * each selected op's harness (lk_harness.bench_validate), a named option no selected op
 * takes is refused, and so is a set of options that selects no implementation. A row
 * that cannot run the case (prefix_lm on a flash row) is skipped with a note, or refused
 * when --impl named it.
 * Rows: {op, impl, device, dtype, shape, [the case's named parameters: mask, hkv, blk,
 * density], pass, ms, gbps, gflops, ceiling_fraction, peak_bytes}, as a table printed
 * once every row is timed, or --json. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

typedef struct {
    const lk_impl *impl;
    const lk_harness *h;
    lk_dtype dt;
} job;

#define MAX_JOBS 256

/* "64", or "0.079": a parameter's value as text. */
static void param_value(const lk_bench_param *p, char *buf, size_t n) {
    if (p->text[0]) snprintf(buf, n, "%s", p->text);
    else if (p->value == floor(p->value) && fabs(p->value) < 1e15) snprintf(buf, n, "%.0f", p->value);
    else snprintf(buf, n, "%.3f", p->value);
}

static void json_row(cli_json *j, const lk_bench_row *r) {
    cli_json_object(j, NULL);
    cli_json_str(j, "op", r->op);
    cli_json_str(j, "impl", r->impl);
    cli_json_str(j, "device", r->device);
    cli_json_str(j, "dtype", r->dtype);
    cli_json_str(j, "shape", r->shape);
    for (int k = 0; k < r->nparam; k++) {
        const lk_bench_param *p = &r->param[k];
        if (p->text[0]) cli_json_str(j, p->name, p->text);
        else if (p->value == floor(p->value) && fabs(p->value) < 1e15) cli_json_int(j, p->name, (long long)p->value);
        else cli_json_num(j, p->name, "%.4f", p->value);
    }
    cli_json_str(j, "pass", r->pass);
    cli_json_num(j, "ms", "%.4f", r->ms);
    cli_json_num(j, "gbps", "%.2f", r->gbps);
    cli_json_num(j, "gflops", "%.2f", r->gflops);
    cli_json_num(j, "ceiling_fraction", "%.3f", r->ceiling_fraction);
    cli_json_int(j, "peak_bytes", (long long)r->peak_bytes);
    cli_json_close(j);
}

static void table_row(cli_table *t, const lk_bench_row *r, int with_case) {
    char ms[32], gbps[32], gflops[32], ceil[32], peak[32], cs[200] = "";
    size_t n = 0;
    for (int k = 0; k < r->nparam && n < sizeof cs; k++) {
        char v[32];
        param_value(&r->param[k], v, sizeof v);
        n += (size_t)snprintf(cs + n, sizeof cs - n, "%s%s=%s", k ? " " : "", r->param[k].name, v);
    }
    snprintf(ms, sizeof ms, "%.3f", r->ms);
    snprintf(gbps, sizeof gbps, "%.2f", r->gbps);
    snprintf(gflops, sizeof gflops, "%.2f", r->gflops);
    snprintf(ceil, sizeof ceil, "%.1f%%", 100.0 * r->ceiling_fraction);
    snprintf(peak, sizeof peak, "%.1f", (double)r->peak_bytes / (1 << 20));
    if (with_case)
        cli_table_add(t, (const char *[]){r->op, r->impl, r->device, r->dtype, r->shape, cs, r->pass, ms, gbps,
                                          gflops, ceil, peak});
    else
        cli_table_add(t, (const char *[]){r->op, r->impl, r->device, r->dtype, r->shape, r->pass, ms, gbps, gflops,
                                          ceil, peak});
}

/* The named options an op's harness takes, the others NULL. */
static lk_case_opts opts_for(const lk_harness *h, const lk_case_opts *all) {
    return (lk_case_opts){.mask = h->case_opts & LK_CASE_MASK ? all->mask : NULL,
                          .kv_heads = h->case_opts & LK_CASE_KV_HEADS ? all->kv_heads : NULL,
                          .block = h->case_opts & LK_CASE_BLOCK ? all->block : NULL};
}

/* A named option given that no selected op's bench takes: refused, naming those that do. */
static int unused_option(const cli_opts *o, const int sel[LK_OP_COUNT], const char *flag, const char *value,
                         unsigned bit) {
    if (!value) return 0;
    char takers[256] = "";
    size_t n = 0;
    for (int op = 0; op < LK_OP_COUNT; op++) {
        const lk_harness *h = lk_harness_get((lk_op)op);
        if (h && (h->case_opts & bit) && sel[op]) return 0;
        if (h && (h->case_opts & bit) && n < sizeof takers)
            n += (size_t)snprintf(takers + n, sizeof takers - n, "%s%s", n ? ", " : "", lk_op_info_get((lk_op)op)->name);
    }
    fprintf(stderr, "llmkern bench: %s: expected an --op whose bench takes it (%s), got --op %s\n", flag,
            takers[0] ? takers : "none", o->op ? o->op : "(none)");
    return 1;
}

/* Every (implementation, dtype) the options select, each case checked: 0 and a message
 * (exit 2) when an option is bad. */
static int plan(const cli_opts *o, const int sel[LK_OP_COUNT], const lk_shape *size, const lk_case_opts *all,
                job *jobs, int *n_jobs) {
    lk_dtype want = LK_F32;
    if (o->dtype) lk_dtype_parse(o->dtype, &want);
    *n_jobs = 0;
    struct { char why[256], names[512]; } skip[8];
    int n_skip = 0;
    for (int i = 0; i < lk_impl_count(); i++) {
        const lk_impl *impl = lk_impl_at(i);
        const lk_harness *h = cli_harness_for(impl, sel, o->impl, CLI_DEVICE(LK_DEVICE_CPU));
        if (!h) continue;
        lk_case_opts mine = opts_for(h, all);
        lk_status s = h->bench_validate ? h->bench_validate(impl, size ? size : &h->bench_shape, &mine) : LK_OK;
        if (s == LK_EUNAVAILABLE && !o->impl) {   /* skipped; each reason said once, below */
            int k = 0;
            while (k < n_skip && strcmp(skip[k].why, lk_last_error()) != 0) k++;
            if (k == n_skip && n_skip < 8) {
                snprintf(skip[k].why, sizeof skip[k].why, "%s", lk_last_error());
                skip[k].names[0] = '\0';
                n_skip++;
            }
            if (k < n_skip) {
                size_t len = strlen(skip[k].names);
                snprintf(skip[k].names + len, sizeof skip[k].names - len, "%s%s", len ? ", " : "", impl->name);
            }
            continue;
        }
        if (s) {
            fprintf(stderr, "llmkern bench: --impl %s: %s (%s)\n", impl->name, lk_last_error(), lk_status_name(s));
            return 0;
        }
        for (int dt = 0; dt < LK_DTYPE_COUNT && *n_jobs < MAX_JOBS; dt++)
            if (lk_harness_runs(h, impl, (lk_dtype)dt) && (!o->dtype || dt == (int)want))
                jobs[(*n_jobs)++] = (job){impl, h, (lk_dtype)dt};
    }
    for (int k = 0; k < n_skip; k++) fprintf(stderr, "llmkern bench: skipped %s: %s\n", skip[k].names, skip[k].why);
    if (*n_jobs == 0) {
        fprintf(stderr, "llmkern bench: no implementation matched the options\n");
        return 0;
    }
    return 1;
}

int cli_bench(const cli_opts *o) {
    static const char *const head_case[] = {"OP", "IMPL", "DEV", "DTYPE", "SHAPE", "CASE", "PASS", "MS", "GB/S",
                                            "GFLOP/S", "CEILING", "PEAK_MIB"},
                             *const head[] = {"OP", "IMPL", "DEV", "DTYPE", "SHAPE", "PASS", "MS", "GB/S",
                                              "GFLOP/S", "CEILING", "PEAK_MIB"};
    int sel[LK_OP_COUNT], n_jobs;
    static job jobs[MAX_JOBS];
    lk_shape size;
    lk_dtype want;
    lk_status s;
    lk_case_opts all = {.mask = o->mask, .kv_heads = o->kv_heads, .block = o->block};
    if (!cli_ops(o->op, sel)) return 2;
    if (o->size && (s = lk_shape_parse(o->size, &size))) return cli_fail("bench", s);
    if (o->dtype && (s = lk_dtype_parse(o->dtype, &want))) return cli_fail("bench", s);
    if (unused_option(o, sel, "--mask", o->mask, LK_CASE_MASK) ||
        unused_option(o, sel, "--kv-heads", o->kv_heads, LK_CASE_KV_HEADS) ||
        unused_option(o, sel, "--block", o->block, LK_CASE_BLOCK) ||
        !plan(o, sel, o->size ? &size : NULL, &all, jobs, &n_jobs))
        return 2;

    lk_ceilings ceil;
    int cap = 2 + 3 * n_jobs, n = 2, with_case = 0;
    lk_bench_row *rows = malloc(sizeof *rows * (size_t)cap);
    if (!rows) return cli_fail("bench", lk_error(LK_ENOMEM, "bench: out of memory"));
    cli_progress("llmkern bench: measuring the ceilings (copy bandwidth, GEMM rate) ...");
    if ((s = lk_measure_ceilings(&ceil, rows))) { cli_progress(NULL); free(rows); return cli_fail("bench", s); }
    for (int i = 0; i < n_jobs; i++, n += 3) {
        const job *jb = &jobs[i];
        lk_case_opts mine = opts_for(jb->h, &all);
        char now[200];
        snprintf(now, sizeof now, "llmkern bench: %d of %d, %s %s %s ...", i + 1, n_jobs,
                 lk_op_info_get(jb->impl->op)->name, jb->impl->name, lk_dtype_name(jb->dt));
        cli_progress(now);
        if ((s = jb->h->bench(jb->impl, jb->dt, o->size ? &size : &jb->h->bench_shape, &mine, &ceil, rows + n))) {
            cli_progress(NULL);
            free(rows);
            return cli_fail("bench", s);
        }
        with_case |= rows[n].nparam > 0;
    }
    cli_progress(NULL);
    if (o->json) {
        cli_json j;
        cli_json_begin(&j, stdout);
        for (int i = 0; i < n; i++) json_row(&j, &rows[i]);
        cli_json_end(&j);
    } else {
        cli_table t;
        cli_table_init(&t, with_case ? 12 : 11, with_case ? head_case : head, with_case ? 0xf80u : 0x7c0u);
        for (int i = 0; i < n; i++) table_row(&t, &rows[i], with_case);
        s = cli_table_print(&t, stdout, 0);
    }
    free(rows);
    return s ? cli_fail("bench", s) : 0;
}
