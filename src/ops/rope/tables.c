/* tables.c — the RoPE cos/sin tables (lk_rope_tables in include/llmkern/rope.h) and the
 * rope scaling types: the inverse frequencies of Hugging Face's default,
 * _compute_llama3_parameters and _compute_yarn_parameters, computed in double. A model
 * builds its tables once; every rope call then only looks rows up. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ops/validate.h"
#include "llmkern/rope.h"

#define OP "rope_tables"

static const char *const scaling_names[LK_ROPE_SCALING_COUNT] = {"default", "llama3", "yarn"};

const char *lk_rope_scaling_name(lk_rope_scaling_type t) {
    return (unsigned)t < LK_ROPE_SCALING_COUNT ? scaling_names[t] : "?";
}

lk_status lk_rope_scaling_parse(const char *name, lk_rope_scaling_type *out) {
    if (name && strcmp(name, "none") == 0) name = "default";
    for (int t = 0; name && t < LK_ROPE_SCALING_COUNT; t++)
        if (strcmp(name, scaling_names[t]) == 0) {
            *out = (lk_rope_scaling_type)t;
            return LK_OK;
        }
    return lk_error(LK_EINVAL, "rope: scaling.type: expected one of default (none), llama3, yarn, got '%s'",
                    name ? name : "(null)");
}

static int positive(double v) { return v > 0.0 && isfinite(v); }

static lk_status check_scaling(const lk_rope_scaling *s) {
    if ((unsigned)s->type >= LK_ROPE_SCALING_COUNT)
        return lk_error(LK_EINVAL, OP ": scaling.type: expected default, llama3 or yarn, got %d", (int)s->type);
    if (s->type == LK_ROPE_SCALING_NONE) return LK_OK;
    if (!positive(s->factor))
        return lk_error(LK_EINVAL, OP ": scaling.factor: expected a finite value > 0, got %g", s->factor);
    if (s->original_max_position_embeddings < 1)
        return lk_error(LK_EINVAL, OP ": scaling.original_max_position_embeddings: expected >= 1, got %lld",
                        (long long)s->original_max_position_embeddings);
    if (s->type == LK_ROPE_SCALING_LLAMA3) {
        if (!positive(s->low_freq_factor))
            return lk_error(LK_EINVAL, OP ": scaling.low_freq_factor: expected a finite value > 0, got %g",
                            s->low_freq_factor);
        if (!(s->high_freq_factor > s->low_freq_factor) || !isfinite(s->high_freq_factor))
            return lk_error(LK_EINVAL, OP ": scaling.high_freq_factor: expected a finite value > "
                            "low_freq_factor (%g), got %g", s->low_freq_factor, s->high_freq_factor);
        return LK_OK;
    }
    if (!(s->beta_fast >= 0.0) || !isfinite(s->beta_fast) || !(s->beta_slow >= 0.0) || !isfinite(s->beta_slow))
        return lk_error(LK_EINVAL, OP ": scaling.beta_fast/beta_slow: expected finite values >= 0 "
                        "(0 = default 32 / 1), got %g / %g", s->beta_fast, s->beta_slow);
    if (!(s->attention_factor >= 0.0) || !isfinite(s->attention_factor))
        return lk_error(LK_EINVAL, OP ": scaling.attention_factor: expected a finite value >= 0 "
                        "(0 = 0.1·ln(factor) + 1), got %g", s->attention_factor);
    return LK_OK;
}

/* llama3: long wavelengths are divided by factor, short ones kept, the band between
 * blended by how many times the wave fits in the original context. */
