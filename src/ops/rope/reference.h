/* reference.h — the float64 RoPE oracle every implementation is held against (by the
 * harness, `llmkern check` and tests/test_rope.c). Plain loops on double arrays, one
 * tensor [B, H, S, D] at a time; no threads, no workspace, nothing clever. */
#ifndef LLMKERN_ROPE_REFERENCE_H
#define LLMKERN_ROPE_REFERENCE_H

#include <stdint.h>

typedef struct {
    int64_t batch, heads, seq, head_dim, rotary_dim;
    const double *cos, *sin;    /* [max_pos, rotary_dim/2] */
    const int64_t *pos;         /* [batch, seq]; NULL: 0..seq-1 */
} lk_rope_ref_problem;

/* out = x·cos + rotate_half(x)·sin on the first rotary_dim dims, x past them. */
void lk_rope_ref_forward(const lk_rope_ref_problem *p, const double *x, double *out);

/* dx = the transpose of the forward applied to dout. */
void lk_rope_ref_backward(const lk_rope_ref_problem *p, const double *dout, double *dx);

#endif
