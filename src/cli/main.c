/* main.c — the llmkern command.
 *   llmkern list | explain [--config F] [--device cpu|cuda] | check [--op N] [--device cpu|cuda]
 *         | bench [--op N] [--size 8192x4096] [--mask M] [--kv-heads H] [--block N]
 *         | train --config F [--steps N] [--out DIR] [--resume DIR] [--init DIR] [--device cpu|cuda] [--no-save]
 *                 [--save-init]
 * Every command takes --json. Exit status: 0 ok, 1 a check failed, 2 bad usage or error. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"

static const char usage[] =
    "usage: llmkern <command> [options]\n"
    "  list                    every op and implementation, and whether it runs here\n"
    "  explain [--config F]    what each op binds, from which source, at which stage\n"
    "          [--family qwen3|qwen3_moe] [--device cpu|cuda]\n"
    "  check   [--op N] [--impl N] [--dtype D] [--seed S] [--device cpu|cuda]\n"
    "                          every available implementation against the float64 reference\n"
    "                          (CUDA rows on the GPU; --device: only that device's rows)\n"
    "  bench   [--op N] [--impl N] [--dtype D] [--size AxB]\n"
    "          [--mask none|causal|sliding|prefix_lm|document] [--kv-heads H] [--block N]\n"
    "                          copy bandwidth and GEMM rate, then every implementation's passes;\n"
    "                          attention: --size BxHxSxD, --mask (causal unless given), --kv-heads\n"
    "                          (GQA, default H), --block (the BlockMask's, default 128)\n"
    "  train   --config F [--steps N] [--out DIR] [--resume DIR] [--init DIR] [--device cpu|cuda]\n"
    "                          train the config's model, checkpoints and loss plot in DIR;\n"
    "                          --init: start from a Hugging Face checkpoint directory;\n"
    "                          --no-save: no checkpoint and no final model (timing runs);\n"
    "                          --save-init: the initial weights saved into DIR, no step\n"
    "options: --json           rows as JSON (train: one object per step)\n";

int cli_fail(const char *what, lk_status s) {
    fprintf(stderr, "llmkern %s: %s (%s)\n", what, lk_last_error(), lk_status_name(s));
    return 2;
}

const lk_harness *cli_harness_for(const lk_impl *impl, const int selected[LK_OP_COUNT], const char *only,
                                  unsigned devices) {
    const lk_harness *h = lk_harness_get(impl->op);
    char why[160];
    if (!selected[impl->op] || !h || !(devices & CLI_DEVICE(impl->device)) || (only && strcmp(only, impl->name) != 0) ||
        !lk_impl_available(impl, lk_hw_get(), why, sizeof why))
        return NULL;
    return h;
}

int cli_ops(const char *name, int selected[LK_OP_COUNT]) {
    lk_op op;
    for (int i = 0; i < LK_OP_COUNT; i++) selected[i] = name == NULL;
    if (name == NULL) return 1;
    if (strcmp(name, "moe") == 0) {     /* the MoE block: its router and its experts */
        selected[LK_OP_MOE_ROUTER] = selected[LK_OP_MOE_EXPERTS] = 1;
        return 1;
    }
    if (lk_op_parse(name, &op) != LK_OK) {
        fprintf(stderr, "llmkern: --op: %s\n", lk_last_error());
        return 0;
    }
    selected[op] = 1;
    return 1;
}

int main(int argc, char **argv) {
    /* OpenMP read its environment when it loaded, before main: with none set, start again
     * with passive barriers (lk_env_openmp_defaults; bench/NOTES.md, "OpenMP under load").
     * Should the exec fail, the run goes on as it is. */
    if (lk_env_openmp_defaults()) execv("/proc/self/exe", argv);
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    cli_opts o = {.seed = 1234};   /* family NULL: explain takes the config's */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = strcmp(a, "--config") == 0 ? &o.config
                          : strcmp(a, "--family") == 0 ? &o.family
                          : strcmp(a, "--op") == 0     ? &o.op
                          : strcmp(a, "--impl") == 0   ? &o.impl
                          : strcmp(a, "--dtype") == 0  ? &o.dtype
                          : strcmp(a, "--size") == 0   ? &o.size
                          : strcmp(a, "--mask") == 0   ? &o.mask
                          : strcmp(a, "--kv-heads") == 0 ? &o.kv_heads
                          : strcmp(a, "--block") == 0  ? &o.block
                          : strcmp(a, "--out") == 0    ? &o.out
                          : strcmp(a, "--resume") == 0 ? &o.resume
                          : strcmp(a, "--init") == 0   ? &o.init
                          : strcmp(a, "--device") == 0 ? &o.device : NULL;
        if (strcmp(a, "--json") == 0) { o.json = 1; continue; }
        if (strcmp(a, "--no-save") == 0) { o.no_save = 1; continue; }
        if (strcmp(a, "--save-init") == 0) { o.save_init = 1; continue; }
        if (strcmp(a, "--seed") == 0 && i + 1 < argc) { o.seed = strtoull(argv[++i], NULL, 10); continue; }
        if (strcmp(a, "--steps") == 0 && i + 1 < argc) {   /* strict: -1, 0, abc and 1e3 are refused by name */
            char *end;
            errno = 0;
            long long v = strtoll(argv[++i], &end, 10);
            if (end == argv[i] || *end || errno || v < 1) {
                fprintf(stderr, "llmkern %s: --steps: expected a positive integer (at most %lld), got '%s'\n", cmd,
                        (long long)INT64_MAX, argv[i]);
                return 2;
            }
            o.steps = v;
            continue;
        }
        if (slot && i + 1 < argc) { *slot = argv[++i]; continue; }
        fprintf(stderr, "llmkern %s: unknown or incomplete option '%s'\n%s", cmd, a, usage);
        return 2;
    }
    lk_status s = lk_init();
    if (s) return cli_fail(cmd, s);
    lk_model_register(&lk_family_qwen3);
    lk_model_register(&lk_family_qwen3_moe);

    if (strcmp(cmd, "list") == 0) return cli_list(&o);
    if (strcmp(cmd, "explain") == 0) return cli_explain(&o);
    if (strcmp(cmd, "check") == 0) return cli_check(&o);
    if (strcmp(cmd, "bench") == 0) return cli_bench(&o);
    if (strcmp(cmd, "train") == 0) return cli_train(&o);
    fprintf(stderr, "llmkern: unknown command '%s'\n%s", cmd, usage);
    return 2;
}
