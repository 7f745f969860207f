/* harness.c — each op's harness, as its descriptor names it (src/ops/op_def.h), and the
 * pieces every harness shares: shapes, random inputs, poisoning, a check's tensors moved
 * to its row's device (lk_place_*), relative error and timing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops/op_def.h"
#ifdef LLMKERN_HAVE_CUDA
#include "model/device.h"       /* the CUDA moves: alloc, put, get (device.cu) */
#endif

const lk_harness *lk_harness_get(lk_op op) {
    const lk_op_def *def = lk_op_def_get(op);
    return def ? def->harness : NULL;
}

int lk_harness_runs(const lk_harness *h, const lk_impl *impl, lk_dtype dt) {
    unsigned bit = LK_DTYPE_BIT(dt);
    return (impl->needs.dtypes & bit) && (!h->dtypes || (h->dtypes & bit));
}

const char *lk_shape_format(const lk_shape *s, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? "x%lld" : "%lld", (long long)s->d[i]);
    return buf;
}

lk_status lk_shape_parse(const char *text, lk_shape *s) {
    lk_shape out = {0};
    const char *p = text;
    while (p && *p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || out.ndim == LK_MAX_DIMS || (*end && *end != 'x' && *end != ','))
            return lk_error(LK_EINVAL, "--size: expected positive integers joined by 'x' such as 8192x4096, got '%s'",
                            text);
        out.d[out.ndim++] = v;
        p = *end ? end + 1 : end;
    }
    if (out.ndim == 0)
        return lk_error(LK_EINVAL, "--size: expected positive integers joined by 'x' such as 8192x4096, got '%s'",
                        text ? text : "(null)");
    *s = out;
    return LK_OK;
}

int64_t lk_shape_numel(const lk_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

void lk_check_row_begin(lk_check_row *row, const char *op, const lk_impl *impl, lk_dtype dt, const lk_shape *shape,
                        double tol) {
    memset(row, 0, sizeof *row);
    snprintf(row->op, sizeof row->op, "%s", op);
    snprintf(row->impl, sizeof row->impl, "%s", impl ? impl->name : "(null)");
    snprintf(row->dtype, sizeof row->dtype, "%s", lk_dtype_name(dt));
    lk_shape_format(shape, row->shape, sizeof row->shape);
    row->max_rel_err = INFINITY;
    row->tol = tol;
}

void lk_check_row_end(lk_check_row *row, double max_rel_err) {
    row->max_rel_err = isnan(max_rel_err) ? INFINITY : max_rel_err;
    row->pass = row->max_rel_err <= row->tol;
}

void *lk_bench_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) & ~(size_t)63); }

void *lk_random_tensor(lk_rng *rng, lk_dtype dt, int64_t n, float std, double **ref) {
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    void *out = malloc((size_t)(n > 0 ? n : 1) * lk_dtype_size(dt));
    if (ref) *ref = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!f || !out || (ref && !*ref)) {
        free(f); free(out);
        if (ref) { free(*ref); *ref = NULL; }
        return NULL;
    }
    lk_rng_normal(rng, f, n, 0.0f, std);
    lk_convert(f, LK_F32, out, dt, n);
    for (int64_t i = 0; ref && i < n; i++) (*ref)[i] = lk_load(out, dt, i);
    free(f);
    return out;
}

void lk_poison(void *data, lk_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) lk_store(data, dt, i, NAN);
}

double lk_rel_err(const void *got, lk_dtype dt, const double *ref, int64_t n) {
    double max_err = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = lk_load(got, dt, i), e = fabs(g - ref[i]);
        if (isnan(g) || isnan(e)) return INFINITY;
        if (e > max_err) max_err = e;
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
    }
    return max_err / (max_ref > 1e-300 ? max_ref : 1.0);
}

double lk_rel_err_f64(const double *got, const double *want, int64_t n) {
    double max_err = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]);
        if (isnan(e)) return INFINITY;
        if (e > max_err) max_err = e;
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    }
    return max_err / (max_ref > 1e-300 ? max_ref : 1.0);
}

lk_status lk_place_begin(lk_placement *p, const char *op, const lk_impl *impl) {
    memset(p, 0, sizeof *p);
    p->op = op;
    p->device = (lk_device){impl ? impl->device : LK_DEVICE_CPU, 0};
    if (p->device.type == LK_DEVICE_CPU) return LK_OK;
#ifdef LLMKERN_HAVE_CUDA
    if (p->device.type == LK_DEVICE_CUDA) {
        const lk_model_device *m = &lk_model_device_cuda;
        p->device.index = m->current();
        p->alloc = m->alloc;
        p->release = m->free;
        p->put = m->put;
        p->get = m->get;
        return LK_OK;
    }
#endif
    return p->status = lk_error(LK_EUNAVAILABLE, "%s: check: %s rows cannot run in this build (no moves to the "
                                "device)", op, lk_device_name(p->device.type));
}

/* The device copy of host's bytes [host, host + bytes): an existing one when they lie
 * inside a buffer already placed, else a new one. NULL (p->status set) on failure. */
