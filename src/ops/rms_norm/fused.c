/* fused.c — `fused` RMSNorm on the CPU: one pass over memory each way.
 *
 * Forward, per row: the sum of squares (f32), rstd saved as f32 [rows], y written while
 * the row is still in L1. Backward, per row: Σ dy·w·x, then dx and the row's share of
 * dweight while x and dy are still in cache. Rows are split statically over OpenMP
 * threads; each thread sums dweight into its own f32 buffer from the arena, and the
 * buffers are added in thread order at the end, so a run is deterministic for a given
 * thread count. bf16 is loaded to f32, computed in f32 and rounded once on the store.
 * bf16 x may come with an f32 weight (rms_norm.h): it is loaded as f32 (wt), and the
 * f32 dweight sums are stored as they are.
 *
 * The residual mode (rms_norm.h) adds a pass over the row before the forward's (residual
 * += delta in f32, x = its rounding), after which the row code above reads the f32
 * residual back from L1 (the stream autocast normalizes; with norm_of_x the written x
 * instead: the same bits as the plain norm of that x, which a recompute runs; in f32
 * the two are the same values) and one after the
 * backward's (dx kept in f32 — in dx itself for f32, a per-thread row for bf16 — then
 * residual += dx, dx = its rounding). The add is its own loop on stored values, so no
 * FMA contraction can fuse it with dx's last multiply: in f32 the stream's sums are the
 * bits of separate adds. The stream in x's dtype (a bf16 residual, rms_norm.h) takes the
 * same passes with the residual loaded as bf16 and never stored: x = the sum's rounding,
 * normalized as x; dx = the rounding of residual + dx.
 *
 * RoPE after the norm (rms_norm.h's rope): the forward rotates each written row of y in
 * place by rope/row.h's row, the `fused` RoPE's own (no streaming stores then: the row is
 * read back); the backward rotates the row of dy back into a per-thread row first, as
 * that RoPE's backward would have written it, and reads that as dy.
 *
 * Reached through lk_rms_norm_forward / lk_rms_norm_backward (rms_norm.c), which have
 * validated every argument and reserved workspace_bytes in ctx->arena.
 *
 * Memory-bound: at 8192x4096 it moves the five tensor passes at about the machine's
 * memcpy rate. Tried and dropped for no measurable gain: software prefetch of the next
 * row during the second pass, and an f32 copy of off + w for the backward. */
#include <math.h>
#include <omp.h>
#include "llmkern/rms_norm.h"
#include "ops/rope/internal.h"
#include "ops/rope/row.h"
#include "ops/rows.h"
#include "ops/simd.h"

/* Outputs larger than this are streamed past the caches: they are evicted before anyone
 * reads them back, and a streaming store skips the read of each destination line that
 * an ordinary store costs (five tensor passes instead of seven forward+backward; at
 * 8192x4096 f32 on a 2-core EPYC, 36 ms -> 23 ms). */
#define FUSED_NT_BYTES ((size_t)16 << 20)
/* Fewer elements than this run on one thread: waking the team costs more. */
#define FUSED_PAR_MIN ((int64_t)1 << 15)

#define INLINE static inline __attribute__((always_inline))

static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static int use_streaming(const void *out, int64_t rows, int64_t n, lk_dtype dt) {
    size_t row_bytes = (size_t)n * lk_dtype_size(dt);
    return LK_V16_NATIVE && (size_t)rows * row_bytes >= FUSED_NT_BYTES && row_bytes % 64 == 0 &&
           (uintptr_t)out % 64 == 0;
}

/* Σ a·b over a row (b may be a itself), four accumulators to cover the FMA latency. */
INLINE float row_dot(const void *a, const void *b, lk_dtype dt, int64_t n) {
    lk_v16 s0 = lk_v16_set1(0), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        s0 = lk_v16_fma(lk_v16_load(a, dt, j, 16), lk_v16_load(b, dt, j, 16), s0);
        s1 = lk_v16_fma(lk_v16_load(a, dt, j + 16, 16), lk_v16_load(b, dt, j + 16, 16), s1);
        s2 = lk_v16_fma(lk_v16_load(a, dt, j + 32, 16), lk_v16_load(b, dt, j + 32, 16), s2);
        s3 = lk_v16_fma(lk_v16_load(a, dt, j + 48, 16), lk_v16_load(b, dt, j + 48, 16), s3);
    }
    for (; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        s0 = lk_v16_fma(lk_v16_load(a, dt, j, k), lk_v16_load(b, dt, j, k), s0);
    }
    return lk_v16_sum(lk_v16_add(lk_v16_add(s0, s1), lk_v16_add(s2, s3)));
}