static double llama3_inv_freq(double f, const lk_rope_scaling *s) {
    double old = (double)s->original_max_position_embeddings;
    double low_wl = old / s->low_freq_factor, high_wl = old / s->high_freq_factor;
    double wl = 2.0 * M_PI / f;
    if (wl < high_wl) return f;
    if (wl > low_wl) return f / s->factor;
    double smooth = (old / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    return (1.0 - smooth) * f / s->factor + smooth * f;
}

/* yarn: the dimension at which a frequency completes num_rot turns over the context. */
static double yarn_correction_dim(double num_rot, double dim, double base, double ctx) {
    return dim * log(ctx / (num_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

/* inv_freq [R/2] and the attention factor cos and sin are scaled by. */
static void inv_freqs(double theta, int64_t R, const lk_rope_scaling *s, double *inv, double *mscale) {
    int64_t half = R / 2;
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0 / pow(theta, (double)(2 * i) / (double)R);
    *mscale = 1.0;
    if (s->type == LK_ROPE_SCALING_LLAMA3) {
        for (int64_t i = 0; i < half; i++) inv[i] = llama3_inv_freq(inv[i], s);
    } else if (s->type == LK_ROPE_SCALING_YARN) {
        double bf = s->beta_fast > 0 ? s->beta_fast : 32.0, bs = s->beta_slow > 0 ? s->beta_slow : 1.0;
        double ctx = (double)s->original_max_position_embeddings;
        double lo = floor(yarn_correction_dim(bf, (double)R, theta, ctx));
        double hi = ceil(yarn_correction_dim(bs, (double)R, theta, ctx));
        lo = fmax(lo, 0.0);
        hi = fmin(hi, (double)(R - 1));
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < half; i++) {
            double ramp = fmin(fmax(((double)i - lo) / (hi - lo), 0.0), 1.0);
            double extra = 1.0 - ramp;          /* 1: keep the frequency, 0: interpolate */
            inv[i] = inv[i] / s->factor * (1.0 - extra) + inv[i] * extra;
        }
        *mscale = s->attention_factor > 0 ? s->attention_factor
                  : s->factor <= 1.0      ? 1.0
                                          : 0.1 * log(s->factor) + 1.0;
    }
}

static lk_status check_table(const char *arg, const lk_tensor *t, int64_t half) {
    lk_status s;
    if (t == NULL) return lk_error(LK_EINVAL, OP ": %s: expected a tensor, got NULL", arg);
    if ((s = lk_expect_operand(OP, LK_DEVICE_CPU, arg, t, 1, 2)) || (s = lk_expect_dtype_eq(OP, arg, t, LK_F32)))
        return s;
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] != half) {
        char b[96];
        return lk_error(LK_ESHAPE, OP ": %s: expected shape [max_pos >= 1, %lld], got %s", arg,
                        (long long)half, lk_shape_str(t, b, sizeof b));
    }
    return LK_OK;
}

lk_status lk_rope_tables(double theta, int64_t rotary_dim, const lk_rope_scaling *scaling,
                         lk_tensor *cos_t, lk_tensor *sin_t) {
    static const lk_rope_scaling none = {0};
    const lk_rope_scaling *s = scaling ? scaling : &none;
    lk_status st;
    if (!(theta > 1.0) || !isfinite(theta))
        return lk_error(LK_EINVAL, OP ": theta: expected a finite value > 1, got %g", theta);
    if (rotary_dim < 2 || rotary_dim % 2)
        return lk_error(LK_EINVAL, OP ": rotary_dim: expected an even value >= 2, got %lld",
                        (long long)rotary_dim);
    if ((st = check_scaling(s)) || (st = check_table("cos", cos_t, rotary_dim / 2)) ||
        (st = check_table("sin", sin_t, rotary_dim / 2)))
        return st;
    if (!lk_tensor_same_shape(cos_t, sin_t))
        return lk_error(LK_ESHAPE, OP ": sin: expected the shape of cos, got a different max_pos");
    size_t tb = lk_tensor_bytes(cos_t);
    uintptr_t pc = (uintptr_t)cos_t->data, ps = (uintptr_t)sin_t->data;
    if (pc < ps + tb && ps < pc + tb)
        return lk_error(LK_EINVAL, OP ": sin: expected memory apart from cos, got an overlap");
    int64_t half = rotary_dim / 2, max_pos = cos_t->shape[0];
    double *inv = malloc((size_t)half * sizeof *inv), m;
    if (inv == NULL) return lk_error(LK_ENOMEM, OP ": out of memory for %lld frequencies", (long long)half);
    inv_freqs(theta, rotary_dim, s, inv, &m);
    float *c = cos_t->data, *sn = sin_t->data;
    #pragma omp parallel for schedule(static) if (max_pos * half >= 65536)
    for (int64_t p = 0; p < max_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)p * inv[i];
            c[p * half + i] = (float)(m * cos(a));
            sn[p * half + i] = (float)(m * sin(a));
        }
    free(inv);
    return LK_OK;
}
