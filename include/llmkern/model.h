/* model.h — the model families llmkern builds. Register one with lk_model_register()
 * before lk_model_build(cfg, "qwen3", &table). */
#ifndef LLMKERN_MODEL_H
#define LLMKERN_MODEL_H

#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const lk_model_family lk_family_qwen3;       /* dense Qwen3 */
extern const lk_model_family lk_family_qwen3_moe;   /* Qwen3-MoE */

#ifdef __cplusplus
}
#endif
#endif