/* Σ dy·(off + w)·x over a row: the backward's one reduction. w is of wt (dt, or f32). */
INLINE float row_dot_weighted(const void *dy, const void *w, float off, const void *x,
                              lk_dtype dt, lk_dtype wt, int64_t n) {
    if (w == NULL) return row_dot(dy, x, dt, n);
    lk_v16 s0 = lk_v16_set1(0), s1 = s0, vo = lk_v16_set1(off);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        lk_v16 g0 = lk_v16_mul(lk_v16_load(dy, dt, j, 16), lk_v16_add(lk_v16_load(w, wt, j, 16), vo));
        lk_v16 g1 = lk_v16_mul(lk_v16_load(dy, dt, j + 16, 16), lk_v16_add(lk_v16_load(w, wt, j + 16, 16), vo));
        s0 = lk_v16_fma(g0, lk_v16_load(x, dt, j, 16), s0);
        s1 = lk_v16_fma(g1, lk_v16_load(x, dt, j + 16, 16), s1);
    }
    for (; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        lk_v16 g = lk_v16_mul(lk_v16_load(dy, dt, j, k), lk_v16_add(lk_v16_load(w, wt, j, k), vo));
        s0 = lk_v16_fma(g, lk_v16_load(x, dt, j, k), s0);
    }
    return lk_v16_sum(lk_v16_add(s0, s1));
}

/* The forward of a row of x (of xt: dt, or the residual mode's f32 stream): rstd
 * returned, y (dt) written. */
INLINE float row_forward(const void *x, lk_dtype xt, const void *w, float off, void *y, lk_dtype dt, lk_dtype wt,
                         int64_t n, double eps, int nt) {
    float rs = (float)(1.0 / sqrt((double)row_dot(x, x, xt, n) / (double)n + eps));
    lk_v16 vr = lk_v16_set1(rs), vo = lk_v16_set1(off);
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        lk_v16 v = lk_v16_mul(lk_v16_load(x, xt, j, k), vr);
        if (w) v = lk_v16_mul(v, lk_v16_add(lk_v16_load(w, wt, j, k), vo));
        lk_v16_store(y, dt, j, v, k, nt);
    }
    return rs;
}

/* dx = rs·(g − x̂·m) with g = dy·(off + w), x̂ = x·rs; dwp += dy·x̂. Element j of dy is
 * read before element j of dx is written, so dx may be dy. dx is stored as dxt (dt, or
 * f32 for the residual mode's row). */
INLINE void row_backward(const void *x, const void *w, float off, const void *dy, void *dx,
                         float *dwp, lk_dtype dt, lk_dtype wt, lk_dtype dxt, int64_t n, float rs, float m,
                         int nt) {
    lk_v16 vr = lk_v16_set1(rs), vm = lk_v16_set1(m), vo = lk_v16_set1(off);
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        lk_v16 d = lk_v16_load(dy, dt, j, k);
        lk_v16 xh = lk_v16_mul(lk_v16_load(x, dt, j, k), vr);
        lk_v16 g = w ? lk_v16_mul(d, lk_v16_add(lk_v16_load(w, wt, j, k), vo)) : d;
        if (dwp) lk_v16_store(dwp, LK_F32, j, lk_v16_fma(d, xh, lk_v16_load(dwp, LK_F32, j, k)), k, 0);
        lk_v16_store(dx, dxt, j, lk_v16_mul(lk_v16_fnma(xh, vm, g), vr), k, nt);
    }
}

/* The residual mode's forward pass over a row: res += delta (f32), x = res rounded. A
 * residual of rt = dt (the stream in x's dtype) is only read; it may be x. */
INLINE void row_residual_in(void *res, lk_dtype rt, const void *delta, void *x, lk_dtype dt, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        lk_v16 r = lk_v16_load(res, rt, j, k);
        if (delta) {
            r = lk_v16_add(r, lk_v16_load(delta, dt, j, k));
            if (rt == LK_F32) lk_v16_store(res, LK_F32, j, r, k, 0);
        }
        lk_v16_store(x, dt, j, r, k, 0);
    }
}

/* ... and its backward pass: res += dxf (the row's dx in f32), dx = res rounded. dxf may
 * be dx (f32); a residual of rt = dt may be dx. */
