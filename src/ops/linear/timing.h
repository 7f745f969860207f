/* timing.h — the bench loop the GEMM-based ops share (linear, swiglu_mlp): forward,
 * backward and both timed with lk_time_ms, rows filled with GFLOP/s against the
 * measured GEMM rate and the extra memory the op held. */
#ifndef LLMKERN_OPS_DENSE_TIMING_H
#define LLMKERN_OPS_DENSE_TIMING_H

#include "ops/harness.h"

typedef struct {
    const char *op;
    const lk_impl *impl;
    lk_dtype dt;
    const lk_shape *shape;
    void (*fwd)(void *job);
    void (*bwd)(void *job);
    void *job;
    double flops_fwd, flops_bwd;    /* per call */
    const lk_arena *arena;          /* the op's workspace: its peak is read after the runs */
    size_t extra_bytes;             /* held besides the arena: what the forward saves, f32 temps */
} lk_dense_bench_spec;

/* Fills rows[0..2] (fwd, bwd, fwd+bwd); ceil may be NULL. */
void lk_dense_bench(const lk_dense_bench_spec *b, const lk_ceilings *ceil, lk_bench_row rows[3]);

#endif
