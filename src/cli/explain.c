/* explain.c — `llmkern explain [--config F] [--device cpu|cuda]`: runs the lifecycle as a
 * model build would (for the family --family names, else the config's model, else qwen3;
 * on the device --device names, else the config's train.device, else the CPU) and
 * prints, per op (and per overridden module), the requested value and its source, the
 * resolved name, the bound implementation, the stage that bound it and any
 * fallback. Rows: {op, module, requested, source, resolved, impl, stage, fallback}. The
 * source also says what another system's name (NeMo AutoModel's model.backend) resolved
 * to, and the MoE router row the router options (fake_gate_noise, gate_precision). */
#include <string.h>
#include "cli/cli.h"
#include "llmkern/train.h"

/* "config cfg.yaml:6:15 (model.backend.rms_norm); torch_fp32 (NeMo AutoModel) = eager_fp32":
 * where the value came from, what another system's name resolved to, and for the MoE
 * router the options every layer's call takes. */
static void source_text(const lk_binding *b, const lk_ops_config *cfg, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "%s%s%s", lk_source_name(b->source), b->source_detail[0] ? " " : "",
                                b->source_detail);
    const lk_op_alias *a = b->source == LK_SOURCE_CONFIG || b->source == LK_SOURCE_OVERRIDE
                               ? lk_op_alias_find(b->op, b->requested) : NULL;
    const char *as = a ? a->same_as[cfg->device] : NULL;   /* before the SP rewrite: flex = flex_attention */
    if (as && k < n) k += (size_t)snprintf(buf + k, n - k, "; %s (%s) = %s", a->name, a->origin, as);
    if (b->op != LK_OP_MOE_ROUTER) return;
    const lk_config_value *opt[2] = {&cfg->fake_gate_noise, &cfg->gate_precision};
    const char *name[2] = {"fake_gate_noise", "gate_precision"};
    for (int i = 0; i < 2; i++)
        if (opt[i]->value[0] && k < n)
            k += (size_t)snprintf(buf + k, n - k, "; %s %s at %s", name[i], opt[i]->value,
                                  opt[i]->where[0] ? opt[i]->where : "set from code");
}

static void print_row(const cli_opts *o, const lk_ops_config *cfg, const lk_binding *b, int first) {
    char src[640], impl[80];
    const char *op = lk_op_info_get(b->op)->name;
    source_text(b, cfg, src, sizeof src);
    snprintf(impl, sizeof impl, "%s%s%s", b->impl ? b->impl->name : "-", b->impl ? "/" : "",
             b->impl ? lk_device_name(b->impl->device) : "");
    if (o->json) {
        printf("%s\n  {\"op\": ", first ? "[" : ",");
        json_str(stdout, op);
        printf(", \"module\": "); json_str(stdout, b->module);
        printf(", \"requested\": "); json_str(stdout, b->requested);
        printf(", \"source\": "); json_str(stdout, src);
        printf(", \"resolved\": "); json_str(stdout, b->resolved);
        printf(", \"impl\": "); json_str(stdout, b->impl ? b->impl->name : "");
        printf(", \"stage\": "); json_str(stdout, lk_stage_name(b->stage));
        printf(", \"fallback\": "); json_str(stdout, b->fallback);
        printf("}");
    } else {
        char name[140];
        snprintf(name, sizeof name, "%s%s%s", op, b->module[0] ? " @ " : "", b->module);
        printf("%-36s %-18s %-32s %-34s %-14s %-16s %s\n", name, b->requested, src, b->resolved, impl,
               lk_stage_name(b->stage), b->fallback);
    }
}

int cli_explain(const cli_opts *o) {
    lk_ops_config cfg;
    lk_op_table table;
    lk_status s;
    static lk_train_config tc;   /* a training config names its model, and so the family */
    lk_ops_config_init(&cfg);
    lk_train_config_init(&tc);
    if (o->config && (s = lk_train_config_load_yaml(o->config, &tc, &cfg))) return cli_fail("explain", s);
    if (o->device && strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0) {
        fprintf(stderr, "llmkern explain: --device: expected cpu or cuda, got '%s'\n", o->device);
        return 2;
    }
    cfg.device = o->device ? (strcmp(o->device, "cuda") == 0 ? LK_DEVICE_CUDA : LK_DEVICE_CPU) : tc.device;
    if ((s = lk_ops_config_finalize(&cfg))) return cli_fail("explain", s);
    const char *family = o->family ? o->family : tc.has_model && tc.model.moe ? "qwen3_moe" : "qwen3";
    if ((s = lk_model_build(&cfg, family, &table))) return cli_fail("explain", s);

    if (!o->json) {
        printf("environment (src/config/env.c):\n");
        for (int i = 0; i < LK_ENV_COUNT; i++) {
            const lk_env_var *v = lk_env_var_get((lk_env_id)i);
            const lk_env_value *e = lk_env((lk_env_id)i);
            printf("  %-26s = %-10s %s (alias %s)\n", v->name, e->value,
                   e->set_by[0] ? "set by" : "default", e->set_by[0] ? e->set_by : v->alias);
        }
        printf("\nmodel family %s, device %s%s%s\n\n", table.family->name, lk_device_name(table.device),
               o->config ? ", config " : "", o->config ? o->config : "");
        printf("%-36s %-18s %-32s %-34s %-14s %-16s %s\n", "OP", "REQUESTED", "SOURCE", "RESOLVED",
               "IMPL", "STAGE", "FALLBACK");
    }
    int first = 1;
    for (int op = 0; op < LK_OP_COUNT; op++, first = 0) print_row(o, &cfg, &table.op[op], first);
    for (int i = 0; i < table.n_module; i++) print_row(o, &cfg, &table.module[i], 0);
    if (o->json) printf("\n]\n");
    return 0;
}