INLINE void row_residual_out(void *res, lk_dtype rt, const float *dxf, void *dx, lk_dtype dt, int64_t n, int nt) {
    for (int64_t j = 0; j < n; j += 16) {
        int k = n - j < 16 ? (int)(n - j) : 16;
        lk_v16 r = lk_v16_add(lk_v16_load(res, rt, j, k), lk_v16_load(dxf, LK_F32, j, k));
        if (rt == LK_F32) lk_v16_store(res, LK_F32, j, r, k, 0);
        lk_v16_store(dx, dt, j, r, k, nt);
    }
}

/* The cos and sin rows of row r's token under rope (x [T, H, n]: token r / H). */
INLINE void rope_rows(const lk_rms_norm_rope *rp, int64_t r, int64_t heads, int64_t n, const float **c,
                      const float **s) {
    int64_t p = lk_rope_pos(&rp->position_ids, 0, r / heads, rp->position_ids.shape[0]);
    *c = (const float *)rp->cos.data + p * (n / 2), *s = (const float *)rp->sin.data + p * (n / 2);
}

INLINE void forward_rows(const lk_rms_norm_args *a, lk_dtype dt, lk_dtype wt, int64_t rows, int64_t n) {
    const int64_t es = (int64_t)lk_dtype_size(dt);
    lk_rows mx, my;                       /* views (rows.h); the facade checked both fold */
    lk_rows_of(&a->x, &mx), lk_rows_of(&a->y, &my);
    char *x = a->x.data;                  /* written only in the residual mode */
    char *y = a->y.data;
    const void *w = a->weight.data;
    float *rstd = a->saved.data, off = a->weight_offset;
    char *res = a->residual.data;
    const lk_dtype rt = a->residual.dtype;
    const int64_t rsz = res ? (int64_t)lk_dtype_size(rt) : 0;
    const int of_x = a->norm_of_x || rt != LK_F32;   /* the stream in x's dtype is x */
    const char *delta = a->delta.data;
    const lk_rms_norm_rope *rp = a->rope;
    const int64_t heads = rp ? a->x.shape[1] : 1;
    int nt = !rp && use_streaming(y, rows, n, dt) && lk_tensor_is_contiguous(&a->y);   /* a view's rows: any alignment */
    #pragma omp parallel if (rows * n >= FUSED_PAR_MIN)
    {
        #pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < rows; r++) {
            char *xr = x + lk_row_at(mx, r) * es, *yr = y + lk_row_at(my, r) * es;
            if (res) row_residual_in(res + r * n * rsz, rt, delta ? delta + r * n * es : NULL, xr, dt, n);
            rstd[r] = res && !of_x ? row_forward(res + r * n * rsz, LK_F32, w, off, yr, dt, wt, n, a->eps, nt)
                                   : row_forward(xr, dt, w, off, yr, dt, wt, n, a->eps, nt);
            if (rp) {
                const float *c, *sn;
                rope_rows(rp, r, heads, n, &c, &sn);
                lk_rope_row(yr, yr, c, sn, lk_v16_set1(1.0f), dt, n / 2, n, 0);
            }
        }
        if (nt) lk_v16_fence();
    }
}

