/* fuzz_config_json.c — config.json (lk_qwen3_config_parse, then, when it parses, the
 * parameter count, the tensor list and the JSON written back) on arbitrary bytes. */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static lk_qwen3_config c;
    lk_status s = lk_qwen3_config_parse((const char *)data, size, "fuzz.json", &c);
    fuzz_expect_status(s);
    if (s) return 0;
    int64_t params, tensors;
    if (lk_qwen3_param_count(&c, "fuzz.json", &params, &tensors) != LK_OK) abort();   /* validated: it must fit */
    size_t n;
    if (tensors <= 100000 && lk_qwen3_tensor_list(&c, NULL, 0, &n) != LK_OK) abort();
    char *json = NULL;
    if (lk_qwen3_config_to_json(&c, &json) == LK_OK) {
        static lk_qwen3_config back;
        if (lk_qwen3_config_parse(json, strlen(json), "written", &back) != LK_OK) {
            fprintf(stderr, "written config.json does not parse back: %s\n", lk_last_error());
            abort();
        }
    }
    free(json);
    return 0;
}
