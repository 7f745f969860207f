/* list.c — `llmkern list [--op N]`: every op and implementation, its device and
 * requirements, whether it runs here and why not; the names the design lists that this
 * build does not have; and other systems' names (NeMo AutoModel's), each with the
 * llmkern implementation it is or the nearest one.
 *
 * Text: the machine (GPU, MPI, NCCL), then sections, each a table (table.c): the
 * implementations that run here; those that do not, one section per reason, so a
 * reason many rows share ("needs a CUDA GPU (...)") is said once; the names not in this
 * build; other systems' names llmkern implements, and those it does not.
 * --json: one row per name, in catalog order: {op, impl, device, available, reason}. */
#include <string.h>
#include "cli/cli.h"

typedef enum { ROW_IMPL, ROW_UNBUILT, ROW_ALIAS } row_kind;

typedef struct {
    row_kind kind;
    const char *op, *name, *dev, *summary;
    const lk_impl *impl;                /* ROW_IMPL */
    const lk_op_alias *alias;           /* ROW_ALIAS */
    int avail;
    char reason[256];                   /* why not, or (aliases) what the name is */
    char needs[96];
} list_row;

#define MAX_ROWS 512

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

/* "eager_fp32", or "blas (cpu), cublaslt (cuda)" where the devices differ. */
static void per_device(const char *const by_dev[LK_DEVICE_COUNT], char *buf, size_t n) {
    const char *cpu = by_dev[LK_DEVICE_CPU], *cuda = by_dev[LK_DEVICE_CUDA];
    if (cpu && cuda && strcmp(cpu, cuda) == 0) snprintf(buf, n, "%s", cpu);
    else snprintf(buf, n, "%s (cpu), %s (cuda)", cpu ? cpu : "none", cuda ? cuda : "none");
}

static int alias_row(lk_op op, const lk_op_alias *a, list_row *r) {
    *r = (list_row){.kind = ROW_ALIAS, .op = lk_op_info_get(op)->name, .name = a->name, .dev = "-", .alias = a};
    size_t n = (size_t)snprintf(r->reason, sizeof r->reason, "%s's name", a->origin);
    char as[128];
    if (!a->same_as[LK_DEVICE_CPU] && !a->same_as[LK_DEVICE_CUDA]) {
        snprintf(r->reason + n, sizeof r->reason - n, " (%s): not available in llmkern; nearest %s", a->what,
                 a->nearest[LK_DEVICE_CPU]);
    } else {
        per_device(a->same_as, as, sizeof as);
        snprintf(r->reason + n, sizeof r->reason - n, " = %s", as);
    }
    for (int d = 0; d < LK_DEVICE_COUNT; d++) {
        const lk_impl *impl = a->same_as[d] ? lk_impl_find(op, a->same_as[d], (lk_device_type)d) : NULL;
        char w[160];
        r->avail |= impl && lk_impl_available(impl, lk_hw_get(), w, sizeof w);
    }
    return 1;
}

/* Every row of the selected ops, in catalog order: implementations, unbuilt names, aliases. */
static int collect(const int sel[LK_OP_COUNT], list_row *rows, int cap) {
    int n = 0;
    for (int op = 0; op < LK_OP_COUNT; op++) {
        if (!sel[op]) continue;
        const lk_op_info *info = lk_op_info_get((lk_op)op);
        for (int i = 0; i < lk_impl_count() && n < cap; i++) {
            const lk_impl *impl = lk_impl_at(i);
            if (impl->op != (lk_op)op) continue;
            list_row *r = &rows[n++];
            *r = (list_row){.kind = ROW_IMPL, .op = info->name, .name = impl->name, .impl = impl,
                            .dev = lk_device_name(impl->device), .summary = impl->summary};
            r->avail = lk_impl_available(impl, lk_hw_get(), r->reason, sizeof r->reason);
            if (r->avail) r->reason[0] = '\0';
            requirements(impl, r->needs, sizeof r->needs);
        }
        for (const char *const *k = info->known; *k && n < cap; k++) {
            int built = 0;
            for (int d = 0; d < LK_DEVICE_COUNT; d++) built |= lk_impl_find((lk_op)op, *k, (lk_device_type)d) != NULL;
            if (built) continue;
            const char *needs = lk_op_name_needs((lk_op)op, *k);
            list_row *r = &rows[n++];
            *r = (list_row){.kind = ROW_UNBUILT, .op = info->name, .name = *k, .dev = "-"};
            snprintf(r->reason, sizeof r->reason, "not available in this build");
            snprintf(r->needs, sizeof r->needs, "%s", needs ? needs : "");
        }
        for (const lk_op_alias *a = info->aliases; a && a->name && n < cap; a++) n += alias_row((lk_op)op, a, &rows[n]);
    }
    return n;
}

static void print_json(const list_row *rows, int n) {
    cli_json j;
    cli_json_begin(&j, stdout);
    for (int i = 0; i < n; i++) {
        cli_json_object(&j, NULL);
        cli_json_str(&j, "op", rows[i].op);
        cli_json_str(&j, "impl", rows[i].name);
        cli_json_str(&j, "device", rows[i].dev);
        cli_json_bool(&j, "available", rows[i].avail);
        cli_json_str(&j, "reason", rows[i].reason);
        cli_json_close(&j);
    }
    cli_json_end(&j);
}

/* A blank line, then the section's heading (wrapped, continuation indented). */
static void heading(const char *text) {
    printf("\n");
    cli_text(stdout, 0, 4, text);
}

