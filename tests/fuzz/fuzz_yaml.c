/* fuzz_yaml.c — the YAML loaders (src/config: the ops sections, model:, train:, data:,
 * parallel:) on arbitrary bytes: every input is LK_OK or an error, never a crash, and a
 * failed load leaves both configs as they were. Run: scripts/fuzz.sh (make fuzz). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".yaml");
    if (!path) return 0;
    static lk_train_config tc, keep_tc;
    static lk_ops_config ops, keep_ops;
    lk_train_config_init(&tc);
    lk_ops_config_init(&ops);
    keep_tc = tc, keep_ops = ops;
    lk_status s = lk_train_config_load_yaml(path, &tc, &ops);
    fuzz_expect_status(s);
    if (s && (memcmp(&tc, &keep_tc, sizeof tc) != 0 || memcmp(&ops, &keep_ops, sizeof ops) != 0)) {
        fprintf(stderr, "a failed load changed the config: %s\n", lk_last_error());
        abort();
    }
    lk_ops_config_init(&ops);
    fuzz_expect_status(lk_config_load_yaml(path, &ops));
    if (s == LK_OK && tc.has_model) {   /* what the trainer checks first must not overflow */
        lk_train_memory m;
        fuzz_expect_status(lk_train_memory_estimate(&tc, &m));
    }
    return 0;
}
