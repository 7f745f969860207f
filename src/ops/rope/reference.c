/* reference.c — the float64 RoPE oracle (see reference.h), written as the textbook
 * formulas over the two halves of the rotated part, h = rotary_dim/2:
 *   out[j]     = x[j]·c − x[j+h]·s          dx[j]     =  dout[j]·c + dout[j+h]·s
 *   out[j+h]   = x[j+h]·c + x[j]·s          dx[j+h]   = −dout[j]·s + dout[j+h]·c
 * with c, s the table row of the token's position; the backward is the transpose of
 * the forward's 2x2 block, written out rather than derived from it. */
#include "reference.h"

#include <stddef.h>

static void rows(const lk_rope_ref_problem *p, const double *in, double *out, int transpose) {
    int64_t D = p->head_dim, h = p->rotary_dim / 2;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t hd = 0; hd < p->heads; hd++)
            for (int64_t s = 0; s < p->seq; s++) {
                int64_t pos = p->pos ? p->pos[b * p->seq + s] : s;
                const double *c = p->cos + pos * h, *sn = p->sin + pos * h;
                const double *x = in + ((b * p->heads + hd) * p->seq + s) * D;
                double *y = out + ((b * p->heads + hd) * p->seq + s) * D;
                for (int64_t j = 0; j < h; j++) {
                    if (!transpose) {
                        y[j] = x[j] * c[j] - x[j + h] * sn[j];
                        y[j + h] = x[j + h] * c[j] + x[j] * sn[j];
                    } else {
                        y[j] = x[j] * c[j] + x[j + h] * sn[j];
                        y[j + h] = -x[j] * sn[j] + x[j + h] * c[j];
                    }
                }
                for (int64_t j = 2 * h; j < D; j++) y[j] = x[j];
            }
}

void lk_rope_ref_forward(const lk_rope_ref_problem *p, const double *x, double *out) { rows(p, x, out, 0); }

void lk_rope_ref_backward(const lk_rope_ref_problem *p, const double *dout, double *dx) { rows(p, dout, dx, 1); }
