/* reference.c — the float64 linear oracle (see reference.h). */
#include "ops/linear/reference.h"

void lk_linear_ref_forward(const double *x, const double *w, const double *b, int64_t rows, int64_t in,
                           int64_t out, double *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
}

void lk_linear_ref_backward(const double *x, const double *w, const double *dy, int64_t rows, int64_t in,
                            int64_t out, double *dx, double *dw, double *db) {
    for (int64_t r = 0; dx && r < rows; r++)
        for (int64_t i = 0; i < in; i++) {
            double s = 0.0;
            for (int64_t o = 0; o < out; o++) s += dy[r * out + o] * w[o * in + i];
            dx[r * in + i] = s;
        }
    for (int64_t o = 0; dw && o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double s = 0.0;
            for (int64_t r = 0; r < rows; r++) s += dy[r * out + o] * x[r * in + i];
            dw[o * in + i] += s;
        }
    for (int64_t o = 0; db && o < out; o++) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; r++) s += dy[r * out + o];
        db[o] += s;
    }
}
