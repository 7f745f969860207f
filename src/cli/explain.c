/* explain.c — `llmkern explain [--config F] [--device cpu|cuda]`: runs the lifecycle as a
 * model build would (for the family --family names, else the config's model, else qwen3;
 * on the device --device names, else the config's train.device, else the CPU) and
 * prints, per op (and per overridden module), the requested value and its source, the
 * resolved name, the bound implementation, the stage that bound it and any
 * fallback. The source also says what another system's name (NeMo AutoModel's
 * model.backend) resolved to, and the MoE router row the router options (fake_gate_noise,
 * gate_precision).
 * Text: the environment table, then tables (table.c) of the op-wide bindings, the
 * per-module overrides and the fallbacks, each only when it has rows.
 * --json: {op, module, requested, source, resolved, impl, stage, fallback} per binding. */
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

static void json_row(cli_json *j, const lk_ops_config *cfg, const lk_binding *b) {
    char src[640];
    source_text(b, cfg, src, sizeof src);
    cli_json_object(j, NULL);
    cli_json_str(j, "op", lk_op_info_get(b->op)->name);
    cli_json_str(j, "module", b->module);
    cli_json_str(j, "requested", b->requested);
    cli_json_str(j, "source", src);
    cli_json_str(j, "resolved", b->resolved);
    cli_json_str(j, "impl", b->impl ? b->impl->name : "");
    cli_json_str(j, "stage", lk_stage_name(b->stage));
    cli_json_str(j, "fallback", b->fallback);
    cli_json_close(j);
}

/* A binding as a table row: [module,] op, requested, impl, stage, source. The device is
 * the table's (said above it): every binding is on it. */
static void text_row(cli_table *t, const lk_ops_config *cfg, const lk_binding *b, int with_module) {
    char src[640];
    const char *op = lk_op_info_get(b->op)->name, *impl = b->impl ? b->impl->name : "none";
    source_text(b, cfg, src, sizeof src);
    if (with_module) cli_table_add(t, (const char *[]){b->module, op, b->requested, impl, lk_stage_name(b->stage), src});
    else cli_table_add(t, (const char *[]){op, b->requested, impl, lk_stage_name(b->stage), src});
}

static lk_status print_text(const cli_opts *o, const lk_ops_config *cfg, const lk_op_table *table,
                            const lk_train_config *tc) {
    static const char *const head[] = {"OP", "REQUESTED", "IMPL", "STAGE", "SOURCE"},
                             *const mod_head[] = {"MODULE", "OP", "REQUESTED", "IMPL", "STAGE", "SOURCE"},
                             *const fb_head[] = {"OP", "FALLBACK"};
    cli_table t;
    lk_status s;
    printf("environment (src/config/env.c):\n");
    cli_table_init(&t, 3, NULL, 0);
    for (int i = 0; i < LK_ENV_COUNT; i++) {
        const lk_env_var *v = lk_env_var_get((lk_env_id)i);
        const lk_env_value *e = lk_env((lk_env_id)i);
        char value[96], how[256];
        snprintf(value, sizeof value, "= %s", e->value);
        if (e->set_by[0]) snprintf(how, sizeof how, "set by %s", e->set_by);
        else snprintf(how, sizeof how, "default (alias %s)", v->alias);
        cli_table_add(&t, (const char *[]){v->name, value, how});
    }
    if ((s = cli_table_print(&t, stdout, 2))) return s;
    char line[1200];
    snprintf(line, sizeof line, "model family %s, device %s%s%s", table->family->name, lk_device_name(table->device),
             o->config ? ", config " : "", o->config ? o->config : "");
    printf("\n");
    cli_text(stdout, 0, 4, line);
    printf("\n");
    cli_table_init(&t, 5, head, 0);
    for (int op = 0; op < LK_OP_COUNT; op++) text_row(&t, cfg, &table->op[op], 0);
    if ((s = cli_table_print(&t, stdout, 0))) return s;
    const lk_binding *qn = lk_op_table_get(table, LK_OP_RMS_NORM, "layers.0.self_attn.q_norm"),
                     *kn = lk_op_table_get(table, LK_OP_RMS_NORM, "layers.0.self_attn.k_norm"),
                     *rp = lk_op_table_get(table, LK_OP_ROPE, "layers.0.self_attn.rotary_emb");
    /* a config's model: its head dim in the run's dtype; none: the implementations alone */
    const int64_t head_dim = tc->has_model ? tc->model.head_dim : 0;
    if (qn && kn && rp && lk_model_rope_in_norms(qn->impl, kn->impl, rp->impl, head_dim, lk_train_dtype(tc))) {
        printf("\n");
        cli_text(stdout, 0, 4, "q_norm and k_norm rotate q and k as they write them (rms_norm's rope, the fused "
                               "RoPE's bits): no RoPE pass of its own (layer 0's bindings)");
    }
    if (table->n_module) {
        printf("\nper-module overrides (%d):\n", table->n_module);
        cli_table_init(&t, 6, mod_head, 0);
        for (int i = 0; i < table->n_module; i++) text_row(&t, cfg, &table->module[i], 1);
        if ((s = cli_table_print(&t, stdout, 2))) return s;
    }
    cli_table_init(&t, 2, fb_head, 0);
    for (int i = 0; i < LK_OP_COUNT + table->n_module; i++) {
        const lk_binding *b = i < LK_OP_COUNT ? &table->op[i] : &table->module[i - LK_OP_COUNT];
        char name[200];
        snprintf(name, sizeof name, "%s%s%s", lk_op_info_get(b->op)->name, b->module[0] ? " @ " : "", b->module);
        if (b->fallback[0]) cli_table_add(&t, (const char *[]){name, b->fallback});
    }
    if (t.nrow) printf("\nfallbacks (%d), defaults that cannot run here:\n", t.nrow);
    return t.nrow ? cli_table_print(&t, stdout, 2) : (cli_table_free(&t), LK_OK);
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
    tc.device = cfg.device;   /* the run's dtype follows the device asked for */
    if ((s = lk_ops_config_finalize(&cfg))) return cli_fail("explain", s);
    const char *family = o->family ? o->family : tc.has_model && tc.model.moe ? "qwen3_moe" : "qwen3";
    if ((s = lk_model_build(&cfg, family, &table))) return cli_fail("explain", s);

    if (!o->json) return (s = print_text(o, &cfg, &table, &tc)) ? cli_fail("explain", s) : 0;
    cli_json j;
    cli_json_begin(&j, stdout);
    for (int op = 0; op < LK_OP_COUNT; op++) json_row(&j, &cfg, &table.op[op]);
    for (int i = 0; i < table.n_module; i++) json_row(&j, &cfg, &table.module[i]);
    cli_json_end(&j);
    return 0;
}