static void *place(lk_placement *p, const char *name, void *host, size_t bytes, int out) {
    const unsigned char *h = host;
    for (int i = 0; i < p->n; i++) {
        const unsigned char *b = p->buf[i].host;
        if (h >= b && h + bytes <= b + p->buf[i].bytes) {
            p->buf[i].out |= out;
            return (unsigned char *)p->buf[i].dev + (h - b);
        }
        if (h < b + p->buf[i].bytes && b < h + bytes) {    /* overlaps one, not inside it: two copies would differ */
            p->status = lk_error(LK_EINTERNAL, "%s: check: %s overlaps a buffer placed before it without lying "
                                 "inside it", p->op, name);
            return NULL;
        }
    }
    if (p->n == LK_PLACE_MAX) {
        p->status = lk_error(LK_EINTERNAL, "%s: check: %s: more than %d buffers to place on %s", p->op, name,
                             LK_PLACE_MAX, lk_device_name(p->device.type));
        return NULL;
    }
    void *d = p->alloc(bytes);
    if (!d) {
        p->status = lk_error(LK_ENOMEM, "%s: check: %s: out of %s memory for %zu bytes", p->op, name,
                             lk_device_name(p->device.type), bytes);
        return NULL;
    }
    lk_status s = p->put(d, host, bytes);
    if (s) {
        p->release(d);
        p->status = s;
        return NULL;
    }
    p->buf[p->n].host = host;
    p->buf[p->n].dev = d;
    p->buf[p->n].bytes = bytes;
    p->buf[p->n].out = out;
    p->n++;
    return d;
}

void lk_place_tensor(lk_placement *p, const char *name, lk_tensor *t, int out) {
    if (p->device.type == LK_DEVICE_CPU || p->status) return;
    t->device = p->device;
    if (!t->data) return;
    void *d = place(p, name, t->data, lk_tensor_span_bytes(t), out);
    if (d) t->data = d;
}

void lk_place_tensors(lk_placement *p, const lk_named_tensor *list, int out) {
    for (; list->name; list++) lk_place_tensor(p, list->name, list->t, out);
}

void lk_place_saved(lk_placement *p, const char *name, lk_saved *s, int out) {
    if (p->device.type == LK_DEVICE_CPU || p->status || !s->data) return;
    void *d = place(p, name, s->data, s->bytes, out);
    if (d) s->data = d;
}

lk_ctx lk_place_ctx(const lk_placement *p, lk_arena *arena) {
    if (p->device.type == LK_DEVICE_CPU) return lk_ctx_cpu(arena);
    arena->device = p->device.type;
    return lk_ctx_cuda(arena, NULL, p->device.index);
}

lk_status lk_place_fetch(lk_placement *p) {
    if (p->status) return p->status;
    for (int i = 0; i < p->n; i++) {
        if (!p->buf[i].out) continue;
        lk_status s = p->get(p->buf[i].host, p->buf[i].dev, p->buf[i].bytes);
        if (s) return p->status = s;
    }
    return LK_OK;
}

void lk_place_end(lk_placement *p) {
    for (int i = 0; i < p->n; i++) p->release(p->buf[i].dev);
    p->n = 0;
}

double lk_tol_find(const lk_tol *tols, size_t n, const lk_impl *impl, lk_dtype dt, double fallback) {
    for (size_t i = 0; i < n; i++)
        if (tols[i].dt == dt && (!tols[i].impl || (impl && strcmp(tols[i].impl, impl->name) == 0)))
            return tols[i].tol;
    return fallback;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lk_time_ms(lk_status (*fn)(void *), void *arg, double min_seconds, lk_status *err) {
    enum { MAX_REPS = 200 };
    double t[MAX_REPS], start = lk_now();
    if ((*err = fn(arg))) return 0.0;            /* warm-up: first touch, arena growth */
    int n = 0;
    while (n < MAX_REPS && (n < 3 || lk_now() - start < min_seconds)) {
        double t0 = lk_now();
        if ((*err = fn(arg))) return 0.0;
        t[n++] = (lk_now() - t0) * 1e3;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

static lk_status both(void *p) {
    const lk_bench_spec *b = p;
    lk_status s = b->fwd(b->job);
    return s ? s : b->bwd(b->job);
}

static lk_status fwd_only(void *p) { const lk_bench_spec *b = p; return b->fwd(b->job); }
static lk_status bwd_only(void *p) { const lk_bench_spec *b = p; return b->bwd(b->job); }

lk_status lk_bench_passes(const lk_bench_spec *b, const lk_ceilings *ceil, lk_bench_row rows[3]) {
    static const char *const pass[3] = {"fwd", "bwd", "fwd+bwd"};
    lk_status (*const fn[3])(void *) = {fwd_only, bwd_only, both};
    double flops[3] = {b->flops[0], b->flops[1], b->flops[0] + b->flops[1]};
    double bytes[3] = {b->bytes[0], b->bytes[1], b->bytes[0] + b->bytes[1]};
    for (int k = 0; k < 3; k++) {
        lk_status s;
        lk_bench_row *r = &rows[k];
        memset(r, 0, sizeof *r);
        r->ms = lk_time_ms(fn[k], (void *)b, 1.0, &s);
        if (s) return s;
        snprintf(r->op, sizeof r->op, "%s", b->op);
        snprintf(r->impl, sizeof r->impl, "%s", b->impl->name);
        snprintf(r->device, sizeof r->device, "%s", lk_device_name(b->impl->device));
        snprintf(r->dtype, sizeof r->dtype, "%s", lk_dtype_name(b->dtype));
        lk_shape_format(b->shape, r->shape, sizeof r->shape);
        snprintf(r->pass, sizeof r->pass, "%s", pass[k]);
        r->gbps = bytes[k] / (r->ms * 1e6);
        r->gflops = flops[k] / (r->ms * 1e6);
        if (ceil && flops[k] > 0 && ceil->gemm_gflops > 0) r->ceiling_fraction = r->gflops / ceil->gemm_gflops;
        else if (ceil && ceil->copy_gbps > 0) r->ceiling_fraction = r->gbps / ceil->copy_gbps;
        r->peak_bytes = b->extra_bytes + (b->arena ? b->arena->peak : 0);
    }
    return LK_OK;
}