/* The implementations whose reason is `reason` ("" : those that run here). */
static lk_status impl_section(const list_row *rows, int n, const char *reason, const char *title) {
    static const char *const head[] = {"OP", "IMPLEMENTATION", "DEV", "NEEDS", "SUMMARY"};
    cli_table t;
    int count = 0;
    cli_table_init(&t, 5, head, 0);
    for (int i = 0; i < n; i++) {
        const list_row *r = &rows[i];
        if (r->kind != ROW_IMPL || strcmp(r->reason, reason) != 0) continue;
        char summary[200];
        snprintf(summary, sizeof summary, "%s%s", r->summary, lk_impl_is_reference(r->impl) ? " [reference]" : "");
        cli_table_add(&t, (const char *[]){r->op, r->name, r->dev, r->needs, summary});
        count++;
    }
    if (count == 0) { cli_table_free(&t); return LK_OK; }
    char h[400];
    snprintf(h, sizeof h, "%s (%d):", title, count);
    heading(h);
    return cli_table_print(&t, stdout, 2);
}

/* Other systems' names of one origin: those that are an llmkern implementation (same 1)
 * or those llmkern does not implement (same 0). */
static lk_status alias_section(const list_row *rows, int n, const char *origin, int same) {
    static const char *const head_is[] = {"OP", "NAME", "IS"}, *const head_not[] = {"OP", "NAME", "NEAREST", "WHAT"};
    cli_table t;
    int count = 0;
    cli_table_init(&t, same ? 3 : 4, same ? head_is : head_not, 0);
    for (int i = 0; i < n; i++) {
        const list_row *r = &rows[i];
        const lk_op_alias *a = r->alias;
        if (r->kind != ROW_ALIAS || strcmp(a->origin, origin) != 0) continue;
        if ((a->same_as[LK_DEVICE_CPU] || a->same_as[LK_DEVICE_CUDA]) != same) continue;
        char text[160], is[200];
        per_device(same ? a->same_as : a->nearest, text, sizeof text);
        snprintf(is, sizeof is, "%s%s", text, same && !r->avail ? " (not available here)" : "");
        cli_table_add(&t, same ? (const char *[]){r->op, r->name, is} : (const char *[]){r->op, r->name, text, a->what});
        count++;
    }
    if (count == 0) { cli_table_free(&t); return LK_OK; }
    char h[300];
    snprintf(h, sizeof h, same ? "%s's names llmkern implements (%d), each the implementation shown:"
                               : "%s's names llmkern does not implement (%d), refused with the nearest named:",
             origin, count);
    heading(h);
    return cli_table_print(&t, stdout, 2);
}

static void machine(void) {
    const lk_hw *hw = lk_hw_get();
    char line[512];
    if (hw->cuda_devices > 0)
        snprintf(line, sizeof line, "GPU: %s, compute capability %d.%d, %d SMs, L2 %zu MiB (%d device%s)",
                 hw->cuda_name, hw->cuda_cc / 10, hw->cuda_cc % 10, hw->cuda_sms, hw->cuda_l2_bytes >> 20,
                 hw->cuda_devices, hw->cuda_devices == 1 ? "" : "s");
    else
        snprintf(line, sizeof line, "GPU: none (%s)", hw->cuda_why);
    cli_text(stdout, 0, 5, line);
    cli_text(stdout, 0, 5, hw->has_mpi ? "MPI: built in (lk_comm_mpi_world; run under mpirun)"
                                       : "MPI: not built (CMake found no MPI; the multi-process communicator is absent)");
    cli_text(stdout, 0, 6, hw->has_nccl ? "NCCL: built in (lk_comm_nccl_create; device buffers)"
                                        : "NCCL: not built (needs CUDA and CMake finding nccl.h and libnccl)");
}

int cli_list(const cli_opts *o) {
    int sel[LK_OP_COUNT];
    static list_row rows[MAX_ROWS];
    if (!cli_ops(o->op, sel)) return 2;
    int n = collect(sel, rows, MAX_ROWS);
    if (o->json) {
        print_json(rows, n);
        return 0;
    }
    machine();
    lk_status s = impl_section(rows, n, "", "runs here");
    for (int i = 0; !s && i < n; i++) {     /* each reason once, where it first occurs */
        if (rows[i].kind != ROW_IMPL || !rows[i].reason[0]) continue;
        int seen = 0;
        for (int k = 0; k < i && !seen; k++) seen = rows[k].kind == ROW_IMPL && strcmp(rows[k].reason, rows[i].reason) == 0;
        char title[300];
        snprintf(title, sizeof title, "does not run here: %s", rows[i].reason);
        if (!seen) s = impl_section(rows, n, rows[i].reason, title);
    }
    if (s) return cli_fail("list", s);
    static const char *const head[] = {"OP", "NAME", "NEEDS"};
    cli_table t;
    cli_table_init(&t, 3, head, 0);
    for (int i = 0; i < n; i++)
        if (rows[i].kind == ROW_UNBUILT) cli_table_add(&t, (const char *[]){rows[i].op, rows[i].name, rows[i].needs});
    if (t.nrow) {
        char h[120];
        snprintf(h, sizeof h, "not in this build (%d), names the design gives:", t.nrow);
        heading(h);
    }
    if ((s = t.nrow ? cli_table_print(&t, stdout, 2) : (cli_table_free(&t), LK_OK))) return cli_fail("list", s);
    for (int i = 0; i < n; i++) {           /* each origin of other systems' names once */
        if (rows[i].kind != ROW_ALIAS) continue;
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = rows[k].kind == ROW_ALIAS && strcmp(rows[k].alias->origin, rows[i].alias->origin) == 0;
        if (!seen && ((s = alias_section(rows, n, rows[i].alias->origin, 1)) ||
                      (s = alias_section(rows, n, rows[i].alias->origin, 0))))
            return cli_fail("list", s);
    }
    return 0;
}