INLINE void backward_rows(const lk_rms_norm_args *a, lk_dtype dt, lk_dtype wt, int64_t rows, int64_t n,
                          float *partials, float *rowbufs, float *ropebufs, int threads) {
    const int64_t es = (int64_t)lk_dtype_size(dt);
    lk_rows mx, mdy, mdx;                 /* views (rows.h) */
    lk_rows_of(&a->x, &mx), lk_rows_of(&a->dy, &mdy), lk_rows_of(&a->dx, &mdx);
    const char *x = a->x.data, *dy = a->dy.data;
    char *dx = a->dx.data;
    const void *w = a->weight.data;
    const float *rstd = a->saved.data;
    float off = a->weight_offset;
    char *res = a->residual.data;
    const lk_dtype rt = a->residual.dtype;
    const int64_t rsz = res ? (int64_t)lk_dtype_size(rt) : 0;
    int64_t stride = round16(n);
    const lk_rms_norm_rope *rp = a->rope;
    const int64_t heads = rp ? a->x.shape[1] : 1;
    int nt = use_streaming(dx, rows, n, dt) && lk_tensor_is_contiguous(&a->dx);
    #pragma omp parallel num_threads(threads) if (rows * n >= FUSED_PAR_MIN)
    {
        int team = omp_get_num_threads();
        float *dwp = partials ? partials + omp_get_thread_num() * stride : NULL;
        float *rowf = rowbufs ? rowbufs + omp_get_thread_num() * stride : NULL;   /* bf16's dx in f32 */
        float *rowr = ropebufs ? ropebufs + omp_get_thread_num() * stride : NULL;   /* dy rotated back, in dt */
        if (dwp)
            for (int64_t j = 0; j < n; j++) dwp[j] = 0.0f;
        #pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < rows; r++) {
            const char *xr = x + lk_row_at(mx, r) * es, *dyr = dy + lk_row_at(mdy, r) * es;
            char *dxr = dx + lk_row_at(mdx, r) * es;
            if (rp) {
                const float *c, *sn;
                rope_rows(rp, r, heads, n, &c, &sn);
                lk_rope_row(dyr, rowr, c, sn, lk_v16_set1(-1.0f), dt, n / 2, n, 0);
                dyr = (const char *)rowr;
            }
            float rs = rstd[r];
            float m = rs * row_dot_weighted(dyr, w, off, xr, dt, wt, n) / (float)n;   /* mean(g·x̂) */
            if (!res) {
                row_backward(xr, w, off, dyr, dxr, dwp, dt, wt, dt, n, rs, m, nt);
            } else {
                float *dxf = dt == LK_F32 ? (float *)dxr : rowf;
                row_backward(xr, w, off, dyr, dxf, dwp, dt, wt, LK_F32, n, rs, m, 0);
                row_residual_out(res + r * n * rsz, rt, dxf, dxr, dt, n, nt);
            }
        }
        if (nt) lk_v16_fence();
        if (partials) {
            #pragma omp barrier
            #pragma omp for schedule(static)
            for (int64_t j = 0; j < n; j += 16) {
                int k = n - j < 16 ? (int)(n - j) : 16;
                lk_v16 s = lk_v16_load(partials, LK_F32, j, k);
                for (int t = 1; t < team; t++) s = lk_v16_add(s, lk_v16_load(partials + t * stride, LK_F32, j, k));
                lk_v16_store(a->dweight.data, wt, j, s, k, 0);   /* the weight's dtype */
            }
        }
    }
}

static size_t fused_saved_bytes(int64_t rows, int64_t n, lk_dtype dt) {
    return (size_t)rows * sizeof(float);
}

/* One f32 dweight row per thread for the backward, one for a bf16 dx in f32 (the
 * residual mode) and one for dy rotated back (rope); the forward needs nothing. */
static size_t fused_workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    size_t row = (size_t)lk_get_num_threads() * (size_t)round16(n) * sizeof(float);
    return backward ? 3 * row : 0;
}

static lk_status fused_forward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    if (a->x.dtype == LK_F32) forward_rows(a, LK_F32, LK_F32, rows, n);
    else if (a->weight.data && a->weight.dtype == LK_F32) forward_rows(a, LK_BF16, LK_F32, rows, n);
    else forward_rows(a, LK_BF16, LK_BF16, rows, n);
    return LK_OK;
}

static lk_status fused_backward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    int threads = lk_get_num_threads();
    size_t row = (size_t)threads * (size_t)round16(n) * sizeof(float);
    float *partials = NULL, *rowbufs = NULL, *ropebufs = NULL;
    if (a->weight.data && a->dweight.data && !(partials = lk_arena_alloc(ctx->arena, row)))
        return lk_error(LK_EINTERNAL, "rms_norm: fused: workspace for %d threads was not reserved", threads);
    if (a->residual.data && a->x.dtype != LK_F32 && !(rowbufs = lk_arena_alloc(ctx->arena, row)))
        return lk_error(LK_EINTERNAL, "rms_norm: fused: workspace for %d threads was not reserved", threads);
    if (a->rope && !(ropebufs = lk_arena_alloc(ctx->arena, row)))
        return lk_error(LK_EINTERNAL, "rms_norm: fused: workspace for %d threads was not reserved", threads);
    if (a->x.dtype == LK_F32) backward_rows(a, LK_F32, LK_F32, rows, n, partials, rowbufs, ropebufs, threads);
    else if (a->weight.data && a->weight.dtype == LK_F32)
        backward_rows(a, LK_BF16, LK_F32, rows, n, partials, rowbufs, ropebufs, threads);
    else backward_rows(a, LK_BF16, LK_BF16, rows, n, partials, rowbufs, ropebufs, threads);
    return LK_OK;
}

const lk_rms_norm_vtable lk_rms_norm_fused_vtable = {
    .version = LK_RMS_NORM_VTABLE_VERSION,
    .saved_bytes = fused_saved_bytes,
    .workspace_bytes = fused_workspace_bytes,
    .forward = fused_forward,
    .backward = fused_backward,
    .takes_views = 1,
    .takes_rope = 1,
};
