/* llmkern.h — the whole public API. Link with -lllmkern.
 *
 *   lk_init();                                   // register, read the environment
 *   lk_ops_config cfg; lk_ops_config_init(&cfg);
 *   lk_config_load_yaml("run.yaml", &cfg);       // optional
 *   lk_ops_config_finalize(&cfg);
 *   lk_op_table ops; lk_model_build(&cfg, "qwen3", &ops);
 *   const lk_impl *norm = lk_op_table_get(&ops, LK_OP_RMS_NORM, "layers.0.input_layernorm")->impl;
 *   lk_rms_norm_forward(norm, &args, &ctx);
 */
#ifndef LLMKERN_H
#define LLMKERN_H

#include "status.h"
#include "tensor.h"
#include "arena.h"
#include "rng.h"
#include "context.h"
#include "registry.h"
#include "config.h"
#include "model.h"
#include "rms_norm.h"
#include "moe_dispatch.h"
#include "comm.h"
#include "data.h"
#include "train.h"
#include "attention.h"
#include "moe.h"
#include "cross_entropy.h"
#include "swiglu_mlp.h"
#include "rope.h"
#include "linear.h"

#endif
